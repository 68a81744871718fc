"""The OpenAPI document and the router table describe the same API."""

from __future__ import annotations

from typing import Any

from sless_api.rest.http import PublicResource
from sless_api.rest.openapi import document
from sless_api.rest.openapi_gateway import FN_METHODS, FN_PATHS
from tests.support.attack import rest_routes


def documented() -> dict[str, Any]:
    paths: dict[str, Any] = document()["paths"]
    return paths


def test_every_route_is_documented_with_its_methods() -> None:
    paths = documented()
    routed = {e.template: e for e in rest_routes()}
    assert set(paths) - set(FN_PATHS) == set(routed)
    for template, entry in routed.items():
        methods = {m for m in paths[template] if m != "parameters"}
        assert methods == {m.lower() for m in entry.methods}, template


def test_public_routes_are_the_documented_public_ones() -> None:
    paths = documented()
    for entry in rest_routes():
        for method in entry.methods:
            security = paths[entry.template][method.lower()].get("security", [{"bearer": []}])
            public = not any("bearer" in requirement for requirement in security)
            assert public == isinstance(entry.resource, PublicResource), (entry.template, method)


def test_every_referenced_response_and_schema_exists() -> None:
    doc = document()
    refs: list[str] = []
    stack: list[Any] = [doc]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "$ref" in item:
                refs.append(item["$ref"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    assert refs
    for ref in refs:
        _, section, kind, name = ref.split("/")
        assert name in doc[section][kind], ref


def test_a_functions_calls_are_documented_with_the_platforms_answers() -> None:
    """Calls through /fn: every method, the async 202 and the refusals the platform makes (bug 11)."""
    paths = documented()
    for path in FN_PATHS:
        assert set(paths[path]) - {"parameters"} == set(FN_METHODS), path
        for method in FN_METHODS:
            operation = paths[path][method]
            codes = set(operation["responses"])
            assert {"default", "202", "401", "403", "404", "413", "429", "502", "503", "504"} <= codes, (path, method)
            assert "Retry-After" in operation["responses"]["429"]["headers"]
            assert {} in operation["security"] and {"bearer": []} in operation["security"]
            assert {p["name"] for p in operation["parameters"]} >= {"Prefer", "X-Sless-Async", "x-request-id"}
    assert paths["/console"]["get"]["security"] == []
