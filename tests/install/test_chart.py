"""The Helm chart charts/sless, rendered by the real helm: lint, schema strictness, RBAC,
Secrets by name, Ingress timeouts, pod security, probes, NetworkPolicies, the test hook, the
operator's admission policy and the build namespace's egress."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sless_core import crd
from sless_operator import manifests
from sless_operator.config import OperatorConfig
from tests.install.helm import CHART, NAMESPACE, HelmError, by_kind, helm, one, pod_specs, render

API = "sless-api"
API_TENANT = "sless-api-tenant"
OPERATOR = "sless-operator"
EVENTS = "sless-events"
SCALER = "sless-scaler"
SCALER_TOKEN = "sless-scaler-token"


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


def test_lint_strict_passes() -> None:
    proc = helm("lint", "--strict", str(CHART), "--kube-version", "1.34.4")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lint_strict_passes_with_everything_on() -> None:
    on = {
        "ingress": {"enabled": True, "host": "f.example.com", "tls": {"enabled": True, "secretName": "tls"}},
        "networkPolicy": {"egress": {"enabled": True, "to": [{"cidr": "10.0.0.1/32"}]}},
        "metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    }
    sets = [arg for key, value in on.items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    proc = helm("lint", "--strict", str(CHART), "--kube-version", "1.34.4", *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_renders_every_part(default: list[dict[str, Any]]) -> None:
    kinds = sorted({o["kind"] for o in default})
    assert kinds == sorted(["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Namespace",
                            "NetworkPolicy", "PodDisruptionBudget", "Pod", "Role", "RoleBinding", "Secret", "Service",
                            "ServiceAccount", "ValidatingAdmissionPolicy",
                            "ValidatingAdmissionPolicyBinding"])  # fmt: skip
    assert {o["metadata"]["name"] for o in by_kind(default, "Deployment")} == {API, OPERATOR, EVENTS, SCALER}


def test_every_object_is_labelled_and_prefixed(default: list[dict[str, Any]]) -> None:
    for obj in default:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "sless"
        assert labels["app.kubernetes.io/instance"] == "sless"
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["name"].startswith("sless-"), obj["metadata"]["name"]


def test_fullname_override_prefixes_everything() -> None:
    objects = render({"fullnameOverride": "fx"})
    names = {o["metadata"]["name"] for o in objects if o["kind"] != "Namespace"}
    assert names and all(n.startswith("fx-") for n in names), names


# ---------------------------------------------------------------- values and schema


@pytest.mark.parametrize(("values", "message"), [
    ({"api": {"replica": 3}}, "additional properties 'replica' not allowed"),
    ({"imagee": {}}, "additional properties 'imagee' not allowed"),
    ({"secrets": {"jwt": {"name": "x", "key": "k", "value": "inline"}}}, "additional properties 'value' not allowed"),
    ({"operator": {"replicas": 6}}, "maximum"),
    ({"limits": {"maxTimeoutSec": "900"}}, "got string, want integer"),
    ({"image": {"pullPolicy": "Sometimes"}}, "value must be one of"),
    ({"build": {"kanikoExtraArgs": ["rm -rf /"]}}, "kanikoExtraArgs"),
])  # fmt: skip
def test_schema_rejects_mistakes(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError) as err:
        render(values)
    assert message in str(err.value)


def _schema_objects(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if "properties" in node:
        found.append((path or "/", node))
        for key, child in node["properties"].items():
            found += _schema_objects(child, f"{path}/{key}")
    if isinstance(node.get("items"), dict):
        found += _schema_objects(node["items"], f"{path}[]")
    return found


def test_schema_is_closed_at_every_level() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    objects = _schema_objects(schema)
    assert len(objects) > 20
    open_ones = [path for path, node in objects if node.get("additionalProperties") is not False
                 and path != "/api/extraEnv[]" and path != "/operator/extraEnv[]"]  # fmt: skip
    assert open_ones == []


def _leaf_paths(node: Any, path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        return set().union(*(_leaf_paths(v, (*path, k)) for k, v in node.items()))
    return {path}


def test_schema_and_values_name_the_same_keys() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def schema_has(path: tuple[str, ...]) -> bool:
        node = schema
        for key in path:
            props = node.get("properties")
            if props is None:  # a free-form map (labels, resources, securityContext)
                return node.get("type") == "object"
            if key not in props:
                return False
            node = props[key]
        return True

    missing = [".".join(p) for p in _leaf_paths(values) if not schema_has(p)]
    assert missing == []
    assert set(schema["properties"]) == set(values)


def test_every_value_is_commented() -> None:
    """Each key of values.yaml has a comment right above it, or sits under a commented key."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    commented_at: list[int] = []  # indentation of the commented ancestors in scope
    bare = []
    for i, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][\w.-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        commented_at = [level for level in commented_at if level < indent]
        above = lines[i - 1].strip() if i else ""
        if above.startswith("#"):
            commented_at.append(indent)
        elif not commented_at and not line.rstrip().endswith(":"):
            bare.append(line.strip())
        elif not commented_at:
            # a section header: fine when every child is commented (checked as they come)
            pass
    assert bare == []


# ---------------------------------------------------------------- RBAC


def _rules(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], rule) for o in objects if o["kind"] in ("ClusterRole", "Role")
            for rule in o.get("rules", [])]  # fmt: skip


def test_rbac_has_no_wildcards(default: list[dict[str, Any]]) -> None:
    rules = _rules(default)
    assert len(rules) > 10
    for name, rule in rules:
        for field in ("verbs", "resources", "apiGroups"):
            assert "*" not in rule.get(field, []), f"{name}: '*' in {field}: {rule}"
            assert not any("*" in item for item in rule.get(field, [])), f"{name}: wildcard in {field}"


def test_rbac_grants_secrets_to_the_api_and_code_url_writes_to_the_operator(default: list[dict[str, Any]]) -> None:
    """The API stores tenants' secrets as Secrets; the operator only writes each function's code URL Secret
    (create, patch: it never reads one); nothing else touches Secrets."""
    granted = {}
    for name, rule in _rules(default):
        if "" in rule.get("apiGroups", []) and "secrets" in rule.get("resources", []):
            granted[name] = set(rule["verbs"])
    assert granted == {API_TENANT: {"get", "list", "create", "update", "delete"},
                       "sless-operator": {"create", "patch"}}, granted  # fmt: skip


def test_the_apis_tenant_rights_are_bound_per_namespace_never_cluster_wide(default: list[dict[str, Any]]) -> None:
    """The API's ClusterRole holds no Secret and no pod log; it may bind its tenant role (and no other role) with
    RoleBindings it creates, and nothing in the chart binds that role cluster-wide."""
    api = _grants(default, API)
    assert not any(resource in ("secrets", "pods", "pods/log") for _, resource, _ in api), api
    assert ("rbac.authorization.k8s.io", "rolebindings", "create") in api
    [bind] = [rule for rule in one(default, "ClusterRole", API)["rules"] if "bind" in rule["verbs"]]
    assert bind == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                    "resourceNames": [API_TENANT]}  # fmt: skip
    assert not any("escalate" in rule["verbs"] for _, rule in _rules(default))
    bound = [o["roleRef"]["name"] for o in default if o["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert API_TENANT not in bound, bound
    env = {e["name"]: e.get("value") for e in one(default, "Deployment", API)["spec"]["template"]["spec"]
           ["containers"][0]["env"]}  # fmt: skip
    assert env["SLESS_KUBE_TENANT_ROLE"] == API_TENANT
    assert env["SLESS_KUBE_SERVICE_ACCOUNT"] == f"{NAMESPACE}:{API}"


def test_rbac_binds_each_role_to_its_own_service_account(default: list[dict[str, Any]]) -> None:
    for component in ("api", "operator"):
        binding = one(default, "ClusterRoleBinding", f"sless-{component}")
        assert binding["roleRef"]["name"] == f"sless-{component}"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"sless-{component}", "namespace": NAMESPACE}]
        deployment = one(default, "Deployment", f"sless-{component}")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == f"sless-{component}"


def test_operator_may_write_status_but_api_may_not(default: list[dict[str, Any]]) -> None:
    def resources(role: str) -> set[str]:
        return {r for rule in one(default, "ClusterRole", role)["rules"] for r in rule["resources"]}

    assert {"functions/status", "triggers/status", "functionjobs/status"} <= resources("sless-operator")
    assert not any(r.endswith("/status") for r in resources("sless-api"))


def _grants(objects: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for rule in one(objects, "ClusterRole", role)["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}


def test_api_reads_pod_logs_and_nothing_more_of_pods(default: list[dict[str, Any]]) -> None:
    pods = {g for g in _grants(default, API_TENANT) if g[0] == "" and g[1].startswith("pods")}
    assert pods == {("", "pods", "list"), ("", "pods/log", "get")}


def test_call_logs_off_grants_no_pod_access(default: list[dict[str, Any]]) -> None:
    off = render({"api.callLogs.enabled": False})
    assert not any(g[1].startswith("pods") for role in (API, API_TENANT) for g in _grants(off, role))
    assert _grants(off, API_TENANT) == {g for g in _grants(default, API_TENANT) if not g[1].startswith("pods")}


def test_call_logs_setting_is_a_boolean() -> None:
    with pytest.raises(HelmError):
        render({"api.callLogs": {"enabled": "yes"}})


# ---------------------------------------------------------------- secrets and config


def _env(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e for e in container.get("env", [])}


def test_secrets_are_referenced_by_name_never_inlined(default: list[dict[str, Any]]) -> None:
    # the one Secret the chart writes holds a token it generated itself (sless-scaler's reports), never a value
    assert [s["metadata"]["name"] for s in by_kind(default, "Secret")] == [SCALER_TOKEN]
    env = _env(one(default, "Deployment", API))
    expected = {
        "SLESS_JWT_SECRET": ("sless-jwt", "secret"),
        "SLESS_DATABASE_URL": ("sless-database", "url"),
        "SLESS_S3_ACCESS_KEY": ("sless-s3", "access-key"),
        "SLESS_S3_SECRET_KEY": ("sless-s3", "secret-key"),
        "SLESS_RABBITMQ_URL": ("sless-rabbitmq", "url"),
    }
    for name, (secret, key) in expected.items():
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": key}
        assert "value" not in env[name]


def test_secret_names_follow_values() -> None:
    secrets = {
        "jwt": {"name": "my-jwt", "key": "pem"},
        "database": {"name": "db", "key": "dsn"},
        "s3": {"name": "s3", "accessKeyKey": "a", "secretKeyKey": "b"},
        "rabbitmq": {"name": "", "key": "url"},
        "buildS3": {"name": "bs3"},
        "registry": {"name": "push", "kanikoName": "cache-only"},
    }
    auth = {"algorithm": "RS256", "jwksUrl": "", "issuer": "", "audience": "", "leewaySec": 30}
    objects = render({"secrets": secrets, "auth": auth})
    env = _env(one(objects, "Deployment", API))
    assert env["SLESS_JWT_PUBLIC_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "my-jwt", "key": "pem"}
    assert "SLESS_JWT_SECRET" not in env
    assert "SLESS_RABBITMQ_URL" not in env
    data = one(objects, "ConfigMap", "sless-config")["data"]
    assert data["SLESS_BUILD_S3_SECRET"] == "bs3"
    assert data["SLESS_BUILD_REGISTRY_SECRET"] == "push"
    assert data["SLESS_BUILD_KANIKO_SECRET"] == "cache-only"  # kaniko's own; the push one is the push step's
    default = one(render({}), "ConfigMap", "sless-config")["data"]
    assert "SLESS_BUILD_REGISTRY_SECRET" not in default and "SLESS_BUILD_KANIKO_SECRET" not in default


def test_jwks_url_needs_no_secret() -> None:
    objects = render({"auth": {"algorithm": "RS256", "jwksUrl": "https://idp/jwks", "issuer": "i", "audience": "a",
                               "leewaySec": 5}})  # fmt: skip
    env = _env(one(objects, "Deployment", API))
    assert not {"SLESS_JWT_SECRET", "SLESS_JWT_PUBLIC_KEY"} & set(env)
    data = one(objects, "ConfigMap", "sless-config")["data"]
    assert (data["SLESS_JWKS_URL"], data["SLESS_JWT_ISSUER"], data["SLESS_JWT_AUDIENCE"]) == (
        "https://idp/jwks",
        "i",
        "a",
    )


def test_configmap_carries_the_settings_both_components_read(default: list[dict[str, Any]]) -> None:
    data = one(default, "ConfigMap", "sless-config")["data"]
    assert data["SLESS_BACKEND"] == "kubernetes"
    assert data["SLESS_PLATFORM_NAMESPACE"] == NAMESPACE
    assert data["SLESS_MAX_TIMEOUT_SEC"] == "900"
    assert data["SLESS_BUILD_NAMESPACE"] == "sless-build"
    assert all(isinstance(v, str) for v in data.values())
    for name in (API, OPERATOR):
        container = one(default, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"] == [{"configMapRef": {"name": "sless-config"}}]


def test_extra_kaniko_flags_reach_the_operator(default: list[dict[str, Any]]) -> None:
    assert "SLESS_KANIKO_EXTRA_ARGS" not in one(default, "ConfigMap", "sless-config")["data"]
    flags = ["--registry-map=index.docker.io=10.0.0.5:5000", "--snapshot-mode=redo"]
    data = one(render({"build": {"kanikoExtraArgs": flags}}), "ConfigMap", "sless-config")["data"]
    assert data["SLESS_KANIKO_EXTRA_ARGS"] == " ".join(flags)


def test_one_go_run_image_reaches_the_api_and_the_operator(default: list[dict[str, Any]]) -> None:
    """The API names it in kaniko builds, the operator in the pods of a compiled binary: one value for both."""
    assert one(default, "ConfigMap", "sless-config")["data"]["SLESS_GO_RUN_IMAGE"] == (
        "gcr.io/distroless/static-debian12:nonroot")
    mirrored = render({"runtimeImages": {"goRun": "registry.example.com/static:nonroot"}})
    assert one(mirrored, "ConfigMap", "sless-config")["data"]["SLESS_GO_RUN_IMAGE"] == (
        "registry.example.com/static:nonroot")
    with pytest.raises(HelmError):  # the schema: one image reference, nothing injected
        render({"runtimeImages": {"goRun": "static\nSLESS_BACKEND: standalone"}})


def test_a_changed_setting_rolls_the_pods(default: list[dict[str, Any]]) -> None:
    changed = render({"limits": {"maxTimeoutSec": 300, "proxyTimeoutMarginSec": 5, "maxUploadBytes": 33554432,
                                 "maxBodyBytes": 6291456}})  # fmt: skip
    for name in (API, OPERATOR):
        before = one(default, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        after = one(changed, "Deployment", name)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert before != after


@pytest.mark.parametrize(("limits", "drain"), [({}, 3600), ({"maxTimeoutSec": 3600, "proxyTimeoutMarginSec": 30,
                                                                "streamMaxSec": 600}, 3630)])
def test_an_api_pod_stops_only_after_its_longest_call_or_stream(limits: dict[str, int], drain: int) -> None:
    """A preStop pause while the endpoint leaves the Service, then SIGTERM and as long as sless-api's graceful timeout
    (the longest call or stream, plus 20 s for its shutdown) before the kubelet kills it."""
    objects = render({"limits": limits} if limits else {})
    spec = one(objects, "Deployment", API)["spec"]["template"]["spec"]
    assert spec["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert spec["terminationGracePeriodSeconds"] == 5 + drain + 25
    data = one(objects, "ConfigMap", "sless-config")["data"]
    assert data["SLESS_PROXY_STREAM_MAX_SEC"] == str(limits.get("streamMaxSec", 3600))
    with pytest.raises(HelmError):
        render({"limits": {"streamMaxSec": 0}})


# ---------------------------------------------------------------- ingress


@pytest.mark.parametrize(("max_timeout", "margin", "expected"), [(900, 5, "915"), (60, 0, "70"), (3600, 30, "3640")])
def test_ingress_timeouts_follow_the_longest_function(max_timeout: int, margin: int, expected: str) -> None:
    objects = render({"ingress": {"enabled": True, "className": "nginx", "host": "fn.example.com",
                                  "tls": {"enabled": False, "secretName": ""}, "annotations": {}},
                      "limits": {"maxTimeoutSec": max_timeout, "proxyTimeoutMarginSec": margin,
                                 "maxUploadBytes": 33554432, "maxBodyBytes": 6291456}})  # fmt: skip
    annotations = one(objects, "Ingress", API)["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == expected
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == expected
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "33m"
    assert one(objects, "ConfigMap", "sless-config")["data"]["SLESS_MAX_TIMEOUT_SEC"] == str(max_timeout)


def test_ingress_routes_to_the_api_service_with_tls() -> None:
    objects = render({"ingress": {"enabled": True, "className": "nginx", "host": "fn.example.com",
                                  "tls": {"enabled": True, "secretName": "fn-tls"},
                                  "annotations": {"example.com/extra": "yes"}}})  # fmt: skip
    ingress = one(objects, "Ingress", API)
    assert ingress["spec"]["tls"] == [{"secretName": "fn-tls", "hosts": ["fn.example.com"]}]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": API, "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"]["example.com/extra"] == "yes"


def test_ingress_is_off_by_default(default: list[dict[str, Any]]) -> None:
    assert by_kind(default, "Ingress") == []


# ---------------------------------------------------------------- pods


def test_pods_are_pod_security_restricted(default: list[dict[str, Any]]) -> None:
    specs = pod_specs(default)
    assert set(specs) == {API, OPERATOR, EVENTS, SCALER, "sless-test-health"}
    for name, spec in specs.items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] > 0, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"] == {"drop": ["ALL"]}, name
            assert ctx["readOnlyRootFilesystem"] is True, name
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"], name


def test_probes_and_commands(default: list[dict[str, Any]]) -> None:
    api = one(default, "Deployment", API)["spec"]["template"]["spec"]["containers"][0]
    assert api["command"] == ["sless-api"]
    assert api["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert api["livenessProbe"]["httpGet"]["path"] == "/health"
    assert api["startupProbe"]["httpGet"]["path"] == "/health"
    assert _env(one(default, "Deployment", API))["SLESS_BIND"]["value"] == "0.0.0.0:8090"
    operator = one(default, "Deployment", OPERATOR)
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sless-operator"]
    assert container["args"] == ["--liveness=http://0.0.0.0:8081/healthz"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert operator["spec"]["strategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert operator["spec"]["replicas"] == 2


def test_operator_replicas_take_turns_through_a_lease(default: list[dict[str, Any]]) -> None:
    """Only the holder of the Lease sless-operator reconciles; the operator may touch that Lease and no other."""
    env = _env(one(default, "Deployment", OPERATOR))
    assert env["SLESS_OPERATOR_LEADER_ELECTION"]["value"] == "true"
    assert env["SLESS_OPERATOR_LEASE_SEC"]["value"] == "15"
    role = one(default, "Role", f"{OPERATOR}-lease")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["sless-operator"],
         "verbs": ["get", "update"]}]
    binding = one(default, "RoleBinding", f"{OPERATOR}-lease")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR, "namespace": NAMESPACE}]
    assert one(default, "PodDisruptionBudget", OPERATOR)["spec"]["minAvailable"] == 1
    single = render({"operator": {"replicas": 1}})
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == OPERATOR]


def test_image_tag_defaults_to_app_version_and_digest_wins(default: list[dict[str, Any]]) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = one(default, "Deployment", API)["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/sless-dev/sless:{chart['appVersion']}"
    digest = "sha256:" + "a" * 64
    objects = render({"image": {"repository": "r.example/s", "tag": "x", "digest": digest, "pullPolicy": "Always"}})
    assert (
        one(objects, "Deployment", OPERATOR)["spec"]["template"]["spec"]["containers"][0]["image"]
        == f"r.example/s@{digest}"
    )


# ---------------------------------------------------------------- network, namespaces, hook


def test_network_policies_limit_ingress(default: list[dict[str, Any]]) -> None:
    api = one(default, "NetworkPolicy", API)["spec"]
    assert api["policyTypes"] == ["Ingress"]
    assert api["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
    assert api["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8090}]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}} in api["ingress"][
        0
    ]["from"]
    operator = one(default, "NetworkPolicy", OPERATOR)["spec"]
    assert operator["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8081}]}]


def test_network_policies_restrict_egress_when_asked() -> None:
    egress = {"enabled": True, "to": [{"cidr": "10.0.0.1/32", "ports": [443]}]}
    objects = render({"networkPolicy": {"enabled": True, "apiIngressNamespaceSelectors": [], "egress": egress}})
    api = one(objects, "NetworkPolicy", API)["spec"]
    assert api["policyTypes"] == ["Ingress", "Egress"]
    to_tenants = [r for r in api["egress"] if r.get("to") and "namespaceSelector" in r["to"][0]]
    assert to_tenants[0]["to"][0]["namespaceSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "sless"}
    assert {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 443}]} in api["egress"]
    operator = one(objects, "NetworkPolicy", OPERATOR)["spec"]
    assert not any("namespaceSelector" in (r.get("to") or [{}])[0] for r in operator["egress"])


def test_build_namespace_is_baseline_and_optional(default: list[dict[str, Any]]) -> None:
    namespace = one(default, "Namespace", "sless-build")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"
    # the same Pod Security labels as the operator's, which makes it when the chart does not (one definition)
    operators = manifests.build_namespace(OperatorConfig())["metadata"]["labels"]
    assert {k: v for k, v in namespace["metadata"]["labels"].items() if k.startswith("pod-security.")} == {
        k: v for k, v in operators.items() if k in (crd.POD_SECURITY_ENFORCE, crd.POD_SECURITY_WARN)}
    objects = render(
        {"build": {**yaml.safe_load((CHART / "values.yaml").read_text())["build"], "createNamespace": False}}
    )
    assert by_kind(objects, "Namespace") == []


def test_helm_test_hook_checks_the_api_health(default: list[dict[str, Any]]) -> None:
    pod = one(default, "Pod", "sless-test-health")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = pod["spec"]["containers"][0]["command"]
    assert command[-2] == f"http://{API}.{NAMESPACE}.svc:80/health"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["restartPolicy"] == "Never"


# ---------------------------------------------------------------- event dispatcher


def _events_objects(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"]["name"] == EVENTS)


def test_events_deployment_runs_the_dispatcher(default: list[dict[str, Any]]) -> None:
    deployment = one(default, "Deployment", EVENTS)
    assert deployment["spec"]["replicas"] == 1
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == EVENTS
    assert spec["automountServiceAccountToken"] is True
    assert spec["terminationGracePeriodSeconds"] == 45
    assert spec["volumes"][0]["name"] == "tmp" and "emptyDir" in spec["volumes"][0]
    [container] = spec["containers"]
    assert container["command"] == ["sless-events"]
    assert container["ports"] == [{"name": "probes", "containerPort": 8091, "protocol": "TCP"}]
    assert container["envFrom"] == [{"configMapRef": {"name": "sless-config"}}]
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, TOKEN_MOUNT]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = _env(deployment)
    assert {name: env[name]["value"] for name in ("SLESS_EVENTS_HOST", "SLESS_EVENTS_PORT", "SLESS_BACKEND")} == {
        "SLESS_EVENTS_HOST": "0.0.0.0", "SLESS_EVENTS_PORT": "8091", "SLESS_BACKEND": "kubernetes"}  # fmt: skip
    api_env = _env(one(default, "Deployment", API))
    for name in ("SLESS_DATABASE_URL", "SLESS_RABBITMQ_URL"):
        assert env[name]["valueFrom"] == api_env[name]["valueFrom"], name
        assert "value" not in env[name]
    assert not {"SLESS_JWT_SECRET", "SLESS_S3_ACCESS_KEY", "SLESS_S3_SECRET_KEY"} & set(env)
    probe = {"httpGet": {"path": "/health", "port": "probes"}, "periodSeconds": 2, "failureThreshold": 30}
    assert container["startupProbe"] == probe
    assert container["livenessProbe"] == {"httpGet": {"path": "/health", "port": "probes"}, "periodSeconds": 10,
                                          "timeoutSeconds": 5, "failureThreshold": 3}  # fmt: skip
    assert container["readinessProbe"] == {"httpGet": {"path": "/ready", "port": "probes"}, "periodSeconds": 5,
                                           "timeoutSeconds": 5, "failureThreshold": 2}  # fmt: skip
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    assert not [o for o in by_kind(default, "Service") if o["metadata"]["name"] == EVENTS]


def test_events_values_reach_the_pods() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["events"]
    values.update(replicas=3, extraEnv=[{"name": "SLESS_EVENT_PREFETCH", "value": "1"}],
                  podAnnotations={"example.com/a": "b"}, nodeSelector={"pool": "events"},
                  tolerations=[{"key": "k", "operator": "Exists"}])  # fmt: skip
    deployment = one(render({"events": values}), "Deployment", EVENTS)
    assert deployment["spec"]["replicas"] == 3
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"]["example.com/a"] == "b"
    assert template["spec"]["nodeSelector"] == {"pool": "events"}
    assert template["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert _env(deployment)["SLESS_EVENT_PREFETCH"]["value"] == "1"


@pytest.mark.parametrize("values", [
    {"events": {**yaml.safe_load((CHART / "values.yaml").read_text())["events"], "enabled": False}},
    {"secrets": {**yaml.safe_load((CHART / "values.yaml").read_text())["secrets"],
                 "rabbitmq": {"name": "", "key": "url"}}},
])  # fmt: skip
def test_events_is_absent_when_off_or_without_rabbitmq(default: list[dict[str, Any]], values: dict[str, Any]) -> None:
    assert ("Deployment", EVENTS) in _events_objects(default)
    objects = render(values)
    assert _events_objects(objects) == []
    assert {o["metadata"]["name"] for o in by_kind(objects, "Deployment")} == {API, OPERATOR, SCALER}
    # sless-scaler then admits the API alone
    [rule] = one(objects, "NetworkPolicy", SCALER)["spec"]["ingress"]
    assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]
            if "podSelector" in peer] == ["api"]  # fmt: skip


def test_events_rbac_is_exactly_what_the_dispatcher_needs(default: list[dict[str, Any]]) -> None:
    assert _events_objects(default) == [("ClusterRole", EVENTS), ("ClusterRoleBinding", EVENTS),
                                        ("Deployment", EVENTS), ("NetworkPolicy", EVENTS),
                                        ("ServiceAccount", EVENTS)]  # fmt: skip
    rules = one(default, "ClusterRole", EVENTS)["rules"]
    assert rules == [
        {"apiGroups": ["sless.dev"], "resources": ["functions", "triggers"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        {"apiGroups": ["sless.dev"], "resources": ["triggers/status"], "verbs": ["patch"]},
    ]
    assert not any("*" in item for rule in rules for field in rule.values() for item in field)
    binding = one(default, "ClusterRoleBinding", EVENTS)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": EVENTS}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": EVENTS, "namespace": NAMESPACE}]


def test_events_schema_rejects_unknown_keys() -> None:
    with pytest.raises(HelmError) as err:
        render({"events": {"replica": 2}})
    assert "additional properties 'replica' not allowed" in str(err.value)
    with pytest.raises(HelmError) as err:
        render({"events": {"extraEnv": [{"name": "1bad"}]}})
    assert "/events/extraEnv/0/name" in str(err.value)


def test_events_network_policy(default: list[dict[str, Any]]) -> None:
    policy = one(default, "NetworkPolicy", EVENTS)["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "events"
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8091}]}]
    egress = {"enabled": True, "to": [{"cidr": "10.0.0.1/32", "ports": [443, 5432, 5672]}]}
    objects = render({"networkPolicy": {"enabled": True, "apiIngressNamespaceSelectors": [], "egress": egress}})
    policy = one(objects, "NetworkPolicy", EVENTS)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    tenants = {"to": [{"namespaceSelector": {"matchLabels": {"app.kubernetes.io/managed-by": "sless"}}}],
               "ports": [{"protocol": "TCP", "port": 8080}]}  # fmt: skip
    api_egress = one(objects, "NetworkPolicy", API)["spec"]["egress"]
    assert tenants in api_egress
    assert policy["egress"] == api_egress
    off = render({"networkPolicy": {"enabled": False, "apiIngressNamespaceSelectors": [], "egress": egress}})
    assert by_kind(off, "NetworkPolicy") == []


# ---------------------------------------------------------------- sless-scaler


TOKEN_MOUNT = {"name": "scaler-token", "mountPath": "/var/run/sless/scaler", "readOnly": True}


def _scaler_objects(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objects
                  if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "scaler")  # fmt: skip


def test_scaler_renders_its_own_objects(default: list[dict[str, Any]]) -> None:
    assert _scaler_objects(default) == [("Deployment", SCALER), ("NetworkPolicy", SCALER), ("Secret", SCALER_TOKEN),
                                        ("Service", SCALER), ("ServiceAccount", SCALER)]  # fmt: skip
    # no API rights: nothing binds its account, and its account token is never mounted
    subjects = [s["name"] for o in default if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
                for s in o.get("subjects", [])]  # fmt: skip
    assert SCALER not in subjects
    assert one(default, "ServiceAccount", SCALER)["automountServiceAccountToken"] is False
    for obj in (one(default, kind, name) for kind, name in _scaler_objects(default)):
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/part-of"] == "sless" and labels["app.kubernetes.io/instance"] == "sless"
        assert labels["helm.sh/chart"].startswith("sless-")


def test_scaler_deployment(default: list[dict[str, Any]]) -> None:
    deployment = one(default, "Deployment", SCALER)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "sless", "app.kubernetes.io/instance": "sless",
                        "app.kubernetes.io/component": "scaler"}  # fmt: skip
    template = deployment["spec"]["template"]
    assert selector.items() <= template["metadata"]["labels"].items()
    spec = template["spec"]
    assert spec["serviceAccountName"] == SCALER
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    api_spec = one(default, "Deployment", API)["spec"]["template"]["spec"]
    assert spec["securityContext"] == api_spec["securityContext"]
    [container] = spec["containers"]
    assert container["command"] == ["sless-scaler"]
    assert container["image"] == api_spec["containers"][0]["image"]
    assert container["securityContext"] == api_spec["containers"][0]["securityContext"]
    assert container["ports"] == [{"name": "grpc", "containerPort": 9090, "protocol": "TCP"}]
    assert "envFrom" not in container  # it needs none of the platform's settings
    env = _env(deployment)
    assert env["SLESS_SCALER_LISTEN"]["value"] == "0.0.0.0:9090"
    assert env["SLESS_SCALER_TOKEN_FILE"]["value"] == "/var/run/sless/scaler/token"
    assert "SLESS_SCALER_TOKEN" not in env
    # the kubelet's native gRPC probe, against the standard health service of the server KEDA talks to
    assert container["startupProbe"] == {"grpc": {"port": 9090}, "periodSeconds": 2, "failureThreshold": 30}
    assert container["livenessProbe"] == {"grpc": {"port": 9090}, "periodSeconds": 10, "timeoutSeconds": 5,
                                          "failureThreshold": 3}  # fmt: skip
    assert container["readinessProbe"] == {"grpc": {"port": 9090}, "periodSeconds": 5, "timeoutSeconds": 5,
                                           "failureThreshold": 2}  # fmt: skip
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, TOKEN_MOUNT]


def test_scaler_values_reach_the_pod() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["scaler"]
    values.update(replicas=0, port=9443, extraEnv=[{"name": "SLESS_SCALER_MAX_STREAMS", "value": "500"}],
                  podAnnotations={"example.com/a": "b"}, nodeSelector={"pool": "system"})  # fmt: skip
    objects = render({"scaler": values})
    deployment = one(objects, "Deployment", SCALER)
    assert deployment["spec"]["replicas"] == 0
    template = deployment["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/a": "b"}
    assert template["spec"]["nodeSelector"] == {"pool": "system"}
    [container] = template["spec"]["containers"]
    assert container["readinessProbe"]["grpc"] == {"port": 9443}
    assert _env(deployment)["SLESS_SCALER_LISTEN"]["value"] == "0.0.0.0:9443"
    assert _env(deployment)["SLESS_SCALER_MAX_STREAMS"]["value"] == "500"
    assert one(objects, "Service", SCALER)["spec"]["ports"][0]["port"] == 9443
    data = one(objects, "ConfigMap", "sless-config")["data"]
    assert data["SLESS_SCALER_ADDRESS"] == f"{SCALER}.{NAMESPACE}.svc:9443"


@pytest.mark.parametrize(("values", "message"), [
    ({"replicas": 2}, "maximum"),  # the counts live in one process's memory
    ({"replica": 1}, "additional properties 'replica' not allowed"),
    ({"kedaNamespace": "Not A Namespace"}, "kedaNamespace"),
])  # fmt: skip
def test_scaler_schema_rejects_mistakes(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError) as err:
        render({"scaler": values})
    assert message in str(err.value)


def test_scaler_address_is_its_services_dns_name(default: list[dict[str, Any]]) -> None:
    """The API and the dispatcher report there and the operator names it in every ScaledObject, which KEDA dials
    from its own namespace: the Service's namespaced DNS name."""
    service = one(default, "Service", SCALER)
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [{"name": "grpc", "port": 9090, "targetPort": "grpc", "protocol": "TCP",
                                         "appProtocol": "grpc"}]  # fmt: skip
    pod_labels = one(default, "Deployment", SCALER)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    address = one(default, "ConfigMap", "sless-config")["data"]["SLESS_SCALER_ADDRESS"]
    assert address == f"{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    for name in (API, EVENTS, OPERATOR):  # all three read it from the ConfigMap
        container = one(default, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"] == [{"configMapRef": {"name": "sless-config"}}], name
        assert "SLESS_SCALER_ADDRESS" not in _env(one(default, "Deployment", name)), name
    assert OperatorConfig.from_env(one(default, "ConfigMap", "sless-config")["data"]).scaler_address == address
    # the release's own prefix follows
    other = render({"fullnameOverride": "fx"})
    assert one(other, "ConfigMap", "fx-config")["data"]["SLESS_SCALER_ADDRESS"] == f"fx-scaler.{NAMESPACE}.svc:9090"


def _token_volume(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any] | None:
    spec = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    found = [v for v in spec["volumes"] if v["name"] == "scaler-token"]
    return found[0] if found else None


def test_scaler_token_is_generated_and_mounted_into_scaler_api_and_events(default: list[dict[str, Any]]) -> None:
    secret = one(default, "Secret", SCALER_TOKEN)
    assert secret["type"] == "Opaque" and set(secret["data"]) == {"token"}
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert re.fullmatch(r"[A-Za-z0-9]{40}", token)
    for name in (SCALER, API, EVENTS):
        volume = _token_volume(default, name)
        assert volume == {"name": "scaler-token", "secret": {"secretName": SCALER_TOKEN, "defaultMode": 0o440,
                                                             "items": [{"key": "token", "path": "token"}]}}, name
        container = one(default, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert TOKEN_MOUNT in container["volumeMounts"], name
        assert _env(one(default, "Deployment", name))["SLESS_SCALER_TOKEN_FILE"] == {
            "name": "SLESS_SCALER_TOKEN_FILE", "value": "/var/run/sless/scaler/token"}, name
    # the operator only names the address; it holds no token
    assert _token_volume(default, OPERATOR) is None
    assert "SLESS_SCALER_TOKEN_FILE" not in _env(one(default, "Deployment", OPERATOR))
    # generated, never a fixed value: each render without a cluster to read it back from makes another
    assert one(render(), "Secret", SCALER_TOKEN)["data"]["token"] != secret["data"]["token"]
    # kept across upgrades: the template reads the release's existing Secret back before making one
    assert 'lookup "v1" "Secret" .Release.Namespace $name' in (CHART / "templates" / "scaler-secret.yaml").read_text()


def test_scaler_token_may_come_from_a_secret_of_ones_own() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["secrets"]
    values["scaler"] = {"name": "my-scaler-token", "key": "t"}
    objects = render({"secrets": values})
    assert by_kind(objects, "Secret") == []
    for name in (SCALER, API, EVENTS):
        volume = _token_volume(objects, name)
        assert volume is not None, name
        assert volume["secret"] == {"secretName": "my-scaler-token", "defaultMode": 0o440,
                                    "items": [{"key": "t", "path": "token"}]}, name


def test_scaler_network_policy_admits_only_the_reporters_and_keda(default: list[dict[str, Any]]) -> None:
    policy = one(default, "NetworkPolicy", SCALER)["spec"]
    assert policy["podSelector"]["matchLabels"] == one(default, "Deployment", SCALER)["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    selector = {"app.kubernetes.io/name": "sless", "app.kubernetes.io/instance": "sless"}
    assert policy["ingress"] == [{
        "from": [{"podSelector": {"matchLabels": {**selector, "app.kubernetes.io/component": "api"}}},
                 {"podSelector": {"matchLabels": {**selector, "app.kubernetes.io/component": "events"}}},
                 {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}],
        "ports": [{"protocol": "TCP", "port": 9090}],
    }]  # fmt: skip
    # it dials nobody: DNS is all its egress, whether or not the platform's egress is restricted
    assert policy["egress"] == [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]
    # KEDA's namespace follows the value
    values = yaml.safe_load((CHART / "values.yaml").read_text())["scaler"]
    moved = one(render({"scaler": {**values, "kedaNamespace": "autoscaling"}}), "NetworkPolicy", SCALER)["spec"]
    assert moved["ingress"][0]["from"][2] == {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "autoscaling"}}}  # fmt: skip


def test_restricted_egress_lets_the_reporters_reach_the_scaler() -> None:
    egress = {"enabled": True, "to": [{"cidr": "10.0.0.1/32"}]}
    objects = render({"networkPolicy": {"enabled": True, "apiIngressNamespaceSelectors": [], "egress": egress}})
    to_scaler = {"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "sless",
                                                         "app.kubernetes.io/instance": "sless",
                                                         "app.kubernetes.io/component": "scaler"}}}],
                 "ports": [{"protocol": "TCP", "port": 9090}]}  # fmt: skip
    for name in (API, EVENTS):
        assert to_scaler in one(objects, "NetworkPolicy", name)["spec"]["egress"], name
    assert to_scaler not in one(objects, "NetworkPolicy", OPERATOR)["spec"]["egress"]
    assert one(objects, "NetworkPolicy", SCALER)["spec"]["egress"] == [
        {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}]


def test_scaler_off_renders_none_of_it() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["scaler"]
    egress = {"enabled": True, "to": []}
    objects = render({"scaler": {**values, "enabled": False},
                      "networkPolicy": {"enabled": True, "apiIngressNamespaceSelectors": [], "egress": egress}})
    assert _scaler_objects(objects) == []
    assert by_kind(objects, "Secret") == []
    data = one(objects, "ConfigMap", "sless-config")["data"]
    assert "SLESS_SCALER_ADDRESS" not in data
    for name in (API, EVENTS, OPERATOR):
        assert _token_volume(objects, name) is None, name
        container = one(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
        assert TOKEN_MOUNT not in container.get("volumeMounts", []), name
        assert not {"SLESS_SCALER_ADDRESS", "SLESS_SCALER_TOKEN_FILE"} & set(_env(one(objects, "Deployment", name)))
        policy = one(objects, "NetworkPolicy", name)["spec"]
        assert "scaler" not in json.dumps(policy), name
    # the operator cannot be told "no scaler": without the variable it keeps its default address (values.yaml)
    assert OperatorConfig.from_env(data).scaler_address == OperatorConfig.scaler_address


# ---------------------------------------------------------------- the operator's scope (admission policy)


POLICY = "sless-operator-scope"


def _policy(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return one(objects, "ValidatingAdmissionPolicy", POLICY), one(objects, "ValidatingAdmissionPolicyBinding", POLICY)


def test_admission_policy_binds_the_operators_service_account_and_denies(default: list[dict[str, Any]]) -> None:
    policy, binding = _policy(default)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["spec"]["failurePolicy"] == "Fail"
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{OPERATOR}'"
    assert one(default, "ClusterRoleBinding", OPERATOR)["subjects"][0]["name"] == OPERATOR  # the same account
    assert binding["spec"] == {"policyName": POLICY, "validationActions": ["Deny"]}
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["buildNamespace"] == "'sless-build'"
    assert "'^sless-[0-9a-f]{16}$'" in variables["tenantShaped"]
    assert f"namespaceObject.metadata.labels['{crd.LABEL_TENANT}'] == 'true'" in variables["tenantLabelled"]
    assert crd.tenant_mark() == {crd.LABEL_TENANT: "true", crd.LABEL_MANAGED: "sless"}  # what the policy reads
    assert all(v.get("reason") == "Forbidden" and v.get("messageExpression") for v in policy["spec"]["validations"])


def _matched(policy: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    found: dict[tuple[str, str], set[str]] = {}
    for rule in policy["spec"]["matchConstraints"]["resourceRules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found.setdefault((group, resource), set()).update(rule["operations"])
    return found


def test_admission_policy_covers_every_kind_the_operator_may_write(default: list[dict[str, Any]]) -> None:
    """Each resource the operator's ClusterRole may create, change or delete (its own custom resources
    and Events aside) is matched for CREATE, UPDATE and DELETE, and so is each kind it builds."""
    from sless_operator.manifests import PLURALS

    policy, _ = _policy(default)
    matched = _matched(policy)
    writes = {"create", "update", "patch", "delete", "deletecollection"}
    for rule in one(default, "ClusterRole", OPERATOR)["rules"]:
        if not writes & set(rule["verbs"]) or rule["apiGroups"] in (["sless.dev"], ["events.k8s.io"]):
            continue
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, resource) == ("", "events"):
                    continue
                assert {"CREATE", "UPDATE", "DELETE"} <= matched.get((group, resource), set()), (group, resource)
    assert set(PLURALS.values()) <= {resource for _, resource in matched}


def test_admission_policy_follows_the_build_namespace_and_names() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    account = {"create": True, "name": "op", "annotations": {}}
    objects = render({"build": {**values["build"], "namespace": "builds"},
                      "operator": {**values["operator"], "serviceAccount": account},
                      "fullnameOverride": "fx"}, "-n", "platform")  # fmt: skip
    policy = one(objects, "ValidatingAdmissionPolicy", "fx-operator-scope")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["buildNamespace"] == "'builds'"
    assert "'system:serviceaccount:platform:op'" in policy["spec"]["matchConditions"][0]["expression"]
    assert (
        one(objects, "ValidatingAdmissionPolicyBinding", "fx-operator-scope")["spec"]["policyName"]
        == policy["metadata"]["name"]
    )


API_POLICY = "sless-api-scope"


def test_the_apis_admission_policy_matches_every_write_of_its_service_account(default: list[dict[str, Any]]) -> None:
    policy = one(default, "ValidatingAdmissionPolicy", API_POLICY)
    assert policy["spec"]["failurePolicy"] == "Fail"
    [condition] = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{API}'"
    assert _matched(policy) == {("*", "*/*"): {"CREATE", "UPDATE", "DELETE", "CONNECT"}}
    rolebinding = policy["spec"]["validations"][-1]["expression"]
    for part in (f"object.roleRef.name == '{API_TENANT}'", f"object.subjects[0].name == '{API}'",
                 f"object.subjects[0].namespace == '{NAMESPACE}'", "size(object.subjects) == 1"):
        assert part in rolebinding, part
    binding = one(default, "ValidatingAdmissionPolicyBinding", API_POLICY)
    assert binding["spec"] == {"policyName": API_POLICY, "validationActions": ["Deny"]}


def test_tenant_guard_rails_reach_the_operator_through_the_configmap() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["functions"]
    values["quota"] = {**values["quota"], "functions": 7, "secrets": 9, "storage": "1Gi"}
    values["dns"] = {"namespace": "dns", "podLabels": "app=coredns,tier=node", "cidrs": ["169.254.20.10/32"]}
    data = one(render({"functions": values}), "ConfigMap", "sless-config")["data"]
    config = OperatorConfig.from_env(data)
    assert (config.tenant_quota_functions, config.tenant_quota_secrets, config.tenant_quota_storage) == (7, 9, "1Gi")
    assert config.dns_namespace == "dns" and dict(config.dns_pod_labels) == {"app": "coredns", "tier": "node"}
    assert config.dns_cidrs == ("169.254.20.10/32",)
    defaults = OperatorConfig.from_env(one(render({}), "ConfigMap", "sless-config")["data"])
    assert manifests.tenant_quota(defaults) == manifests.tenant_quota(OperatorConfig())
    assert manifests.dns_peers(defaults) == manifests.dns_peers(OperatorConfig())


@pytest.mark.parametrize("bad", [{"quota": {"functions": -1}}, {"quota": {"storage": "lots"}},
                                 {"dns": {"podLabels": ""}}, {"dns": {"podLabels": "k8s-app"}},
                                 {"dns": {"cidrs": ["8.8.8.8"]}}, {"dns": {"namespace": "Kube_System"}}])  # fmt: skip
def test_bad_guard_rail_values_are_refused(bad: dict[str, Any]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["functions"]
    for key, part in bad.items():
        values[key] = {**values[key], **part}
    with pytest.raises(HelmError):
        render({"functions": values})


def test_admission_policy_is_optional() -> None:
    off = render({"admissionPolicy": {"enabled": False}})
    assert by_kind(off, "ValidatingAdmissionPolicy") == [] and by_kind(off, "ValidatingAdmissionPolicyBinding") == []


def test_the_chart_needs_kubernetes_1_30() -> None:
    """Function pods pause in a preStop `sleep` hook (1.30+); the admission policy is v1 from 1.30 on too."""
    with pytest.raises(HelmError) as err:
        render({"admissionPolicy": {"enabled": False}}, "--kube-version", "1.29.0")
    assert ">=1.30.0-0" in str(err.value) and "incompatible" in str(err.value)
    assert by_kind(render({}, "--kube-version", "1.30.0"), "ValidatingAdmissionPolicy")


# ---------------------------------------------------------------- builds: init container image, build namespace egress


def test_build_fetch_image_defaults_to_the_platform_image() -> None:
    data = one(render(), "ConfigMap", "sless-config")["data"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert data["SLESS_BUILD_FETCH_IMAGE"] == f"ghcr.io/sless-dev/sless:{app_version}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    digest = "sha256:" + "1" * 64
    pinned = one(render({"image": {**values["image"], "digest": digest}}), "ConfigMap", "sless-config")["data"]
    assert pinned["SLESS_BUILD_FETCH_IMAGE"] == f"ghcr.io/sless-dev/sless@{digest}"
    own = render({"build": {**values["build"], "fetchImage": "reg.example/fetch:1"}})
    assert one(own, "ConfigMap", "sless-config")["data"]["SLESS_BUILD_FETCH_IMAGE"] == "reg.example/fetch:1"


def test_build_namespace_is_default_deny_with_an_egress_allow_list(default: list[dict[str, Any]]) -> None:
    deny = one(default, "NetworkPolicy", "sless-build-default-deny")
    assert deny["metadata"]["namespace"] == "sless-build"
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    allow = one(default, "NetworkPolicy", "sless-build-egress")
    assert allow["metadata"]["namespace"] == "sless-build"
    assert allow["spec"]["policyTypes"] == ["Egress"] and "ingress" not in allow["spec"]
    egress = allow["spec"]["egress"]

    def ns(name: str) -> dict[str, Any]:
        return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}}}

    assert egress == [
        {"to": [ns("kube-system")], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [ns("sless-system")], "ports": [{"protocol": "TCP", "port": 5000}]},
        {"to": [ns("sless-system")], "ports": [{"protocol": "TCP", "port": 9000}]},
    ]


def test_build_egress_takes_cidrs_and_package_registries() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    policy = {"enabled": True, "dns": [{"cidr": "169.254.20.10/32", "ports": [53]}],
              "registry": [{"cidr": "10.9.0.0/16", "ports": [443]}], "s3": [{"cidr": "10.8.0.5/32"}],
              "packageRegistries": [{"cidr": "151.101.0.0/16", "ports": [443]}, {"namespace": "mirrors"}]}  # fmt: skip
    objects = render({"build": {**values["build"], "namespace": "builds", "networkPolicy": policy}})
    egress = one(objects, "NetworkPolicy", "sless-build-egress")["spec"]["egress"]
    assert {"to": [{"ipBlock": {"cidr": "10.8.0.5/32"}}]} in egress  # no ports: every port of that peer
    assert {"to": [{"ipBlock": {"cidr": "151.101.0.0/16"}}], "ports": [{"protocol": "TCP", "port": 443}]} in egress
    assert {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mirrors"}}}]} in egress
    assert egress[0]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]
    assert one(objects, "NetworkPolicy", "sless-build-default-deny")["metadata"]["namespace"] == "builds"
    off = render({"build": {**values["build"], "networkPolicy": {**policy, "enabled": False}}})
    assert [p["metadata"]["name"] for p in by_kind(off, "NetworkPolicy") if "build" in p["metadata"]["name"]] == []


@pytest.mark.parametrize("peer", [{"cidr": "10.0.0.0/8", "namespace": "x"}, {"ports": [443]}, {"cidr": "nope"},
                                  {"namespace": "x", "port": 443}])  # fmt: skip
def test_build_egress_schema_wants_exactly_one_peer(peer: dict[str, Any]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    policy = {**values["build"]["networkPolicy"], "packageRegistries": [peer]}
    with pytest.raises(HelmError):
        render({"build": {**values["build"], "networkPolicy": policy}})


def test_metrics_are_off_by_default(default: list[dict[str, Any]]) -> None:
    assert not by_kind(default, "ServiceMonitor") and not by_kind(default, "PodMonitor")
    for name in (API, EVENTS, OPERATOR):
        assert "SLESS_METRICS_TOKEN" not in _env(one(default, "Deployment", name))
    data = one(default, "ConfigMap", "sless-config")["data"]
    assert (data["SLESS_LOG_FORMAT"], data["SLESS_LOG_LEVEL"]) == ("json", "INFO")


def test_metrics_on_give_the_token_monitors_and_a_way_through_the_network_policy() -> None:
    objects = render({"metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "labels": {"release": "p"}}},
                      "secrets": {"metrics": {"name": "scrape", "key": "t"}}, "logging": {"format": "text"}})
    for name in (API, EVENTS):
        env = _env(one(objects, "Deployment", name))
        assert env["SLESS_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "scrape", "key": "t"}
    auth = {"type": "Bearer", "credentials": {"name": "scrape", "key": "t"}}
    [monitor] = by_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "p"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "honorLabels": True,
                                             "interval": "30s", "authorization": auth}]
    pods = {m["metadata"]["name"]: m["spec"]["podMetricsEndpoints"][0] for m in by_kind(objects, "PodMonitor")}
    assert pods[EVENTS]["port"] == "probes" and pods[OPERATOR]["port"] == "metrics"
    assert all(endpoint["authorization"] == auth for endpoint in pods.values())
    # the metrics' `namespace` is the tenant's: kept, not renamed exported_namespace by Prometheus
    assert all(endpoint["honorLabels"] is True for endpoint in pods.values())
    operator = _env(one(objects, "Deployment", OPERATOR))
    assert operator["SLESS_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "scrape", "key": "t"}
    assert (operator["SLESS_OPERATOR_METRICS_HOST"]["value"], operator["SLESS_OPERATOR_METRICS_PORT"]["value"]) == (
        "0.0.0.0", "8082")
    op_policy = one(objects, "NetworkPolicy", OPERATOR)["spec"]["ingress"]
    assert {"protocol": "TCP", "port": 8082} in op_policy[1]["ports"]
    policy = one(objects, "NetworkPolicy", API)
    sources = policy["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}} in sources
    assert one(objects, "ConfigMap", "sless-config")["data"]["SLESS_LOG_FORMAT"] == "text"


def test_monitors_need_metrics_on() -> None:
    objects = render({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}})
    assert not by_kind(objects, "ServiceMonitor") and not by_kind(objects, "PodMonitor")


# ---------------------------------------------------------------- the processes accept what the chart sets


def _process_env(objects: list[dict[str, Any]], deployment: str, files: Path) -> dict[str, str]:
    """What the container's process finds in its environment: the ConfigMap (when the pod reads it), literal
    values, and a stand-in for each Secret reference (a value of the shape the process expects), plus the pod's
    own variable. A file the pod mounts from a Secret (the scaler's token) is a stand-in file under FILES."""
    container = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]
    data = one(objects, "ConfigMap", "sless-config")["data"] if container.get("envFrom") else {}
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"} | dict(data)
    stand_ins = {"SLESS_JWT_SECRET": "s" * 32, "SLESS_DATABASE_URL": "postgresql://sless@db/sless",
                 "SLESS_RABBITMQ_URL": "amqp://sless@mq/", "SLESS_JWT_PUBLIC_KEY": ""}
    for name, entry in _env(one(objects, "Deployment", deployment)).items():
        env[name] = entry["value"] if "value" in entry else stand_ins.get(name, "from-a-secret")
    if "SLESS_SCALER_TOKEN_FILE" in env:
        assert env["SLESS_SCALER_TOKEN_FILE"] == f"{TOKEN_MOUNT['mountPath']}/token"
        token = files / "token"
        token.write_text("t" * 40 + "\n")
        env["SLESS_SCALER_TOKEN_FILE"] = str(token)
    return env


@pytest.mark.parametrize("values", [{}, {"auth": {"algorithm": "RS256", "jwksUrl": "https://idp/jwks", "issuer": "i",
                                                  "audience": "a", "leewaySec": 5}}])
def test_every_process_parses_the_configuration_the_chart_gives_it(values: dict[str, Any], tmp_path: Path) -> None:
    from sless_api.main.config import ApiConfig
    from sless_api.main.events import ServiceSettings
    from sless_api.services.scaling.config import ScalerConfig
    from sless_operator.config import OperatorConfig

    objects = render(values)
    api = ApiConfig.from_env(_process_env(objects, API, tmp_path), keep_alive_default=75)
    assert api.backend == "kubernetes" and api.kube.in_cluster and api.secrets.backend == "kubernetes"
    assert api.auth is not None
    events = ApiConfig.from_env(_process_env(objects, EVENTS, tmp_path))
    assert events.events is not None and ServiceSettings.from_config(events).port == events.probes.port
    for config in (api, events):  # both report to the scaler, with its token
        assert (config.kube.scaler_address, config.kube.scaler_token) == (f"{SCALER}.{NAMESPACE}.svc:9090", "t" * 40)
    operator = OperatorConfig.from_env(_process_env(objects, OPERATOR, tmp_path))
    assert operator.platform_namespace == NAMESPACE
    assert operator.scaler_address == f"{SCALER}.{NAMESPACE}.svc:9090"
    scaler = ScalerConfig.from_env(_process_env(objects, SCALER, tmp_path))
    assert (scaler.listen, scaler.token) == ("0.0.0.0:9090", "t" * 40)
