"""The committed gRPC code of the scaler is what the pinned generators write from the committed protos.

A change of a ``.proto``, of grpcio-tools or of mypy-protobuf without regenerating (``python -m
sless_api.services.scaling.proto.generate``) fails here, naming the files that differ.
"""

from __future__ import annotations

from pathlib import Path

from sless_api.services.scaling.proto import generate


def test_the_committed_stubs_are_what_the_generators_write(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written != generate.HERE
    stale = [name for name in generate.generated_names()
             if (written / name).read_text() != (generate.HERE / name).read_text()]
    assert not stale, f"regenerate them (python -m sless_api.services.scaling.proto.generate): {stale}"


def test_the_keda_proto_is_kedas_service() -> None:
    from sless_api.services.scaling.proto import externalscaler_pb2, loadreports_pb2

    service = externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"  # what KEDA's operator calls
    assert [m.name for m in service.methods] == ["IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics"]
    assert loadreports_pb2.DESCRIPTOR.services_by_name["LoadReports"].full_name == "sless.scaling.v1.LoadReports"
