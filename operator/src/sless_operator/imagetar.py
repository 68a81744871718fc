"""The image tarball kaniko writes (``--tar-path``), read as the hostile input it may be.

kaniko writes go-containerregistry's ``tarball.Write`` format (pkg/v1/tarball/write.go): a plain USTAR tar
of regular files, the config named ``sha256:<hex>`` (``ConfigName()``), each layer once as ``<hex>.tar.gz``
(its compressed bytes, ``hex`` their SHA-256: ``Layer.Digest()``), and last ``manifest.json``,
``[{"Config": ..., "RepoTags": [...], "Layers": [...], "LayerSources": {...}}]``. The media types are not
in it: gzip layers are pushed with Docker schema 2's types (what kaniko would have pushed), anything else
(zstd, plain tar) with OCI's.

A build step runs as root beside the path kaniko writes to, so it can leave anything there: this reads
only the tar headers it needs (no extraction), refuses anything but uniquely and plainly named regular
files inside the file, bounds the entry count, ``manifest.json`` and the config, and checks every blob's
SHA-256 against its name before a byte is pushed.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

BLOCK = 512
CHUNK = 1 << 20
MAX_ENTRIES = 1024
MAX_MANIFEST_BYTES = 1 << 20
MAX_CONFIG_BYTES = 8 << 20

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_GZIP_LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYERS = {"gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
              "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
              "tar": "application/vnd.oci.image.layer.v1.tar"}  # fmt: skip

_HEX = re.compile(r"[0-9a-f]{64}")


class TarballError(Exception):
    """The tarball is not one image as kaniko writes it: cut short, malformed, too large, altered."""


def short(text: str, limit: int = 200) -> str:
    """TEXT cut for a message (names from a tarball and registry answers are not ours to print at length)."""
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class Entry:
    """A regular file inside the tarball: where its bytes start and how many there are."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Blob:
    """A blob to push: its digest, size, media type and where its bytes are in the tarball."""

    digest: str
    size: int
    media_type: str
    entry: Entry


@dataclass(frozen=True)
class Image:
    """The tarball's one image, checked: its config and layers as blobs, ready to push."""

    config: Blob
    layers: tuple[Blob, ...]
    manifest_type: str


def _octal(field_: bytes, what: str) -> int:
    if field_[:1] and field_[0] & 0x80:  # base-256: only for sizes far beyond any bound here
        raise TarballError(f"{what}: a size too large for this tarball")
    text = field_.split(b"\0", 1)[0].strip(b" ")
    if not text:
        return 0
    if not re.fullmatch(rb"[0-7]+", text):
        raise TarballError(f"{what}: not a tar header (bad number field)")
    return int(text, 8)


def read_index(handle: IO[bytes], file_size: int, max_entries: int = MAX_ENTRIES) -> dict[str, Entry]:
    """Every entry of the (USTAR) tar HANDLE: only regular files, unique plain names, inside the file."""
    entries: dict[str, Entry] = {}
    offset = 0
    while True:
        handle.seek(offset)
        header = handle.read(BLOCK)
        if len(header) < BLOCK:
            raise TarballError("the image tarball is cut short (no end-of-archive marker)")
        if header == b"\0" * BLOCK:
            return entries
        try:
            stored = _octal(header[148:156], "the image tarball")
        except TarballError:
            stored = -1
        if stored != sum(header[:148]) + 32 * 8 + sum(header[156:]):
            raise TarballError(f"the image tarball has a damaged header at byte {offset}: not a tar file kaniko wrote")
        raw_name = header[:100].split(b"\0", 1)[0]
        if header[257:262] == b"ustar" and header[345:500].strip(b"\0"):
            raw_name = header[345:500].split(b"\0", 1)[0] + b"/" + raw_name
        name = raw_name.decode("utf-8", "replace")
        kind = header[156:157]
        if kind not in (b"0", b"\0"):
            raise TarballError(f"the image tarball holds {short(name)!r}, which is not a regular file (type "
                            f"{kind.decode('latin-1')!r}): not an image kaniko writes")  # fmt: skip
        if "/" in name or name in ("", ".", ".."):
            raise TarballError(f"the image tarball holds an unexpected path {short(name)!r}")
        if name in entries:
            raise TarballError(f"the image tarball holds {short(name)!r} twice")
        size = _octal(header[124:136], f"the image tarball's entry {short(name)!r}")
        start = offset + BLOCK
        if start + size > file_size:
            raise TarballError(f"the image tarball's entry {short(name)!r} runs past the end of the file")
        if len(entries) >= max_entries:
            raise TarballError(f"the image tarball holds more than {max_entries} entries")
        entries[name] = Entry(name, start, size)
        offset = start + (size + BLOCK - 1) // BLOCK * BLOCK


def _region(handle: IO[bytes], entry: Entry, chunk: int = CHUNK) -> Iterator[bytes]:
    handle.seek(entry.offset)
    left = entry.size
    while left:
        data = handle.read(min(chunk, left))
        if not data:
            raise TarballError(f"the image tarball ends inside {short(entry.name)!r}")
        left -= len(data)
        yield data


def _read_small(handle: IO[bytes], entry: Entry, limit: int, what: str) -> bytes:
    if entry.size > limit:
        raise TarballError(f"the image tarball's {what} is larger than {limit} bytes")
    return b"".join(_region(handle, entry))


def _sha256(handle: IO[bytes], entry: Entry) -> str:
    digest = hashlib.sha256()
    for data in _region(handle, entry):
        digest.update(data)
    return digest.hexdigest()


def _compression(handle: IO[bytes], entry: Entry) -> str:
    handle.seek(entry.offset)
    head = handle.read(min(entry.size, BLOCK))
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "zstd"
    if entry.size == 0 or head[257:262] == b"ustar" or (len(head) == BLOCK and head == b"\0" * BLOCK):
        return "tar"
    raise TarballError(f"layer {short(entry.name)!r} is neither gzip, zstd nor tar")


def load_image(handle: IO[bytes], file_size: int) -> Image:
    """The image in the tarball HANDLE, every blob's digest checked against its name (else TarballError)."""
    entries = read_index(handle, file_size)
    if "manifest.json" not in entries:
        raise TarballError("the image tarball has no manifest.json: not an image kaniko writes")
    try:
        described = json.loads(_read_small(handle, entries["manifest.json"], MAX_MANIFEST_BYTES, "manifest.json"))
    except (ValueError, RecursionError) as exc:
        raise TarballError(f"the image tarball's manifest.json is not JSON ({short(str(exc))})") from None
    if not isinstance(described, list) or len(described) != 1 or not isinstance(described[0], dict):
        raise TarballError("the image tarball's manifest.json must describe exactly one image")
    desc: dict[str, Any] = described[0]
    if desc.get("LayerSources"):
        raise TarballError("the image has foreign (non-distributable) layers, which this platform does not push")
    config_name, layer_names = desc.get("Config"), desc.get("Layers")
    if not isinstance(config_name, str) or not config_name.startswith("sha256:") \
            or not _HEX.fullmatch(config_name[7:]):  # fmt: skip
        raise TarballError("the image tarball's manifest.json names no config sha256:<hex>")
    if not isinstance(layer_names, list) or not all(isinstance(n, str) for n in layer_names):
        raise TarballError("the image tarball's manifest.json has no list of layers")
    if len(layer_names) > MAX_ENTRIES:
        raise TarballError(f"the image has more than {MAX_ENTRIES} layers")
    config_entry = _entry(entries, config_name)
    config_bytes = _read_small(handle, config_entry, MAX_CONFIG_BYTES, "config")
    if hashlib.sha256(config_bytes).hexdigest() != config_name[7:]:
        raise TarballError("the image's config does not match its digest")
    _check_config(config_bytes, len(layer_names))
    layers = []
    for name in layer_names:
        hex_ = name.removesuffix(".tar.gz")
        if not name.endswith(".tar.gz") or not _HEX.fullmatch(hex_):
            raise TarballError(f"the image tarball names a layer {short(name)!r}, not <sha256 hex>.tar.gz")
        entry = _entry(entries, name)
        if _sha256(handle, entry) != hex_:
            raise TarballError(f"layer {hex_[:12]} does not match its digest")
        layers.append((entry, f"sha256:{hex_}", _compression(handle, entry)))
    docker = all(kind == "gzip" for _, _, kind in layers)  # what kaniko itself pushes; else OCI types
    blobs = tuple(Blob(digest, entry.size, DOCKER_GZIP_LAYER if docker else OCI_LAYERS[kind], entry)
                  for entry, digest, kind in layers)  # fmt: skip
    config = Blob(config_name, config_entry.size, DOCKER_CONFIG if docker else OCI_CONFIG, config_entry)
    return Image(config, blobs, DOCKER_MANIFEST if docker else OCI_MANIFEST)


def _entry(entries: dict[str, Entry], name: str) -> Entry:
    if name not in entries:
        raise TarballError(f"the image tarball lacks {short(name)!r}, which its manifest.json names")
    return entries[name]


def _check_config(raw: bytes, layers: int) -> None:
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError):
        raise TarballError("the image's config is not JSON") from None
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") if isinstance(config, dict) else None
    if not isinstance(diff_ids, list) or len(diff_ids) != layers:
        raise TarballError(f"the image's config does not list its {layers} layers (rootfs.diff_ids)")


def manifest_bytes(image: Image) -> bytes:
    """The image manifest for IMAGE (Docker schema 2 for gzip layers, as kaniko pushes them; else OCI)."""
    def desc(blob: Blob) -> dict[str, Any]:
        return {"mediaType": blob.media_type, "size": blob.size, "digest": blob.digest}

    return json.dumps({"schemaVersion": 2, "mediaType": image.manifest_type, "config": desc(image.config),
                       "layers": [desc(b) for b in image.layers]}, separators=(",", ":")).encode()  # fmt: skip
