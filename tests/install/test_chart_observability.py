"""The chart's Grafana dashboard (a ConfigMap for Grafana's sidecar) and PrometheusRule alerts, rendered by the
real helm: both off by default; the dashboard is valid JSON with a datasource variable; every PromQL expression
of the dashboard and the alerts names only metrics of the README's metrics table (or the few external ones)
and only the labels the table gives them; thresholds, `for` and severity come from values; promtool accepts the
rules and, with series fed to it, fires them when it should."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.helm import CHART, NAMESPACE, HelmError, by_kind, helm, one, render
from tests.support.metricdocs import DocumentedMetric, documented_metrics

DASHBOARD = CHART / "dashboards" / "sless.json"
DASHBOARD_CM = "sless-grafana-dashboard"
RULE = "sless-alerts"
ALERTS = {"SlessFunctionErrorRate", "SlessFunctionLatencyHigh", "SlessEventDeadLetters", "SlessBuildsFailing",
          "SlessOperatorDown", "SlessOperatorReconcileErrors"}
ON = {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}, "grafanaDashboard": {"enabled": True},
                  "prometheusRule": {"enabled": True}}}
# metrics from outside sless the dashboard and alerts may use, with the labels they may read
EXTERNAL: dict[str, set[str]] = {
    "kube_deployment_status_replicas": {"namespace", "deployment"},  # kube-state-metrics (optional panel)
    "up": {"job", "instance", "namespace", "pod"},  # Prometheus' own, per scrape target
}

SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
GROUPING = re.compile(r"\b(by|without|on|ignoring)\s*\(([^()]*)\)")
RANGE = re.compile(r"\[[^\]]*\]")
IDENT = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)\b(?!\s*\()")
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}
DURATION = re.compile(r"^\d+(ms|s|m|h|d|w|y)$")


@pytest.fixture(scope="module")
def on() -> list[dict[str, Any]]:
    return render(ON)


@pytest.fixture(scope="module")
def docs() -> dict[str, DocumentedMetric]:
    return documented_metrics()


def _dashboard_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(one(objects, "ConfigMap", DASHBOARD_CM)["data"]["sless.json"])
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found += panel.get("panels", [])  # a collapsed row holds its panels
    return [p for p in found if p["type"] != "row"]


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in _panels(dashboard) for target in panel["targets"]]


def _rules(objects: list[dict[str, Any]], rule: str = RULE) -> list[dict[str, Any]]:
    return [r for group in one(objects, "PrometheusRule", rule)["spec"]["groups"] for r in group["rules"]]


def _alert(objects: list[dict[str, Any]], name: str, rule: str = RULE) -> dict[str, Any]:
    [found] = [r for r in _rules(objects, rule) if r["alert"] == name]
    return found


# ---------------------------------------------------------------- PromQL, read just enough to check names


def _allowed_labels(series: str, docs: dict[str, DocumentedMetric]) -> tuple[set[str], DocumentedMetric | None]:
    """The labels SERIES may be selected or grouped by, and its documented metric (None: an external one)."""
    if series in EXTERNAL:
        return EXTERNAL[series], None
    for metric in docs.values():
        if series in metric.series_names():
            extra = {"le"} if series.endswith("_bucket") else set()
            return set(metric.labels) | extra, metric
    raise AssertionError(f"{series}: neither in the README's metrics table nor a known external metric")


def _check_values(metric: DocumentedMetric, label: str, op: str, value: str) -> list[str]:
    """An equality (or a regex of plain alternatives) must name values the table lists for LABEL."""
    allowed = metric.labels.get(label)
    if allowed is None or "$" in value or op.startswith("!"):
        return []
    wanted = value.split("|") if op == "=~" else [value]
    if op == "=~" and not all(re.fullmatch(r"[\w.]+", w) for w in wanted):
        return []  # a real regex (5..): not a list of values
    return [f"{metric.name}{{{label}{op}{value!r}}}: {w!r} not among {sorted(allowed)}" for w in wanted
            if w not in allowed]


def promql_problems(expr: str, docs: dict[str, DocumentedMetric]) -> list[str]:
    """What EXPR reads that the README's table does not give: unknown metrics, labels a metric does not have, label
    values outside the listed ones. Empty when it only uses documented names."""
    problems: list[str] = []
    text = RANGE.sub("", expr)
    names: set[str] = set()
    for name, body in SELECTOR.findall(text):
        labels = MATCHER.findall(body)
        if not name:  # {__name__="..."} or a bare {...}: not used here
            problems.append(f"a selector without a metric name: {{{body}}}")
            continue
        allowed, metric = _allowed_labels(name, docs)
        names.add(name)
        for label, op, value in labels:
            if label not in allowed:
                problems.append(f"{name}: label {label!r} is not documented ({sorted(allowed)})")
            elif metric is not None:
                problems += _check_values(metric, label, op, value)
    text = SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    groupings = GROUPING.findall(text)
    text = GROUPING.sub(" ", text)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', " ", text)
    for ident in IDENT.findall(text):
        if ident in KEYWORDS or DURATION.match(ident):
            continue
        _allowed_labels(ident, docs)
        names.add(ident)
    assert names, f"no metric in {expr!r}"
    label_sets = [_allowed_labels(name, docs)[0] for name in names]
    common = set.intersection(*label_sets)
    for _, grouped in groupings:
        for label in (g.strip() for g in grouped.split(",") if g.strip()):
            if label not in common:
                problems.append(f"grouped by {label!r}, which not every one of {sorted(names)} has")
    return problems


def test_the_promql_check_catches_mistakes(docs: dict[str, DocumentedMetric]) -> None:
    assert promql_problems('sum by (namespace) (rate(sless_invocations_total{status="500"}[5m]))', docs) == []
    assert promql_problems("histogram_quantile(0.9, sum by (le) (rate(sless_build_duration_seconds_bucket[1m])))",
                           docs) == []  # fmt: skip
    assert promql_problems('sum by (tenant) (rate(sless_invocations_total[5m]))', docs)
    assert promql_problems('rate(sless_builds_total{result="failure"}[5m])', docs)
    assert promql_problems('sum by (le) (sless_invocations_total)', docs)
    assert promql_problems('sless_event_queue_messages{queue=~"queue|dead"}', docs)
    for unknown in ("rate(sless_invocations[5m])", "sless_invocation_duration_seconds > 1", "sless_nope_total"):
        with pytest.raises(AssertionError):
            promql_problems(unknown, docs)


# ---------------------------------------------------------------- off by default


def test_both_are_off_by_default() -> None:
    objects = render()
    assert not by_kind(objects, "PrometheusRule")
    assert DASHBOARD_CM not in {o["metadata"]["name"] for o in by_kind(objects, "ConfigMap")}


def test_the_rule_needs_metrics_on() -> None:
    objects = render({"metrics": {"enabled": False, "prometheusRule": {"enabled": True}}})
    assert not by_kind(objects, "PrometheusRule")


def test_lint_strict_passes_with_both_on() -> None:
    sets = ["--set-json", f"metrics={json.dumps(ON['metrics'])}"]
    proc = helm("lint", "--strict", str(CHART), "--kube-version", "1.34.4", *sets)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(("values", "message"), [
    ({"grafanaDashboard": {"enabled": "yes"}}, "got string, want boolean"),
    ({"grafanaDashboard": {"labelName": "grafana_dashboard"}}, "additional properties 'labelName' not allowed"),
    ({"grafanaDashboard": {"labelValue": 1}}, "got number, want string"),
    ({"prometheusRule": {"alerts": {"errorRate": {"threshold": 5}}}}, "maximum"),
    ({"prometheusRule": {"alerts": {"latency": {"for": "ten minutes"}}}}, "does not match pattern"),
    ({"prometheusRule": {"alerts": {"cpu": {}}}}, "additional properties 'cpu' not allowed"),
])  # fmt: skip
def test_schema_rejects_mistakes(values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmError) as err:
        render({"metrics": values})
    assert message in str(err.value)


# ---------------------------------------------------------------- the dashboard


def test_dashboard_configmap_is_labelled_for_the_sidecar(on: list[dict[str, Any]]) -> None:
    cm = one(on, "ConfigMap", DASHBOARD_CM)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["labels"]["app.kubernetes.io/part-of"] == "sless"
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert "annotations" not in cm["metadata"]
    assert _dashboard_of(on) == json.loads(DASHBOARD.read_text())


def test_dashboard_label_annotations_and_namespace_follow_values() -> None:
    objects = render({"metrics": {"grafanaDashboard": {
        "enabled": True, "label": "dashboards", "labelValue": "sless", "labels": {"team": "platform"},
        "annotations": {"grafana_folder": "Platform"}, "namespace": "monitoring"}}})  # fmt: skip
    cm = one(objects, "ConfigMap", DASHBOARD_CM)
    assert cm["metadata"]["labels"]["dashboards"] == "sless" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["team"] == "platform"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Platform"}
    assert cm["metadata"]["namespace"] == "monitoring"
    assert not by_kind(objects, "PrometheusRule")  # the dashboard alone needs no metrics.enabled


def test_dashboard_uses_a_datasource_variable_and_tenant_filters(on: list[dict[str, Any]]) -> None:
    dashboard = _dashboard_of(on)
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "function"):
        assert variables[name]["type"] == "query" and variables[name]["multi"] and variables[name]["includeAll"]
        assert variables[name]["definition"].startswith("label_values(")
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels(dashboard):
        assert panel["datasource"] == ds, panel["title"]
        assert panel["targets"] and all(t["datasource"] == ds for t in panel["targets"]), panel["title"]
        assert panel.get("description"), panel["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    per_function = [e for e in _dashboard_exprs(dashboard) if "sless_invocation" in e]
    assert per_function and all('namespace=~"$namespace"' in e and 'function=~"$function"' in e
                                for e in per_function)  # fmt: skip


def test_dashboard_has_no_external_links_or_images() -> None:
    text = DASHBOARD.read_text()
    assert not re.search(r"https?://|<img|<iframe|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.IGNORECASE)
    assert json.loads(text)["links"] == []


def test_dashboard_shows_every_subject(on: list[dict[str, Any]]) -> None:
    exprs = "\n".join(_dashboard_exprs(_dashboard_of(on)))
    for needle in ["rate(sless_invocations_total", 'status=~"5..|429"', "histogram_quantile(0.5,",
                   "histogram_quantile(0.95,", "histogram_quantile(0.99,", "sless_invocation_duration_seconds_bucket",
                   "sless_cold_starts_total", "sless_invocations_in_flight", "sless_throttled_total",
                   "kube_deployment_status_replicas", "sless_builds_total", "sless_compiles_total",
                   "sless_operator_reconcile_duration_seconds_bucket", "sless_operator_reconcile_errors_total",
                   "sless_operator_queue_depth", 'sless_event_queue_messages{namespace=~"$namespace", queue="queue"}',
                   "sless_event_dead_letters_total"]:  # fmt: skip
        assert needle in exprs, needle
    replicas = [p for p in _panels(_dashboard_of(on)) if "kube_deployment_status_replicas" in p["targets"][0]["expr"]]
    assert "optional" in replicas[0]["title"].lower() and "kube-state-metrics" in replicas[0]["description"]


def test_dashboard_reads_only_documented_metrics_and_labels(on: list[dict[str, Any]],
                                                            docs: dict[str, DocumentedMetric]) -> None:
    dashboard = _dashboard_of(on)
    problems = {e: p for e in _dashboard_exprs(dashboard) if (p := promql_problems(e, docs))}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"])
            assert found, variable["definition"]
            metric, label = found.groups()
            assert label in _allowed_labels(metric.split("{")[0], docs)[0], variable["definition"]
            if p := promql_problems(metric, docs):
                problems[variable["definition"]] = p
    assert problems == {}


# ---------------------------------------------------------------- the alerts


def test_rule_has_every_alert_with_for_severity_and_annotations(on: list[dict[str, Any]]) -> None:
    rules = _rules(on)
    assert {r["alert"] for r in rules} == ALERTS
    for rule in rules:
        assert DURATION.match(rule["for"]), rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
    assert _alert(on, "SlessOperatorDown")["labels"]["severity"] == "critical"
    assert one(on, "PrometheusRule", RULE)["metadata"]["namespace"] == NAMESPACE


def test_rule_reads_only_documented_metrics_and_labels(on: list[dict[str, Any]],
                                                       docs: dict[str, DocumentedMetric]) -> None:
    problems = {r["alert"]: p for r in _rules(on) if (p := promql_problems(r["expr"], docs))}
    assert problems == {}


def test_thresholds_durations_and_labels_come_from_values() -> None:
    alerts: dict[str, dict[str, Any]] = {
        "errorRate": {"threshold": 0.125, "for": "7m", "severity": "page"},
        "latency": {"thresholdSeconds": 2.5, "triggers": "http|async", "for": "11m", "severity": "ticket"},
        "deadLetters": {"window": "45m", "for": "2m", "severity": "info"},
        "buildsFailing": {"ratio": 0.75, "minFailures": 9, "window": "3h", "for": "20m", "severity": "ticket"},
        "operatorDown": {"job": "monitoring/custom-operator", "for": "3m", "severity": "page"},
        "reconcileErrors": {"threshold": 0.5, "for": "25m", "severity": "ticket"},
    }
    objects = render({"metrics": {"enabled": True, "prometheusRule": {
        "enabled": True, "additionalLabels": {"release": "prom"}, "alertLabels": {"team": "platform"},
        "alerts": alerts}}})  # fmt: skip
    assert one(objects, "PrometheusRule", RULE)["metadata"]["labels"]["release"] == "prom"
    names = {"errorRate": "SlessFunctionErrorRate", "latency": "SlessFunctionLatencyHigh",
             "deadLetters": "SlessEventDeadLetters", "buildsFailing": "SlessBuildsFailing",
             "operatorDown": "SlessOperatorDown", "reconcileErrors": "SlessOperatorReconcileErrors"}
    for key, settings in alerts.items():
        rule = _alert(objects, names[key])
        assert rule["for"] == settings["for"] and rule["labels"] == {"severity": settings["severity"],
                                                                     "team": "platform"}  # fmt: skip
    expr = {name: _alert(objects, name)["expr"] for name in names.values()}
    assert re.search(r"\)\s*> 0\.125$", expr["SlessFunctionErrorRate"])
    assert re.search(r"\)\s*> 2\.5$", expr["SlessFunctionLatencyHigh"])
    assert 'trigger=~"http|async"' in expr["SlessFunctionLatencyHigh"]
    assert "[45m]" in expr["SlessEventDeadLetters"] and "offset 45m" in expr["SlessEventDeadLetters"]
    assert "> 0.75" in expr["SlessBuildsFailing"] and ">= 9" in expr["SlessBuildsFailing"]
    assert "[3h]" in expr["SlessBuildsFailing"]
    assert expr["SlessOperatorDown"] == 'absent(up{job="monitoring/custom-operator"} == 1)'
    assert expr["SlessOperatorReconcileErrors"].endswith("> 0.5")


def test_defaults_are_the_documented_ones(on: list[dict[str, Any]]) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["metrics"]["prometheusRule"]["alerts"]
    assert values["errorRate"]["threshold"] == 0.05
    assert _alert(on, "SlessFunctionErrorRate")["expr"].endswith("> 0.05")
    assert _alert(on, "SlessFunctionLatencyHigh")["expr"].endswith(f"> {values['latency']['thresholdSeconds']}")
    assert "[15m]" in _alert(on, "SlessEventDeadLetters")["expr"]


@pytest.mark.parametrize("fullname", ["", "fx"])
def test_operator_down_watches_the_job_of_the_operators_pod_monitor(fullname: str) -> None:
    """The Prometheus Operator names a PodMonitor's scrape job <its namespace>/<its name> (no jobLabel set)."""
    objects = render({**ON, "fullnameOverride": fullname})
    monitor = one(objects, "PodMonitor", f"{fullname or 'sless'}-operator")
    assert "jobLabel" not in monitor["spec"]
    job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    alert = _alert(objects, "SlessOperatorDown", f"{fullname or 'sless'}-alerts")
    assert alert["expr"] == f'absent(up{{job="{job}"}} == 1)'


# ---------------------------------------------------------------- promtool


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); the rules were not checked by it")
    return found


def _write_groups(objects: list[dict[str, Any]], path: Path) -> None:
    path.write_text(yaml.safe_dump({"groups": one(objects, "PrometheusRule", RULE)["spec"]["groups"]}))


def test_promtool_accepts_the_rules(on: list[dict[str, Any]], tmp_path: Path) -> None:
    promtool = _promtool()
    _write_groups(on, tmp_path / "rules.yaml")
    proc = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in proc.stdout


def test_the_alerts_fire_on_series_that_should_fire_them(on: list[dict[str, Any]], tmp_path: Path) -> None:
    """promtool test rules: a failing function, a slow one, a trigger's very first dead letters (a counter that
    starts at 1: increase() alone misses it), failing builds, reconcile errors and an operator that stops; and
    none of them for a healthy function."""
    promtool = _promtool()
    _write_groups(on, tmp_path / "rules.yaml")
    ns, job = "sless-0123456789abcdef", f"{NAMESPACE}/sless-operator"
    inv = "sless_invocations_total{{namespace='{ns}',function='{fn}',trigger='http',status='{status}'}}"
    bucket = ("sless_invocation_duration_seconds_bucket{{namespace='{ns}',function='{fn}',trigger='http',"
              "status_class='2xx',le='{le}'}}")
    series = [
        {"series": inv.format(ns=ns, fn="bad", status="200"), "values": "0+60x30"},
        {"series": inv.format(ns=ns, fn="bad", status="502"), "values": "0+30x30"},
        {"series": inv.format(ns=ns, fn="good", status="200"), "values": "0+60x30"},
        {"series": bucket.format(ns=ns, fn="slow", le="1"), "values": "0+1x30"},
        {"series": bucket.format(ns=ns, fn="slow", le="5"), "values": "0+60x30"},
        {"series": bucket.format(ns=ns, fn="slow", le="+Inf"), "values": "0+60x30"},
        {"series": bucket.format(ns=ns, fn="good", le="1"), "values": "0+60x30"},
        {"series": bucket.format(ns=ns, fn="good", le="5"), "values": "0+60x30"},
        {"series": bucket.format(ns=ns, fn="good", le="+Inf"), "values": "0+60x30"},
        {"series": f"sless_event_dead_letters_total{{namespace='{ns}',trigger='orders',kind='failed'}}",
         "values": "_x20 1x10"},
        {"series": "sless_builds_total{runtime='python3.11',result='failed'}", "values": "0+1x30"},
        {"series": "sless_builds_total{runtime='python3.11',result='ready'}", "values": "0x30"},
        {"series": "sless_operator_reconcile_errors_total{kind='function'}", "values": "0+60x30"},
        {"series": f"up{{job='{job}',pod='sless-operator-0'}}", "values": "1x10 0x20"},
    ]
    labels = {"severity": "warning"}

    def fired(alert: str, at: str, annotations: tuple[str, str] | None, **extra: str) -> dict[str, Any]:
        expected = [] if annotations is None else [{
            "exp_labels": {**labels, **extra}, "exp_annotations": dict(zip(("summary", "description"), annotations,
                                                                           strict=True))}]  # fmt: skip
        return {"eval_time": at, "alertname": alert, "exp_alerts": expected}

    checks = [
        fired("SlessFunctionErrorRate", "25m", (
            f"Function {ns}/bad answers 5xx to many calls",
            f"33.33% of the calls of bad in {ns} answered 5xx over the last 5 minutes (threshold 0.05)."),
            namespace=ns, function="bad"),
        fired("SlessFunctionLatencyHigh", "25m", (
            f"Function {ns}/slow is slow",
            f"The 95th percentile of the http calls of slow in {ns} is 4.797s over the last 5 minutes (threshold 1s)."),
            namespace=ns, function="slow"),
        fired("SlessEventDeadLetters", "19m", None),
        fired("SlessEventDeadLetters", "22m", (
            f"Event trigger {ns}/orders dead-letters messages",
            f"Messages of the event trigger orders in {ns} were moved to its dead-letter queue within the last 15m "
            "(failed, rejected or malformed: sless_event_dead_letters_total by kind)."),
            namespace=ns, trigger="orders"),
        fired("SlessBuildsFailing", "25m", (
            "Builds of python3.11 functions fail",
            "100% of the builds of python3.11 functions within the last 1h failed (threshold 0.5, at least 3 "
            "failures)."), runtime="python3.11"),
        fired("SlessOperatorReconcileErrors", "25m", (
            "The sless operator fails to reconcile function resources",
            "The operator's reconciles of kind function fail 1 times a second (threshold 0.05/s); they are retried, "
            "or the resource's status says why."), kind="function"),
        fired("SlessOperatorDown", "9m", None),
        fired("SlessOperatorDown", "20m", (
            "The sless operator is down",
            f"No target of the scrape job {job} is up: functions, triggers and jobs are not reconciled (no builds, no "
            "rollouts, no scaling changes)."), severity="critical"),
    ]
    tests = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "alert_rule_test": checks}]}
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", "tests.yaml"], capture_output=True, text=True, timeout=60,
                          check=False, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
