"""Names that become paths, keys and object names: full matches only, for every caller (admins too)."""

from __future__ import annotations

import pytest

from sless_core.errors import ValidationError
from sless_core.models import ENV_NAME, GO_ENTRY, PY_ENTRY, QUEUE_NAME
from sless_core.naming import (
    is_function_name,
    is_tenant_namespace,
    tenant_namespace,
    validate_name,
    validate_namespace,
)

GOOD_NS = tenant_namespace("alice")


@pytest.mark.parametrize("name", ["hello\n", "hello\r\n", "a" * 41, "-a", "a-", "A", "a_b", "a.b", "", "a/b",
                                  "..", "a\x00"])
def test_function_names_are_full_matches(name: str) -> None:
    assert not is_function_name(name)
    with pytest.raises(ValidationError):
        validate_name(name)


@pytest.mark.parametrize("ns", [GOOD_NS + "\n", "default", "kube-system", "sless-system", "functions", "logs",
                                "..", "sless-" + "0" * 15, "sless-" + "A" * 16, "sless-" + "0" * 17,
                                "sless-" + "g" * 16, "", " " + GOOD_NS, None, 7])
def test_only_tenant_namespaces_are_namespaces(ns: object) -> None:
    assert not is_tenant_namespace(ns)
    with pytest.raises(ValidationError) as err:
        validate_namespace(ns)
    assert err.value.field == "namespace"


def test_a_tenant_namespace_is_accepted() -> None:
    assert is_tenant_namespace(GOOD_NS)
    assert validate_namespace(GOOD_NS) == GOOD_NS
    assert is_function_name("hello-1")


@pytest.mark.parametrize("pattern, value", [(ENV_NAME, "FOO\n"), (PY_ENTRY, "handler.handle\n"),
                                            (GO_ENTRY, "Handle\n"), (QUEUE_NAME, "orders\n")])
def test_model_patterns_refuse_a_trailing_newline(pattern: object, value: str) -> None:
    assert pattern.match(value) is None  # type: ignore[attr-defined]
