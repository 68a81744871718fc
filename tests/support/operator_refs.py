"""The operator's view of one Function (a :class:`FunctionRef`), for tests of the manifests it renders.

Shared by test_operator_manifests.py and test_build_push.py, so both render from the same function.
"""

from __future__ import annotations

from typing import Any

from sless_core import crd
from sless_core.models import FunctionSpec
from sless_operator.manifests import FunctionRef, Owner

NS = "sless-0123456789abcdef"
HASH = "ab" * 32


def fn_ref(runtime: str = "python3.11", **spec: Any) -> FunctionRef:
    """The function "hello" in NS with code HASH; SPEC overrides fields of its FunctionSpec."""
    entry = "Handle" if runtime == "go1.23" else "handler.handle"
    fields: dict[str, Any] = {"name": "hello", "runtime": runtime, "entrypoint": entry, **spec}
    return FunctionRef(
        namespace=NS,
        name="hello",
        spec=FunctionSpec(**fields),
        code_hash=HASH,
        context_key=f"contexts/{NS}/hello/1.tar.gz",
        owner=Owner(crd.API_VERSION, "Function", "hello", "uid-1"),
    )
