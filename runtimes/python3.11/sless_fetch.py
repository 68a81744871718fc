"""sless Python runtime: the function's code, fetched by the runtime itself before the handler loads.

On Kubernetes a function without dependencies runs on this image with its code fetched at pod start. The
runtime container does that itself rather than an init container of the platform image: a container start
less (a sandbox, a container, a Python start) on every cold start. ``main`` of the server and of the runner
call it first (``sless_runtime.fetch_code``, which imports this module only when SLESS_CODE_URL is set), so the
server listens (and the pod turns Ready) only once the code is there.

The operator sets (``sless_operator.manifests``): ``SLESS_CODE_URL``, a URL signed for exactly the code
archive (from the function's Secret, so renewing it restarts nothing; removed from the environment here,
before the handler loads), ``SLESS_CODE_KEY`` (its name in messages), ``SLESS_CODE_SHA256``,
``SLESS_CODE_MAX_BYTES`` and ``SLESS_CODE_REPORT_FILE`` (the termination log). Without ``SLESS_CODE_URL``
nothing is fetched: the code is in the image, or a supervisor put it in ``SLESS_CODE_DIR``.

The archive is untrusted input, checked as ``sless_operator.contextfetch`` checks it, with the same messages
(the operator shows them in the Function's status): only http(s), the SHA-256 checked before anything is
unpacked, regular files and directories only, no absolute paths, ``..``, backslashes, NULs or duplicates, at
most ``SLESS_CODE_MAX_ENTRIES`` entries and ``SLESS_CODE_MAX_BYTES`` bytes (downloaded, and unpacked: counted
while writing, so a lying header does not help), the download bounded in time. A refusal is written to
``SLESS_CODE_REPORT_FILE`` and stderr and the process exits ``EXIT_FETCH`` (3), which the operator reads as
"the code could not be fetched" (a handler that fails to load exits 1).

The code directory is a writable emptyDir: the files are made read-only (0444, 0555 when executable,
directories 0555), but they belong to the function's user, so a function could still change its own code,
in its own pod only, until the pod's next start fetches it again. It can reach nothing it could not before.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up
if TYPE_CHECKING:
    from typing import IO, Any

EXIT_FETCH = 3
WHAT = "code archive"
CHUNK = 1 << 16
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 20000
#: each wait for the S3 server's next bytes, and the whole download
SOCKET_TIMEOUT_SEC = 30.0
DOWNLOAD_TIMEOUT_SEC = 300.0
#: the kubelet keeps at most 4096 bytes of a termination message
MESSAGE_TAIL = 4000


class FetchError(Exception):
    """The code cannot be used: missing, altered, too large or unsafe to unpack."""


def _reason(key: str, code: int, reason: str) -> str:
    why = {403: "access denied or the URL expired", 404: "no such object"}.get(code, reason)
    return f"cannot read {key}: HTTP {code} ({why})"


def download(url: str, key: str, out: IO[bytes], sha256: str, max_bytes: int) -> str:
    """Stream URL into OUT; returns its SHA-256, which must equal SHA256. No proxy, no redirect: the URL
    is signed for one object on the S3 server the tenant's network policy lets it reach."""
    import hashlib
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise FetchError(f"cannot read {key}: the download URL is not http(s)")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None  # the 3xx then is an HTTPError like any other

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())
    deadline = time.monotonic() + DOWNLOAD_TIMEOUT_SEC
    digest = hashlib.sha256()
    size = 0
    try:
        with opener.open(url, timeout=SOCKET_TIMEOUT_SEC) as response:
            while chunk := response.read1(CHUNK):  # what has come: a trickle cannot outlast the deadline
                size += len(chunk)
                if size > max_bytes:
                    raise FetchError(f"{WHAT} {key} is larger than {max_bytes} bytes")
                if time.monotonic() > deadline:
                    raise FetchError(f"cannot read {key}: not downloaded within {DOWNLOAD_TIMEOUT_SEC:.0f}s")
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise FetchError(_reason(key, exc.code, str(exc.reason))) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"cannot read {key}: {exc}") from exc
    found = digest.hexdigest()
    if found != sha256.lower():
        raise FetchError(f"{WHAT} {key} has SHA-256 {found}, expected {sha256.lower()}")
    return found


def _member_path(name: str) -> list[str]:
    """The member's relative path, or FetchError when it could land outside the destination."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        raise FetchError(f"unsafe path in {WHAT}: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise FetchError(f"unsafe path in {WHAT}: {name!r}")
    return parts


def _copy(source: IO[bytes], out: IO[bytes], budget: int, name: str) -> int:
    written = 0
    while chunk := source.read(CHUNK):
        written += len(chunk)
        if written > budget:
            raise FetchError(f"{WHAT} unpacks to more than the limit (at {name})")
        out.write(chunk)
    return written


def unpack(archive: IO[bytes], dest: str, max_bytes: int, max_entries: int) -> list[tuple[str, int]]:
    """Unpack the tar.gz ARCHIVE into the empty folder DEST; returns (path, mode) of what it made, to be
    made read-only once everything is written (a read-only folder could not take its files)."""
    import tarfile

    seen: set[tuple[str, ...]] = set()
    made: list[tuple[str, int]] = []
    total = 0
    try:
        with tarfile.open(fileobj=archive, mode="r:gz") as tar:
            for count, member in enumerate(tar, start=1):
                if count > max_entries:
                    raise FetchError(f"{WHAT} has more than {max_entries} entries")
                parts = _member_path(member.name)
                if tuple(parts) in seen:
                    raise FetchError(f"duplicate entry in {WHAT}: {member.name!r}")
                seen.add(tuple(parts))
                path = os.path.join(dest, *parts)
                if member.isdir():
                    os.makedirs(path, exist_ok=True)
                    made.append((path, 0o555))
                    continue
                if not member.isreg():
                    raise FetchError(f"{WHAT} entry {member.name!r} is not a regular file or directory")
                if member.size > max_bytes - total:
                    raise FetchError(f"{WHAT} unpacks to more than {max_bytes} bytes")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                if os.path.islink(path) or os.path.isdir(path):
                    raise FetchError(f"{WHAT} entry {member.name!r} clashes with another entry")
                stream = tar.extractfile(member)
                if stream is None:
                    raise FetchError(f"{WHAT} entry {member.name!r} cannot be read")
                with stream, open(path, "xb") as out:
                    total += _copy(stream, out, max_bytes - total, member.name)
                made.append((path, 0o555 if member.mode & 0o111 else 0o444))
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(f"{WHAT} is not a readable tar.gz: {exc}") from exc
    return made


def clear(dest: str) -> None:
    """Empty DEST (a container restarted in the same pod finds the last start's read-only code there)."""
    import shutil

    for root, dirs, _ in os.walk(dest):
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(root, name), 0o700)
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def fetch(url: str, key: str, sha256: str, dest: str, max_bytes: int, max_entries: int) -> str:
    """Download, check and unpack the code into DEST, then make it read-only; returns its SHA-256. The
    archive lies unlinked in DEST while it is read (no other writable place is large enough for it)."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256.lower()):
        raise FetchError(f"SLESS_CODE_SHA256 must be 64 hex digits, got {sha256!r}")
    os.makedirs(dest, exist_ok=True)
    try:
        clear(dest)
        fd = os.open(os.path.join(dest, ".sless-code.tar.gz"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(os.path.join(dest, ".sless-code.tar.gz"))
    except OSError as exc:
        raise FetchError(f"cannot write the code into {dest}: {exc}") from exc
    try:
        with os.fdopen(fd, "w+b") as archive:
            found = download(url, key, archive, sha256, max_bytes)
            archive.seek(0)
            made = unpack(archive, dest, max_bytes, max_entries)
        for path, mode in reversed(made):  # files before the folders that hold them
            os.chmod(path, mode)
    except (FetchError, OSError) as exc:
        with contextlib.suppress(OSError):
            clear(dest)  # nothing half-unpacked is ever loaded
        if isinstance(exc, FetchError):
            raise
        raise FetchError(f"cannot write the code into {dest}: {exc}") from exc
    return found


def report(message: str) -> None:
    """MESSAGE on stderr and, in a pod, as the container's termination message."""
    print(message, file=sys.stderr, flush=True)
    path = os.environ.get("SLESS_CODE_REPORT_FILE")
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as out:
            out.write(message[-MESSAGE_TAIL:])


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return int(raw) if raw else default
    except ValueError:
        report(f"{WHAT}: {name} must be an integer, got {raw!r}")
        os._exit(EXIT_FETCH)


def fetch_from_env() -> None:
    """Fetch the code when ``SLESS_CODE_URL`` says where it is (see the module docstring); on failure report
    why and exit ``EXIT_FETCH``. The URL leaves the environment either way: the handler never sees it."""
    url = os.environ.pop("SLESS_CODE_URL", "")
    if not url:
        return
    key = os.environ.get("SLESS_CODE_KEY", "") or "code"
    dest = os.environ.get("SLESS_CODE_DIR", "/app/function")
    started = time.monotonic()
    try:
        found = fetch(url, key, os.environ.get("SLESS_CODE_SHA256", ""), dest,
                      _int("SLESS_CODE_MAX_BYTES", DEFAULT_MAX_BYTES),
                      _int("SLESS_CODE_MAX_ENTRIES", DEFAULT_MAX_ENTRIES))  # fmt: skip
    except FetchError as exc:
        report(f"{WHAT}: {exc}")
        os._exit(EXIT_FETCH)
    took = (time.monotonic() - started) * 1000
    # tagged as no call's (runtimes/README.md): the runtime's own line, never part of a run's or a call's output
    print(f"@sless:- {WHAT} {key} (sha256 {found}) unpacked into {dest} in {took:.0f} ms", file=sys.stderr, flush=True)
