"""The OpenAPI document and the router table describe the same API."""

from __future__ import annotations

from typing import Any

from sless_api.rest.http import PublicResource
from sless_api.rest.openapi import UNDOCUMENTED_ROUTES, document
from tests.support.attack import rest_routes


def documented() -> dict[str, Any]:
    paths: dict[str, Any] = document()["paths"]
    return paths


def test_every_route_is_documented_with_its_methods() -> None:
    paths = documented()
    routed = {e.template: e for e in rest_routes() if e.template not in UNDOCUMENTED_ROUTES}
    assert set(paths) == set(routed)
    for template, entry in routed.items():
        methods = {m for m in paths[template] if m != "parameters"}
        assert methods == {m.lower() for m in entry.methods}, template


def test_public_routes_are_the_documented_public_ones() -> None:
    paths = documented()
    for entry in rest_routes():
        if entry.template in UNDOCUMENTED_ROUTES:
            continue
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
