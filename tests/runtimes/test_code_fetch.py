"""The Python and Node runtimes fetch their own code (``sless_fetch.py``, ``sless-fetch.js``) before loading it.

A real HTTP server on loopback stands in for S3's presigned GET (``s3_like``). Each hostile archive is refused
by both runtimes, server and runner, with exit code 3, the reason in the report file (the termination log in a
pod) word for word as ``contextfetch`` says it (the operator shows it), nothing left in the code directory and
the handler never loaded.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sless_operator import contextfetch
from tests.support.s3_like import GOOD_SIGNATURE, Objects, serving

FETCHING = ("python3.11", "nodejs20")
KEY = "code/sless-1111111111111111/fn/0001-ab.tar.gz"
EXIT_FETCH = 3

HANDLERS = {
    "handler.py": (
        "import os\n"
        "open(os.environ['SLESS_TEST_MARKER'], 'w').close()  # the handler was loaded\n"
        "HERE = os.path.dirname(os.path.abspath(__file__))\n"
        "def handle(event):\n"
        "    with open(os.path.join(HERE, 'sub', 'data.txt')) as f:\n"
        "        return {'url': os.environ.get('SLESS_CODE_URL'), 'data': f.read()}\n"
    ),
    "handler.js": (
        "const fs = require('fs');\nconst path = require('path');\n"
        "fs.writeFileSync(process.env.SLESS_TEST_MARKER, ''); // the handler was loaded\n"
        "exports.handle = async () => ({ url: process.env.SLESS_CODE_URL ?? null,\n"
        "  data: fs.readFileSync(path.join(__dirname, 'sub', 'data.txt'), 'utf8') });\n"
    ),
}


@pytest.fixture(scope="module")
def s3_like() -> Iterator[str]:
    with serving() as url:
        yield url


def tar_gz(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return raw.getvalue()


def entry(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, mode: int = 0o644, **fields: Any) -> Any:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, len(data) if kind == tarfile.REGTYPE else 0
    for k, v in fields.items():
        setattr(info, k, v)
    return info, data if kind == tarfile.REGTYPE else None


def good_members() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [*(entry(n, c.encode()) for n, c in HANDLERS.items()), entry("sub", kind=tarfile.DIRTYPE, mode=0o755),
            entry("sub/data.txt", b"data"), entry("sub/run.sh", b"#!/bin/sh\n", mode=0o755)]  # fmt: skip


GOOD = tar_gz(*good_members())
GOOD_SHA = hashlib.sha256(GOOD).hexdigest()


@pytest.fixture
def fetch_env(s3_like: str, tmp_path: Path) -> Callable[..., dict[str, str]]:
    """The variables the operator sets, for ARCHIVE served at a fresh path (or URL as given)."""

    def make(archive: bytes | None = GOOD, sha: str = "", url: str = "", **extra: str) -> dict[str, str]:
        path = f"/bucket/{KEY}-{time.monotonic_ns()}"
        if archive is not None:
            Objects.objects[path] = archive
        return {"SLESS_CODE_URL": url or f"{s3_like}{path}?{GOOD_SIGNATURE}", "SLESS_CODE_KEY": KEY,
                "SLESS_CODE_SHA256": sha or hashlib.sha256(archive or b"").hexdigest(),
                "SLESS_CODE_REPORT_FILE": str(tmp_path / "termination-log"),
                "SLESS_TEST_MARKER": str(tmp_path / "loaded"), **extra}  # fmt: skip

    return make


def code_dir(tmp_path: Path) -> Path:
    path = tmp_path / "function"
    path.mkdir(exist_ok=True)
    return path


@pytest.mark.parametrize("runtime", FETCHING)
def test_the_runner_and_the_server_fetch_their_code_then_load_it(
    runtime: str, tmp_path: Path, fetch_env: Callable[..., dict[str, str]], run_runner: Any, start_server: Any
) -> None:
    code = code_dir(tmp_path)
    done = run_runner(runtime, {}, code_dir=code, env=fetch_env())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"url": None, "data": "data"}  # the handler never sees the URL
    # the runtime's own line, tagged as no call's: a Kubernetes run's record leaves it out of the run's output
    assert f"@sless:- code archive {KEY} (sha256 {GOOD_SHA}) unpacked into" in done.stderr
    # read-only: files 0444 (0555 when executable), folders 0555
    modes = {p.relative_to(code).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in code.rglob("*")}
    assert modes == {"handler.py": 0o444, "handler.js": 0o444, "sub": 0o555, "sub/data.txt": 0o444,
                     "sub/run.sh": 0o555}  # fmt: skip

    # a restarted container finds the last start's read-only code in the volume: fetched afresh
    server = start_server(runtime, code_dir=code, env=fetch_env())
    conn = server.connection()
    conn.request("GET", "/")
    assert json.loads(conn.getresponse().read()) == {"url": None, "data": "data"}
    assert not (tmp_path / "termination-log").exists()


def _hostile() -> dict[str, tuple[bytes, dict[str, str], str]]:
    """name -> (archive, extra variables, the reason contextfetch gives)."""
    big = os.urandom(4096)
    return {
        "dotdot": (tar_gz(entry("../evil.py", b"x")), {}, "unsafe path in code archive: '../evil.py'"),
        "absolute": (tar_gz(entry("/etc/evil", b"x")), {}, "unsafe path in code archive: '/etc/evil'"),
        "backslash": (tar_gz(entry("a\\b", b"x")), {}, "unsafe path in code archive: 'a\\\\b'"),
        "symlink": (tar_gz(entry("link", kind=tarfile.SYMTYPE, linkname="/etc/passwd")), {},
                    "code archive entry 'link' is not a regular file or directory"),
        "hardlink": (tar_gz(entry("a", b"x"), entry("hard", kind=tarfile.LNKTYPE, linkname="a")), {},
                     "code archive entry 'hard' is not a regular file or directory"),
        "device": (tar_gz(entry("dev", kind=tarfile.CHRTYPE, devmajor=1, devminor=3)), {},
                   "code archive entry 'dev' is not a regular file or directory"),
        "fifo": (tar_gz(entry("pipe", kind=tarfile.FIFOTYPE)), {},
                 "code archive entry 'pipe' is not a regular file or directory"),
        "unpacks too large": (tar_gz(entry("zeros", bytes(100_000))), {"SLESS_CODE_MAX_BYTES": "20000"},
                              "code archive unpacks to more than 20000 bytes"),
        "too many entries": (tar_gz(*(entry(f"f{i}", b"x") for i in range(5))), {"SLESS_CODE_MAX_ENTRIES": "3"},
                             "code archive has more than 3 entries"),
        "duplicate": (tar_gz(entry("a.txt", b"1"), entry("./a.txt", b"2")), {},
                      "duplicate entry in code archive: './a.txt'"),
        "file over folder": (tar_gz(entry("d", kind=tarfile.DIRTYPE), entry("d/", b"x")), {},
                             "duplicate entry in code archive: 'd/'"),
        "download too large": (tar_gz(entry("noise", big)), {"SLESS_CODE_MAX_BYTES": "1000"},
                               f"code archive {KEY} is larger than 1000 bytes"),
    }  # fmt: skip


HOSTILE = _hostile()


def contextfetch_reason(archive: bytes, extra: dict[str, str], tmp_path: Path) -> str:
    """What ``contextfetch`` (the build Jobs' and Go pods' fetcher) says of the same archive."""
    limits = contextfetch.Limits(int(extra.get("SLESS_CODE_MAX_BYTES", 256 * 1024 * 1024)),
                                 int(extra.get("SLESS_CODE_MAX_ENTRIES", 20000)), "code archive")  # fmt: skip

    class Source:
        def chunks(self, bucket: str, key: str) -> Iterator[bytes]:
            yield archive

    with pytest.raises(contextfetch.FetchError) as refused:
        contextfetch.fetch(Source(), "", KEY, tmp_path / "ctx" / "function", hashlib.sha256(archive).hexdigest(),
                           limits)  # fmt: skip
    return str(refused.value)


def refused(runtime: str, tmp_path: Path, env: dict[str, str], run_runner: Any, spawn_server: Any) -> list[str]:
    """Run the runner, then the server, with ENV; both must exit 3 without loading anything. Their reports."""
    reports = []
    code = code_dir(tmp_path)
    done = run_runner(runtime, {}, code_dir=code, env=env)
    assert done.returncode == EXIT_FETCH, (done.stdout, done.stderr)
    assert done.stdout == ""
    reports.append((tmp_path / "termination-log").read_text())
    assert done.stderr.strip().endswith(reports[-1])
    (tmp_path / "termination-log").unlink()
    server = spawn_server(runtime, code_dir=code, env=env)
    assert server.proc.wait(timeout=30) == EXIT_FETCH, server.stderr
    reports.append((tmp_path / "termination-log").read_text())
    assert not (tmp_path / "loaded").exists(), "the handler was loaded"
    assert list(code.iterdir()) == [], "something was left unpacked"
    return reports


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize("runtime", FETCHING)
def test_a_hostile_archive_is_refused_with_contextfetchs_reason(
    runtime: str, case: str, tmp_path: Path, fetch_env: Callable[..., dict[str, str]], run_runner: Any,
    spawn_server: Any,
) -> None:  # fmt: skip
    archive, extra, reason = HOSTILE[case]
    code_dir(tmp_path)
    (code_dir(tmp_path) / "stale.py").write_text("left by the last start\n")
    assert contextfetch_reason(archive, extra, tmp_path) == reason
    reports = refused(runtime, tmp_path, fetch_env(archive, **extra), run_runner, spawn_server)
    assert reports == [f"code archive: {reason}"] * 2


@pytest.mark.parametrize("runtime", FETCHING)
def test_an_altered_missing_or_unsigned_archive_is_refused(
    runtime: str, tmp_path: Path, s3_like: str, fetch_env: Callable[..., dict[str, str]], run_runner: Any,
    spawn_server: Any,
) -> None:  # fmt: skip
    cases = {
        "altered": (fetch_env(GOOD, sha="0" * 64), f"code archive {KEY} has SHA-256 {GOOD_SHA}, expected {'0' * 64}"),
        "missing": (fetch_env(None, url=f"{s3_like}/bucket/none?{GOOD_SIGNATURE}", sha=GOOD_SHA),
                    f"cannot read {KEY}: HTTP 404 (no such object)"),
        "unsigned": (fetch_env(GOOD, url=f"{s3_like}/bucket/x?X-Amz-Signature=forged"),
                     f"cannot read {KEY}: HTTP 403 (access denied or the URL expired)"),
        "not http": (fetch_env(GOOD, url="file:///etc/passwd"), f"cannot read {KEY}: the download URL is not http(s)"),
        "no digest": (fetch_env(GOOD, sha="xyz"), "SLESS_CODE_SHA256 must be 64 hex digits, got 'xyz'"),
    }  # fmt: skip
    for name, (env, reason) in cases.items():
        reports = refused(runtime, tmp_path, env, run_runner, spawn_server)
        assert reports == [f"code archive: {reason}"] * 2, name


@pytest.mark.parametrize("runtime", FETCHING)
def test_an_archive_that_is_no_tar_gz_is_refused(
    runtime: str, tmp_path: Path, fetch_env: Callable[..., dict[str, str]], run_runner: Any, spawn_server: Any
) -> None:
    truncated = GOOD[: len(GOOD) // 2]
    for archive in (b"not the code", truncated):
        for report in refused(runtime, tmp_path, fetch_env(archive), run_runner, spawn_server):
            assert report.startswith("code archive: code archive is not a readable tar.gz: "), report
