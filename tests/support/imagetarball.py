"""Image tarballs in the layout kaniko's ``--tar-path`` writes (go-containerregistry ``tarball.Write``).

That writer (pkg/v1/tarball/write.go, v0.19.2 in kaniko v1.23.2) puts the config first as ``sha256:<hex>``,
each distinct layer once as ``<hex>.tar.gz`` (the compressed blob, ``hex`` its SHA-256), and
``manifest.json`` last: ``[{"Config": "sha256:<hex>", "RepoTags": [tag], "Layers": ["<hex>.tar.gz", ...]}]``,
in a USTAR tar of regular files (mode 0644). These helpers write the same, so tests can push images
without kaniko and can also spoil one part at a time.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path


def layer(files: dict[str, bytes]) -> bytes:
    """A gzip-compressed layer tar holding FILES (fixed times, so the same files give the same digest)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


def config_for(layers: list[bytes]) -> bytes:
    """An image config whose rootfs.diff_ids name LAYERS' uncompressed digests."""
    diff_ids = [f"sha256:{hashlib.sha256(gzip.decompress(b)).hexdigest()}" for b in layers]
    return json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/true"]},
                       "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()  # fmt: skip


@dataclass
class ImageTarball:
    """The parts of one image tarball; ``write`` lays them out as kaniko does (override a part to spoil it)."""

    layers: list[bytes]
    tag: str = "registry.test/sless/ns/fn:tag"
    config: bytes = b""
    manifest: bytes | None = None  # the manifest.json text, when not the one made from the parts
    extra: dict[str, bytes] = field(default_factory=dict)  # entries added before manifest.json

    def __post_init__(self) -> None:
        self.config = self.config or config_for(self.layers)

    @property
    def config_name(self) -> str:
        return f"sha256:{hashlib.sha256(self.config).hexdigest()}"

    def layer_names(self) -> list[str]:
        return [f"{hashlib.sha256(b).hexdigest()}.tar.gz" for b in self.layers]

    def manifest_json(self) -> bytes:
        if self.manifest is not None:
            return self.manifest
        return json.dumps([{"Config": self.config_name, "RepoTags": [self.tag],
                            "Layers": self.layer_names()}]).encode()  # fmt: skip

    def write(self, path: Path) -> Path:
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            entries = [(self.config_name, self.config)]
            seen: set[str] = set()
            for name, data in zip(self.layer_names(), self.layers, strict=True):
                if name not in seen:
                    seen.add(name)
                    entries.append((name, data))
            entries += [*self.extra.items(), ("manifest.json", self.manifest_json())]
            for name, data in entries:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        return path
