"""Who holds which credential in a build Job: kaniko none, the push step the push credential.

kaniko runs the tenant's Dockerfile steps (setup.py, npm install scripts) as root, so anything mounted
into or named by its container, or by the fetch-context step before it (the same emptyDir), is the
tenant's to read. These check every container of the Job for Secret volumes, env and envFrom.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sless_core.envconfig import ConfigError
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from tests.support.operator_refs import NS, fn_ref

PUSH, KANIKO_ONLY = "sless-registry-push", "sless-registry-cache"
WITH_PUSH = OperatorConfig(registry="registry.test/sless", build_registry_secret=PUSH)


def steps(config: OperatorConfig, runtime: str = "python3.11") -> dict[str, dict[str, Any]]:
    job = manifests.build_job(config, fn_ref(runtime))
    pod = job["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*pod["initContainers"], *pod["containers"]]}


def secret_volumes(config: OperatorConfig) -> dict[str, str]:
    pod = manifests.build_job(config, fn_ref())["spec"]["template"]["spec"]
    return {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}


def secrets_seen(config: OperatorConfig, container: dict[str, Any]) -> set[str]:
    """Every Secret CONTAINER can read: mounted volumes, env and envFrom references."""
    volumes = secret_volumes(config)
    seen = {volumes[m["name"]] for m in container.get("volumeMounts", []) if m["name"] in volumes}
    seen |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
    seen |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", [])
             if "secretKeyRef" in e.get("valueFrom", {})}  # fmt: skip
    return seen


@pytest.mark.parametrize("runtime", ["python3.11", "nodejs20", "go1.23"])
def test_kaniko_holds_no_credential_and_the_push_step_holds_the_push_credential(runtime: str) -> None:
    found = steps(WITH_PUSH, runtime)
    assert list(found) == ["fetch-context", "kaniko", "push-image"]  # the push runs after kaniko has exited
    kaniko, push, fetch = found["kaniko"], found["push-image"], found["fetch-context"]
    assert secrets_seen(WITH_PUSH, kaniko) == set()
    assert PUSH not in json.dumps(kaniko) and "/kaniko/.docker" not in json.dumps(kaniko)
    assert secrets_seen(WITH_PUSH, fetch) == {WITH_PUSH.build_s3_secret}  # S3 only, never the registry's
    assert PUSH not in json.dumps(fetch)
    assert secrets_seen(WITH_PUSH, push) == {PUSH}
    assert secret_volumes(WITH_PUSH) == {"push-config": PUSH}
    assert f"--docker-config={manifests.PUSH_CONFIG_DIR}/config.json" in push["args"]
    # kaniko leaves the image as a tarball in the shared emptyDir and pushes nothing itself
    assert "--no-push" in kaniko["args"] and f"--tar-path={manifests.IMAGE_TARBALL}" in kaniko["args"]
    assert not any(a.startswith("--push-retry") for a in kaniko["args"])
    image = manifests.image_ref(WITH_PUSH, NS, "hello", fn_ref().code_hash)
    assert f"--destination={image}" in kaniko["args"] and f"--destination={image}" in push["args"]
    assert f"--tarball={manifests.IMAGE_TARBALL}" in push["args"]


def test_the_push_step_runs_no_tenant_code_as_non_root_on_a_read_only_root() -> None:
    push = steps(WITH_PUSH)["push-image"]
    assert push["image"] == WITH_PUSH.build_fetch_image  # the platform image, never a tenant's
    assert push["command"] == ["python", "-m", "sless_operator.imagepush"]
    sc = push["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == manifests.FETCH_UID
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged")
    assert all(m.get("readOnly") for m in push["volumeMounts"])  # reads the tarball, writes nothing
    assert push["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert f"--max-bytes={manifests.IMAGE_TARBALL_MAX_BYTES}" in push["args"]
    assert "--insecure" not in push["args"]


def test_without_a_push_credential_no_secret_is_mounted_and_the_cache_stays_as_configured() -> None:
    config = OperatorConfig(registry="registry.test/sless")
    found = steps(config)
    assert secret_volumes(config) == {}
    assert not any(a.startswith("--docker-config") for a in found["push-image"]["args"])
    assert "--cache=true" in found["kaniko"]["args"] and "--cache-repo=registry.test/sless/cache" in found["kaniko"][
        "args"]
    off = dataclasses.replace(config, build_cache=False)
    assert not any(a.startswith("--cache") for a in steps(off)["kaniko"]["args"])


def test_with_a_push_credential_the_cache_is_off_unless_kaniko_gets_a_credential_of_its_own() -> None:
    assert WITH_PUSH.build_cache is True
    assert not any(a.startswith("--cache") for a in steps(WITH_PUSH)["kaniko"]["args"])
    assert manifests.kaniko_cache(WITH_PUSH) is False
    cached = dataclasses.replace(WITH_PUSH, build_kaniko_secret=KANIKO_ONLY)
    found = steps(cached)
    assert "--cache=true" in found["kaniko"]["args"]
    assert secrets_seen(cached, found["kaniko"]) == {KANIKO_ONLY}  # the cache credential, never the push one
    assert {"name": "kaniko-config", "mountPath": "/kaniko/.docker", "readOnly": True} in found["kaniko"][
        "volumeMounts"]
    assert secrets_seen(cached, found["push-image"]) == {PUSH}
    assert secrets_seen(cached, found["fetch-context"]) == {cached.build_s3_secret}


def test_the_kaniko_credential_may_not_be_the_push_credential() -> None:
    env = {"SLESS_BUILD_REGISTRY_SECRET": PUSH, "SLESS_BUILD_KANIKO_SECRET": PUSH}
    with pytest.raises(ConfigError, match="SLESS_BUILD_KANIKO_SECRET"):
        OperatorConfig.from_env(env)
    config = OperatorConfig.from_env(env | {"SLESS_BUILD_KANIKO_SECRET": KANIKO_ONLY})
    assert (config.build_registry_secret, config.build_kaniko_secret) == (PUSH, KANIKO_ONLY)
    for flag in ("--no-push=false", "--tar-path=/tmp/x.tar"):  # kaniko must not push nor write elsewhere
        with pytest.raises(ConfigError, match="set by the operator"):
            OperatorConfig.from_env({"SLESS_KANIKO_EXTRA_ARGS": flag})


def test_the_push_mounts_base_layers_from_the_runtime_images_repository_on_the_same_registry() -> None:
    same = OperatorConfig(registry="10.0.0.5:5000/sless", runtime_image_prefix="10.0.0.5:5000/sless",
                          runtime_image_tag="v1", go_run_image="10.0.0.5:5000/base/static@sha256:" + "0" * 64)
    assert "--mount-from=sless/python3.11" in steps(same)["push-image"]["args"]
    go = [a for a in steps(same, "go1.23")["push-image"]["args"] if a.startswith("--mount-from")]
    assert go == ["--mount-from=sless/go1.23", "--mount-from=base/static"]
    other = OperatorConfig(registry="10.0.0.5:5000/sless", runtime_image_prefix="ghcr.io/sless")
    assert not any(a.startswith("--mount-from") for a in steps(other)["push-image"]["args"])


def test_an_insecure_registry_is_plain_http_for_the_push_step_too() -> None:
    config = dataclasses.replace(WITH_PUSH, registry_insecure=True)
    assert "--insecure" in steps(config)["push-image"]["args"]


def test_the_go_compile_job_holds_no_credential_whatever_the_build_is_given() -> None:
    """It runs the tenant's code (go build) in the tenant namespace: only URLs signed for its code and binary."""
    loaded = dataclasses.replace(WITH_PUSH, build_kaniko_secret=KANIKO_ONLY, s3_access_key="AKIA-SIGNING",
                                 s3_secret_key="signing-secret-key", image_pull_secret="pull")  # fmt: skip
    go = dataclasses.replace(fn_ref("go1.23"), code_key=f"code/{NS}/hello/0001-ab.tar.gz", code_sha256="c0" * 32,
                             context_key="")  # fmt: skip
    key = manifests.binary_key(go, "registry.test/sless/go1.23:latest")
    job = manifests.compile_job(loaded, go, "registry.test/sless/go1.23:latest", key, "http://s3/get?sig",
                                "http://s3/put?sig")  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert all("secret" not in v and "projected" not in v for v in pod["volumes"]), pod["volumes"]
    for c in [*pod["initContainers"], *pod["containers"]]:
        assert "envFrom" not in c, c["name"]
        assert all("valueFrom" not in e for e in c.get("env", [])), c["name"]
    text = json.dumps(job)
    for secret in (PUSH, KANIKO_ONLY, loaded.build_s3_secret, "AKIA-SIGNING", "signing-secret-key"):
        assert secret not in text, secret
    assert pod["imagePullSecrets"] == [{"name": "pull"}]  # read by the kubelet, never mounted into a container
