"""An http trigger's methods and CORS settings: their validation, and what the proxy answers from them."""

from __future__ import annotations

from typing import Any

import pytest

from sless_api.domain.httppolicy import route_policy
from sless_core.errors import ValidationError
from sless_core.models import TriggerSpec

BASE = {"name": "web", "type": "http", "function": "f"}
APP = "https://app.example.com"


def spec(**fields: Any) -> TriggerSpec:
    return TriggerSpec.from_user({**BASE, **fields})


def test_methods_are_normalised_and_cors_gets_its_defaults() -> None:
    made = spec(methods=["post", "GET"], cors={"origins": [APP]})
    assert made.methods == ["GET", "POST"]
    assert made.cors == {"origins": [APP], "methods": ["GET", "HEAD", "POST"], "headers": [], "credentials": False,
                         "max_age": 600}


@pytest.mark.parametrize(("fields", "field"), [
    ({"methods": []}, "methods"),
    ({"methods": ["GET", "get"]}, "methods"),
    ({"methods": ["TRACE"]}, "methods"),
    ({"methods": "GET"}, "methods"),
    ({"cors": {"origins": []}}, "cors.origins"),
    ({"cors": {"origins": ["app.example.com"]}}, "cors.origins"),
    ({"cors": {"origins": ["https://app.example.com/path"]}}, "cors.origins"),
    ({"cors": {"origins": ["https://*.example.com"]}}, "cors.origins"),
    ({"cors": {"origins": ["*"], "credentials": True}}, "cors.credentials"),
    ({"cors": {"origins": [APP], "max_age": 86401}}, "cors.max_age"),
    ({"cors": {"origins": [APP], "max_age": True}}, "cors.max_age"),
    ({"cors": {"origins": [APP], "headers": ["x y"]}}, "cors.headers"),
    ({"cors": {"origins": [APP], "expose": []}}, "cors.expose"),
    ({"cors": ["*"]}, "cors"),
])  # fmt: skip
def test_bad_settings_name_their_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(**fields)
    assert err.value.field == field


@pytest.mark.parametrize("kind", [{"type": "cron", "schedule": "* * * * *"}, {"type": "event", "queue": "q"}])
def test_methods_and_cors_are_for_http_triggers_only(kind: dict[str, str]) -> None:
    for fields in ({"methods": ["GET"]}, {"cors": {"origins": [APP]}}):
        with pytest.raises(ValidationError, match="only to http triggers"):
            TriggerSpec.from_user({**BASE, **kind, **fields})


def test_no_rule_is_no_policy_and_several_triggers_give_the_strictest() -> None:
    assert route_policy([(None, None)]) is None
    policy = route_policy([(["GET", "POST"], None), (["POST", "PUT"], None)])
    assert policy is not None and policy.allows("POST") and not policy.allows("GET") and not policy.allows("PUT")
    assert policy.allow_header() == "POST"
    cors = spec(cors={"origins": [APP]}).cors
    assert route_policy([(None, cors), (None, None)]) is None  # they disagree: no CORS at all
    agreed = route_policy([(None, cors), (None, cors)])
    assert agreed is not None and agreed.cors is not None


def test_preflight_and_answer_headers() -> None:
    cors = route_policy([(None, spec(cors={"origins": [APP], "methods": ["GET", "PUT"], "headers": ["X-Token"],
                                           "credentials": True, "max_age": 60}).cors)]).cors  # type: ignore[union-attr]
    assert cors is not None
    assert dict(cors.preflight(APP, "PUT", "x-token") or []) == {
        "access-control-allow-origin": APP, "vary": "Origin", "access-control-allow-credentials": "true",
        "access-control-allow-methods": "GET, PUT", "access-control-allow-headers": "x-token",
        "access-control-max-age": "60"}
    assert cors.preflight("https://evil.example", "PUT", "") is None
    assert cors.preflight(APP, "DELETE", "") is None
    assert cors.preflight(APP, "PUT", "x-token, x-other") is None
    assert cors.answer_headers("https://evil.example") == []
    anyone = route_policy([(None, spec(cors={"origins": ["*"]}).cors)]).cors  # type: ignore[union-attr]
    assert anyone is not None and anyone.answer_headers("https://x.example") == [("access-control-allow-origin", "*")]
