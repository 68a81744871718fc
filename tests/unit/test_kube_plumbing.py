"""Settings, error translation and watch-stream parsing of the Kubernetes backend."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import urllib3.exceptions
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from sless_api.backends.kube.client import KubeClient, KubeConflict, KubeNotFound, translate
from sless_api.backends.kube.code import stamp
from sless_api.backends.kube.routes import FUNCTIONS, RouteTable
from sless_api.backends.kube.watch import Backoff, Gone, Watcher, iter_lines
from sless_api.backends.settings import KubeSettings
from sless_api.domain.errors import Unavailable
from sless_core.errors import ValidationError


def test_settings_defaults_and_overrides() -> None:
    default = KubeSettings.from_env({})
    assert default.service_url("sless-0123456789abcdef", "hello") == \
        "http://hello.sless-0123456789abcdef.svc.cluster.local:8080"
    assert default.base_image("python3.11") == "sless/python3.11:latest"
    custom = KubeSettings.from_env({"SLESS_KUBE_SERVICE_DOMAIN": "svc.example.internal.",
                                    "SLESS_RUNTIME_IMAGE_PREFIX": "registry.local:5000/sless/",
                                    "SLESS_RUNTIME_IMAGE_TAG": "v1", "SLESS_KUBE_WATCH_TIMEOUT_SEC": "30",
                                    "KUBECONFIG": "/tmp/kc"})
    assert custom.service_url("ns", "f") == "http://f.ns.svc.example.internal:8080"
    assert custom.base_image("go1.23") == "registry.local:5000/sless/go1.23:v1"
    assert (custom.watch_timeout_sec, custom.kubeconfig) == (30.0, "/tmp/kc")
    assert default.go_run_image == "gcr.io/distroless/static-debian12:nonroot"
    assert KubeSettings.from_env({"SLESS_GO_RUN_IMAGE": "10.0.0.1:5000/static:1"}).go_run_image == \
        "10.0.0.1:5000/static:1"
    with pytest.raises(ValueError):
        KubeSettings.from_env({"SLESS_GO_RUN_IMAGE": "static:1 RUN x"})
    assert default.code_fetch and not KubeSettings.from_env({"SLESS_KUBE_CODE_FETCH": "false"}).code_fetch


@pytest.mark.parametrize("env", [
    {"SLESS_KUBE_SERVICE_DOMAIN": "bad domain"},
    {"SLESS_KUBE_SERVICE_DOMAIN": "a/b"},
    {"SLESS_RUNTIME_IMAGE_TAG": "x\nRUN evil"},
    {"SLESS_KUBE_REQUEST_TIMEOUT_SEC": "0"},
    {"SLESS_KUBE_WATCH_TIMEOUT_SEC": "soon"},
    {"SLESS_KUBE_CODE_FETCH": "maybe"},
])
def test_bad_settings_name_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(env))):
        KubeSettings.from_env(env)


def _api_exception(status: int, reason: str = "", details: dict[str, str] | None = None) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "message": f"server says {status}", "reason": reason,
                           "details": details or {}})
    return exc


def test_api_errors_become_platform_errors() -> None:
    missing = translate(_api_exception(404, "NotFound", {"kind": "namespaces"}), "function 'a'")
    assert isinstance(missing, KubeNotFound) and missing.status == 404 and missing.kind == "namespaces"
    taken = translate(_api_exception(409, "AlreadyExists"), "function 'a'")
    assert isinstance(taken, KubeConflict) and taken.reason == "AlreadyExists"
    invalid = translate(_api_exception(422, "Invalid"), "function 'a'")
    assert isinstance(invalid, ValidationError) and "server says 422" in invalid.message
    for status in (401, 403, 429, 500, 503, 0):
        err = translate(_api_exception(status), "function 'a'")
        assert isinstance(err, Unavailable) and err.status == 503, status
    assert isinstance(translate(urllib3.exceptions.MaxRetryError(None, "/"), "x"), Unavailable)  # type: ignore[arg-type]
    assert isinstance(translate(ConnectionRefusedError(), "x"), Unavailable)


def test_a_status_body_that_is_not_json_still_translates() -> None:
    exc = ApiException(status=404, reason="Not Found")
    exc.body = "<html>proxy error</html>"
    assert isinstance(translate(exc, "job 'j'"), KubeNotFound)


def test_watch_lines_survive_any_chunking() -> None:
    events = [{"type": "ADDED", "object": {"n": i}} for i in range(3)]
    raw = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    for size in (1, 7, 64, len(raw)):
        chunks = [raw[i:i + size] for i in range(0, len(raw), size)]
        assert [json.loads(line) for line in iter_lines(iter(chunks))] == events
    assert list(iter_lines(iter([b'{"a": 1}']))) == [b'{"a": 1}']  # no trailing newline


def test_backoff_doubles_to_a_cap_and_resets() -> None:
    backoff = Backoff(0.5, 4)
    assert [backoff.next() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    backoff.reset()
    assert backoff.next() == 0.5


def test_stamps_sort_by_time_and_name_the_code() -> None:
    first, second = stamp("a" * 64, 1767323045.25), stamp("b" * 64, 1767323045.5)
    assert first == "20260102T030405250000Z-aaaaaaaaaaaa"
    assert first < second


def _watcher(table: RouteTable) -> Watcher:
    """A watcher that is never started: its event handling is plain code (no server needed)."""
    kube = KubeClient(KubeSettings(), configuration=k8s.Configuration())
    return Watcher(kube, table, FUNCTIONS, None, threading.Event())


def test_watch_events_update_the_table_and_the_resume_point() -> None:
    table = RouteTable()
    watcher = _watcher(table)
    obj = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "12"}, "spec": {},
           "status": {"phase": "Ready"}}
    assert watcher._event({"type": "ADDED", "object": obj}, "10") == "12"
    assert ("ns", "a") in table._functions
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}}
    assert watcher._event(bookmark, "12") == "20"
    assert watcher._event({"type": "DELETED", "object": {**obj, "metadata": {**obj["metadata"],
                                                                             "resourceVersion": "21"}}}, "20") == "21"
    assert ("ns", "a") not in table._functions


def test_a_gone_watch_relists_and_other_errors_fail_the_watch() -> None:
    watcher = _watcher(RouteTable())
    with pytest.raises(Gone):
        watcher._event({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}, "1")
    with pytest.raises(RuntimeError, match="500"):
        watcher._event({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}, "1")


def test_the_scaler_settings_need_an_address_and_a_token(tmp_path: Path) -> None:
    assert KubeSettings.from_env({}).scaler_address == ""  # not told: no reports
    token = tmp_path / "token"
    token.write_text("token-0123456789abcdef\n")
    told = KubeSettings.from_env({"SLESS_SCALER_ADDRESS": "sless-scaler.sless:9090",
                                  "SLESS_SCALER_TOKEN_FILE": str(token)})  # fmt: skip
    assert (told.scaler_address, told.scaler_token) == ("sless-scaler.sless:9090", "token-0123456789abcdef")
    assert "token-0123" not in repr(told)
    for env, why in (({"SLESS_SCALER_ADDRESS": "sless-scaler"}, "host:port"),
                     ({"SLESS_SCALER_ADDRESS": "a:99999", "SLESS_SCALER_TOKEN": "t" * 20}, "host:port"),
                     ({"SLESS_SCALER_ADDRESS": "a:9090"}, "token"),
                     ({"SLESS_SCALER_ADDRESS": "a:9090", "SLESS_SCALER_TOKEN_FILE": str(tmp_path / "none")},
                      "cannot read")):
        with pytest.raises(ValueError, match=why):
            KubeSettings.from_env(env)
