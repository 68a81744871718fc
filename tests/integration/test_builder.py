"""The standalone builder against the real pip, npm and Go toolchains and registries.

Dependencies are tiny on purpose (six, is-number@7.0.0, github.com/google/uuid):
the tests check caching, failure classification and retries, not the registries.
Network faults are produced for real by a loopback package index that resets
or stalls connections (pointed to with PIP_INDEX_URL).
"""

from __future__ import annotations

import http.server
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sless_api.backends.standalone.builder import (
    BuildArtifact,
    Builder,
    BuildFailed,
    BuildRequest,
    find_runtimes_dir,
    is_transient,
    precompile_python_runtime,
    python_interpreter,
    toolchain_paths,
)
from sless_api.backends.standalone.host.sandbox import Sandbox, tenant_uid
from sless_api.backends.standalone.runner import run_once
from sless_core.buildcontext import code_tree_hash, make_build_context

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GO_SUM = (
    "github.com/google/uuid v1.6.0 h1:NIvaJDMOsjHA8n1jAhLSgzrAzy1Hgr+hNrb57e+94F0=\n"
    "github.com/google/uuid v1.6.0/go.mod h1:TIyPZe4MgqvfeYDBFedMoGGpEw/LqOeaOT+nhxU+yHo=\n"
)


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")


def _need_runtime_files(*rel: str) -> None:
    missing = [r for r in rel if not (REPO / "runtimes" / r).is_file()]
    if missing:
        pytest.skip(f"runtime files not written yet: {', '.join(missing)}")


class Log(list[str]):
    """Progress collector."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def has(self, fragment: str) -> bool:
        return any(fragment in line for line in self)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def builder(cache_dir: Path) -> Builder:
    """A builder with short backoff (Go uses this host's Go caches by default)."""
    return Builder(cache_dir, retry_delays=(0.2, 0.2))


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


PY_SIX = {
    "handler.py": """
        import six

        def handle(event):
            return {"six": six.__version__, "file": six.__file__}
    """,
    "requirements.txt": "six\n",
}

NODE_IS_NUMBER = {
    "handler.js": """
        const isNumber = require('is-number');
        exports.handle = async (event) => ({ five: isNumber(5), word: isNumber('x'),
          path: require.resolve('is-number') });
    """,
    "package.json": json.dumps({"name": "fn", "version": "1.0.0", "dependencies": {"is-number": "7.0.0"}}),
}

GO_UUID = {
    "go.mod": "module example.com/fn\n\ngo 1.23\n\nrequire github.com/google/uuid v1.6.0\n",
    "go.sum": GO_SUM,
    "handler.go": """
        package function

        import (
            "context"

            "github.com/google/uuid"
        )

        func Handle(ctx context.Context, event map[string]any) (any, error) {
            return map[string]any{"uuid": uuid.NewString(), "name": event["name"]}, nil
        }
    """,
}


def req(runtime: str, code: Path, entrypoint: str = "handler.handle", code_hash: str | None = None) -> BuildRequest:
    return BuildRequest(runtime, code, entrypoint, code_hash or f"hash-of-{code.name}")


# -- python ---------------------------------------------------------------------------------------


def test_python_without_requirements_has_no_deps_dir(builder: Builder, tmp_path: Path) -> None:
    code = write(tmp_path / "code", {"handler.py": "def handle(e):\n    return 1\n"})
    log = Log()
    art = builder.build(req("python3.11", code), log)
    assert art.deps_dir is None and art.bin_dir is None
    assert log.has("no requirements.txt")
    argv, env = art.server_command()
    assert argv[0] == str(python_interpreter())
    assert argv[-1] == str(find_runtimes_dir() / "python3.11" / "server.py")
    assert env["SLESS_CODE_DIR"] == str(code.resolve())
    assert env["SLESS_ENTRYPOINT"] == "handler.handle"
    assert "SLESS_DEPS_DIR" not in env


def test_python_deps_installed_then_cached(
    builder: Builder, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A platform secret must not reach pip (which runs package build scripts).
    monkeypatch.setenv("SLESS_JWT_SECRET", "platform-secret")
    first = write(tmp_path / "v1", PY_SIX)
    log1 = Log()
    art1 = builder.build(req("python3.11", first), log1)
    assert log1.has("installing dependencies (pip)...")
    assert art1.deps_dir is not None and (art1.deps_dir / "six.py").is_file()
    assert art1.deps_dir.is_relative_to(cache_dir)
    assert art1.server_command()[1]["SLESS_DEPS_DIR"] == str(art1.deps_dir)
    assert "SLESS_JWT_SECRET" not in art1.server_command()[1]

    # New code, same manifest, a fresh Builder over the same cache: no install runs.
    second = write(tmp_path / "v2", {**PY_SIX, "handler.py": "def handle(e):\n    return 2\n"})
    log2 = Log()
    started = time.monotonic()
    art2 = Builder(cache_dir).build(req("python3.11", second), log2)
    assert time.monotonic() - started < 5
    assert art2.deps_dir == art1.deps_dir
    assert log2.has("dependencies: cached")
    assert not log2.has("installing")

    # A different manifest is a different entry.
    third = write(tmp_path / "v3", {**PY_SIX, "requirements.txt": "six\n# pinned later\n"})
    art3 = builder.build(req("python3.11", third), Log())
    assert art3.deps_dir != art1.deps_dir
    assert not list((cache_dir / "tmp").iterdir()), "staging dirs must not be left behind"


def test_python_deps_reach_the_function(builder: Builder, tmp_path: Path) -> None:
    _need_runtime_files("python3.11/runner.py")
    art = builder.build(req("python3.11", write(tmp_path / "code", PY_SIX)), Log())
    result = run_once(art, {}, 30)
    assert result.ok, result.output
    assert json.loads(result.output)["file"].startswith(str(art.deps_dir))


def test_bad_requirement_fails_fast_with_pips_message(builder: Builder, cache_dir: Path, tmp_path: Path) -> None:
    code = write(tmp_path / "code", {"handler.py": "", "requirements.txt": "sless-no-such-package-4242==1.0\n"})
    log = Log()
    with pytest.raises(BuildFailed) as info:
        builder.build(req("python3.11", code), log)
    tail = info.value.log_tail
    assert "No matching distribution found for sless-no-such-package-4242" in tail
    assert len(tail.splitlines()) <= 50
    assert not log.has("retrying"), "a bad package name is not a network error"
    assert not (cache_dir / "deps" / "python3.11").exists() or not any((cache_dir / "deps" / "python3.11").iterdir())
    assert not list((cache_dir / "tmp").iterdir())


def test_concurrent_builds_of_one_key_install_once(cache_dir: Path, tmp_path: Path) -> None:
    codes = [write(tmp_path / f"c{i}", PY_SIX) for i in range(2)]
    logs = [Log(), Log()]
    results: list[BuildArtifact | BaseException] = [RuntimeError("not run")] * 2

    def build(i: int) -> None:
        try:
            results[i] = Builder(cache_dir).build(req("python3.11", codes[i]), logs[i])
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=build, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    arts = [r for r in results if isinstance(r, BuildArtifact)]
    assert len(arts) == 2, results
    assert arts[0].deps_dir == arts[1].deps_dir
    assert arts[0].deps_dir is not None and (arts[0].deps_dir / "six.py").is_file()
    installs = sum(log.has("installing dependencies") for log in logs)
    cached = sum(log.has("dependencies: cached") for log in logs)
    assert (installs, cached) == (1, 1), logs


# -- network faults (a real loopback index) ---------------------------------------------------------


class FlakyIndex:
    """A PEP 503 index for one wheel that resets connections while ``failing`` is set."""

    def __init__(self, wheel: Path) -> None:
        self.failing = True
        self.requests = 0
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                index.requests += 1
                if index.failing:
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if self.path.startswith("/files/"):
                    body = wheel.read_bytes()
                    ctype = "application/octet-stream"
                else:
                    body = f'<html><body><a href="/files/{wheel.name}">{wheel.name}</a></body></html>'.encode()
                    ctype = "text/html"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def six_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "six", "--no-deps", "--only-binary=:all:", "-d", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return next(out.glob("six-*.whl"))


@pytest.fixture
def flaky_index(six_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FlakyIndex]:
    index = FlakyIndex(six_wheel)
    monkeypatch.setenv("PIP_INDEX_URL", index.url)
    monkeypatch.setenv("PIP_RETRIES", "1")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    yield index
    index.close()


def test_network_failure_is_retried_then_succeeds(flaky_index: FlakyIndex, cache_dir: Path, tmp_path: Path) -> None:
    def progress(line: str) -> None:
        log(line)
        if "attempt 3/3" in line:  # the last attempt finds the index healthy again
            flaky_index.failing = False

    log = Log()
    builder = Builder(cache_dir, retry_delays=(0.2, 0.5))
    art = builder.build(req("python3.11", write(tmp_path / "code", PY_SIX)), progress)
    assert art.deps_dir is not None and (art.deps_dir / "six.py").is_file()
    assert sum("retrying" in line for line in log) == 2, log


def test_persistent_network_failure_gives_up_after_two_retries(
    flaky_index: FlakyIndex, cache_dir: Path, tmp_path: Path
) -> None:
    log = Log()
    with pytest.raises(BuildFailed) as info:
        Builder(cache_dir, retry_delays=(0.1, 0.1)).build(req("python3.11", write(tmp_path / "c", PY_SIX)), log)
    assert sum("retrying" in line for line in log) == 2, log
    assert is_transient(info.value.log_tail)
    assert flaky_index.requests >= 3


def test_stalled_tool_is_killed_at_the_timeout(
    cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A listener that never accepts: connections complete, requests never get an answer.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{silent.getsockname()[1]}/simple")
        monkeypatch.setenv("PIP_TIMEOUT", "300")
        monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
        started = time.monotonic()
        with pytest.raises(BuildFailed) as info:
            Builder(cache_dir, timeout_sec=3).build(req("python3.11", write(tmp_path / "c", PY_SIX)), Log())
        elapsed = time.monotonic() - started
    assert "pip timed out after 3s" in info.value.log_tail
    assert elapsed < 60


# -- node -----------------------------------------------------------------------------------------


def test_node_deps_installed_cached_and_resolved(builder: Builder, cache_dir: Path, tmp_path: Path) -> None:
    _need("npm")
    log = Log()
    art = builder.build(req("nodejs20", write(tmp_path / "v1", NODE_IS_NUMBER)), log)
    assert log.has("installing dependencies (npm)...")
    assert art.deps_dir is not None and art.deps_dir.name == "node_modules"
    assert (art.deps_dir / "is-number" / "package.json").is_file()
    assert json.loads((art.deps_dir / "is-number" / "package.json").read_text())["version"] == "7.0.0"

    log2 = Log()
    art2 = builder.build(req("nodejs20", write(tmp_path / "v2", NODE_IS_NUMBER)), log2)
    assert art2.deps_dir == art.deps_dir and log2.has("dependencies: cached")
    assert not log2.has("installing")

    _need_runtime_files("nodejs20/runner.js")
    result = run_once(art2, {}, 30)
    assert result.ok, result.output
    out = json.loads(result.output)
    assert out["five"] is True and out["word"] is False
    assert out["path"].startswith(str(art.deps_dir))


def test_node_unknown_package_fails_fast(builder: Builder, tmp_path: Path) -> None:
    _need("npm")
    manifest = json.dumps({"name": "fn", "version": "1.0.0", "dependencies": {"sless-no-such-package-4242": "1.0.0"}})
    code = write(tmp_path / "c", {"handler.js": "", "package.json": manifest})
    log = Log()
    with pytest.raises(BuildFailed) as info:
        builder.build(req("nodejs20", code), log)
    assert "E404" in info.value.log_tail
    assert "sless-no-such-package-4242" in info.value.log_tail
    assert not log.has("retrying")


def test_node_without_package_json_has_no_deps_dir(builder: Builder, tmp_path: Path) -> None:
    art = builder.build(req("nodejs20", write(tmp_path / "c", {"handler.js": ""})), Log())
    assert art.deps_dir is None
    argv, _env = art.runner_command()
    assert argv[-1].endswith("nodejs20/runner.js")


# -- go -------------------------------------------------------------------------------------------


def test_go_build_with_module_dependency_then_cached(builder: Builder, tmp_path: Path) -> None:
    _need("go")
    _need_runtime_files("go1.23/build.sh")
    code = write(tmp_path / "c", GO_UUID)
    log = Log()
    art = builder.build(req("go1.23", code, "Handle", "go-v1"), log)
    assert log.has("compiling (go)...")
    assert art.bin_dir is not None
    assert (art.bin_dir / "server").is_file() and (art.bin_dir / "runner").is_file()
    assert art.server_command()[0] == [str(art.bin_dir / "server")]

    result = run_once(art, {"name": "gopher"}, 30)
    assert result.ok, result.output
    out = json.loads(result.output)
    assert out["name"] == "gopher" and len(out["uuid"]) == 36

    log2 = Log()
    art2 = builder.build(req("go1.23", code, "Handle", "go-v1"), log2)
    assert art2.bin_dir == art.bin_dir and log2.has("binary: cached")
    assert not log2.has("compiling")


def test_go_compile_error_names_file_and_line(builder: Builder, cache_dir: Path, tmp_path: Path) -> None:
    _need("go")
    _need_runtime_files("go1.23/build.sh")
    broken = """
        package function

        import "context"

        func Handle(ctx context.Context, event map[string]any) (any, error) {
            return undefinedThing, nil
        }
    """
    code = write(tmp_path / "c", {"handler.go": broken})
    log = Log()
    with pytest.raises(BuildFailed) as info:
        builder.build(req("go1.23", code, "Handle", "broken"), log)
    assert "handler.go:7:" in info.value.log_tail, info.value.log_tail
    assert "undefinedThing" in info.value.log_tail
    assert not log.has("retrying")
    assert not (cache_dir / "bin" / "go1.23").exists() or not any((cache_dir / "bin" / "go1.23").iterdir())


def test_runtimes_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SLESS_RUNTIMES_DIR", str(tmp_path))
    assert find_runtimes_dir() == tmp_path
    art = BuildArtifact("nodejs20", tmp_path, None, None, "handler.handle", "h")
    assert art.server_command()[0][-1] == str(tmp_path / "nodejs20" / "server.js")
    monkeypatch.delenv("SLESS_RUNTIMES_DIR")
    assert find_runtimes_dir() == REPO / "runtimes"


# -- build context (shared with the Kubernetes backend) --------------------------------------------


def _context_members(data: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = {}
        for info in tar.getmembers():
            handle = tar.extractfile(info) if info.isfile() else None
            out[info.name] = (info, handle.read() if handle else b"")
        return out


def _dockerfile(data: bytes) -> str:
    return _context_members(data)["Dockerfile"][1].decode()


def test_build_context_is_deterministic(tmp_path: Path) -> None:
    files = {**PY_SIX, "sub/data.txt": "payload\n", "run.sh": "#!/bin/sh\necho hi\n"}
    a = write(tmp_path / "a", {})
    (a / "sub").mkdir()
    write(a, files)
    (a / "run.sh").chmod(0o755)
    first = make_build_context(a, "python3.11", "handler.handle", "sless/python3.11:1")
    time.sleep(1.1)  # the scenario: time passes (mtimes and a gzip header time a second later must not show)
    b = write(tmp_path / "elsewhere" / "b", {})  # other path, other mtimes, other umask bits
    (b / "sub").mkdir()
    write(b, files)
    (b / "run.sh").chmod(0o700)
    (b / "handler.py").chmod(0o600)
    assert make_build_context(a, "python3.11", "handler.handle", "sless/python3.11:1") == first
    assert make_build_context(b, "python3.11", "handler.handle", "sless/python3.11:1") == first
    assert code_tree_hash(a) == code_tree_hash(b)


def test_build_context_contents(tmp_path: Path) -> None:
    code = write(tmp_path / "c", {})
    (code / "sub").mkdir()
    write(code, {**PY_SIX, "sub/data.txt": "payload\n", "Dockerfile": "FROM evil\n"})
    members = _context_members(make_build_context(code, "python3.11", "handler.handle", "sless/python3.11:1"))
    names = list(members)
    assert names == sorted(names)
    assert set(names) == {
        "Dockerfile",
        "function",
        "function/Dockerfile",
        "function/handler.py",
        "function/requirements.txt",
        "function/sub",
        "function/sub/data.txt",
    }
    assert members["function/sub/data.txt"][1] == b"payload\n"
    assert members["function/Dockerfile"][1] == b"FROM evil\n"  # the user's file, not ours
    for info, _data in members.values():
        assert (info.uid, info.gid, info.uname, info.gname) == (0, 0, "", "")
        assert info.mtime == members["Dockerfile"][0].mtime
        assert info.mode in (0o644, 0o755)


def test_python_dockerfile_layers(tmp_path: Path) -> None:
    v1 = write(tmp_path / "v1", PY_SIX)
    df1 = _dockerfile(make_build_context(v1, "python3.11", "main.run", "sless/python3.11:1"))
    lines = df1.splitlines()
    assert lines[1] == "FROM sless/python3.11:1"
    install = next(i for i, line in enumerate(lines) if "pip install" in line)
    label = next(i for i, line in enumerate(lines) if line.startswith("LABEL dev.sless.code-hash="))
    copy_code = lines.index("COPY function/ /app/function/")
    assert lines[install - 1] == "COPY function/requirements.txt /app/manifest/requirements.txt"
    assert install < label < copy_code, "deps before the code hash, code after it"
    assert code_tree_hash(v1) in lines[label]
    assert "ENV SLESS_DEPS_DIR=/app/deps" in lines
    assert 'SLESS_ENTRYPOINT="main.run"' in df1
    assert lines[-1] == "USER 1000:1000"

    # A code-only change: every line up to the label (the dependency layers) is unchanged.
    v2 = write(tmp_path / "v2", {**PY_SIX, "handler.py": "def handle(e):\n    return 2\n"})
    df2 = _dockerfile(make_build_context(v2, "python3.11", "main.run", "sless/python3.11:1"))
    assert df2.splitlines()[:label] == lines[:label]
    assert df2.splitlines()[label] != lines[label]

    bare = write(tmp_path / "bare", {"handler.py": ""})
    assert "pip" not in _dockerfile(make_build_context(bare, "python3.11", "handler.handle", "img"))
    own = _dockerfile(make_build_context(bare, "python3.11", "handler.handle", "img", code_hash="abc123"))
    assert 'dev.sless.code-hash="abc123"' in own


def test_node_and_go_dockerfiles(tmp_path: Path) -> None:
    node = write(tmp_path / "node", NODE_IS_NUMBER)
    df = _dockerfile(make_build_context(node, "nodejs20", "handler.handle", "sless/nodejs20:1"))
    assert "COPY function/package.json /app/deps/" in df
    assert "npm install --omit=dev" in df and "ENV SLESS_DEPS_DIR=/app/deps/node_modules" in df
    (node / "package-lock.json").write_text("{}")
    df = _dockerfile(make_build_context(node, "nodejs20", "handler.handle", "sless/nodejs20:1"))
    assert "COPY function/package.json function/package-lock.json /app/deps/" in df
    assert "WORKDIR" not in df  # the base image's CMD is relative to its WORKDIR

    go = write(tmp_path / "go", GO_UUID)
    lines = _dockerfile(make_build_context(go, "go1.23", "Handle", "sless/go1.23:1")).splitlines()
    download = lines.index("RUN cd /app/manifest && go mod download all")
    label = next(i for i, line in enumerate(lines) if line.startswith("LABEL "))
    build = lines.index("RUN /app/runtime/build.sh /app/function /app/bin")
    assert lines[download - 1] == "COPY function/go.mod function/go.sum /app/manifest/"
    assert download < label < lines.index("COPY function/ /app/function/") < build
    assert next(i for i, line in enumerate(lines) if "SLESS_ENTRYPOINT" in line) < build
    # two stages: the function image holds the binary only, no Go toolchain, as a non-root user
    stages = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    assert lines[stages[0]] == "FROM sless/go1.23:1 AS build" and len(stages) == 2 and stages[1] > build
    final = lines[stages[1]:]
    assert "COPY --from=build /app/bin /app/bin" in final and 'CMD ["/app/bin/server"]' in final
    assert final[-1].startswith("USER ") and not final[-1].startswith("USER root")
    assert lines[stages[1]] == "FROM gcr.io/distroless/static-debian12:nonroot"
    own = _dockerfile(make_build_context(go, "go1.23", "Handle", "sless/go1.23:1",
                                         go_run_image="registry.local:5000/static:1")).splitlines()
    assert [line for line in own if line.startswith("FROM ")][1] == "FROM registry.local:5000/static:1"
    with pytest.raises(ValueError):
        make_build_context(go, "go1.23", "Handle", "sless/go1.23:1", go_run_image="x\nRUN curl evil")


def test_build_context_refuses_unsafe_input(tmp_path: Path) -> None:
    code = write(tmp_path / "c", {"handler.py": ""})
    with pytest.raises(ValueError, match="base_image"):
        make_build_context(code, "python3.11", "handler.handle", "img\nRUN curl evil")
    with pytest.raises(ValueError, match="entrypoint"):
        make_build_context(code, "python3.11", "handler.handle\nRUN x", "img")
    with pytest.raises(ValueError, match="runtime"):
        make_build_context(code, "ruby", "handler.handle", "img")
    (code / "link").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="symlink"):
        make_build_context(code, "python3.11", "handler.handle", "img")


# -- sandboxed installs ---------------------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids need root")
def test_sandboxed_install_is_per_tenant_sees_only_its_code_and_is_sealed(cache_dir: Path, tmp_path: Path) -> None:
    sandbox = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    try:
        _sandboxed_installs(Builder(cache_dir, sandbox=sandbox), tmp_path)
    finally:
        sandbox.close()


def _sandboxed_installs(sandboxed: Builder, tmp_path: Path) -> None:
    code = write(tmp_path / "code", PY_SIX)
    art_a = sandboxed.build(BuildRequest("python3.11", code, "handler.handle", "h1", tenant="tenant-a"), Log())
    assert art_a.deps_dir is not None and (art_a.deps_dir / "six.py").is_file()
    # Installed as the tenant, then handed back to the platform's user: the tenant cannot change it later.
    assert (art_a.deps_dir / "six.py").stat().st_uid == os.getuid()
    assert art_a.deps_dir.stat().st_uid == os.getuid()
    # The same manifest of another tenant is another entry: one tenant's install never feeds another's.
    art_b = sandboxed.build(BuildRequest("python3.11", code, "handler.handle", "h1", tenant="tenant-b"), Log())
    assert art_b.deps_dir is not None and art_b.deps_dir != art_a.deps_dir

    # pip, run by the tenant's manifest, cannot read a file outside the function's code.
    outside = tmp_path / "outside" / "more.txt"
    outside.parent.mkdir()
    outside.write_text("six\n")
    peeking = write(tmp_path / "peek", {"handler.py": "", "requirements.txt": f"-r {outside}\n"})
    with pytest.raises(BuildFailed) as info:
        sandboxed.build(BuildRequest("python3.11", peeking, "handler.handle", "h2", tenant="tenant-a"), Log())
    assert "more.txt" in info.value.log_tail
    # Unsandboxed, the same manifest reads it: the failure above is the sandbox's doing.
    plain = Builder(tmp_path / "plain-cache").build(
        BuildRequest("python3.11", peeking, "handler.handle", "h2", tenant="tenant-a"), Log())
    assert plain.deps_dir is not None and (plain.deps_dir / "six.py").is_file()


GO_ECHO = {"handler.go": """
    package function

    import "context"

    func Handle(ctx context.Context, event map[string]any) (any, error) { return event, nil }
"""}


@pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids need root")
def test_sandboxed_go_builds_are_per_tenant_with_caches_seeded_read_only(cache_dir: Path, tmp_path: Path) -> None:
    """A Go build is tenant code: it runs as the tenant in the tenant's own caches, whose compiled standard
    library comes from the platform's seed as links the tenant can read but not change; the same code of two
    tenants gives two binaries, each handed back to the platform's user."""
    _need("go")
    _need_runtime_files("go1.23/build.sh")
    sandbox = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    try:
        builder = Builder(cache_dir, sandbox=sandbox)
        code = write(tmp_path / "code", GO_ECHO)
        arts = [builder.build(BuildRequest("go1.23", code, "Handle", "g1", tenant=t), Log()) for t in ("ta", "tb")]
    finally:
        sandbox.close()
    bins = [art.bin_dir for art in arts]
    assert bins[0] is not None and bins[1] is not None and bins[0] != bins[1]
    assert all((b / "server").stat().st_uid == os.getuid() for b in bins if b is not None)
    caches = sorted((cache_dir / "go").iterdir(), key=lambda c: c.stat().st_uid)
    assert sorted(c.stat().st_uid for c in caches) == sorted([tenant_uid("ta"), tenant_uid("tb")])
    seeded = [p for p in (caches[0] / "build").rglob("*-d") if p.stat().st_nlink > 1]
    assert seeded, "the tenant's build cache holds no object of the seed"
    for obj in seeded[:20]:
        info = obj.stat()
        assert info.st_uid == os.getuid() and info.st_mode & 0o222 == 0, obj
    result = run_once(arts[0], {"go": "jailed"}, 30)
    assert result.ok and json.loads(result.output)["go"] == "jailed", result.output


def _runtime_copy(root: Path) -> Path:
    folder = root / "runtimes" / "python3.11"
    folder.mkdir(parents=True)
    for name in ("server.py", "sless_server.py", "sless_runtime.py", "sless_stream.py", "sless_ws.py", "runner.py"):
        shutil.copy(REPO / "runtimes" / "python3.11" / name, folder / name)
    return folder


def test_python_runtime_is_precompiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Function processes cannot write bytecode (PYTHONDONTWRITEBYTECODE, a read-only folder in the sandbox):
    the platform compiles the runtime's modules once, and a start then loads them from __pycache__."""
    _need_runtime_files("python3.11/sless_server.py")
    folder = _runtime_copy(tmp_path)
    monkeypatch.setenv("SLESS_RUNTIMES_DIR", str(folder.parent))
    assert precompile_python_runtime() is None
    cached = sorted(p.name for p in (folder / "__pycache__").iterdir())
    assert cached == ["sless_runtime.cpython-311.pyc", "sless_server.cpython-311.pyc", "sless_stream.cpython-311.pyc",
                      "sless_ws.cpython-311.pyc"]
    script = f"import sys; sys.path.insert(0, {str(folder)!r}); import sless_server"
    probe = subprocess.run(
        [str(python_interpreter()), "-S", "-v", "-c", script], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}, check=True)
    for module in ("sless_server", "sless_runtime", "sless_stream", "sless_ws"):
        assert f"code object from '{folder}/__pycache__/{module}.cpython-311.pyc'" in probe.stderr


def test_python_runtime_precompile_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need_runtime_files("python3.11/sless_server.py")
    folder = _runtime_copy(tmp_path)
    (folder / "__pycache__").write_text("not a folder")  # py_compile cannot write below it
    monkeypatch.setenv("SLESS_RUNTIMES_DIR", str(folder.parent))
    reason = precompile_python_runtime()
    assert reason and "__pycache__" in reason
    empty = tmp_path / "empty" / "python3.11"
    empty.mkdir(parents=True)
    monkeypatch.setenv("SLESS_RUNTIMES_DIR", str(empty.parent))
    assert precompile_python_runtime() == f"no runtime modules in {empty}"
