"""Build context of a function image: the user's files plus a generated Dockerfile, as tar.gz.

Shared by both backends: the Kubernetes backend stores it in S3 for the kaniko
build Job, and the standalone backend keeps it next to the code so what was
deployed can be rebuilt as an image later.

The Dockerfile is layered for deploy speed and correctness:

1. ``FROM`` the runtime's base image (wrapper already inside, see runtimes/*/Dockerfile).
2. Only the dependency manifest is copied, then dependencies are installed: the
   layer cache keys on the manifest's content, so a code-only change reuses it.
3. A ``LABEL`` with the code hash, then the code. The label changes the layer
   chain whenever the code changes, so a builder whose cache misjudges COPY
   layers (kaniko did in the original platform) can never serve stale code.

The archive is deterministic (sorted entries, fixed mtimes, owners and modes,
fixed gzip header), so the same code always gives the same bytes and the same
object in S3.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from pathlib import Path

#: Where the runtime images expect things (see runtimes/*/Dockerfile).
CODE_DIR = "/app/function"
DEPS_DIR = "/app/deps"
GO_BIN_DIR = "/app/bin"
GO_BUILD_SCRIPT = "/app/runtime/build.sh"
GO_MOD_CACHE = "/app/go/mod"
#: Compiles the packages of the modules go.mod requires directly (a module that does not build alone is skipped:
#: the function's compile then builds what it uses of it).
GO_WARM_DEPS = ("for m in $(go list -m -f '{{if not (or .Main .Indirect)}}{{.Path}}{{end}}' all);"
                ' do go build -mod=mod -trimpath "$m/..." || true; done')
#: The runtime images run as this numeric user (Kubernetes runAsNonRoot needs a number).
RUNTIME_USER = "1000:1000"
#: Every entry's mtime (2000-01-01T00:00:00Z); a constant keeps the archive reproducible.
FIXED_MTIME = 946_684_800
#: Label carrying the code hash in the image.
CODE_HASH_LABEL = "dev.sless.code-hash"
#: Go functions run from a static binary on distroless (the build stage keeps the toolchain); the
#: kubernetes backend's SLESS_GO_RUN_IMAGE replaces it (a registry without Docker Hub or gcr.io).
GO_RUN_IMAGE = "gcr.io/distroless/static-debian12:nonroot"
GO_RUN_USER = "65532:65532"
#: Folder of the user's files inside the archive (the Dockerfile sits beside it, never clashing).
FUNCTION_PREFIX = "function"


def code_tree_hash(code_dir: Path) -> str:
    """sha256 over the tree's relative paths, executable bits and contents (sorted)."""
    digest = hashlib.sha256()
    for rel, path in _walk(Path(code_dir)):
        if path.is_dir():
            digest.update(b"d\0" + rel.encode() + b"\0")
            continue
        digest.update(b"f\0" + rel.encode() + b"\0" + (b"x" if _executable(path) else b"-"))
        data = path.read_bytes()
        digest.update(len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()


def make_build_context(
    code_dir: Path, runtime: str, entrypoint: str, base_image: str, *, code_hash: str | None = None,
    go_run_image: str = GO_RUN_IMAGE,
) -> bytes:
    """tar.gz bytes: ``Dockerfile`` + ``function/<user files>``.

    ``code_hash`` defaults to :func:`code_tree_hash`; pass the platform's own
    hash of the upload to make the label match the Function's status.
    """
    code_dir = Path(code_dir)
    if not code_dir.is_dir():
        raise ValueError(f"code directory {code_dir} does not exist")
    digest = code_hash or code_tree_hash(code_dir)
    dockerfile = render_dockerfile(code_dir, runtime, entrypoint, base_image, digest, go_run_image)
    return _tar_gz(code_dir, FUNCTION_PREFIX, {"Dockerfile": dockerfile.encode()})


def make_code_archive(code_dir: Path) -> bytes:
    """tar.gz bytes of the code alone (no Dockerfile, no folder prefix): what a function pod fetches
    at start and unpacks as its code directory. Deterministic like the build context."""
    code_dir = Path(code_dir)
    if not code_dir.is_dir():
        raise ValueError(f"code directory {code_dir} does not exist")
    return _tar_gz(code_dir, "", {})


def make_deps_context(runtime: str, manifests: dict[str, bytes], base_image: str, deps_key: str) -> bytes:
    """tar.gz bytes: a Dockerfile that installs MANIFESTS on BASE_IMAGE, and the manifests; no code.

    Its bytes depend on the runtime, the manifests and the base image only, so every function with
    the same dependencies builds the same image (the code arrives at pod start, see sless_core.rebuild).
    For Go that image is where the code compiles: the toolchain with the modules downloaded.
    """
    if runtime not in ("python3.11", "nodejs20", "go1.23"):
        raise ValueError(f"no dependency image for runtime {runtime!r}")
    _check_single_line("deps_key", deps_key)
    dockerfile = render_dockerfile(Path("/nonexistent"), runtime, "-", base_image, "", manifest_names=set(manifests),
                                   deps_key=deps_key)
    files = {"Dockerfile": dockerfile.encode(), **{f"{FUNCTION_PREFIX}/{n}": c for n, c in sorted(manifests.items())}}
    return _tar_gz(None, FUNCTION_PREFIX, files)


def _tar_gz(code_dir: Path | None, prefix: str, extra: dict[str, bytes]) -> bytes:
    """Deterministic tar.gz: EXTRA's files first, then PREFIX/ and CODE_DIR's tree below it."""
    raw = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        if prefix:
            for name, data in extra.items():
                if "/" not in name:
                    _add_bytes(tar, name, data)
            _add_dir(tar, prefix)
            for name, data in extra.items():
                if "/" in name:
                    _add_bytes(tar, name, data)
        for rel, path in _walk(code_dir) if code_dir is not None else []:
            name = f"{prefix}/{rel}" if prefix else rel
            if path.is_dir():
                _add_dir(tar, name)
            else:
                with open(path, "rb") as handle:
                    info = _info(name, 0o755 if _executable(path) else 0o644)
                    info.size = os.fstat(handle.fileno()).st_size
                    tar.addfile(info, handle)
    return raw.getvalue()


def render_dockerfile(code_dir: Path, runtime: str, entrypoint: str, base_image: str, code_hash: str,
                      go_run_image: str = GO_RUN_IMAGE, *, manifest_names: set[str] | None = None,
                      deps_key: str = "") -> str:
    """The generated Dockerfile for ``runtime`` (dependency layers depend on which manifests exist).

    With DEPS_KEY it is a dependency image: the install steps of MANIFEST_NAMES and a label naming the
    key, no code (the function's pods fetch their code at start).
    """
    for name, image in (("base_image", base_image), ("go_run_image", go_run_image)):
        _check_single_line(name, image)
        if not image or any(c.isspace() for c in image):
            raise ValueError(f"{name} must be one image reference, got {image!r}")
    _check_single_line("entrypoint", entrypoint)
    _check_single_line("code_hash", code_hash)
    if manifest_names is not None:
        has = {name: name in manifest_names for name in _MANIFESTS}
    else:
        has = {name: (Path(code_dir) / name).is_file() for name in _MANIFESTS}
    src = FUNCTION_PREFIX
    lines = [
        f"# Generated by sless for a {runtime} function; do not edit.",
        f"FROM {base_image}" + (" AS build" if runtime == "go1.23" and not deps_key else ""),
        "USER root",
    ]
    if runtime == "python3.11":
        if has["requirements.txt"]:
            lines += [
                f"COPY {src}/requirements.txt /app/manifest/requirements.txt",
                "RUN python3 -m pip install --no-cache-dir --no-input --disable-pip-version-check"
                f" --target {DEPS_DIR} -r /app/manifest/requirements.txt",
                f"ENV SLESS_DEPS_DIR={DEPS_DIR}",
            ]
    elif runtime == "nodejs20":
        if has["package.json"]:
            manifests = [f"{src}/package.json"] + (
                [f"{src}/package-lock.json"] if has["package-lock.json"] else []
            )
            lines += [
                f"COPY {' '.join(manifests)} {DEPS_DIR}/",
                # cd instead of WORKDIR: the base image's CMD is relative to its WORKDIR.
                f"RUN cd {DEPS_DIR} && npm install --omit=dev --no-audit --no-fund --no-progress"
                " && mkdir -p node_modules",
                f"ENV SLESS_DEPS_DIR={DEPS_DIR}/node_modules",
            ]
    elif runtime == "go1.23":
        lines.append(f"ENV GOMODCACHE={GO_MOD_CACHE}")
        if has["go.mod"]:
            sums = [f"{src}/go.sum"] if has["go.sum"] else []
            lines += [
                f"COPY {' '.join([f'{src}/go.mod', *sums])} /app/manifest/",
                "RUN cd /app/manifest && go mod download all"
                # a dependency image is where code compiles: the required modules' packages compiled once
                # (as build.sh compiles them, so its build cache finds them), the modules the runtime user's
                + (f" && {GO_WARM_DEPS} && chown -R 1000:1000 /app/go" if deps_key else ""),
            ]
    else:
        raise ValueError(f"unknown runtime {runtime!r}")
    if deps_key:
        label = f"LABEL dev.sless.deps={json.dumps(deps_key)} dev.sless.runtime={json.dumps(runtime)}"
        return "\n".join([*lines, label, f"USER {RUNTIME_USER}"]) + "\n"
    lines += [
        f"LABEL {CODE_HASH_LABEL}={json.dumps(code_hash)} dev.sless.runtime={json.dumps(runtime)}",
        f"COPY {src}/ {CODE_DIR}/",
        f"ENV SLESS_CODE_DIR={CODE_DIR} SLESS_ENTRYPOINT={json.dumps(entrypoint)}",
    ]
    if runtime == "go1.23":
        # The toolchain stays in the build stage: the function image holds only the static binary.
        lines += [
            f"RUN {GO_BUILD_SCRIPT} {CODE_DIR} {GO_BIN_DIR}",
            f"FROM {go_run_image}",
            f"COPY --from=build {GO_BIN_DIR} {GO_BIN_DIR}",
            f"LABEL {CODE_HASH_LABEL}={json.dumps(code_hash)} dev.sless.runtime={json.dumps(runtime)}",
            f'CMD ["{GO_BIN_DIR}/server"]',
            f"USER {GO_RUN_USER}",
        ]
    else:
        lines.append(f"USER {RUNTIME_USER}")
    return "\n".join(lines) + "\n"


_MANIFESTS = ("requirements.txt", "package.json", "package-lock.json", "go.mod", "go.sum")


def _check_single_line(what: str, value: str) -> None:
    """A value spliced into the Dockerfile must not be able to add instructions."""
    if "\n" in value or "\r" in value or "\\" in value:
        raise ValueError(f"{what} must be a single line without backslashes")


def _walk(root: Path) -> list[tuple[str, Path]]:
    """(relative posix path, path) of every dir and file under ``root``, sorted; symlinks refused.

    Uploads are checked for symlinks already; refusing here keeps a link that
    appeared later from pulling host files into an image.
    """
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        for name in dirnames + filenames:
            path = base / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise ValueError(f"symlink in function code: {path.relative_to(root)}")
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise ValueError(f"special file in function code: {path.relative_to(root)}")
            found.append((path.relative_to(root).as_posix(), path))
    found.sort(key=lambda item: item[0])
    return found


def _executable(path: Path) -> bool:
    return bool(path.stat().st_mode & 0o111)


def _info(name: str, mode: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = FIXED_MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = _info(name, 0o755)
    info.type = tarfile.DIRTYPE
    tar.addfile(info)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _info(name, 0o644)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
