"""Local build step of the standalone backend: dependencies and Go binaries, cached by hash.

A deploy must not reinstall dependencies when only the code changed, so every
dependency set lives in a directory keyed by the sha256 of its manifest
(``requirements.txt``, ``package.json`` + ``package-lock.json``); Go compiles the
user's code and its modules into one binary, so its output is keyed by code hash
and entrypoint instead, while the module download cache and build cache are
shared by all Go builds.

Every cache entry is built in a staging directory on the same file system and
renamed into place under an exclusive lock file, so a crash leaves no half
entry and two concurrent builds of the same key never see each other's work:
the second one waits for the lock and then finds the entry ready.

With a sandbox (sandbox.py), every build step is tenant code: a dependency
install runs setup.py and npm install scripts, and a Go build reads whatever
the upload names (an assembler ``#include`` of an absolute path, a ``replace``
into another folder) and quotes it back in its error messages. So both run
jailed like the function itself: as the tenant's uid, seeing only the
toolchain, the code, its staging directory and (Go) the tenant's own module
and build caches; their cache entries are keyed by tenant as well, so one
tenant's build can never plant files that another tenant's function runs.
A tenant's Go build cache starts as hard links to a seed the platform compiled
from its own wrapper alone (read-only to tenants), so the standard library is
not compiled again for every tenant.

Build tools see an allow-list of the host's environment (locale, proxies, CA
bundles, the operator's pip/npm/Go settings): nothing else the platform's
process holds (database URLs, cloud credentials) reaches an install script.

The builder is synchronous; the standalone backend calls it from a worker thread.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from sless_api import metrics
from sless_api.backends.standalone.host.process import kill_group, set_parent_death_signal
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Prepared, Sandbox, tenant_uid
from sless_core import rebuild

Progress = Callable[[str], None]

PYTHON = "python3.11"
NODE = "nodejs20"
GO = "go1.23"

#: Bumped when the cache layout changes, so old entries are never misread.
CACHE_FORMAT = "1"
#: Memory (MB) and private /tmp size of a sandboxed dependency install (pip builds wheels in /tmp).
BUILD_MEMORY_MB = 2048
BUILD_TMP_MB = 1024
#: Lines of the build log kept in BuildFailed (the Function's status message).
LOG_TAIL_LINES = 50
#: Environment variables of the platform process that functions and build tools may see.
#: Anything else (SLESS_* secrets, database URLs) stays out of their environment.
_PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR")
#: Host variables build tools may see besides _PASSED_ENV: where to reach package registries (proxies,
#: CA bundles, the operator's own pip/npm/Go settings) and where the host keeps its Go caches.
_TOOL_ENV = frozenset({
    *_PASSED_ENV, "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "all_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "XDG_CACHE_HOME",
    "GOPROXY", "GOSUMDB", "GOPRIVATE", "GONOPROXY", "GONOSUMDB", "GOINSECURE", "GOVCS", "GOFLAGS", "GOROOT",
    "GOPATH", "GOCACHE", "GOMODCACHE",
})
_TOOL_ENV_PREFIXES = ("LC_", "PIP_", "npm_config_", "NPM_CONFIG_")
#: Memory, processes, file size and private /tmp of every sandboxed build step (pip builds wheels in /tmp,
#: go build keeps its work folder there).
# nproc: RLIMIT_NPROC counts every task of the tenant's uid, its functions' threads (up to SLESS_SANDBOX_NPROC's
# default) included, so a build beside a busy function can still fork
BUILD_LIMITS = Limits(memory_mb=BUILD_MEMORY_MB, nproc=1280, fsize_mb=1024, tmp_mb=BUILD_TMP_MB)
#: The Go function that seeds the tenants' build caches: the platform's wrapper with an empty handler.
_GO_SEED_FUNCTION = """package function

import "context"

func Handle(ctx context.Context, event map[string]any) (any, error) { return nil, nil }
"""

#: Build-log phrases that mean "the network failed", not "the request is wrong".
#: pip prints "No matching distribution" both for a bad name and after network
#: retries, so a network phrase anywhere in the log wins.
_TRANSIENT = re.compile(
    "|".join(
        [
            r"connection (?:reset|refused|aborted|broken)",
            r"ConnectionResetError",
            r"RemoteDisconnected",
            r"IncompleteRead",
            r"Read timed out",
            r"ReadTimeoutError",
            r"ConnectTimeoutError",
            r"NewConnectionError",
            r"Max retries exceeded",
            r"WARNING: Retrying \(Retry\(",  # pip's own retries: only network errors cause them
            r"Temporary failure in name resolution",
            r"\b(?:ECONNRESET|ECONNREFUSED|ETIMEDOUT|EAI_AGAIN|ESOCKETTIMEDOUT|ERR_SOCKET_TIMEOUT)\b",
            r"socket hang up",
            r"npm (?:ERR!|error) network",
            r"\bE(?:429|500|502|503|504)\b",
            r"\b(?:429 Too Many Requests|500 Internal Server Error|502 Bad Gateway|503 Service Unavailable"
            r"|504 Gateway Time-?out)\b",
            r"i/o timeout",
            r"TLS handshake timeout",
            r"unexpected EOF",
        ]
    ),
    re.IGNORECASE,
)


class BuildFailed(Exception):
    """A build that cannot succeed as is; ``log_tail`` says why (last ~50 log lines)."""

    def __init__(self, log_tail: str) -> None:
        super().__init__(log_tail)
        self.log_tail = log_tail


@dataclass(frozen=True)
class BuildRequest:
    """What to build: unpacked code of one function version."""

    runtime: str
    code_dir: Path
    entrypoint: str
    code_hash: str
    #: The tenant (namespace) the code belongs to: the sandbox's user and part of the deps cache key.
    tenant: str = ""


@dataclass(frozen=True)
class BuildArtifact:
    """A built function version: everything needed to start its server or runner."""

    runtime: str
    code_dir: Path
    deps_dir: Path | None
    bin_dir: Path | None
    entrypoint: str
    code_hash: str

    def server_command(self) -> tuple[list[str], dict[str, str]]:
        """argv and the complete environment of the HTTP server process.

        The environment is complete on purpose: callers add PORT, SLESS_HOST,
        SLESS_TIMEOUT_SEC and the function's own variables, but must not merge
        the platform's environment in (it holds secrets).
        """
        return self._command("server"), self.environment()

    def runner_command(self) -> tuple[list[str], dict[str, str]]:
        """argv and the complete environment of the one-shot runner (see server_command)."""
        return self._command("runner"), self.environment()

    def jail(self, tenant: str, limits: Limits) -> JailSpec:
        """The sandbox of this version's processes: its code, dependencies and binary, read-only."""
        paths = [p for p in (self.code_dir, self.deps_dir, self.bin_dir) if p is not None]
        return JailSpec(tenant=tenant, limits=limits, ro_binds=tuple(paths))

    def environment(self) -> dict[str, str]:
        """The contract's variables plus the few host variables a process needs to work."""
        env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
        env["SLESS_CODE_DIR"] = str(self.code_dir)
        env["SLESS_ENTRYPOINT"] = self.entrypoint
        if self.deps_dir is not None:
            env["SLESS_DEPS_DIR"] = str(self.deps_dir)
        return env

    def _command(self, kind: str) -> list[str]:
        if self.runtime == PYTHON:
            # -S: no site-packages of the host interpreter, so a function sees the
            # standard library, its code and its deps dir, exactly as in its image.
            return [str(python_interpreter()), "-S", str(find_runtimes_dir() / PYTHON / f"{kind}.py")]
        if self.runtime == NODE:
            return [node_binary(), str(find_runtimes_dir() / NODE / f"{kind}.js")]
        if self.runtime == GO:
            if self.bin_dir is None:
                raise ValueError("a Go artifact needs bin_dir")
            return [str(self.bin_dir / kind)]
        raise ValueError(f"unknown runtime {self.runtime!r}")


def find_runtimes_dir() -> Path:
    """The repository's ``runtimes/`` folder: $SLESS_RUNTIMES_DIR, else found above this package."""
    override = os.environ.get("SLESS_RUNTIMES_DIR")
    if override:
        return Path(override)
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "runtimes"
        if (candidate / PYTHON).is_dir() or (candidate / NODE).is_dir():
            return candidate
    raise RuntimeError("cannot find the runtimes/ folder; set SLESS_RUNTIMES_DIR")


def python_interpreter() -> Path:
    """The Python 3.11 that runs functions and installs their dependencies.

    $SLESS_PYTHON wins. Otherwise the interpreter behind this process when it is
    3.11: its base executable, not the virtualenv's (platform packages must not
    leak into functions) and not a pyenv shim (which adds ~100 ms per start).
    Failing that, python3.11 from PATH, then this interpreter.
    """
    override = os.environ.get("SLESS_PYTHON")
    if override:
        return Path(override)
    if sys.version_info[:2] == (3, 11):
        return Path(getattr(sys, "_base_executable", "") or sys.executable)
    found = shutil.which("python3.11")
    return Path(found) if found else Path(sys.executable)


#: The Python runtime's modules (server.py and runner.py are scripts: Python never loads a script's bytecode).
PYTHON_RUNTIME_MODULES = ("sless_runtime.py", "sless_server.py", "sless_stream.py", "sless_ws.py")


def precompile_python_runtime() -> str | None:
    """Compile the Python runtime's modules into its ``__pycache__``, with the interpreter that runs functions.

    Function processes run with PYTHONDONTWRITEBYTECODE and, sandboxed, see the runtimes folder read-only:
    without this, every cold start compiled the server's thousand-odd lines again (tens of milliseconds on
    a busy machine). Only the platform's own files are compiled, by the platform's user; a tenant cannot
    write there. Returns why it failed (e.g. a read-only install): cold starts are then only slower.
    """
    folder = find_runtimes_dir() / PYTHON
    files = [str(folder / name) for name in PYTHON_RUNTIME_MODULES if (folder / name).is_file()]
    if not files:
        return f"no runtime modules in {folder}"
    run = _run_tool([str(python_interpreter()), "-S", "-m", "py_compile", *files], folder, tool_env(), 120)
    return None if run.returncode == 0 else tail_lines(run.log) or f"py_compile exited with {run.returncode}"


def node_binary() -> str:
    """The node executable ($SLESS_NODE or node on PATH)."""
    return os.environ.get("SLESS_NODE") or "node"


def toolchain_paths() -> list[Path]:
    """Folders a sandboxed function or install must see read-only besides /usr.

    The runtime wrappers, and the install prefix of the Python and Node
    interpreters when they live outside /usr (pyenv, a tarball under /opt).
    """
    paths = [find_runtimes_dir().resolve()]
    for binary in (python_interpreter(), shutil.which(node_binary()), shutil.which("npm")):
        if binary is None:
            continue
        resolved = Path(binary).resolve()
        if not resolved.is_relative_to("/usr"):
            paths.append(resolved.parent.parent)
    return paths


def tool_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for build tools: the allow-listed part of the host's (_TOOL_ENV), plus ``extra``.

    pip, npm and go need the host's proxy, registry and certificate settings, but
    a package's install script must not read the platform's secrets or anything
    else its process was started with.
    """
    env = {k: v for k, v in os.environ.items() if k in _TOOL_ENV or k.startswith(_TOOL_ENV_PREFIXES)}
    env.update(extra or {})
    return env


def sha256_hex(*parts: bytes) -> str:
    """sha256 of length-prefixed parts (so part boundaries cannot be shifted)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def tail_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def is_transient(log: str) -> bool:
    """Whether a failed tool's log points at the network rather than the input."""
    return _TRANSIENT.search(log) is not None


@dataclass
class _ToolRun:
    returncode: int | None  # None: killed at the timeout
    log: str
    duration_s: float


def _run_tool(
    argv: Sequence[str], cwd: Path, env: Mapping[str, str], timeout_sec: float, jail: Prepared | None = None
) -> _ToolRun:
    """Run a build tool with stdout+stderr in one log; kill its whole group at the timeout.

    ``jail``: run it sandboxed (the prepared argv and hook); without one the tool
    still gets SIGKILL when the platform dies, so no build outlives it.
    """
    started = time.monotonic()
    with tempfile.TemporaryFile() as log:
        try:
            proc = subprocess.Popen(
                jail.argv if jail is not None else list(argv),
                cwd=cwd,
                env={**env, **(jail.env if jail is not None else {})},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=jail.pass_fds if jail is not None else (),
                preexec_fn=jail.preexec if jail is not None else _die_with_platform,  # noqa: PLW1509 - prctl, cgroup join, rlimits
            )
        except OSError as exc:
            if jail is not None:
                jail.cleanup()
            return _ToolRun(127, f"cannot start {argv[0]}: {exc}", 0.0)
        if jail is not None:
            jail.release_fds()
        try:
            returncode: int | None = proc.wait(timeout=timeout_sec)
        except subprocess.TimeoutExpired:
            if jail is not None:
                jail.kill(proc.pid)  # the sandbox's PID 1 first, so nothing is orphaned
            kill_group(proc.pid)
            proc.wait()
            returncode = None
        # Leftover children (a compiler server, a postinstall daemon) die with the build; in a sandbox
        # they died with its PID namespace.
        if jail is None or not jail.sandboxed:
            kill_group(proc.pid)
        note = None
        if jail is not None:
            note = jail.exit_note(returncode)
            jail.cleanup()
        log.seek(0)
        text = log.read().decode("utf-8", errors="replace")
        if note:
            text += f"\n[sless] {note}"
    return _ToolRun(returncode, text, time.monotonic() - started)


def _go_env(gocache: Path, gomodcache: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment of build.sh: the tool env with these caches, the local toolchain only."""
    goflags = " ".join(filter(None, [os.environ.get("GOFLAGS", ""), "-modcacherw"]))
    return tool_env({"GOCACHE": str(gocache), "GOMODCACHE": str(gomodcache), "GOTOOLCHAIN": "local",
                     "GOFLAGS": goflags, **extra})


def _share_seed(seed: Path, dest: Path, *, link: bool) -> None:
    """Give DEST the seed's build cache: its folders and top-level files as the tenant's own, the cached
    objects below them as hard links when LINK (read-only to the tenant, so it cannot change the seed),
    else as copies (a user-namespace sandbox runs tenants as the platform's own uid, which could write
    through a link)."""
    for here, _dirs, files in os.walk(seed):
        rel = Path(here).relative_to(seed)
        (dest / rel).mkdir(exist_ok=True)
        for name in files:
            source, target = Path(here) / name, dest / rel / name
            if link and rel != Path("."):
                try:
                    os.link(source, target)
                    continue
                except OSError:  # another file system: copy
                    pass
            shutil.copyfile(source, target)
            target.chmod(0o600)  # the tenant's own copy, which Go may rewrite (trim.txt)


def _chown_tree(root: Path, uid: int) -> None:
    """Give ROOT's folders and files to UID, but for hard links to the seed, which stay the platform's."""
    for here, _dirs, names in os.walk(root):
        os.chown(here, uid, uid)
        for name in names:
            path = Path(here) / name
            if path.lstat().st_nlink == 1:
                os.lchown(path, uid, uid)


def _make_read_only(root: Path) -> None:
    """Files 0444 below ROOT: a tenant reads the seed's objects through its links, whatever the platform's
    umask was when Go wrote them, and writes none of them (its folders stay the platform's alone)."""
    for here, _dirs, names in os.walk(root):
        os.chmod(here, 0o700)
        for name in names:
            os.chmod(Path(here) / name, 0o444)


def _die_with_platform() -> None:
    """preexec hook: SIGKILL the tool when the platform dies (Linux ties it to the forking thread)."""
    set_parent_death_signal(signal.SIGKILL)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (works across processes and threads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


class Builder:
    """Builds function versions into a cache directory; safe to share between threads and processes."""

    def __init__(
        self,
        cache_dir: Path,
        *,
        timeout_sec: float = 600.0,
        retry_delays: Sequence[float] = (2.0, 8.0),
        go_cache: Path | None = None,
        go_mod_cache: Path | None = None,
        sandbox: Sandbox | None = None,
        go_seed_dir: Path | None = None,
    ) -> None:
        """``retry_delays``: backoff before each retry of a transient failure (its length = retries).

        ``go_cache``/``go_mod_cache`` (GOCACHE/GOMODCACHE) of unsandboxed builds
        default to this host's own Go caches (``go env``): both are
        content-addressed and locked by Go itself, so sharing them is safe, and
        the first function build then does not recompile the standard library.
        Sandboxed builds use per-tenant caches instead, seeded from
        ``go_seed_dir`` (default: ``sless-go-seed`` beside the host's GOCACHE,
        so every data dir on the host shares one seed per Go version).
        """
        self.cache_dir = Path(cache_dir)
        self.timeout_sec = timeout_sec
        self.retry_delays = tuple(retry_delays)
        self.go_cache = go_cache
        self.go_mod_cache = go_mod_cache
        self.sandbox = sandbox if sandbox is not None and sandbox.enabled else None
        self.go_seed_dir = go_seed_dir
        self._tool_versions: dict[str, str] = {}

    # -- public -------------------------------------------------------------------------------

    def build(self, req: BuildRequest, progress: Progress | None = None) -> BuildArtifact:
        """Install dependencies / compile as the runtime needs; raises BuildFailed with the log tail."""
        began, result = time.monotonic(), "failed"
        try:
            artifact = self._build(req, progress)
            result = "ready"
            return artifact
        finally:
            metrics.BUILDS.labels(req.runtime, result).inc()
            metrics.BUILD_SECONDS.labels(req.runtime).observe(time.monotonic() - began)

    def _build(self, req: BuildRequest, progress: Progress | None) -> BuildArtifact:
        say: Progress = progress if progress is not None else (lambda _line: None)
        code_dir = Path(req.code_dir).resolve()
        if not code_dir.is_dir():
            raise BuildFailed(f"code directory {code_dir} does not exist")
        deps_dir: Path | None = None
        bin_dir: Path | None = None
        if req.runtime == PYTHON:
            deps_dir = self._python_deps(code_dir, say, req.tenant)
        elif req.runtime == NODE:
            deps_dir = self._node_deps(code_dir, say, req.tenant)
        elif req.runtime == GO:
            bin_dir = self._go_binary(code_dir, req, say)
        else:
            raise ValueError(f"unknown runtime {req.runtime!r}")
        return BuildArtifact(req.runtime, code_dir, deps_dir, bin_dir, req.entrypoint, req.code_hash)

    # -- per runtime ----------------------------------------------------------------------------

    def _install_jail(self, tenant: str, code_dir: Path, staging: Path,
                      caches: tuple[Path, ...] = ()) -> JailSpec | None:  # fmt: skip
        """The sandbox of a build step: the tenant's uid, the code read-only, staging and CACHES writable."""
        if self.sandbox is None:
            return None
        if self.sandbox.as_root:
            uid = tenant_uid(tenant)
            os.chown(staging, uid, uid)
        return JailSpec(tenant=tenant, limits=BUILD_LIMITS, ro_binds=(code_dir,), rw_binds=(staging, *caches),
                        own_network=False)

    def _seal(self, staging: Path) -> None:
        """Give an installed entry back to the platform's user, so the tenant's uid cannot change it later."""
        if self.sandbox is None or not self.sandbox.as_root:
            return
        uid, gid = os.getuid(), os.getgid()
        for root, dirs, files in os.walk(staging):
            for name in [*dirs, *files]:
                with suppress(OSError):
                    os.lchown(os.path.join(root, name), uid, gid)
        os.chown(staging, uid, gid)
        staging.chmod(0o755)

    def _tenant_key(self, tenant: str) -> bytes:
        """Sandboxed installs are per tenant (see the module docstring); unsandboxed ones are shared."""
        return tenant.encode() if self.sandbox is not None else b""

    def _python_deps(self, code_dir: Path, say: Progress, tenant: str = "") -> Path | None:
        manifest_path = code_dir / "requirements.txt"
        manifests = rebuild.read_manifests(PYTHON, code_dir)
        if not manifests:  # the rule both backends share (sless_core.rebuild)
            say("dependencies: none (no requirements.txt, or one that names nothing)")
            return None
        manifest = rebuild.dependency_key(PYTHON, manifests).encode()
        python = python_interpreter()
        # The interpreter is part of the key: compiled wheels are built for one Python.
        key = sha256_hex(CACHE_FORMAT.encode(), PYTHON.encode(), str(python).encode(), manifest,
                         *([self._tenant_key(tenant)] if self.sandbox is not None else []))

        def install(staging: Path) -> None:
            argv = [
                str(python),
                "-m",
                "pip",
                "install",
                "--target",
                str(staging),
                "-r",
                str(manifest_path),
                "--no-input",
                "--disable-pip-version-check",
                "--no-warn-script-location",
            ]
            # cwd = the code, so "-r other.txt" and "./local-pkg" lines resolve against it.
            jail = self._install_jail(tenant, code_dir, staging)
            self._run_with_retries("pip", argv, code_dir, tool_env({"PYTHONNOUSERSITE": "1"}), say, jail)
            self._seal(staging)

        return self._cached_entry(
            "deps", PYTHON, key, start_line="installing dependencies (pip)...", make=install, say=say
        )

    def _node_deps(self, code_dir: Path, say: Progress, tenant: str = "") -> Path | None:
        manifest_path = code_dir / "package.json"
        manifests = rebuild.read_manifests(NODE, code_dir)
        if not manifests:  # the rule both backends share (sless_core.rebuild)
            say("dependencies: none (no package.json)")
            return None
        lock_path = code_dir / "package-lock.json"
        npm = shutil.which("npm")
        if npm is None:
            raise BuildFailed("npm is not installed on this host (needed for package.json)")
        # Node's version is part of the key: native addons are built for one Node ABI.
        node = self._tool_version(node_binary(), "--version")
        key = sha256_hex(CACHE_FORMAT.encode(), NODE.encode(), node.encode(),
                         rebuild.dependency_key(NODE, manifests).encode(),
                         *([self._tenant_key(tenant)] if self.sandbox is not None else []))

        def install(staging: Path) -> None:
            shutil.copyfile(manifest_path, staging / "package.json")
            if lock_path.is_file():
                shutil.copyfile(lock_path, staging / "package-lock.json")
            argv = [npm, "install", "--omit=dev", "--no-audit", "--no-fund", "--no-progress"]
            jail = self._install_jail(tenant, code_dir, staging)
            self._run_with_retries("npm", argv, staging, tool_env({"NODE_ENV": "production"}), say, jail)
            (staging / "node_modules").mkdir(exist_ok=True)  # a package.json without dependencies
            self._seal(staging)

        entry = self._cached_entry(
            "deps", NODE, key, start_line="installing dependencies (npm)...", make=install, say=say
        )
        return entry / "node_modules"

    def _go_binary(self, code_dir: Path, req: BuildRequest, say: Progress) -> Path:
        build_sh = find_runtimes_dir() / GO / "build.sh"
        if shutil.which("go") is None:
            raise BuildFailed("go is not installed on this host")
        key = sha256_hex(CACHE_FORMAT.encode(), GO.encode(), req.code_hash.encode(), req.entrypoint.encode(),
                         *([self._tenant_key(req.tenant)] if self.sandbox is not None else []))

        def compile_into(staging: Path) -> None:
            argv = [str(build_sh), str(code_dir), str(staging)]
            if self.sandbox is None:
                caches = (self.go_cache or Path(self._tool_version("go", "env", "GOCACHE")),
                          self.go_mod_cache or Path(self._tool_version("go", "env", "GOMODCACHE")))
                jail = None
            else:
                tenant_caches = self._tenant_go_caches(req.tenant, say)
                caches = (tenant_caches / "build", tenant_caches / "mod")
                jail = self._install_jail(req.tenant, code_dir, staging, (tenant_caches,))
            env = _go_env(caches[0], caches[1], {"SLESS_ENTRYPOINT": req.entrypoint})
            self._run_with_retries("go build", argv, code_dir, env, say, jail)
            self._seal(staging)
            missing = [name for name in ("server", "runner") if not (staging / name).is_file()]
            if missing:
                raise BuildFailed(f"build.sh succeeded but did not produce {', '.join(missing)}")

        return self._cached_entry("bin", GO, key, start_line="compiling (go)...", make=compile_into, say=say)

    def _tenant_go_caches(self, tenant: str, say: Progress) -> Path:
        """The tenant's own Go caches (``build/``, ``mod/``), owned by its uid; made once, from the seed.

        Per tenant because a build cache is trusted by whoever reads it: one shared with another tenant
        would let a build plant compiled packages that the other's binary links.
        """
        folder = self.cache_dir / "go" / sha256_hex(tenant.encode())[:32]
        if folder.is_dir():
            return folder
        with _locked(self.cache_dir / "locks" / f"go-{folder.name}.lock"):
            if folder.is_dir():
                return folder
            seed = self._go_seed(say)
            (self.cache_dir / "tmp").mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f"go-{folder.name}.", dir=self.cache_dir / "tmp"))
            try:
                (staging / "mod").mkdir()
                if seed is None:
                    (staging / "build").mkdir()
                else:
                    assert self.sandbox is not None
                    _share_seed(seed, staging / "build", link=self.sandbox.as_root)
                if self.sandbox is not None and self.sandbox.as_root:
                    _chown_tree(staging, tenant_uid(tenant))
                folder.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staging, folder)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return folder

    def _go_seed(self, say: Progress) -> Path | None:
        """A Go build cache holding the standard library and the wrapper, compiled from the platform's code alone.

        Made once per Go version and wrapper (the key), outside any tenant's reach; None when it cannot be
        made (the tenant's first build then compiles the standard library itself: slower, not wrong).
        """
        root = self.go_seed_dir or Path(self._tool_version("go", "env", "GOCACHE")).parent / "sless-go-seed"
        wrapper = find_runtimes_dir() / GO
        sources = [p.read_bytes() for p in sorted((wrapper / "wrapper").glob("*.go"))]
        key = sha256_hex(CACHE_FORMAT.encode(), self._tool_version("go", "env", "GOVERSION").encode(),
                         (wrapper / "build.sh").read_bytes(), *sources)[:32]
        final = root / key
        if (final / "build").is_dir():
            return final / "build"
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        with _locked(root / f"{key}.lock"):
            if (final / "build").is_dir():
                return final / "build"
            say("compiling the Go standard library for tenant builds (once per Go version)...")
            staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=root))
            try:
                (staging / "fn").mkdir()
                (staging / "fn" / "handler.go").write_text(_GO_SEED_FUNCTION)
                env = _go_env(staging / "build", staging / "mod", {"SLESS_ENTRYPOINT": "Handle"})
                run = _run_tool([str(wrapper / "build.sh"), str(staging / "fn"), str(staging / "out")],
                                staging, env, self.timeout_sec)
                if run.returncode != 0:
                    say(f"the Go seed failed; tenant builds compile the standard library themselves:\n"
                        f"{tail_lines(run.log, 10)}")
                    return None
                for name in ("fn", "out", "mod"):
                    shutil.rmtree(staging / name, ignore_errors=True)
                _make_read_only(staging / "build")
                os.rename(staging, final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return final / "build"

    # -- shared machinery ---------------------------------------------------------------------

    def _tool_version(self, *argv: str) -> str:
        """One line a tool prints about itself (``node --version``, ``go env GOCACHE``), memoized."""
        key = " ".join(argv)
        if key not in self._tool_versions:
            run = _run_tool(argv, Path("/"), tool_env(), 60)
            lines = run.log.strip().splitlines()
            if run.returncode != 0 or not lines:
                raise BuildFailed(tail_lines(run.log + f"\n{key} failed"))
            self._tool_versions[key] = lines[-1].strip()  # after any warnings
        return self._tool_versions[key]

    def _cached_entry(
        self,
        kind: str,
        runtime: str,
        key: str,
        *,
        start_line: str,
        make: Callable[[Path], None],
        say: Progress,
    ) -> Path:
        """The cache entry ``kind/runtime/key``, made by ``make(staging)`` unless it exists."""
        final = self.cache_dir / kind / runtime / key
        label = "dependencies" if kind == "deps" else "binary"
        if final.is_dir():
            say(f"{label}: cached ({key[:12]})")
            return final
        tmp_root = self.cache_dir / "tmp"
        tmp_root.mkdir(parents=True, exist_ok=True)
        with _locked(self.cache_dir / "locks" / f"{kind}-{runtime}-{key}.lock"):
            if final.is_dir():  # another build finished it while we waited for the lock
                say(f"{label}: cached ({key[:12]})")
                return final
            prefix = f"{kind}-{runtime}-{key}."
            for stale in tmp_root.glob(prefix + "*"):  # left by a crashed build; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            staging = Path(tempfile.mkdtemp(prefix=prefix, dir=tmp_root))
            try:
                say(start_line)
                started = time.monotonic()
                make(staging)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.rename(staging, final)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            say(f"{label}: done in {time.monotonic() - started:.1f}s")
        return final

    def _run_with_retries(
        self,
        tool: str,
        argv: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        say: Progress,
        jail: JailSpec | None = None,
    ) -> None:
        """Run ``argv`` (in ``jail`` when given); retry transient (network) failures, fail fast otherwise."""
        attempts = len(self.retry_delays) + 1
        for attempt in range(1, attempts + 1):
            prepared = None
            if jail is not None and self.sandbox is not None:
                prepared = self.sandbox.prepare(argv, cwd, jail, f"build-{tool.replace(' ', '-')}")
            run = _run_tool(argv, cwd, env, self.timeout_sec, prepared)
            if run.returncode == 0:
                return
            if run.returncode is None:
                raise BuildFailed(
                    tail_lines(run.log + f"\n{tool} timed out after {self.timeout_sec:g}s and was killed")
                )
            if attempt < attempts and is_transient(run.log):
                delay = self.retry_delays[attempt - 1]
                say(f"{tool} failed with a network error; retrying in {delay:g}s (attempt {attempt + 1}/{attempts})")
                time.sleep(delay)
                continue
            raise BuildFailed(tail_lines(run.log + f"\n{tool} failed with exit code {run.returncode}"))
