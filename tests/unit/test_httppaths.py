"""An http trigger's path pattern: what is a valid one, which trigger serves a path, and with which parameters."""

from __future__ import annotations

import json

import pytest

from sless_api.backends.kube.routes import FUNCTIONS, TRIGGERS, RouteTable, trigger_view
from sless_api.domain.httppaths import DotSegment, HttpRule, path_table, route_rules
from sless_api.domain.routing import Route
from sless_core.errors import ValidationError
from sless_core.httproutes import path_shape, validate_path
from sless_core.models import TriggerSpec
from tests.support.kube_objects import NS, fn, trg


@pytest.mark.parametrize("path", ["/", "/users", "/users/{id}", "/a/{x}/b/{y_2}", "/v1.2/~me_-x",
                                  "/" + "/".join(["s"] * 16)])
def test_valid_patterns(path: str) -> None:
    assert validate_path(path) == path


@pytest.mark.parametrize("path", ["", "users", "/users/", "//users", "/users//x", "/a/./b", "/..", "/%2e%2e",
                                  "/a b", "/{Id}", "/{1d}", "/{id", "/x{id}", "/{id}/{id}", "/{}", "/é",
                                  "/" + "/".join(["s"] * 17), "/" + "a" * 101, 7, None, ["/a"]])
def test_invalid_patterns_are_refused_with_the_field(path: object) -> None:
    with pytest.raises(ValidationError) as refused:
        validate_path(path)
    assert refused.value.field == "path"


def test_path_belongs_to_http_triggers_and_is_unset_by_a_null_patch() -> None:
    spec = TriggerSpec.from_user({"name": "t", "type": "http", "function": "f", "path": "/users/{id}"})
    assert spec.path == "/users/{id}" and spec.to_dict()["path"] == "/users/{id}"
    assert spec.patched({"path": None}).path is None
    with pytest.raises(ValidationError, match="path applies only to http"):
        TriggerSpec.from_user({"name": "t", "type": "cron", "function": "f", "schedule": "* * * * *", "path": "/x"})


def test_shapes_ignore_parameter_names() -> None:
    assert path_shape("/users/{id}") == path_shape("/users/{name}") == ("users", None)
    assert path_shape("/users/me") != path_shape("/users/{id}")
    assert path_shape(None) is None and path_shape("/") == ()


def test_a_literal_wins_over_a_parameter_and_parameters_are_decoded() -> None:
    table = path_table([HttpRule("/users/{id}", "public"), HttpRule("/users/me", "token"),
                        HttpRule("/{kind}/{id}/{part}", "public"), HttpRule("/", "public")])
    assert table is not None and not table.fallback
    me = table.match("/users/me")
    assert me is not None and me.auth == "token" and json.loads(me.params) == {}
    one = table.match("/users/caf%C3%A9")
    assert one is not None and one.auth == "public" and json.loads(one.params) == {"id": "café"}
    assert one.params.isascii()  # a header's value
    deep = table.match("/users/7/avatar/")
    assert deep is not None and json.loads(deep.params) == {"kind": "users", "id": "7", "part": "avatar"}
    assert table.match("/") is not None and table.match("") is not None
    assert table.match("/users") is None and table.match("/users//x") is None


def test_an_odd_spelling_reaches_the_pattern_it_spells() -> None:
    """Decoded before matching: /%75sers/1 is /users/1, never the fallback's looser auth."""
    table = path_table([HttpRule("/users/{id}", "token"), HttpRule(None, "public")])
    assert table is not None and table.fallback
    spelled = table.match("/%75sers/1")
    assert spelled is not None and spelled.auth == "token"
    for dotted in ("/x/../users/1", "/users/%2e%2E/1", "/./users/1", "/users/1/."):
        with pytest.raises(DotSegment):
            table.match(dotted)


def test_route_at_a_path_takes_its_triggers_auth_and_policy() -> None:
    auth, policy, paths = route_rules([HttpRule(None, "public"),
                                       HttpRule("/admin/{op}", "token", ["POST"], None)])
    route = Route("t-a", "f", 30.0, auth, policy=policy, paths=paths)
    admin = route.at("/admin/reset")
    assert admin is not None
    assert admin[0].auth == "token" and admin[0].policy is not None and not admin[0].policy.allows("GET")
    assert json.loads(admin[1] or "") == {"op": "reset"}
    assert route.at("/anything/else") == (route, None)  # the trigger without a path serves the rest
    auth, policy, paths = route_rules([HttpRule("/admin/{op}", "token")])
    only = Route("t-a", "f", 30.0, auth, policy=policy, paths=paths)
    assert only.at("/anything") is None and only.auth == "token"
    auth, policy, paths = route_rules([HttpRule(None, "public")])
    plain = Route("t-a", "f", 30.0, auth, policy=policy, paths=paths)
    assert plain.paths is None and plain.at("/x/../y") == (plain, None)  # no patterns: the path is the function's


def test_same_shapes_written_directly_share_the_strictest_rule() -> None:
    """Custom resources are not checked by the API: two triggers of one shape get the stricter auth and the
    methods both allow, whichever is listed first."""
    for rules in ([HttpRule("/u/{id}", "public", ["GET", "POST"]), HttpRule("/u/{name}", "token", ["GET"])],
                  [HttpRule("/u/{name}", "token", ["GET"]), HttpRule("/u/{id}", "public", ["GET", "POST"])]):
        table = path_table(rules)
        assert table is not None and len(table.rules) == 1
        found = table.match("/u/1")
        assert found is not None and found.auth == "token"
        assert found.policy is not None and not found.policy.allows("POST")


def test_the_kube_route_table_reads_a_triggers_path() -> None:
    view = trigger_view({"apiVersion": "sless.dev/v1alpha1", "kind": "Trigger",
                         "metadata": {"name": "t", "namespace": "t-a"},
                         "spec": {"type": "http", "function": "f", "path": "/users/{id}"}})
    assert view is not None and view.path == "/users/{id}"
    bad = trigger_view({"apiVersion": "sless.dev/v1alpha1", "kind": "Trigger",
                        "metadata": {"name": "t", "namespace": "t-a"},
                        "spec": {"type": "http", "function": "f", "path": "/../x"}})
    assert bad is None  # refused by the codec: it routes nothing


def test_the_kube_route_table_serves_each_pattern_with_its_triggers_rules() -> None:
    table = RouteTable()
    table.apply(FUNCTIONS, "ADDED", fn("a"))
    table.apply(TRIGGERS, "ADDED", trg("orders", "a", auth="token", path="/orders/{id}"))
    route = table.lookup(NS, "a")
    assert route is not None and route.paths is not None and route.at("/") is None  # no trigger for the rest
    found = route.at("/orders/7")
    assert found is not None and found[0].auth == "token" and json.loads(found[1] or "") == {"id": "7"}
    table.apply(TRIGGERS, "ADDED", trg("rest", "a"))
    route = table.lookup(NS, "a")
    assert route is not None and route.auth == "public" and route.at("/x") == (route, None)
    orders = route.at("/orders/7")
    assert orders is not None and orders[0].auth == "token"
    table.apply(TRIGGERS, "DELETED", trg("orders", "a", auth="token", path="/orders/{id}"))
    route = table.lookup(NS, "a")
    assert route is not None and route.paths is None
