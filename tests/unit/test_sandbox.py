"""The optional gVisor sandbox: the function's field, its custom-resource form, the operator's settings and pods.

A function asks with ``"sandbox": "gvisor"``; an administrator requires it for every function pod with
``SLESS_REQUIRE_SANDBOX=gvisor``. Either way the operator names the RuntimeClass in every pod it makes for the
function (Deployment, run Job, CronJob) and nowhere else; anything it does not know is refused, never ignored.
tests/realnode/test_realnode_gvisor.py runs such a function on a real node.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sless_api.backends.standalone.functions import refuse_sandbox
from sless_api.domain.errors import Unsupported
from sless_api.rest.openapi import SCHEMAS
from sless_core import crd
from sless_core.crcodec import FunctionResource, InvalidResource, function_spec_to_cr
from sless_core.envconfig import ConfigError
from sless_core.errors import ValidationError
from sless_core.models import SANDBOXES, FunctionSpec
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner

NS = "sless-0123456789abcdef"
HASH = "ab" * 32


def spec(**fields: Any) -> FunctionSpec:
    return FunctionSpec.from_user({"name": "hello", "runtime": "python3.11", **fields}, 900)


@pytest.mark.parametrize("given", [None, "", "gvisor"])
def test_known_sandboxes_and_none_are_accepted(given: str | None) -> None:
    body = {} if given is None else {"sandbox": given}
    assert spec(**body).sandbox == (given or "")


@pytest.mark.parametrize("given", ["runc", "GVISOR", "gvisor ", "kata", 1, True, ["gvisor"], {"name": "gvisor"}])
def test_an_unknown_sandbox_is_a_400_naming_the_field(given: object) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(sandbox=given)
    assert caught.value.field == "sandbox"
    assert "gvisor" in str(caught.value), "the message names what is accepted"


def test_an_update_keeps_sets_and_clears_the_sandbox() -> None:
    asked = spec(sandbox="gvisor")
    assert asked.updated({"memory_mb": 256}, 900).sandbox == "gvisor"
    assert spec().updated({"sandbox": "gvisor"}, 900).sandbox == "gvisor"
    assert asked.updated({"sandbox": ""}, 900).sandbox == ""
    with pytest.raises(ValidationError):
        asked.updated({"sandbox": "none"}, 900)


def test_the_api_shows_the_field_and_stored_records_without_it_read_as_none() -> None:
    assert spec(sandbox="gvisor").to_dict()["sandbox"] == "gvisor"
    assert spec().to_dict()["sandbox"] == ""
    stored_before = {k: v for k, v in spec().to_dict().items() if k != "sandbox"}
    assert FunctionSpec.from_dict(stored_before).sandbox == ""


def test_the_openapi_document_lists_exactly_the_models_sandboxes() -> None:
    field = SCHEMAS["FunctionFields"]["properties"]["sandbox"]
    assert field["enum"] == ["", *SANDBOXES]


def cr(spec_body: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": crd.API_VERSION,
        "kind": "Function",
        "metadata": {"name": "hello", "namespace": NS},
        "spec": spec_body,
    }


def test_the_custom_resource_carries_the_sandbox_only_when_asked() -> None:
    assert "sandbox" not in function_spec_to_cr(spec())
    body = function_spec_to_cr(spec(sandbox="gvisor"))
    assert body["sandbox"] == "gvisor"
    parsed = FunctionResource.from_cr(cr(body))
    assert parsed.spec.sandbox == "gvisor"


def test_a_custom_resource_with_an_unknown_sandbox_is_refused_with_its_path() -> None:
    body = {**function_spec_to_cr(spec()), "sandbox": "runc"}
    with pytest.raises(InvalidResource) as caught:
        FunctionResource.from_cr(cr(body))
    assert caught.value.field == "spec.sandbox"


def test_the_standalone_backend_refuses_a_sandbox_it_cannot_give() -> None:
    refuse_sandbox(spec())
    with pytest.raises(Unsupported) as caught:
        refuse_sandbox(spec(sandbox="gvisor"))
    assert caught.value.status == 422 and "kubernetes" in str(caught.value)


# -- the operator ------------------------------------------------------------------------------------------------


def test_operator_settings_default_to_no_requirement_and_the_gvisor_class() -> None:
    config = OperatorConfig.from_env({})
    assert (config.require_sandbox, config.sandbox_runtime_class) == ("", "gvisor")
    config = OperatorConfig.from_env(
        {"SLESS_REQUIRE_SANDBOX": "gvisor", "SLESS_SANDBOX_RUNTIME_CLASS": "gvisor-systrap"}
    )
    assert (config.require_sandbox, config.sandbox_runtime_class) == ("gvisor", "gvisor-systrap")
    assert OperatorConfig.from_env({"SLESS_REQUIRE_SANDBOX": ""}).require_sandbox == ""


@pytest.mark.parametrize(("name", "value"), [("SLESS_REQUIRE_SANDBOX", "gVisor"), ("SLESS_REQUIRE_SANDBOX", "yes"),
                                             ("SLESS_SANDBOX_RUNTIME_CLASS", "Bad_Name")])  # fmt: skip
def test_a_bad_operator_setting_stops_the_operator_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        OperatorConfig.from_env({name: value})


def fn_ref(**fields: Any) -> FunctionRef:
    return FunctionRef(namespace=NS, name="hello", spec=spec(**fields), code_hash=HASH,
                       context_key=f"contexts/{NS}/hello/1.tar.gz",
                       owner=Owner(crd.API_VERSION, "Function", "hello", "uid-1"))  # fmt: skip


def function_pods(config: OperatorConfig, fn: FunctionRef) -> list[dict[str, Any]]:
    """The pod specs of every kind of function pod: the Deployment's, a run Job's, a CronJob's."""
    image = "registry.test/sless/img:1"
    deployment = manifests.deployment(config, fn, image, 1)
    job = manifests.run_job(config, fn, image, Owner(crd.API_VERSION, "FunctionJob", "once", "uid-2"), 1, {})
    cron = manifests.cron_job(config, fn, image, Owner(crd.API_VERSION, "Trigger", "tick", "uid-3"), "* * * * *",
                              True)  # fmt: skip
    return [deployment["spec"]["template"]["spec"], job["spec"]["template"]["spec"],
            cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]]  # fmt: skip


def test_pods_of_a_function_without_a_sandbox_name_no_runtime_class() -> None:
    for pod in function_pods(OperatorConfig(), fn_ref()):
        assert "runtimeClassName" not in pod


def test_a_function_that_asks_for_gvisor_runs_every_pod_under_its_runtime_class() -> None:
    for pod in function_pods(OperatorConfig(), fn_ref(sandbox="gvisor")):
        assert pod["runtimeClassName"] == "gvisor"
    for pod in function_pods(OperatorConfig(sandbox_runtime_class="gvisor-systrap"), fn_ref(sandbox="gvisor")):
        assert pod["runtimeClassName"] == "gvisor-systrap"


def test_an_administrators_requirement_covers_functions_that_did_not_ask() -> None:
    for pod in function_pods(OperatorConfig(require_sandbox="gvisor"), fn_ref()):
        assert pod["runtimeClassName"] == "gvisor"


def test_a_sandboxed_functions_build_runs_as_before() -> None:
    """Only the function's own pods change: its image build (kaniko) keeps the cluster's default runtime."""
    build = manifests.build_job(OperatorConfig(require_sandbox="gvisor"), fn_ref(sandbox="gvisor"))
    assert "runtimeClassName" not in build["spec"]["template"]["spec"]


def test_the_standalone_backend_refuses_before_it_stores_anything() -> None:
    """The refusal is create's first step: no state, secrets or namespace are touched (none exist here)."""
    from sless_api.backends.standalone.functions import Functions

    fns = Functions.__new__(Functions)  # no collaborators: reaching any of them would fail the test
    with pytest.raises(Unsupported):
        asyncio.run(fns.create_function(NS, spec(sandbox="gvisor")))
