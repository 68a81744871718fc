"""The scaler's wire: KEDA's external scaler protocol and our load reports, as protoc generated them.

Everything here but :mod:`.generate` and this file is generated code (``*_pb2.py``, ``*_pb2_grpc.py`` and their
``.pyi`` stubs, from the ``.proto`` files beside them): do not edit it, run ``python -m
sless_api.services.scaling.proto.generate`` after changing a ``.proto`` or the pinned grpcio-tools/mypy-protobuf.
A unit test (tests/unit/test_scaler_proto.py) regenerates them and fails when the committed files differ.
"""
