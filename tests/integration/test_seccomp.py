"""The sandbox's syscall filter against real sandboxed processes: every refused call answers EPERM.

A probe (the hostile function's ``syscalls`` action, tests/e2e/hostile/handler.py) calls each refused syscall
raw through libc's ``syscall()`` with arguments that fail harmlessly, and with another errno, where no
filter stops them; the same probe in the same sandbox without the filter shows that difference, so the
EPERMs are the filter's. The filter reaches bwrap on a descriptor the caller passes on (every launch of the
platform; one that passes none makes bwrap refuse to start). As root the sandbox drops to a tenant uid; the
same checks run as uid 65534, where it is a user namespace.
"""

from __future__ import annotations

import io
import json
import os
import platform
import resource
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sless_api.backends.standalone.builder import (
    Builder,
    BuildFailed,
    BuildRequest,
    python_interpreter,
    toolchain_paths,
)
from sless_api.backends.standalone.host import seccomp
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Sandbox
from tests.support.seccomp_probe import HANDLER, run_jailed, run_probe

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
#: Calls the probe sees fail otherwise (or succeed) without the filter: proof that the probe can tell.
UNFILTERED_NOT_EPERM = ("io_uring_setup", "keyctl", "bpf", "userfaultfd", "unshare", "setns", "mount",
                        "open_tree", "ptrace", "process_vm_readv", "name_to_handle_at", "personality",
                        "clone(CLONE_NEWUSER)", "int 0x80 getpid")

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe knows x86_64's syscall numbers"),
    pytest.mark.skipif(seccomp.problem() is not None, reason=f"no filter here: {seccomp.problem()}"),
]


def assert_refused(answers: dict[str, Any]) -> None:
    refused = {name: got for name, got in answers.items()
               if name not in ("clone3", "personality(PER_LINUX)", "Seccomp")}
    assert len(refused) >= 50 and set(refused.values()) == {"EPERM"}, refused
    assert answers["clone3"] == "ENOSYS"  # so libc falls back to clone, whose flags the filter reads
    assert answers["personality(PER_LINUX)"] == "ok"  # the default persona stays settable
    assert answers["Seccomp"] == "2"  # /proc/self/status: a filter is on


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    made = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    yield made
    made.close()


def test_the_start_up_reason_names_the_filter(sandbox: Sandbox) -> None:
    assert sandbox.syscall_filter and "seccomp filter refusing io_uring" in sandbox.reason


def test_every_refused_call_answers_eperm(sandbox: Sandbox) -> None:
    assert_refused(run_probe(sandbox))


def test_a_launch_starts_when_its_descriptors_are_numbered_past_1024(sandbox: Sandbox) -> None:
    """A long-running sless up has over 1024 descriptors open: the launch's own (the filter's memfd, the
    network's pipes) then get high numbers, which select() refuses and poll() does not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-files hard limit ({hard}) leaves no room above 1024")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) >= 1024
        jail = JailSpec(tenant="t1", limits=Limits.for_function(128, "python3.11"), ro_binds=(HANDLER.parent,))
        prepared = sandbox.prepare([str(python_interpreter()), "-S", "-c", "print('ran')"], HANDLER.parent, jail,
                                   "seccomp-highfds")
        assert min(prepared.pass_fds) >= 1024
        run = run_jailed(prepared, HANDLER.parent)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert run.returncode == 0 and run.stdout.strip() == "ran", run.stderr[-2000:]


def test_a_launch_without_its_descriptors_does_not_start(sandbox: Sandbox) -> None:
    """Deny by default: a caller that does not pass the launch's descriptors on gets no process, not one that
    runs unfiltered (bwrap cannot read the filter it was told to apply, and refuses). On the host's network,
    so that the filter's is the only descriptor in play."""
    jail = JailSpec(tenant="t1", limits=Limits.for_function(128, "python3.11"), ro_binds=(HANDLER.parent,),
                    own_network=False)
    prepared = sandbox.prepare([str(python_interpreter()), "-S", "-c", "print('ran')"], HANDLER.parent, jail,
                               "seccomp-nofds")
    try:
        proc = subprocess.Popen(prepared.argv, env={"PATH": "/usr/bin:/bin", **prepared.env}, cwd=HANDLER.parent,
                                preexec_fn=prepared.preexec,  # the sandbox's hook
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        prepared.release_fds()
        out, err = proc.communicate(timeout=60)
    finally:
        prepared.cleanup()
    assert proc.returncode != 0 and "ran" not in out and "seccomp" in err, (out, err)


def test_without_the_filter_the_probe_sees_the_kernels_own_answers(sandbox: Sandbox) -> None:
    # The same sandbox with the filter off (a second Sandbox in this process would share, and on closing
    # remove, this one's cgroup folder).
    sandbox.syscall_filter = False
    try:
        answers = run_probe(sandbox)
    finally:
        sandbox.syscall_filter = True
    assert answers["Seccomp"] == "0"
    assert all(answers[name] != "EPERM" for name in UNFILTERED_NOT_EPERM), answers


def test_the_filter_holds_without_root(tmp_path: Path) -> None:
    """As uid 65534 the sandbox is a user namespace (the process is root inside it): still EPERM everywhere."""
    if os.geteuid() != 0 or not SYSTEM_PYTHON.is_file():
        pytest.skip("needs root (to become uid 65534) and the system python3.11")
    site = REPO / ".venv" / "lib" / "python3.11" / "site-packages"
    script = (
        "import json, sys\n"
        "sys.path[:0] = [p for p in sys.argv[1:]]\n"
        "from sless_api.backends.standalone.builder import toolchain_paths\n"
        "from sless_api.backends.standalone.host.sandbox import Sandbox\n"
        "from tests.support.seccomp_probe import run_probe\n"
        "sandbox = Sandbox.detect('bwrap', toolchain=toolchain_paths())\n"
        "print(json.dumps({'reason': sandbox.reason, 'passed': run_probe(sandbox)}))\n"
    )
    paths = [str(p) for p in (REPO, REPO / "api" / "src", REPO / "core" / "src", site)]
    run = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", str(SYSTEM_PYTHON), "-c",
         script, *paths],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}, cwd="/", capture_output=True, text=True,
        timeout=120, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert "user namespaces" in result["reason"] and "seccomp filter" in result["reason"], result["reason"]
    assert_refused(result["passed"])


def test_a_filtered_sandbox_still_runs_threads_subprocesses_and_node(sandbox: Sandbox, tmp_path: Path) -> None:
    """What runtimes do at start and at work: threads (clone3 answers ENOSYS, clone is used), a subprocess,
    and Node, whose libuv probes io_uring (refused) and falls back to its thread pool."""
    script = ("import subprocess, threading\n"
              "t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()\n"
              "print(subprocess.run(['sh', '-c', 'echo child'], capture_output=True, text=True).stdout.strip())\n")
    node = "require('fs').readFile('/usr/bin/env', (e) => console.log(e ? 'fs error ' + e.code : 'node fs'))"
    runs: list[tuple[list[str], str]] = [([str(python_interpreter()), "-S", "-c", script], "thread\nchild")]
    node_bin = next((p for p in ("/usr/bin/node", "/usr/local/bin/node") if Path(p).is_file()), None)
    if node_bin is not None:
        runs.append(([node_bin, "-e", node], "node fs"))
    for argv, expected in runs:
        jail = JailSpec(tenant="t1", limits=Limits.for_function(256, "nodejs20"))
        prepared = sandbox.prepare(argv, Path("/"), jail, "seccomp-work")
        run = run_jailed(prepared, Path("/"))
        assert run.returncode == 0 and run.stdout.strip() == expected, (argv[0], run.stdout, run.stderr[-2000:])
    if node_bin is None:
        pytest.skip("node is not installed: only the Python half ran")


def test_the_program_is_built_once_and_each_launch_gets_its_own_descriptor(sandbox: Sandbox) -> None:
    assert seccomp.program() is seccomp.program()
    jail = JailSpec(tenant="t1", limits=Limits.for_function(128, "python3.11"))
    first, second = (sandbox.prepare(["true"], Path("/"), jail, f"seccomp-fd-{n}") for n in (1, 2))
    try:
        fds = [p.pass_fds[0] for p in (first, second)]  # no secret files: the filter's comes first
        assert fds[0] != fds[1]
        assert os.read(fds[0], 1 << 16) == seccomp.program() == os.read(fds[1], 1 << 16)
    finally:
        for prepared in (first, second):
            prepared.cleanup()


def test_without_libseccomp_the_sandbox_is_refused_and_says_why(tmp_path: Path) -> None:
    """A host without libseccomp: pyseccomp raises at import as it does there (a stand-in module first on the
    path). Required (bwrap) the sandbox refuses; auto reports it off with the reason, which makes `sless up`
    refuse to start (platform.make_sandbox) rather than run tenants unfiltered."""
    (tmp_path / "pyseccomp.py").write_text('raise RuntimeError("Unable to find libseccomp")\n')
    script = (
        "from sless_api.backends.settings import SandboxSettings\n"
        "from sless_api.backends.standalone.platform import make_sandbox\n"
        "from sless_api.backends.standalone.host.sandbox import Sandbox, SandboxUnavailable\n"
        "print('auto:', Sandbox.detect('auto').reason)\n"
        "for mode in ('bwrap', 'auto'):\n"
        "    try:\n"
        "        make_sandbox(SandboxSettings(mode=mode))\n"
        "        print(mode, 'started')\n"
        "    except SandboxUnavailable as exc:\n"
        "        print(mode, 'refused:', exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith("auto: no syscall filter: libseccomp") and "Unable to find libseccomp" in lines[0]
    assert lines[1].startswith("bwrap refused: no syscall filter: libseccomp"), lines
    assert lines[2].startswith("auto refused: no sandbox for function processes: no syscall filter"), lines


PROBE_SETUP = """\
import ctypes
from setuptools import setup

with open("/proc/self/status") as fh:
    mode = next(line.split()[1] for line in fh if line.startswith("Seccomp:"))
libc = ctypes.CDLL(None, use_errno=True)
ctypes.set_errno(0)
unshare = libc.syscall(272, 0)  # unshare(0): a no-op where nothing refuses it
if mode != "2" or unshare != -1 or ctypes.get_errno() != 1:
    raise SystemExit(f"sless-probe: not filtered (Seccomp {mode}, unshare {unshare}, errno {ctypes.get_errno()})")
print("sless-probe: filtered")
setup(name="sless-seccomp-probe", version="0.1", py_modules=[])
"""


def _sdist(path: Path) -> Path:
    """A source distribution whose build (setup.py, run by pip) fails unless it runs under the filter."""
    with tarfile.open(path, "w:gz") as tar:
        data = PROBE_SETUP.encode()
        info = tarfile.TarInfo("sless-seccomp-probe-0.1/setup.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path


def test_a_dependency_install_runs_under_the_filter(sandbox: Sandbox, tmp_path: Path) -> None:
    """pip through the builder (whose steps get the filter on a passed descriptor): a package's setup.py sees the
    filter, and the install succeeds."""
    if os.geteuid() != 0:
        pytest.skip("sandboxed installs per tenant uid need root (tests/integration/test_builder.py)")
    code = tmp_path / "code"
    code.mkdir()
    (code / "handler.py").write_text("def handle(event):\n    return 'ok'\n")
    _sdist(code / "sless-seccomp-probe-0.1.tar.gz")
    (code / "requirements.txt").write_text("./sless-seccomp-probe-0.1.tar.gz\n")
    progress: list[str] = []
    try:
        artifact = Builder(tmp_path / "cache", sandbox=sandbox, retry_delays=()).build(
            BuildRequest("python3.11", code, "handler.handle", "h1", tenant="t1"), progress.append)
    except BuildFailed as exc:
        if "setuptools" in exc.log_tail and ("network" in exc.log_tail.lower() or "resolve" in exc.log_tail.lower()):
            pytest.skip(f"pip could not fetch setuptools to build the probe: {exc.log_tail[-300:]}")
        raise
    assert artifact.deps_dir is not None
    assert "sless-probe: not filtered" not in "\n".join(progress)
