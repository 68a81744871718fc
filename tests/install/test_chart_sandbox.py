"""The chart's optional gVisor sandbox: the RuntimeClass (off by default) and the operator's two settings.

`helm template` of charts/sless (see helm.py); the operator reads the rendered ConfigMap as it would in the cluster.
"""

from __future__ import annotations

from typing import Any

import pytest

from sless_operator.config import OperatorConfig
from tests.install.helm import HelmError, by_kind, one, render


def operator_config(objects: list[dict[str, Any]]) -> OperatorConfig:
    data = one(objects, "ConfigMap", "sless-config")["data"]
    return OperatorConfig.from_env(data)


def test_off_by_default_no_runtime_class_and_no_requirement() -> None:
    objects = render()
    assert by_kind(objects, "RuntimeClass") == []
    config = operator_config(objects)
    assert (config.require_sandbox, config.sandbox_runtime_class) == ("", "gvisor")


def test_the_runtime_class_names_the_runsc_handler() -> None:
    objects = render({"sandbox.runtimeClass.create": True})
    (rc,) = by_kind(objects, "RuntimeClass")
    assert rc["apiVersion"] == "node.k8s.io/v1"
    assert (rc["metadata"]["name"], rc["handler"]) == ("gvisor", "runsc")
    assert "scheduling" not in rc
    assert rc["metadata"]["labels"]["app.kubernetes.io/component"] == "sandbox"


def test_a_renamed_class_on_some_nodes_reaches_the_operator() -> None:
    rc_values = {"create": True, "name": "gvisor-systrap", "handler": "runsc-systrap",
                 "nodeSelector": {"sandbox": "gvisor"}}  # fmt: skip
    objects = render({"sandbox": {"require": "gvisor", "runtimeClass": rc_values}})
    (rc,) = by_kind(objects, "RuntimeClass")
    assert (rc["metadata"]["name"], rc["handler"]) == ("gvisor-systrap", "runsc-systrap")
    assert rc["scheduling"] == {"nodeSelector": {"sandbox": "gvisor"}}
    config = operator_config(objects)
    assert (config.require_sandbox, config.sandbox_runtime_class) == ("gvisor", "gvisor-systrap")


@pytest.mark.parametrize("values", [{"sandbox.require": "runc"}, {"sandbox.runtimeClass.name": "Not_A_Name"},
                                    {"sandbox.runtimeClass.handler": ""}, {"sandbox.other": 1}])  # fmt: skip
def test_the_schema_refuses_what_the_operator_would(values: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="sandbox"):
        render(values)
