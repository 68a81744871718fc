"""``fetch-code``: a function pod's code through a signed URL, verified before it is unpacked.

A real HTTP server (a thread serving one object, answering 403/404 like S3) stands in for S3's
presigned GET; contextfetch is run as its command line, as the init container runs it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from sless_core.buildcontext import make_code_archive
from sless_core.crcodec import InvalidResource
from sless_core.models import FunctionSpec
from sless_operator import codeurl, contextfetch
from sless_operator.config import OperatorConfig
from sless_operator.manifests import FunctionRef, Owner
from tests.support.s3_like import Objects, serving


@pytest.fixture
def s3_like() -> Iterator[str]:
    with serving() as url:
        yield url


def run(monkeypatch: pytest.MonkeyPatch, url: str, sha: str, dest: Path) -> int:
    monkeypatch.setenv("SLESS_CODE_URL", url)
    return contextfetch.main(["--url-env=SLESS_CODE_URL", "--key=code/ns/fn/1.tar.gz", f"--sha256={sha}",
                              f"--dest={dest}", "--what=code archive"])  # fmt: skip


def test_the_code_is_fetched_verified_and_unpacked(tmp_path: Path, s3_like: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    code = tmp_path / "src"
    code.mkdir()
    (code / "handler.py").write_text("def handle(e):\n    return 1\n")
    archive = make_code_archive(code)
    assert archive == make_code_archive(code)  # deterministic: the same code, the same hash
    Objects.objects["/bucket/code/a.tar.gz"] = archive
    sha = hashlib.sha256(archive).hexdigest()
    dest = tmp_path / "ws" / "function"
    assert run(monkeypatch, f"{s3_like}/bucket/code/a.tar.gz?X-Amz-Signature=good", sha, dest) == 0
    assert (dest / "handler.py").read_text() == "def handle(e):\n    return 1\n"


def test_a_corrupted_missing_or_unsigned_archive_is_refused(
    tmp_path: Path, s3_like: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    Objects.objects["/bucket/code/b.tar.gz"] = b"tampered"
    cases = {
        f"{s3_like}/bucket/code/b.tar.gz?X-Amz-Signature=good": "has SHA-256",
        f"{s3_like}/bucket/code/none.tar.gz?X-Amz-Signature=good": "HTTP 404 (no such object)",
        f"{s3_like}/bucket/code/b.tar.gz?X-Amz-Signature=forged": "HTTP 403 (access denied or the URL expired)",
        "file:///etc/passwd": "not http(s)",
    }
    for url, reason in cases.items():
        dest = tmp_path / "ws" / "function"
        assert run(monkeypatch, url, "0" * 64, dest) == 1
        err = capsys.readouterr().err
        assert err.startswith("code archive: ") and reason in err, (url, err)
        assert not dest.exists() or not any(dest.iterdir())
    # no URL, or no digest to check against: refused before anything is fetched
    monkeypatch.delenv("SLESS_CODE_URL", raising=False)
    assert contextfetch.main(["--url-env=SLESS_CODE_URL", "--key=k", "--sha256=" + "0" * 64,
                              f"--dest={tmp_path / 'x'}"]) == 2  # fmt: skip
    monkeypatch.setenv("SLESS_CODE_URL", "http://x/")
    assert contextfetch.main(["--url-env=SLESS_CODE_URL", "--key=k", f"--dest={tmp_path / 'x'}"]) == 2


def _body(namespace: str, name: str, **spec: object) -> dict[str, object]:
    return {"apiVersion": "sless.dev/v1alpha1", "kind": "Function",
            "metadata": {"name": name, "namespace": namespace, "uid": "u1"},
            "spec": {"runtime": "python3.11", "codeHash": "a" * 64, **spec}}  # fmt: skip


def test_a_function_names_only_its_own_code_archive() -> None:
    ns = "sless-" + "1" * 16
    ok = FunctionRef.of(_body(ns, "fn", codeKey=f"code/{ns}/fn/1.tar.gz", codeSha256="b" * 64))
    assert ok.fetched and ok.code_sha256 == "b" * 64
    for key in (f"code/sless-{'2' * 16}/fn/1.tar.gz", f"code/{ns}/other/1.tar.gz", f"code/{ns}/fn/../x/1.tar.gz",
                f"contexts/{ns}/fn/1.tar.gz", f"code/{ns}/fn/.hidden"):
        with pytest.raises(InvalidResource, match="codeKey"):
            FunctionRef.of(_body(ns, "fn", codeKey=key, codeSha256="b" * 64))
    with pytest.raises(InvalidResource, match="codeSha256"):
        FunctionRef.of(_body(ns, "fn", codeKey=f"code/{ns}/fn/1.tar.gz"))
    with pytest.raises(InvalidResource, match="depsHash"):
        FunctionRef.of(_body(ns, "fn", codeKey=f"code/{ns}/fn/1.tar.gz", codeSha256="b" * 64, depsHash="XYZ"))


def test_urls_are_renewed_for_new_code_and_at_half_their_life() -> None:
    config = OperatorConfig(code_url_ttl_sec=1000)
    spec = FunctionSpec.from_user({"name": "fn", "runtime": "python3.11"}, 3600)
    ref = FunctionRef("ns", "fn", spec, "a" * 64, "", Owner("sless.dev/v1alpha1", "Function", "fn", "u"),
                      code_key="code/ns/fn/1.tar.gz")
    fresh = {"key": "code/ns/fn/1.tar.gz", "expires": 2000}
    assert not codeurl.needs_renewal(config, ref, fresh, now=1400)
    assert codeurl.needs_renewal(config, ref, fresh, now=1600)
    assert codeurl.needs_renewal(config, ref, {**fresh, "key": "code/ns/fn/0.tar.gz"}, now=1000)
    assert codeurl.needs_renewal(config, ref, {}, now=1000)
    with pytest.raises(codeurl.NoSigningKey):
        codeurl.Signer(config).sign("code/ns/fn/1.tar.gz", 60)
    signed = codeurl.Signer(OperatorConfig(s3_endpoint="s3.example:9000", s3_access_key="AK", s3_secret_key="SK",
                                           s3_bucket="code")).sign("code/ns/fn/1.tar.gz", 60)  # fmt: skip
    assert signed.startswith("http://s3.example:9000/code/code/ns/fn/1.tar.gz?") and "X-Amz-Signature=" in signed
    assert "X-Amz-Expires=60" in signed


def test_tenant_pods_may_reach_the_s3_address_for_their_code() -> None:
    from sless_operator import manifests

    def fetch_policy(endpoint: str) -> list[dict[str, object]]:
        objects = manifests.tenant_objects(OperatorConfig(s3_endpoint=endpoint), "sless-" + "1" * 16)
        return [o["spec"] for o in objects if o["metadata"]["name"] == manifests.ALLOW_CODE_FETCH_NAME]

    [spec] = fetch_policy("10.199.0.1:9000")
    assert spec["egress"] == [{"to": [{"ipBlock": {"cidr": "10.199.0.1/32"}}],
                               "ports": [{"protocol": "TCP", "port": 9000}]}]  # fmt: skip
    assert fetch_policy("https://[fd00::5]")[0]["egress"][0]["ports"][0]["port"] == 443  # type: ignore[index]
    # a name cannot be a NetworkPolicy peer: SLESS_FUNCTION_EGRESS_CIDRS then; AWS: none
    assert fetch_policy("minio.sless-system.svc:9000") == [] and fetch_policy("") == []


def _pod(containers: list[dict[str, object]], **status: object) -> dict[str, object]:
    return {"spec": {"containers": containers}, "status": status}


def test_a_failed_fetch_is_read_from_the_container_that_fetches() -> None:
    """Go and dependency-image pods: ``fetch-code``'s message. Python and Node pods on the runtime's image: the
    runtime container's, when it exited 3 (any other exit is the function's own, reported by the rollout)."""
    from sless_operator import observe

    reason = "code archive: cannot read code/ns/fn/1.tar.gz: HTTP 404 (no such object)"
    init = _pod([{"name": "function", "env": []}], initContainerStatuses=[
        {"name": "fetch-code", "state": {"running": {}},
         "lastState": {"terminated": {"exitCode": 1, "message": reason}}}])  # fmt: skip
    init["spec"]["initContainers"] = [{"name": "fetch-code", "args": ["--key=code/ns/fn/1.tar.gz"]}]  # type: ignore[index]
    assert observe.fetch_failure(init) == reason and observe.fetched_key(init) == "code/ns/fn/1.tar.gz"

    itself = [{"name": "function", "env": [{"name": "SLESS_CODE_KEY", "value": "code/ns/fn/2.tar.gz"},
                                           {"name": "SLESS_CODE_URL", "valueFrom": {"secretKeyRef": {}}}]}]  # fmt: skip

    def status(state: dict[str, object], last: dict[str, object]) -> dict[str, object]:
        return _pod(itself, containerStatuses=[{"name": "function", "state": state, "lastState": last}])

    crashed = {"terminated": {"exitCode": 3, "message": reason + "\n"}}
    backoff = {"waiting": {"reason": "CrashLoopBackOff"}}
    assert observe.fetched_key(status({}, {})) == "code/ns/fn/2.tar.gz"
    assert observe.fetch_failure(status(crashed, {})) == reason
    assert observe.fetch_failure(status(backoff, crashed)) == reason
    assert observe.fetch_failure(status(backoff, {"terminated": {"exitCode": 3}})) == "function exited with code 3"
    assert observe.fetch_failure(status({"running": {}}, crashed)) is None  # fetched since (or trying again)
    assert observe.fetch_failure(status(backoff, {"terminated": {"exitCode": 1, "message": "SyntaxError"}})) is None
    # a pod with code in its image: whatever its container says is no fetch
    plain = _pod([{"name": "function", "env": []}], containerStatuses=[{"name": "function", "state": crashed}])
    assert observe.fetch_failure(plain) is None and observe.fetched_key(plain) == ""
