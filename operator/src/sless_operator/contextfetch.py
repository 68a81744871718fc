"""``python -m sless_operator.contextfetch``: the init container of build and compile Jobs, and of the function
pods of Go and of dependency images (``fetch-code``).

Python and Node pods on their runtime's own image fetch their code in the runtime container instead
(``runtimes/python3.11/sless_fetch.py``, ``runtimes/nodejs20/sless-fetch.js``), which the function's code then
runs beside, so those fetchers take nothing from this package: they check archives as ``unpack`` does and give
its messages, which ``tests/runtimes/test_code_fetch.py`` holds them to, archive by archive.

It alone holds the S3 credentials of a build: it downloads one build context (a tar.gz the
API wrote, ``sless_core.buildcontext``) by key, checks its SHA-256 when the Function states
one, and unpacks it into an emptyDir that the kaniko container then reads as
``--context=dir://...``. kaniko runs the tenant's Dockerfile (``RUN pip install ...``) as root;
had it the S3 keys in its environment, a build step could read every tenant's code.

The archive is untrusted input, so unpacking is strict: only regular files and directories,
no absolute paths, ``..``, backslashes or duplicates, at most ``--max-entries`` entries and
``--max-bytes`` bytes (counted while writing, so a lying header does not help). Exit codes:
0 unpacked, 1 refused or failed (the reason is the termination message, which the operator
shows in the Function's status), 2 bad arguments.

Credentials come from the environment: ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``
(the build S3 Secret, ``SLESS_BUILD_S3_SECRET``). A function pod has none: ``--url-env`` names
the variable holding a URL the operator signed for exactly its code archive, and ``--sha256``
is then required (a pod never runs code other than the Function names).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, Protocol

from sless_operator import podstep

CHUNK = 1 << 16
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 20000


class FetchError(Exception):
    """The context cannot be used: missing, altered, too large or unsafe to unpack."""


@dataclass(frozen=True)
class Limits:
    """Bounds of one archive (archive bytes, unpacked bytes, entries), and what it is called in messages."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_entries: int = DEFAULT_MAX_ENTRIES
    what: str = "build context"


class ObjectSource(Protocol):
    """What is needed of an S3 client: the object's bytes, in chunks."""

    def chunks(self, bucket: str, key: str) -> Iterator[bytes]: ...


def download(source: ObjectSource, bucket: str, key: str, target: Path, sha256: str, limits: Limits) -> str:
    """Stream BUCKET/KEY into TARGET; returns its SHA-256 (which must equal SHA256 when that is given)."""
    digest = hashlib.sha256()
    size = 0
    with open(target, "wb") as out:
        for chunk in source.chunks(bucket, key):
            size += len(chunk)
            if size > limits.max_bytes:
                raise FetchError(f"{limits.what} {key} is larger than {limits.max_bytes} bytes")
            digest.update(chunk)
            out.write(chunk)
    found = digest.hexdigest()
    if sha256 and found != sha256.lower():
        raise FetchError(f"{limits.what} {key} has SHA-256 {found}, expected {sha256.lower()}")
    return found


def _member_path(name: str, what: str) -> PurePosixPath:
    """The member's relative path, or FetchError when it could land outside the destination."""
    if not name or "\\" in name or "\x00" in name or name.startswith("/"):
        raise FetchError(f"unsafe path in {what}: {name!r}")
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts or any(p == ".." for p in parts):
        raise FetchError(f"unsafe path in {what}: {name!r}")
    return PurePosixPath(*parts)


def _copy(source: IO[bytes], out: IO[bytes], budget: int, name: str, what: str) -> int:
    written = 0
    while chunk := source.read(CHUNK):
        written += len(chunk)
        if written > budget:
            raise FetchError(f"{what} unpacks to more than the limit (at {name})")
        out.write(chunk)
    return written


def unpack(archive: Path, dest: Path, limits: Limits) -> int:
    """Unpack the tar.gz ARCHIVE into the (empty or missing) folder DEST; returns the bytes written."""
    dest.mkdir(parents=True, exist_ok=True)
    seen: set[PurePosixPath] = set()
    total = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for count, member in enumerate(tar, start=1):
                if count > limits.max_entries:
                    raise FetchError(f"{limits.what} has more than {limits.max_entries} entries")
                rel = _member_path(member.name, limits.what)
                if rel in seen:
                    raise FetchError(f"duplicate entry in {limits.what}: {member.name!r}")
                seen.add(rel)
                path = dest.joinpath(*rel.parts)
                if member.isdir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isreg():
                    raise FetchError(f"{limits.what} entry {member.name!r} is not a regular file or directory")
                if member.size > limits.max_bytes - total:
                    raise FetchError(f"{limits.what} unpacks to more than {limits.max_bytes} bytes")
                path.parent.mkdir(parents=True, exist_ok=True)
                if path.is_symlink() or path.is_dir():
                    raise FetchError(f"{limits.what} entry {member.name!r} clashes with another entry")
                stream = tar.extractfile(member)
                if stream is None:
                    raise FetchError(f"{limits.what} entry {member.name!r} cannot be read")
                with stream, open(path, "xb") as out:
                    total += _copy(stream, out, limits.max_bytes - total, member.name, limits.what)
                path.chmod(0o755 if member.mode & 0o111 else 0o644)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FetchError(f"{limits.what} is not a readable tar.gz: {exc}") from exc
    return total


class MinioSource:
    """``ObjectSource`` over the minio client (any S3 server)."""

    def __init__(self, endpoint: str, region: str, access_key: str, secret_key: str) -> None:
        from minio import Minio  # imported here: the operator process itself never needs it

        # as the API reads SLESS_S3_ENDPOINT: host:port is plain HTTP, a URL's scheme decides, empty is AWS
        secure = endpoint.startswith("https://") or not endpoint
        host = endpoint.removeprefix("https://").removeprefix("http://").rstrip("/") or "s3.amazonaws.com"
        self.client = Minio(host, access_key=access_key, secret_key=secret_key, secure=secure, region=region or None)

    def chunks(self, bucket: str, key: str) -> Iterator[bytes]:
        from minio.error import S3Error

        try:
            response: Any = self.client.get_object(bucket, key)
        except S3Error as exc:
            raise FetchError(f"cannot read build context s3://{bucket}/{key}: {exc.code}") from exc
        try:
            yield from response.stream(CHUNK)
        finally:
            response.close()
            response.release_conn()


class UrlSource:
    """``ObjectSource`` over one signed URL: the object it was signed for, nothing else."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self.url = url
        self.timeout = timeout

    def chunks(self, bucket: str, key: str) -> Iterator[bytes]:
        import urllib.error
        import urllib.request

        if not self.url.startswith(("http://", "https://")):
            raise FetchError(f"cannot read {key}: the download URL is not http(s)")
        try:
            response = urllib.request.urlopen(self.url, timeout=self.timeout)  # noqa: S310  (scheme checked)
        except urllib.error.HTTPError as exc:
            why = {403: "access denied or the URL expired", 404: "no such object"}.get(exc.code, exc.reason)
            raise FetchError(f"cannot read {key}: HTTP {exc.code} ({why})") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FetchError(f"cannot read {key}: {exc}") from exc
        with response:
            while chunk := response.read(CHUNK):
                yield chunk


def fetch(source: ObjectSource, bucket: str, key: str, dest: Path, sha256: str, limits: Limits) -> str:
    """Download and unpack one context into DEST (the archive is removed afterwards); returns its SHA-256."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest.parent / f".{dest.name}.tar.gz"
    try:
        found = download(source, bucket, key, archive, sha256, limits)
        unpack(archive, dest, limits)
    except FetchError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    finally:
        archive.unlink(missing_ok=True)
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sless_operator.contextfetch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--endpoint", default="", help="S3 endpoint: host:port (plain HTTP) or URL; empty: AWS")
    parser.add_argument("--region", default="", help="S3 region")
    parser.add_argument("--bucket", default="", help="bucket (with S3 credentials)")
    parser.add_argument("--url-env", default="", help="environment variable holding a signed URL of the object")
    parser.add_argument("--what", default="build context", help="what the archive is called in messages")
    parser.add_argument("--key", required=True, help="object key of the tar.gz build context")
    parser.add_argument("--dest", required=True, type=Path, help="folder to unpack into (kaniko's dir:// context)")
    parser.add_argument("--sha256", default="", help="expected SHA-256 of the archive, when known")
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES, help="archive and unpacked size limit")
    parser.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES, help="entry count limit")
    return parser.parse_args(argv)




def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sha256 = args.sha256.strip().lower()
    if sha256 and (len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256)):
        podstep.report(f"--sha256 must be 64 hex digits, got {args.sha256!r}")
        return 2
    source: ObjectSource
    if args.url_env:
        url = os.environ.get(args.url_env, "")
        if not url or not sha256:
            podstep.report(f"{args.what}: --url-env needs ${args.url_env} set and --sha256")
            return 2
        source = UrlSource(url)
    elif args.bucket:
        source = MinioSource(args.endpoint, args.region, os.environ.get("AWS_ACCESS_KEY_ID", ""),
                             os.environ.get("AWS_SECRET_ACCESS_KEY", ""))  # fmt: skip
    else:
        podstep.report("either --bucket (with S3 credentials) or --url-env is required")
        return 2
    try:
        found = fetch(source, args.bucket, args.key, args.dest, sha256,
                      Limits(args.max_bytes, args.max_entries, args.what))  # fmt: skip
    except FetchError as exc:
        podstep.report(f"{args.what}: {exc}")
        return 1
    print(f"{args.what} {args.key} (sha256 {found}) unpacked into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
