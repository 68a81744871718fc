"""Kopf's connection pool: sized for the namespaces served, unbounded for a namespace pattern."""

from __future__ import annotations

from sless_operator.config import OperatorConfig
from sless_operator.context import Context
from sless_operator.main import watch_streams


def test_listed_namespaces_are_counted_and_patterns_are_not_bounded() -> None:
    assert watch_streams([]) == 9  # cluster-wide: one stream per resource
    assert watch_streams(["sless-a", "sless-build"]) == 14
    for pattern in ("sless-*", "sless-?", "!kube-system", "a,b"):
        assert watch_streams(["sless-build", pattern]) is None
    config = OperatorConfig.from_env({})
    assert Context(config, watch_streams=None).kopf_connections == 0  # aiohttp: no limit
    assert Context(config, watch_streams=14).kopf_connections == 14 + config.api_concurrency
