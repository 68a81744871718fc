"""The route table of the Kubernetes backend, fed with watch events as the API server sends them."""

from __future__ import annotations

from typing import Any

from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS, RouteTable
from sless_api.domain.httppolicy import route_auth
from sless_api.domain.routing import Route
from sless_core.traffic import other_version_name
from tests.support.kube_objects import NS, OTHER, fn, trg


def test_routable_only_when_ready_and_an_http_trigger_is_enabled() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a", phase=None))
    assert table.lookup(NS, "a") is None
    assert "not ready (phase Pending)" in table.explain(NS, "a")
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    assert table.lookup(NS, "a") is None
    table.apply(FUNCTIONS, "MODIFIED", fn("a", timeout=90))
    assert table.lookup(NS, "a") == Route(NS, "a", 90.0, "public")
    table.apply(TRIGGERS, "MODIFIED", trg("web", "a", enabled=False))
    assert table.lookup(NS, "a") is None
    assert "no enabled http trigger" in table.explain(NS, "a")
    table.apply(TRIGGERS, "MODIFIED", trg("web", "a"))
    table.apply(FUNCTIONS, "DELETED", fn("a"))
    assert table.lookup(NS, "a") is None
    assert "not found" in table.explain(NS, "a")


def test_cron_and_event_triggers_do_not_route() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    table.apply(TRIGGERS, "ADDED", trg("c", "a", kind="cron"))
    table.apply(TRIGGERS, "ADDED", trg("e", "a", kind="event"))
    assert table.lookup(NS, "a") is None


def test_a_rebuild_keeps_serving_the_deployed_version() -> None:
    table = RouteTable()
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    table.apply(FUNCTIONS, "ADDED", fn("a", phase="Building"))  # first build: nothing deployed yet
    assert table.lookup(NS, "a") is None
    table.apply(FUNCTIONS, "MODIFIED", fn("a", phase="Building", image="reg/a:1"))
    assert table.lookup(NS, "a") is not None
    table.apply(FUNCTIONS, "MODIFIED", fn("a", phase="Failed", image="reg/a:1"))
    assert table.lookup(NS, "a") is not None
    table.apply(FUNCTIONS, "MODIFIED", fn("a", phase="Failed"))
    assert table.lookup(NS, "a") is None


def test_a_url_needs_a_token_when_any_enabled_trigger_says_so() -> None:
    """Two http triggers of one function (written as custom resources; the API refuses the second): the stricter
    wins. A public one once opened the URL that the other said needs a token."""
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    table.apply(TRIGGERS, "ADDED", trg("private", "a", auth="token"))
    assert table.lookup(NS, "a") == Route(NS, "a", 30.0, "token")
    table.apply(TRIGGERS, "ADDED", trg("public", "a"))
    assert table.lookup(NS, "a") == Route(NS, "a", 30.0, "token")
    table.apply(TRIGGERS, "MODIFIED", trg("private", "a", auth="token", enabled=False))
    assert table.lookup(NS, "a") == Route(NS, "a", 30.0, "public")
    table.apply(TRIGGERS, "MODIFIED", trg("private", "a", auth="token"))
    table.apply(TRIGGERS, "DELETED", trg("public", "a"))
    assert table.lookup(NS, "a") == Route(NS, "a", 30.0, "token")


def test_a_triggers_methods_and_cors_reach_the_route() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    web = trg("web", "a")
    web["spec"] |= {"methods": ["POST"], "cors": {"origins": ["https://app.example.com"]}}
    table.apply(TRIGGERS, "ADDED", web)
    route = table.lookup(NS, "a")
    assert route is not None and route.policy is not None
    assert route.policy.allows("POST") and not route.policy.allows("GET")
    assert route.policy.cors is not None and route.policy.cors.allowed_origin("https://app.example.com")
    table.apply(TRIGGERS, "MODIFIED", trg("web", "a"))
    assert table.lookup(NS, "a") == Route(NS, "a", 30.0, "public")  # no rules: no policy to check per call


def test_route_auth_is_public_only_when_every_trigger_is() -> None:
    assert route_auth(["public"]) == route_auth(["public", "public"]) == "public"
    assert route_auth(["public", "token"]) == route_auth(["token", "public"]) == route_auth(["token"]) == "token"
    assert route_auth([]) == "token"  # deny by default (no trigger: no route at all)


def test_a_trigger_moved_to_another_function_moves_the_route() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    table.apply(FUNCTIONS, "ADDED", fn("b"))
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    assert set(table.routes()) == {(NS, "a")}
    table.apply(TRIGGERS, "MODIFIED", trg("web", "b"))
    assert set(table.routes()) == {(NS, "b")}


def test_namespaces_are_separate() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    table.apply(TRIGGERS, "ADDED", trg("web", "a", ns=OTHER))  # same names, other tenant
    assert table.lookup(NS, "a") is None
    assert table.lookup(OTHER, "a") is None


def test_relist_replaces_only_its_scope() -> None:
    table = RouteTable()
    for ns in (NS, OTHER):
        table.apply(FUNCTIONS, "ADDED", fn("a", ns=ns))
        table.apply(FUNCTIONS, "ADDED", fn("gone", ns=ns))
        table.apply(TRIGGERS, "ADDED", trg("web", "a", ns=ns))
        table.apply(TRIGGERS, "ADDED", trg("web2", "gone", ns=ns))
    assert len(table.routes()) == 4
    # a relist of NS's functions after a missed DELETED event: "gone" vanished in NS only
    table.replace(FUNCTIONS, [fn("a")], namespace=NS)
    assert set(table.routes()) == {(NS, "a"), (OTHER, "a"), (OTHER, "gone")}
    # a cluster-wide relist of triggers
    table.replace(TRIGGERS, [trg("web", "a", ns=OTHER)])
    assert set(table.routes()) == {(OTHER, "a")}


def test_objects_without_identity_are_ignored() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", {"metadata": {}, "spec": {}})
    table.replace(TRIGGERS, [{"spec": {"type": "http", "function": "a"}}])
    assert table.routes() == {}


def test_objects_the_codec_refuses_route_nothing_and_say_why() -> None:
    table = RouteTable()
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    assert table.lookup(NS, "a") is not None
    # edited with kubectl past what the platform accepts: the old Ready status no longer routes
    broken = fn("a")
    broken["spec"]["envVars"] = {"PORT": "1"}
    table.apply(FUNCTIONS, "MODIFIED", broken)
    assert table.lookup(NS, "a") is None
    assert table.explain(NS, "a") == ("function 'a' is invalid: spec.envVars: environment variable 'PORT' is reserved "
                                      "by the platform")
    table.apply(FUNCTIONS, "MODIFIED", fn("a"))
    assert table.lookup(NS, "a") is not None
    # a trigger turned invalid stops routing, as if deleted; valid again, it routes again
    table.apply(TRIGGERS, "MODIFIED", {**trg("web", "a"), "spec": {"type": "http", "function": "a", "auth": "x"}})
    assert table.lookup(NS, "a") is None
    table.apply(TRIGGERS, "MODIFIED", trg("web", "a"))
    assert table.lookup(NS, "a") is not None
    table.apply(TRIGGERS, "MODIFIED", {"metadata": {"name": "web", "namespace": NS}})  # no spec at all
    assert table.lookup(NS, "a") is None


def versioned(traffic: list[dict[str, int]] | None, split: dict[str, Any] | None, versions: tuple[int, ...] = (1, 2),
              timeouts: dict[int, int] | None = None) -> dict[str, Any]:
    """A Ready function with kept VERSIONS (the newest current), spec.traffic and status.split as given."""
    obj = fn("a")
    entry_spec = {"runtime": "python3.11", "timeoutSec": 30}
    obj["status"]["versions"] = [{"version": v, "codeHash": "0" * 64,
                                  "spec": {**entry_spec, "timeoutSec": (timeouts or {}).get(v, 30)}} for v in versions]
    if traffic is not None:
        obj["spec"]["traffic"] = traffic
    if split is not None:
        obj["status"]["split"] = split
    return obj


def test_a_split_routes_by_weight_once_the_operator_reports_its_other_version_ready() -> None:
    table = RouteTable()
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    half = [{"version": 2, "weight": 50}, {"version": 1, "weight": 50}]
    table.apply(FUNCTIONS, "ADDED", versioned(None, None))
    plain = table.lookup(NS, "a")
    assert plain is not None and plain.version == 2 and plain.split is None and plain.served() is plain
    for waiting in (None, {"version": 1, "ready": False}, {"version": 3, "ready": True}, {"version": 1}):
        table.apply(FUNCTIONS, "MODIFIED", versioned(half, waiting))
        route = table.lookup(NS, "a")
        assert route is not None and route.split is None and route.version == 2
    table.apply(FUNCTIONS, "MODIFIED", versioned(half, {"version": 1, "ready": True}, timeouts={1: 12}))
    route = table.lookup(NS, "a")
    assert route is not None
    picked = [route.served() for _ in range(4)]
    assert [(r.version, r.target, r.timeout_sec) for r in picked] == [
        (2, "", 30.0), (1, other_version_name("a"), 12.0), (2, "", 30.0), (1, other_version_name("a"), 12.0)]


def test_a_split_without_the_current_version_or_a_kept_other_routes_to_the_current_one() -> None:
    table = RouteTable()
    table.apply(TRIGGERS, "ADDED", trg("web", "a"))
    ready = {"version": 1, "ready": True}
    # a newer version became current: the split (set for version 2) no longer applies
    table.apply(FUNCTIONS, "ADDED", versioned([{"version": 2, "weight": 50}, {"version": 1, "weight": 50}], ready,
                                              versions=(1, 2, 3)))
    route = table.lookup(NS, "a")
    assert route is not None and route.split is None and route.version == 3
    # the other version is no longer kept
    table.apply(FUNCTIONS, "MODIFIED", versioned([{"version": 3, "weight": 50}, {"version": 1, "weight": 50}], ready,
                                                 versions=(2, 3)))
    route = table.lookup(NS, "a")
    assert route is not None and route.split is None
    # a malformed spec.traffic makes the object invalid: it routes nothing
    table.apply(FUNCTIONS, "MODIFIED", versioned([{"version": 2, "weight": 70}], ready))
    assert table.lookup(NS, "a") is None and "spec.traffic" in table.explain(NS, "a")
