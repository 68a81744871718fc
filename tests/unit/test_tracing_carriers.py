"""The shared tracing plumbing while tracing is off: nothing is written, nothing is current."""

from __future__ import annotations

from sless_api.backends.kube.resources import with_traceparent
from sless_core import crd, tracing


def test_off_there_is_no_context_to_write() -> None:
    assert not tracing.enabled()
    assert tracing.current_traceparent() == ""
    with tracing.span_if_enabled("deploy ns/fn", "server", {"traceparent": "00-x-y-01"}) as current:
        assert current is None


def test_the_annotation_is_written_only_with_a_context() -> None:
    manifest = {"metadata": {"name": "fn", "annotations": {"keep": "me"}}}
    assert with_traceparent(manifest, "") == {"metadata": {"name": "fn", "annotations": {"keep": "me"}}}
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    patch = with_traceparent({"spec": {}}, tp)
    assert patch == {"spec": {}, "metadata": {"annotations": {crd.ANNOTATION_TRACEPARENT: tp}}}
    assert with_traceparent(manifest, tp)["metadata"]["annotations"] == {"keep": "me", crd.ANNOTATION_TRACEPARENT: tp}


def test_a_carrier_without_a_traceparent_names_no_parent() -> None:
    assert tracing.extract({"tracestate": "a=b"}) is None
