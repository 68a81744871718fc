"""Regenerate the Python code of the ``.proto`` files of this package (a developer's tool, not used at run time).

``python -m sless_api.services.scaling.proto.generate`` rewrites the committed files in place;
:func:`generate` writes them under another root (the test that checks the committed ones are current). It needs
the dev dependencies grpcio-tools (protoc and the gRPC plugin) and mypy-protobuf (typed stubs for mypy): protoc
runs as a subprocess of this interpreter, so nothing here imports them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The import root: protoc names the files relative to it, so the generated imports are absolute
#: (``from sless_api.services.scaling.proto import externalscaler_pb2``).
SOURCE_ROOT = HERE.parents[3]
PROTOS = ("externalscaler.proto", "loadreports.proto")
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")


def generated_names() -> list[str]:
    """The file names protoc writes for the protos of this package."""
    return [proto.removesuffix(".proto") + suffix for proto in PROTOS for suffix in SUFFIXES]


def _plugin(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install the dev dependencies (mypy-protobuf)")
    return found


def generate(out_root: Path) -> Path:
    """Generate the code of every proto under OUT_ROOT (same package layout); the package folder written."""
    package = HERE.relative_to(SOURCE_ROOT)
    (out_root / package).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{SOURCE_ROOT}",
               f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
               f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
               f"--python_out={out_root}", f"--grpc_python_out={out_root}",
               f"--mypy_out={out_root}", f"--mypy_grpc_out={out_root}",
               *(str(package / proto) for proto in PROTOS)]
    done = subprocess.run(command, cwd=SOURCE_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed ({done.returncode}): {done.stderr.strip()}")
    return out_root / package


def main() -> int:
    written = generate(SOURCE_ROOT)
    print("\n".join(str(written / name) for name in generated_names()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
