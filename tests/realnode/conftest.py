"""Fixtures of the real-node tests: the session's control plane with a real kubelet node."""

from tests.support.realnode import real_node

__all__ = ["real_node"]
