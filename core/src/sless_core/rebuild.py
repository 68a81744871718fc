"""When a function needs an image of its own: one rule for both backends.

A deploy is fast when it builds nothing. Code is data: it is unpacked next to a generic runtime
(a folder on the standalone host, a volume fetched at pod start on Kubernetes). Only what the code
cannot bring at start-up needs a build, and that is its third-party dependencies:

- Python: ``requirements.txt`` (one that names nothing, blank lines and comments only, installs
  nothing and counts as absent);
- Node.js: ``package.json`` with ``package-lock.json`` when present;
- Go: ``go.mod`` with ``go.sum``. Go is compiled: its binary *is* the code, so every Go code change
  compiles. Compiling is not building an image: the dependency image (the toolchain with the
  modules downloaded and the standard library compiled; the runtime's own image without a
  manifest) is built once per key, and a code change only compiles on it, into a binary that the
  function's pods fetch at start like Python and Node code.

The dependency key is the SHA-256 of the runtime and the manifests' names and bytes (in a fixed
order), so two functions with the same manifest for the same runtime share one dependency set,
and a code-only change keeps its key. No manifest: no key, the runtime's base image as it is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

#: Bumped when what goes into a key changes, so no older dependency set is reused by mistake.
KEY_FORMAT = "1"
GO = "go1.23"

#: Per runtime: the manifest files that define its dependencies, the first one being required.
MANIFESTS: dict[str, tuple[str, ...]] = {
    "python3.11": ("requirements.txt",),
    "nodejs20": ("package.json", "package-lock.json"),
    GO: ("go.mod", "go.sum"),
}


def _meaningful(name: str, content: bytes) -> bool:
    """A requirements.txt of blank lines and comments installs nothing: it is no manifest."""
    if name != "requirements.txt":
        return True
    for raw in content.decode("utf-8", errors="replace").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            return True
    return False


def manifest_files(runtime: str, files: Mapping[str, bytes]) -> dict[str, bytes]:
    """The dependency manifests among FILES (top-level name -> bytes), or {} when there are none."""
    names = MANIFESTS.get(runtime)
    if names is None:
        raise ValueError(f"unknown runtime {runtime!r}")
    primary = names[0]
    if primary not in files or not _meaningful(primary, files[primary]):
        return {}
    return {name: files[name] for name in names if name in files}


def read_manifests(runtime: str, code_dir: Path) -> dict[str, bytes]:
    """:func:`manifest_files` of an unpacked code folder (only regular files at its top level count)."""
    found = {}
    for name in MANIFESTS.get(runtime, ()):
        path = Path(code_dir) / name
        if path.is_file() and not path.is_symlink():
            found[name] = path.read_bytes()
    return manifest_files(runtime, found)


def dependency_key(runtime: str, manifests: Mapping[str, bytes]) -> str:
    """SHA-256 (hex) of the runtime and its manifests; "" when there are none (nothing to install)."""
    if not manifests:
        return ""
    digest = hashlib.sha256(f"sless-deps/{KEY_FORMAT}\0{runtime}\0".encode())
    for name in sorted(manifests):
        content = manifests[name]
        digest.update(name.encode() + b"\0" + len(content).to_bytes(8, "big") + content)
    return digest.hexdigest()


@dataclass(frozen=True)
class Plan:
    """What one version of a function needs before it can run."""

    runtime: str
    #: :func:`dependency_key`, "" without dependencies
    deps_key: str

    @property
    def compiled(self) -> bool:
        """The code itself is compiled (Go): every code change compiles."""
        return self.runtime == GO

    @property
    def needs_image(self) -> bool:
        """Whether an image of its own is needed (else the runtime's image runs or compiles the code)."""
        return bool(self.deps_key)

    def builds_image_for(self, previous: Plan | None) -> bool:
        """Whether moving from PREVIOUS to this plan builds a dependency image: new dependencies only."""
        if not self.needs_image:
            return False
        return previous is None or previous.runtime != self.runtime or previous.deps_key != self.deps_key

    def compiles_for(self, previous: Plan | None, code_changed: bool) -> bool:
        """Whether moving from PREVIOUS to this plan compiles: Go, with new code or new dependencies."""
        if not self.compiled:
            return False
        return code_changed or previous is None or previous != self

    def rebuild_for(self, previous: Plan | None, code_changed: bool) -> bool:
        """Whether moving from PREVIOUS to this plan builds anything: an image or a binary."""
        return self.builds_image_for(previous) or self.compiles_for(previous, code_changed)


def plan(runtime: str, code_dir: Path) -> Plan:
    """The plan of the unpacked code in CODE_DIR for RUNTIME."""
    return Plan(runtime, dependency_key(runtime, read_manifests(runtime, code_dir)))
