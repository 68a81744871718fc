"""When the platform traces: off by default (unlike the SDK's own default), on for OTLP only when asked."""

from __future__ import annotations

import pytest

from sless_api.tracing import enabled, wanted


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ({"OTEL_TRACES_EXPORTER": "console"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "TRUE"}, False),
])  # fmt: skip
def test_traces_are_wanted_only_when_the_environment_asks(env: dict[str, str], on: bool) -> None:
    assert wanted(env) is on


def test_off_in_a_process_that_was_not_configured() -> None:
    assert not enabled()
