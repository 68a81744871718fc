"""``python -m sless_operator.binaryupload``: the last step of a Go function's compile Job.

The ``compile`` step leaves ``server`` and ``runner`` (the same static binary, whose mode follows the
name it is started as) in ``--src``. This packs both into a tar.gz that ``contextfetch`` unpacks in
the function's pods (regular files only, so two copies rather than a link), writes it through a URL
the operator signed for exactly ``--key`` (a PUT: the pod holds no S3 credential and can write
nothing else), and leaves ``{"sha256": ..., "bytes": ...}`` as its termination message: the operator
puts that digest into the function's pods, which refuse any other bytes.

Exit codes: 0 uploaded, 1 failed (the reason is the termination message), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

from sless_operator import podstep

NAMES = ("server", "runner")
#: Fixed mtime of every entry: the same binary gives the same archive.
FIXED_MTIME = 946_684_800


class UploadError(Exception):
    """The binary cannot be packed or written."""


def pack(src: Path, max_bytes: int) -> bytes:
    """tar.gz bytes of SRC/server and SRC/runner (mode 0755, fixed owner and time)."""
    raw = io.BytesIO()
    total = 0
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in NAMES:
            path = src / name
            if not path.is_file() or path.is_symlink():
                raise UploadError(f"{path} is missing: the compile step left no binary")
            total += path.stat().st_size
            if total > max_bytes:
                raise UploadError(f"the binary is larger than {max_bytes} bytes")
            info = tarfile.TarInfo(name)
            info.mode, info.mtime, info.size = 0o755, FIXED_MTIME, path.stat().st_size
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    return raw.getvalue()


def put(url: str, data: bytes, timeout: float = 60.0) -> None:
    """PUT DATA to the signed URL."""
    if not url.startswith(("http://", "https://")):
        raise UploadError("the upload URL is not http(s)")
    # a content type of its own: with urllib's default (a form) some S3 servers read the body as a form
    request = urllib.request.Request(url, data=data, method="PUT",  # noqa: S310  (scheme checked)
                                     headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:  # noqa: S310  (scheme checked)
            resp.read()
    except urllib.error.HTTPError as exc:
        why = {403: "access denied or the URL expired"}.get(exc.code, exc.reason)
        raise UploadError(f"HTTP {exc.code} ({why})") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise UploadError(str(exc)) from exc




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sless_operator.binaryupload", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--src", required=True, type=Path, help="folder with server and runner")
    parser.add_argument("--url-env", required=True, help="environment variable holding the signed PUT URL")
    parser.add_argument("--key", required=True, help="the object key the URL is signed for (for messages)")
    parser.add_argument("--max-bytes", type=int, default=256 * 1024 * 1024, help="size limit of the binaries")
    args = parser.parse_args(argv)
    url = os.environ.get(args.url_env, "")
    if not url:
        podstep.report(f"binary upload: ${args.url_env} is not set")
        return 2
    try:
        data = pack(args.src, args.max_bytes)
        put(url, data)
    except UploadError as exc:
        podstep.report(f"binary upload to {args.key}: {exc}")
        return 1
    result = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    print(f"binary {args.key} uploaded ({len(data)} bytes)", file=sys.stderr)
    return podstep.succeed(result)


if __name__ == "__main__":
    sys.exit(main())
