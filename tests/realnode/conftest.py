"""Fixtures of the real-node tests: the session's control plane with a real kubelet node, an S3 server on its
bridge and the API process that reaches functions through cluster DNS (tests/support/realnode_operator.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.realnode import RealNode, real_node
from tests.support.realnode_operator import api_server, s3_server

__all__ = ["real_node"]


@pytest.fixture
def s3_on_bridge(real_node: RealNode, tmp_path: Path) -> Iterator[str]:
    """An S3 server on the node's bridge, which build Jobs and function pods reach."""
    with s3_server(real_node, tmp_path) as endpoint:
        yield endpoint


@pytest.fixture
def api_url(real_node: RealNode, s3_on_bridge: str, tmp_path: Path) -> Iterator[str]:
    """The URL of an API process on the kubernetes backend that resolves names through cluster DNS."""
    with api_server(real_node, s3_on_bridge, tmp_path) as url:
        yield url
