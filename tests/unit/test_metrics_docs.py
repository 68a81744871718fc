"""The README's metrics table and the metrics the code defines are the same set, with the same labels."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import Counter, Gauge, Histogram

from sless_api import metrics as api_metrics
from sless_operator import metrics as operator_metrics
from tests.support.metricdocs import documented_metrics, undocumented_series


def defined() -> dict[str, Any]:
    """Every metric object of the API's and the operator's metrics modules, by its documented name."""
    found: dict[str, Any] = {}
    for module in (api_metrics, operator_metrics):
        for value in vars(module).values():
            if isinstance(value, (Counter, Gauge, Histogram)):
                family = value.describe()[0]
                name = family.name + "_total" if family.type == "counter" else family.name
                found[name] = value
    return found


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    assert set(defined()) == set(documented_metrics())


@pytest.mark.parametrize("name", sorted(documented_metrics()))
def test_a_metrics_type_and_labels_are_the_documented_ones(name: str) -> None:
    documented, metric = documented_metrics()[name], defined()[name]
    assert metric.describe()[0].type == documented.kind
    if not documented.labels:
        with pytest.raises(ValueError, match="No label names"):
            metric.labels()
        return
    values = {label: "documented" for label in documented.labels}
    metric.labels(**values)  # raises ValueError unless these are exactly its label names
    metric.remove(*values.values())


def test_an_undocumented_label_value_is_found() -> None:
    """The check the end-to-end scrapes use finds drift: an unknown trigger, label or metric."""
    exposition = (
        '# TYPE sless_invocations_total counter\n'
        'sless_invocations_total{namespace="n",function="f",trigger="http",status="200"} 1.0\n'
        'sless_invocations_total{namespace="n",function="f",trigger="webhook",status="200"} 1.0\n'
        'sless_invocations_total{namespace="n",function="f",trigger="http",status="200",zone="a"} 1.0\n'
        '# TYPE sless_mystery_total counter\nsless_mystery_total 1.0\n'
        '# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total{generation="0"} 1.0\n')
    problems = undocumented_series(exposition)
    assert len(problems) == 3, problems
    assert any("trigger='webhook'" in p for p in problems)
    assert any("'zone'" in p for p in problems)
    assert any("sless_mystery_total" in p for p in problems)
