"""A hostile tenant against a real `sless up` (sandboxed with bubblewrap): every attack fails, and the
platform and another tenant's function keep serving.

The attacks live in tests/e2e/hostile/handler.py; each answers what it got, so a leak shows up as
data in the answer. Each test first checks that its probe can see what it looks for when it is
there (the victim's marker is findable from the host, the detached process exists before the
deletion), so a probe that sees nothing proves something.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from sless_api.backends.standalone.host.sandbox import tenant_uid
from tests.support.platform import REPO, SECRET, SlessProcess, Tenant, start_sless
from tests.support.poll import until
from tests.support.services import children_of, free_port

pytestmark = pytest.mark.e2e
POLL = 0.1  # s between looks at the host's processes

HOSTILE: dict[str, str | bytes] = {"handler.py": (Path(__file__).parent / "hostile" / "handler.py").read_text()}
MARKER = "victim-marker-7f3a9c"
CANARY = "canary-secret-5b1e22"
#: The victim's tenant secret, delivered to its function as an env var and as a file.
STORED = "stored-secret-e4a07c"
#: Processes (and threads) a tenant may have: low, so the fork bomb meets it before the memory limit.
NPROC = 64
VICTIM: dict[str, str | bytes] = {"handler.py": "def handle(event):\n    return {'victim': 'fine'}\n"}


@dataclass
class Arena:
    sless: SlessProcess
    attacker: Tenant
    victim: Tenant

    @property
    def data_dir(self) -> Path:
        return self.sless.data_dir

    def attack(self, action: str, function: str = "hostile", timeout: float = 60, **event: Any) -> requests.Response:
        return requests.post(self.attacker.fn_url(function), json={"action": action, **event}, timeout=timeout)

    def assert_fine(self) -> None:
        """The platform answers and the other tenant's function still serves."""
        assert self.sless.proc.poll() is None, f"sless up died:\n{self.sless.log_tail()}"
        assert requests.get(self.sless.url + "/health", timeout=10).status_code == 200
        resp = requests.get(self.victim.fn_url("victim"), timeout=30)
        assert resp.status_code == 200 and resp.json() == {"victim": "fine"}, resp.text

    def victim_pid(self) -> int:
        """The victim runtime's host pid, found from outside by its marker (proves the marker is findable)."""
        for pid in _pids():
            try:
                if MARKER.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                    return pid
            except OSError:
                continue
        raise AssertionError("the victim's runtime is not running")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdlines(needle: str) -> list[int]:
    """Host pids whose command line contains ``needle``."""
    found = []
    for pid in _pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and pid != os.getpid():
            found.append(pid)
    return found


def _uid_pids(uid: int) -> list[int]:
    found = []
    for pid in _pids():
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                found.append(pid)
        except OSError:
            continue
    return found


def _errors_only(results: dict[str, str]) -> None:
    leaked = {k: v for k, v in results.items() if not v.startswith("err: ")}
    assert not leaked, f"an attack got through: {leaked}"


def enter_arena(sp: SlessProcess) -> Arena:
    """A victim tenant with a secret in its env and an attacker tenant with the hostile function, both serving."""
    attacker, victim = Tenant(sp.url, "attacker"), Tenant(sp.url, "victim")
    victim.api("POST", "/ensure", expect=(200, 201))
    victim.api("POST", "/secrets", json={"name": "vault", "data": {"value": STORED}}, expect=201)
    victim.deploy("victim", "python3.11", VICTIM, env_vars={"VICTIM_SECRET": MARKER},
                  secrets=[{"name": "vault", "key": "value", "env": "STORED_SECRET"},
                           {"name": "vault", "key": "value", "file": "stored"}])
    attacker.deploy("hostile", "python3.11", HOSTILE, memory_mb=64, timeout_sec=30)
    arena = Arena(sp, attacker, victim)
    arena.assert_fine()
    return arena


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    if os.geteuid() != 0:
        pytest.skip("the per-tenant uid sandbox is exercised as root (see the test_unprivileged_* tests)")
    data = Path(tmp_path_factory.mktemp("hostile"))
    (data / "canary-secret").write_text(CANARY)
    (data / "canary-secret").chmod(0o600)
    # Fresh processes only: the probes find the victim by the marker in its /proc/<pid>/environ, where a
    # function started from a warm spare has none (its environment came later, over its stdin); spares are
    # attacked in test_a_function_started_from_a_warm_spare_keeps_tenants_apart.
    sp = start_sless(data, {"SLESS_SANDBOX": "bwrap", "SLESS_SANDBOX_NPROC": str(NPROC), "SLESS_WARM_SPARES": "0"})
    try:
        arena = enter_arena(sp)
        yield arena
    finally:
        code = sp.stop()
    assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"


def test_runs_as_its_tenants_own_uid_in_its_own_pid_namespace(arena: Arena) -> None:
    me = arena.attack("whoami").json()
    assert me["uid"] == tenant_uid(arena.attacker.ns) and me["uid"] >= 100_000
    assert me["pid"] < 10 and me["ppid"] in (0, 1), me


def test_cannot_read_the_data_dir_the_secret_or_another_tenants_code(arena: Arena) -> None:
    code_hash = arena.victim.api("GET", "/functions/victim", expect=200).json()["code_hash"]
    victim_code = arena.data_dir / "functions" / arena.victim.ns / "victim" / code_hash
    assert (victim_code / "handler.py").is_file()  # the path the attack aims at is the real one
    assert (arena.data_dir / "secrets.key").is_file() and (arena.data_dir / "secrets.db").is_file()
    paths = [arena.data_dir, arena.data_dir / "canary-secret", arena.data_dir / "state.db",
             arena.data_dir / "invocations.db", arena.data_dir / "functions" / arena.victim.ns, victim_code,
             victim_code / "handler.py", arena.data_dir / "cache", f"/proc/{arena.sless.proc.pid}/environ",
             "/root", "/etc/shadow", "/etc/passwd", arena.data_dir / "secrets.key", arena.data_dir / "secrets.db",
             "/run/sless/secrets", "/run/sless/secrets/stored"]
    resp = arena.attack("read_files", paths=[str(p) for p in paths])
    assert resp.status_code == 200, resp.text
    _errors_only(resp.json())
    assert CANARY not in resp.text and SECRET not in resp.text and "def handle" not in resp.text
    assert STORED not in resp.text
    arena.assert_fine()


GO_HANDLER = ('package function\n\nimport "context"\n\n'
              "func Handle(ctx context.Context, event map[string]any) (any, error) { return event, nil }\n")
#: The first word of a host file the Go assembler would quote back ("unrecognized instruction ...").
BUILD_CANARY = "buildcanary7d41e0"


@pytest.mark.parametrize("target", ["data dir", "/etc/shadow"])
def test_a_go_build_cannot_read_host_files(arena: Arena, target: str) -> None:
    """The build is tenant code: the Go assembler opens an absolute ``#include`` path and quotes what it read
    in the compile error the tenant gets back. Jailed, the build sees neither the data dir nor /etc/shadow."""
    if target == "data dir":
        path = arena.data_dir / "build-canary"
        path.write_text(f"{BUILD_CANARY} rest of a secret\n")
        path.chmod(0o600)
        leaked = BUILD_CANARY
    else:
        path = Path("/etc/shadow")
        leaked = path.read_text().split(":", 1)[0]  # what an unjailed build quoted back: "root"
    arena.attacker.api("POST", "/functions", json={"name": f"leak-{len(target)}", "runtime": "go1.23"}, expect=201)
    arena.attacker.upload(f"leak-{len(target)}", {"handler.go": GO_HANDLER, "leak_amd64.s": f'#include "{path}"\n'})
    record = arena.attacker.wait_phase(f"leak-{len(target)}", ("Failed",), wait=300)
    message = record["message"]
    assert "no such file or directory" in message, message
    assert "unrecognized instruction" not in message and f'"{leaked}"' not in message, message
    assert BUILD_CANARY not in message
    arena.assert_fine()


def test_a_go_build_runs_as_the_tenant_and_its_binary_is_sealed(arena: Arena) -> None:
    """The compile runs as the tenant's uid in its own caches; what it produced is handed back to the platform,
    so the tenant cannot change its binary afterwards, and its caches are not another tenant's."""
    arena.attacker.deploy("gofine", "go1.23", {"handler.go": GO_HANDLER}, wait=300)
    assert requests.post(arena.attacker.fn_url("gofine"), json={"a": 1}, timeout=30).json()["a"] == 1
    binaries = list((arena.data_dir / "cache" / "bin" / "go1.23").glob("*/server"))
    assert binaries and all(b.stat().st_uid == os.getuid() for b in binaries)
    caches = list((arena.data_dir / "cache" / "go").iterdir())
    assert caches and {c.stat().st_uid for c in caches} == {tenant_uid(arena.attacker.ns)}
    assert all(c.stat().st_mode & 0o077 == 0 for c in caches)  # no other uid can even look inside


def test_cannot_see_other_processes_or_their_environment(arena: Arena) -> None:
    victim_pid = arena.victim_pid()
    resp = arena.attack("scan_environ", marker=MARKER, pids=[victim_pid, arena.sless.proc.pid])
    assert resp.status_code == 200, resp.text
    seen = resp.json()
    assert seen["found"] == []
    assert all(not v.startswith("ok: True") for v in seen["direct"].values()), seen["direct"]
    assert len(seen["visible_pids"]) < 10, seen["visible_pids"]  # its own namespace, not the host's
    assert MARKER not in resp.text and SECRET not in resp.text
    # The victim's stored secret is in its environment (the probe could find it) and out of the attacker's reach.
    assert STORED.encode() in Path(f"/proc/{victim_pid}/environ").read_bytes()
    stored = arena.attack("scan_environ", marker=STORED, pids=[victim_pid]).json()
    assert stored["found"] == [] and all(not v.startswith("ok: True") for v in stored["direct"].values()), stored


def test_cannot_signal_the_platform_its_parent_or_pid_1(arena: Arena) -> None:
    victim_pid = arena.victim_pid()
    resp = arena.attack("signals", pids=[arena.sless.proc.pid, victim_pid, os.getpid()])
    assert resp.status_code == 200, resp.text
    results = resp.json()
    for pid in (arena.sless.proc.pid, victim_pid, os.getpid()):
        assert results[f"host-{pid}"].startswith("err: "), results
    arena.assert_fine()
    assert arena.victim_pid() == victim_pid  # the same victim process, not a restarted one
    assert arena.attack("whoami").status_code == 200  # its own sandbox survived its PID 1 attempt


def test_cannot_call_another_tenants_runtime_port_directly(arena: Arena) -> None:
    env = Path(f"/proc/{arena.victim_pid()}/environ").read_bytes().split(b"\0")
    victim_port = int(next(v for v in env if v.startswith(b"PORT=")).split(b"=", 1)[1])
    api_port = int(arena.sless.url.rsplit(":", 1)[1])
    results = arena.attack("connect", ports=[victim_port, api_port]).json()
    # The platform's API stays reachable (functions keep the network); the victim's runtime port does not.
    assert results[str(api_port)].startswith("ok: HTTP/1.1"), results
    assert results[str(victim_port)].startswith("err: "), results
    with socket.create_connection(("127.0.0.1", victim_port), timeout=5):
        pass  # from the platform's own user the port is open: the refusal is the sandbox's doing
    arena.assert_fine()


def test_a_function_has_a_network_of_its_own(arena: Arena) -> None:
    """In its own namespace a function sees only its own sockets and reaches none of the host's loopback
    services (a database, another tenant's runtime); the platform's API stays reachable on its 127.0.0.1."""
    assert "a network namespace each (pasta)" in arena.sless.log_path.read_text()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        host_view = Path("/proc/net/tcp").read_text()
        assert f":{port:04X} 00000000:0000 0A" in host_view  # the probe's source shows it from the host
        seen = arena.attack("sockets").json()["listening"]
        assert port not in seen and len(seen) <= 4, seen
        api_port = int(arena.sless.url.rsplit(":", 1)[1])
        results = arena.attack("connect", ports=[port, api_port]).json()
    assert results[str(port)].startswith("err: ConnectionRefusedError"), results
    assert results[str(api_port)].startswith("ok: HTTP/1.1"), results
    arena.assert_fine()


def test_fork_bomb_is_bounded(arena: Arena) -> None:
    arena.attacker.deploy("forker", "python3.11", HOSTILE, memory_mb=1024)
    resp = arena.attack("fork_bomb", function="forker", count=300)
    assert resp.status_code == 200, resp.text
    result = resp.json()
    assert result["started"] < NPROC and result["error"], result
    assert "Resource temporarily unavailable" in result["error"], result
    arena.assert_fine()


def test_memory_bomb_fails_that_call_with_a_clear_message(arena: Arena) -> None:
    resp = arena.attack("memory_bomb", mb=800)
    assert resp.status_code >= 500, resp.text
    assert "memory limit of 64 MB" in resp.text, resp.text
    arena.assert_fine()
    until("the function serves again", lambda: arena.attack("whoami").status_code == 200, 30, POLL)


def test_memory_bomb_in_a_job_fails_the_job_with_a_clear_message(arena: Arena) -> None:
    arena.attacker.api("POST", "/jobs", json={"name": "bomb", "function": "hostile", "run_id": 1,
                                              "event": {"action": "memory_bomb", "mb": 800}}, expect=201)
    job = arena.attacker.wait_job("bomb")
    assert job["phase"] == "Failed" and "memory limit of 64 MB" in job["message"], job
    arena.assert_fine()


def test_disk_filler_is_stopped(arena: Arena) -> None:
    target = arena.data_dir / "fill"
    resp = arena.attack("fill_disk", mb=512, paths=[str(target)])
    assert resp.status_code == 200, resp.text
    _errors_only(resp.json())
    assert not target.exists()
    arena.assert_fine()


def test_detached_child_dies_with_the_function(arena: Arena) -> None:
    arena.attacker.deploy("detacher", "python3.11", HOSTILE, memory_mb=64)
    resp = arena.attack("detach", function="detacher", seconds=313)
    assert resp.status_code == 200, resp.text
    until("the detached process is visible from the host", lambda: _cmdlines("sleep 313"), 10, POLL)
    arena.attacker.api("DELETE", "/functions/detacher", expect=(200, 204))
    until("the detached process died with its function", lambda: not _cmdlines("sleep 313"), 15, POLL)
    arena.assert_fine()


def test_stopped_runtime_is_replaced(arena: Arena) -> None:
    assert arena.attack("stop_self").status_code == 200
    time.sleep(0.5)  # the scenario: the handler stops its own process 0.3 s after answering (hostile/handler.py)
    with pytest.raises(requests.Timeout):
        arena.attack("whoami", timeout=2)  # stopped: it does not answer

    def serves() -> bool:
        try:
            return arena.attack("whoami", timeout=3).status_code == 200
        except requests.RequestException:
            return False

    until("the stopped runtime was replaced", serves, 45, POLL)
    arena.assert_fine()


def assert_syscalls_refused(answers: dict[str, str]) -> None:
    """The hostile probe's answers: EPERM for every call the seccomp filter refuses (seccomp.py)."""
    if "skipped" in answers:
        pytest.skip(f"the probe knows x86_64's syscall numbers, not {answers['skipped']}'s")
    refused = {k: v for k, v in answers.items() if k not in ("clone3", "personality(PER_LINUX)", "Seccomp")}
    assert len(refused) >= 50 and set(refused.values()) == {"EPERM"}, refused
    assert answers["clone3"] == "ENOSYS" and answers["personality(PER_LINUX)"] == "ok", answers
    assert answers["Seccomp"] == "2", answers


NODE_FUNCTION: dict[str, str | bytes] = {"handler.js": (
    "const fs = require('fs');\n"
    "exports.handle = async () => ({ node: 'fine', read: (await fs.promises.readFile(__filename)).length > 0 });\n")}


def test_refused_syscalls_answer_eperm_in_a_function_and_a_job(arena: Arena) -> None:
    resp = arena.attack("syscalls")
    assert resp.status_code == 200, resp.text
    assert_syscalls_refused(resp.json())
    arena.attacker.api("POST", "/jobs", json={"name": "probe", "function": "hostile", "run_id": 1,
                                              "event": {"action": "syscalls"}}, expect=201)
    job = arena.attacker.wait_job("probe")
    assert job["phase"] == "Succeeded", job
    assert_syscalls_refused(json.loads(job["message"]))
    arena.assert_fine()


def test_a_node_function_runs_under_the_syscall_filter(arena: Arena) -> None:
    """libuv probes io_uring (refused: EPERM) and falls back to its thread pool for file reads."""
    arena.attacker.deploy("nodefn", "nodejs20", NODE_FUNCTION, memory_mb=128)
    resp = requests.get(arena.attacker.fn_url("nodefn"), timeout=60)
    assert resp.status_code == 200 and resp.json() == {"node": "fine", "read": True}, resp.text


ENV_PROBE: dict[str, str | bytes] = {"handler.py": (
    "import os\n"
    "def handle(event):\n"
    "    return {k: os.environ.get(k) for k in ('LD_PRELOAD', 'LD_DEBUG', 'LD_DEBUG_OUTPUT', 'KEPT')}\n")}


def assert_loader_env_stays_out(arena: Arena, name: str) -> None:
    """A tenant's dynamic-loader variables reach neither bwrap (which starts outside the sandbox, as root or
    the platform's user) nor the function: glibc would write LD_DEBUG_OUTPUT's file, or load LD_PRELOAD's
    library, in bwrap's process."""
    target = arena.data_dir / f"ld-debug-{name}"
    env = {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": str(target), "LD_PRELOAD": "/nonexistent/sless-preload.so",
           "KEPT": "yes"}
    arena.attacker.deploy(name, "python3.11", ENV_PROBE, env_vars=env, memory_mb=64)
    resp = requests.get(arena.attacker.fn_url(name), timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"LD_PRELOAD": None, "LD_DEBUG": None, "LD_DEBUG_OUTPUT": None, "KEPT": "yes"}
    assert not list(arena.data_dir.glob(f"{target.name}*")), "a process outside the sandbox took the tenant's LD_*"
    job = f"{name}-job"
    arena.attacker.api("POST", "/jobs", json={"name": job, "function": name, "run_id": 1, "event": {}}, expect=201)
    assert arena.attacker.wait_job(job)["phase"] == "Succeeded"
    assert not list(arena.data_dir.glob(f"{target.name}*")), "a runner's bwrap took the tenant's LD_*"
    arena.assert_fine()


def test_loader_variables_of_a_tenant_reach_no_process_outside_the_sandbox(arena: Arena) -> None:
    assert_loader_env_stays_out(arena, "ldenv")


def test_platform_sigkill_leaves_no_process_and_no_build(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root like the arena")
    sp = start_sless(tmp_path / "data", {"SLESS_SANDBOX": "bwrap"})
    tenant = Tenant(sp.url, "sigkill")
    try:
        tenant.deploy("stubborn", "python3.11", HOSTILE, memory_mb=64)
        # A child that ignores SIGTERM, in its own session, like a runtime that will not stop.
        ignorer: dict[str, str | bytes] = {"handler.py": (
            "import subprocess\n"
            "def handle(event):\n"
            "    subprocess.Popen(['sh', '-c', \"trap '' TERM; sleep 317\"], start_new_session=True)\n"
            "    return {'ok': True}\n")}
        tenant.deploy("ignorer", "python3.11", ignorer, memory_mb=64)
        assert requests.post(tenant.fn_url("stubborn"), json={"action": "detach", "seconds": 319},
                             timeout=30).status_code == 200
        assert requests.get(tenant.fn_url("ignorer"), timeout=30).status_code == 200
        until("both children run", lambda: _cmdlines("sleep 317") and _cmdlines("sleep 319"), 10, POLL)
        # A Go build in progress: it must die with the platform too.
        tenant.api("POST", "/functions", json={"name": "slowgo", "runtime": "go1.23"}, expect=201)
        tenant.upload("slowgo", {"main.go": "package function\n\nimport \"context\"\n\n"
                                            "func Handle(ctx context.Context, e map[string]any) (any, error) "
                                            "{ return 1, nil }\n",
                                 "go.mod": f"module slowgo{time.monotonic_ns()}\n\ngo 1.23\n"})
        until("the go build runs", lambda: _cmdlines(str(sp.data_dir / "cache")), 30, POLL)
        # The functions' network helpers (pasta, one per function in its own namespace) are the platform's.
        networks = {pid for pid in children_of(sp.proc.pid) if _program(pid) == "pasta"}
    finally:
        sp.stop(signal.SIGKILL)
    uid = tenant_uid(tenant.ns)
    until("the functions' children died with the platform",
          lambda: not _cmdlines("sleep 317") and not _cmdlines("sleep 319"), 10, POLL)
    until("no process of the tenant's uid is left", lambda: not _uid_pids(uid), 10, POLL)
    until("no build or runtime outlived the platform", lambda: not _cmdlines(str(sp.data_dir)), 10, POLL)
    until("no function's network helper outlived the platform",
          lambda: not any(_program(pid) == "pasta" for pid in networks), 10, POLL)
    # What the killed platform left outside its processes (cgroups, and without namespaces of their own its
    # iptables chain) goes at the next start.
    chain = f"SLESS-{sp.proc.pid}"
    if not networks:
        assert chain in _iptables_rules() or not shutil.which("iptables")
    again = start_sless(tmp_path / "again", {"SLESS_SANDBOX": "bwrap"})
    assert again.stop() == 0
    assert chain not in _iptables_rules()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/**/sless-{sp.proc.pid}"))


def _program(pid: int) -> str:
    """The name a process was started as (pasta re-executes itself as passt.avx2, which its comm shows)."""
    try:
        return Path(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode()).name
    except (OSError, UnicodeDecodeError):
        return ""


def _iptables_rules() -> str:
    if not shutil.which("iptables"):
        return ""
    return subprocess.run(["iptables", "-w", "5", "-S"], capture_output=True, text=True, check=True).stdout


def test_refuses_to_start_unconfined_unless_told_single_tenant(tmp_path: Path) -> None:
    env = {**os.environ, "SLESS_JWT_SECRET": SECRET, "PATH": str(tmp_path)}  # no bwrap on PATH
    env.pop("SLESS_SANDBOX", None)
    argv = [sys.executable, "-m", "sless_api", "up", "--port", "1", "--data-dir", str(tmp_path / "d")]
    run = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "refusing to start" in run.stderr and "--single-tenant" in run.stderr and "bwrap" in run.stderr
    env["PATH"] = os.environ["PATH"]
    sp = start_sless(tmp_path / "single", {"SLESS_SANDBOX": "off"})
    try:
        assert requests.get(sp.url + "/health", timeout=10).status_code == 200
        assert "function sandbox: SLESS_SANDBOX=off" in sp.log_tail(200)
    finally:
        assert sp.stop() == 0


# -- the same attacks on a platform run by an unprivileged user (user namespaces, RLIMIT_AS) --------

NOBODY = 65534
SYSTEM_PYTHON = Path("/usr/bin/python3.11")


def _start_as_nobody(data_dir: Path) -> SlessProcess:
    """`sless up` as uid 65534 with the system Python 3.11 and the project venv's packages on its path.

    The venv's interpreter lives under /root (pyenv), which an unprivileged user cannot reach.
    """
    port = free_port()
    site = REPO / ".venv" / "lib" / "python3.11" / "site-packages"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(data_dir.parent), "SLESS_JWT_SECRET": SECRET,
           "SLESS_SANDBOX": "bwrap", "SLESS_SANDBOX_NPROC": str(NPROC), "SLESS_IDLE_TIMEOUT_SEC": "300",
           "PYTHONPATH": os.pathsep.join(str(p) for p in (site, REPO / "api" / "src", REPO / "core" / "src", REPO))}
    log_path = data_dir.parent / "sless-up.log"
    out = open(log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
    proc = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", str(SYSTEM_PYTHON),
         "-m", "sless_api", "up", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=out, stderr=subprocess.STDOUT, env=env, cwd=data_dir.parent, start_new_session=True)
    out.close()
    sp = SlessProcess(f"http://127.0.0.1:{port}", data_dir, proc, log_path, env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sless up exited with {proc.returncode}:\n{sp.log_tail()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(sp.url + "/health", timeout=1).status_code == 200:
                return sp
        time.sleep(0.1)
    sp.stop(signal.SIGKILL)
    raise RuntimeError(f"sless up did not answer /health:\n{sp.log_tail()}")


@pytest.fixture(scope="module")
def nobody_arena() -> Iterator[Arena]:
    if os.geteuid() != 0 or not SYSTEM_PYTHON.is_file():
        pytest.skip("needs root (to become uid 65534) and the system python3.11")
    home = Path(tempfile.mkdtemp(prefix="sless-nobody-", dir="/tmp"))
    data = home / "data"
    data.mkdir()
    (data / "canary-secret").write_text(CANARY)
    (data / "canary-secret").chmod(0o600)
    for path in (home, data, data / "canary-secret"):
        os.chown(path, NOBODY, NOBODY)
    sp = _start_as_nobody(data)
    try:
        arena = enter_arena(sp)
        assert "user namespaces" in sp.log_tail(200)
        yield arena
    finally:
        code = sp.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"


def test_unprivileged_platform_keeps_tenants_apart(nobody_arena: Arena) -> None:
    arena = nobody_arena
    me = arena.attack("whoami").json()
    assert me["uid"] == NOBODY and me["pid"] < 10 and me["ppid"] in (0, 1), me

    paths = [arena.data_dir, arena.data_dir / "canary-secret", arena.data_dir / "state.db",
             arena.data_dir / "functions" / arena.victim.ns, f"/proc/{arena.sless.proc.pid}/environ"]
    resp = arena.attack("read_files", paths=[str(p) for p in paths])
    assert resp.status_code == 200, resp.text
    _errors_only(resp.json())
    assert CANARY not in resp.text and SECRET not in resp.text

    victim_pid = arena.victim_pid()
    seen = arena.attack("scan_environ", marker=MARKER, pids=[victim_pid, arena.sless.proc.pid]).json()
    assert seen["found"] == [] and len(seen["visible_pids"]) < 10, seen
    assert all(not v.startswith("ok: True") for v in seen["direct"].values()), seen["direct"]

    results = arena.attack("signals", pids=[arena.sless.proc.pid, victim_pid]).json()
    assert all(results[f"host-{pid}"].startswith("err: ") for pid in (arena.sless.proc.pid, victim_pid)), results
    arena.assert_fine()
    assert arena.victim_pid() == victim_pid


def test_unprivileged_platform_refuses_the_same_syscalls(nobody_arena: Arena) -> None:
    """In a user namespace the function is root inside it: the filter, not missing capabilities, refuses."""
    resp = nobody_arena.attack("syscalls")
    assert resp.status_code == 200, resp.text
    assert_syscalls_refused(resp.json())
    assert "seccomp filter" in nobody_arena.sless.log_tail(200)
    nobody_arena.assert_fine()


def test_unprivileged_platform_keeps_loader_variables_out(nobody_arena: Arena) -> None:
    assert_loader_env_stays_out(nobody_arena, "ldenv")


def test_unprivileged_platform_bounds_forks_memory_and_disk(nobody_arena: Arena) -> None:
    arena = nobody_arena
    arena.attacker.deploy("forker", "python3.11", HOSTILE, memory_mb=1024)
    bomb = arena.attack("fork_bomb", function="forker", count=300).json()
    assert bomb["started"] < 300 and "Resource temporarily unavailable" in (bomb["error"] or ""), bomb
    arena.assert_fine()

    # RLIMIT_AS (memory_mb + 3 GB of headroom for a Python runtime's reserved address space, its handler threads'
    # stacks): the allocation fails inside.
    resp = arena.attack("memory_bomb", mb=5000)
    assert resp.status_code >= 500 and "MemoryError" in resp.text, resp.text
    arena.assert_fine()

    fill = arena.attack("fill_disk", mb=512, paths=[str(arena.data_dir / "fill")])
    assert fill.status_code == 200, fill.text
    _errors_only(fill.json())
    assert not (arena.data_dir / "fill").exists()

    arena.attacker.deploy("detacher", "python3.11", HOSTILE, memory_mb=64)
    assert arena.attack("detach", function="detacher", seconds=337).status_code == 200
    until("the detached process is visible from the host", lambda: _cmdlines("sleep 337"), 10, POLL)
    arena.attacker.api("DELETE", "/functions/detacher", expect=(200, 204))
    until("the detached process died with its function", lambda: not _cmdlines("sleep 337"), 15, POLL)
    arena.assert_fine()


def _runtimes_of(tenant: str, cwd: Path) -> list[int]:
    """Host pids of the tenant's Python runtimes working in ``cwd`` (a spare: its tenant's code folder)."""
    found = []
    for pid in _uid_pids(tenant_uid(tenant)):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if os.readlink(f"/proc/{pid}/cwd") == str(cwd) and b"server.py" in cmdline:
                found.append(pid)
        except OSError:
            continue
    return found


def _port_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in env if v.startswith(b"PORT=")).split(b"=", 1)[1])


def test_a_function_started_from_a_warm_spare_keeps_tenants_apart(tmp_path: Path) -> None:
    """Both tenants' functions are claimed spares; the attacker still reaches neither the victim's process,
    its secrets (env and the file in the victim's private /tmp), its port, nor the victim's next spare."""
    if os.geteuid() != 0:
        pytest.skip("warm spares need memory cgroups (root)")
    sp = start_sless(tmp_path / "data", {"SLESS_SANDBOX": "bwrap", "SLESS_WARM_SPARES": "1"})
    # Tenants of their own: the module's arena (its own sless up) may still run "attacker" and "victim".
    attacker, victim = Tenant(sp.url, "spare-attacker"), Tenant(sp.url, "spare-victim")
    try:
        victim.api("POST", "/ensure", expect=(200, 201))
        victim.api("POST", "/secrets", json={"name": "vault", "data": {"value": STORED}}, expect=201)
        rec = victim.deploy("victim", "python3.11", VICTIM, env_vars={"VICTIM_SECRET": MARKER},
                            secrets=[{"name": "vault", "key": "value", "env": "STORED_SECRET"},
                                     {"name": "vault", "key": "value", "file": "stored"}])
        attacker.deploy("hostile", "python3.11", HOSTILE, memory_mb=128, timeout_sec=30)
        roots = {t: sp.data_dir / "functions" / t for t in (attacker.ns, victim.ns)}
        until("both tenants' spares", lambda: all(_runtimes_of(t, root) for t, root in roots.items()), 30, POLL)
        time.sleep(0.5)  # listening (the pids exist a moment before)
        arena = Arena(sp, attacker, victim)
        arena.assert_fine()
        assert arena.attack("whoami").json()["uid"] == tenant_uid(attacker.ns)
        logs = sp.data_dir / "logs"
        for key in (f"{victim.ns}.victim", f"{attacker.ns}.hostile"):
            assert "in warm spare pid" in (logs / f"{key}.log").read_text(), f"{key} was not started from a spare"
        victim_code = roots[victim.ns] / "victim" / rec["code_hash"]
        [victim_pid] = _runtimes_of(victim.ns, victim_code)
        until("the victim's next spare", lambda: len(_runtimes_of(victim.ns, roots[victim.ns])) == 1, 30, POLL)
        [spare_pid] = _runtimes_of(victim.ns, roots[victim.ns])

        seen = arena.attack("scan_environ", marker=MARKER, pids=[victim_pid, spare_pid, sp.proc.pid]).json()
        assert seen["found"] == [] and len(seen["visible_pids"]) < 10, seen
        assert all(not v.startswith("ok: True") for v in seen["direct"].values()), seen["direct"]
        paths = [roots[victim.ns], victim_code / "handler.py", "/tmp/.sless-secrets", "/tmp/.sless-secrets/stored",
                 f"/proc/{victim_pid}/root/tmp/.sless-secrets/stored", f"/proc/{victim_pid}/mem",
                 f"/proc/{spare_pid}/fd/0"]
        resp = arena.attack("read_files", paths=[str(p) for p in paths])
        _errors_only(resp.json())
        assert STORED not in resp.text and MARKER not in resp.text and "def handle" not in resp.text
        ports = [_port_of(victim_pid), _port_of(spare_pid)]
        results = arena.attack("connect", ports=ports).json()
        assert all(results[str(port)].startswith("err: ") for port in ports), results
        signals = arena.attack("signals", pids=[victim_pid, spare_pid]).json()
        assert all(signals[f"host-{pid}"].startswith("err: ") for pid in (victim_pid, spare_pid)), signals
        arena.assert_fine()
        assert _runtimes_of(victim.ns, victim_code) == [victim_pid]
        # The attacker's memory limit (set on its spare's cgroup at the claim) ends a memory bomb, named as such.
        bomb = arena.attack("memory_bomb", mb=800)
        assert bomb.status_code >= 500 and "memory limit of 128 MB" in bomb.text, bomb.text
        arena.assert_fine()
    finally:
        code = sp.stop()
    assert code == 0, f"sless up did not stop cleanly ({code}):\n{sp.log_tail()}"
    until("no process of either tenant (their spares included) outlives sless up",
          lambda: not _uid_pids(tenant_uid(victim.ns)) and not _uid_pids(tenant_uid(attacker.ns)), 10, POLL)
