"""Warm spares (standalone/spares.py) through the supervisor: real runtime processes in the real bwrap sandbox.

As root (per-tenant uids, memory cgroups, the port rule), like `sless up` runs tenants. Every test ends by
checking that no child process and no cgroup of a spare is left behind. Python first, then Node (a spare per
tenant and runtime).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import aiohttp
import pytest

from sless_api import metrics
from sless_api.backends.standalone.builder import node_binary, python_interpreter, toolchain_paths
from sless_api.backends.standalone.host import supervisor as supervisor_module
from sless_api.backends.standalone.host.sandbox import JailSpec, Limits, Sandbox, inner_pid, tenant_uid
from sless_api.backends.standalone.host.spares import SPARE_SECRETS_DIR, SpareTemplate
from sless_api.backends.standalone.host.supervisor import ProcessSpec, Supervisor
from tests.support.poll import until_async
from tests.support.supervised import POLL, child_pids, get
from tests.support.supervised import run_scenario as supervised_scenario

REPO = Path(__file__).resolve().parents[2]
SERVER = REPO / "runtimes" / "python3.11" / "server.py"
ARGV = (str(python_interpreter()), "-S", str(SERVER))
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1"}

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant uids and memory cgroups need root")

HANDLER = """\
import os


def handle(event):
    query = event.get("_query") or {}
    secrets_dir = os.environ.get("SLESS_SECRETS_DIR", "")
    files = {}
    if secrets_dir and os.path.isdir(secrets_dir):
        for name in sorted(os.listdir(secrets_dir)):
            with open(os.path.join(secrets_dir, name)) as fh:
                files[name] = fh.read()
    hog = [b"x" * (1 << 20) for _ in range(int(query.get("mb", "0")))]
    return {"pid": os.getpid(), "uid": os.getuid(), "env": dict(os.environ), "files": files,
            "cwd": os.getcwd(), "held": len(hog),
            "secrets_mode": oct(os.stat(secrets_dir).st_mode & 0o777) if files else None}
"""

T = TypeVar("T")


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    made = Sandbox.detect("bwrap", toolchain=toolchain_paths())
    if made.cgroups is None:
        pytest.skip("no memory cgroup here: spares need one")
    yield made
    made.close()


def function(root: Path, tenant: str, name: str) -> Path:
    """``<root>/functions/<tenant>/<name>/v1`` holding the test handler, as the code store lays code out."""
    code = root / "functions" / tenant / name / "v1"
    code.mkdir(parents=True)
    (code / "handler.py").write_text(HANDLER)
    return code


def fn_spec(sandbox: Sandbox, code: Path, tenant: str, version: str = "v1", *, memory_mb: int = 128,
            env: dict[str, str] | None = None, files: tuple[tuple[str, bytes], ...] = (),
            spares: bool = True, spare_memory_mb: int | None = None) -> ProcessSpec:
    """A function of ``tenant`` as the router describes it, allowed to start from the tenant's spares."""
    limits = Limits.for_function(memory_mb, "python3.11")
    template = SpareTemplate(tenant=tenant, argv=ARGV, env=tuple(sorted(BASE_ENV.items())),
                             roots=(code.parents[1],),
                             limits=Limits.for_function(spare_memory_mb or memory_mb, "python3.11"))
    full_env = {**BASE_ENV, "SLESS_CODE_DIR": str(code), "FN_VERSION": version, **(env or {})}
    jail = JailSpec(tenant=tenant, limits=limits, ro_binds=(code,), files=files)
    return ProcessSpec(argv=list(ARGV), env=full_env, cwd=code, version=version, sandbox=sandbox, jail=jail,
                       runtime="python3.11", spare=template if spares else None)


def test_a_failed_spare_start_is_tried_again(tmp_path: Path, sandbox: Sandbox,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """A spare whose start fails (here its code folder is not there yet, so the sandbox cannot bind it: a fault
    that heals, as a set-up that broke under load does) is started again after a pause rather than left missing
    until the tenant's next claim; the failed attempt leaves no cgroup behind."""
    root = tmp_path / "functions" / "t1"
    template = SpareTemplate(tenant="t1", argv=ARGV, env=tuple(sorted(BASE_ENV.items())), roots=(root,),
                             limits=Limits.for_function(128, "python3.11"))
    caplog.set_level("INFO", "sless.standalone")

    async def scenario(sup: Supervisor) -> None:
        sup.spares.want(template, sandbox)
        await until_async("a failed first start", lambda: "trying again" in caplog.text, 30, POLL)
        assert sup.spares.count("t1") == 0 and sup.spares.starting("t1") == 1  # one start, waiting to try again
        root.mkdir(parents=True)
        await until_async("the spare, started again", lambda: sup.spares.count("t1") == 1, 30, POLL)
        assert "failed to start:" not in caplog.text.replace("failed to start, trying again", "")

    run_scenario(tmp_path, sandbox, scenario)


def spare_cgroups(sandbox: Sandbox) -> list[Path]:
    assert sandbox.cgroups is not None
    return [p for base in sandbox.cgroups.bases.values() for p in base.glob("spare-*")]


def run_scenario(tmp_path: Path, sandbox: Sandbox, scenario: Callable[[Supervisor], Awaitable[T]],
                 warm_spares: int = 1) -> T:
    result = supervised_scenario(tmp_path, scenario, timeout=120, warm_spares=warm_spares)
    assert spare_cgroups(sandbox) == [], "a spare's cgroups survived Supervisor.close()"
    return result


def log_text(tmp_path: Path, key: str) -> str:
    return (tmp_path / "logs" / f"{key}.log").read_text(errors="replace")


def environ_of_spares(sup: Supervisor, tenant: str, runtime: str | None = None) -> list[bytes]:
    """The environment blocks of the tenant's ready spares' runtimes, as root reads them from /proc."""
    blocks = []
    for spare in sup.spares.spares(tenant, runtime):
        pid = inner_pid(spare.proc.pid)
        assert pid is not None
        blocks.append(Path(f"/proc/{pid}/environ").read_bytes())
    return blocks


def test_a_claimed_spare_serves_the_function_with_its_env_and_secret_files(tmp_path: Path, sandbox: Sandbox) -> None:
    code = function(tmp_path, "t1", "fn")
    secret = (("token", b"s3cret-file-value"),)

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("t1.fn", fn_spec(sandbox, code, "t1", env={"API_KEY": "s3cret-env"}, files=secret))
        await until_async("the tenant's spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        spare_pid = sup.spares.spares("t1")[0].proc.pid
        claims = metrics.WARM_SPARE_CLAIMS.labels("python3.11")._value.get()
        async with aiohttp.ClientSession() as session, sup.lease("t1.fn") as url:
            body = await get(session, url)
        assert sup.status("t1.fn")["pid"] == spare_pid  # the spare itself became the function's process
        assert body["uid"] == tenant_uid("t1") and body["pid"] < 10
        assert body["env"]["API_KEY"] == "s3cret-env" and body["env"]["FN_VERSION"] == "v1"
        assert "SLESS_SPARE" not in body["env"] and "SLESS_READY_FD" not in body["env"]
        assert body["env"]["SLESS_SECRETS_DIR"] == SPARE_SECRETS_DIR
        assert body["files"] == {"token": "s3cret-file-value"} and body["secrets_mode"] == "0o500"
        assert body["cwd"] == str(code)
        assert "in warm spare pid" in log_text(tmp_path, "t1.fn")
        assert metrics.WARM_SPARE_CLAIMS.labels("python3.11")._value.get() == claims + 1
        # A new spare replaces the claimed one; the function's values never reached it.
        await until_async("the replacement spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        for block in environ_of_spares(sup, "t1"):
            assert b"s3cret" not in block and b"FN_VERSION" not in block
        # Output after the claim goes to the function's log; the claim's values never do.
        async with aiohttp.ClientSession() as session, sup.lease("t1.fn") as url:
            await get(session, url)
        assert "python runtime listening" in log_text(tmp_path, "t1.fn")
        assert "s3cret" not in log_text(tmp_path, "t1.fn")
        # A redeploy takes the replacement spare, and the claimed one drains on SIGTERM as any process does.
        await sup.deploy("t1.fn", fn_spec(sandbox, code, "t1", "v2", files=secret))
        assert log_text(tmp_path, "t1.fn").count("in warm spare pid") == 2
        async with aiohttp.ClientSession() as session, sup.lease("t1.fn") as url:
            assert (await get(session, url))["env"]["FN_VERSION"] == "v2"
        await until_async("the first claimed spare to drain",
                          lambda: f"pid {spare_pid} stopped (exit code 0)" in log_text(tmp_path, "t1.fn"), 20, POLL)

    run_scenario(tmp_path, sandbox, scenario)


def test_the_replacement_spare_starts_after_the_first_call_not_beside_it(
    tmp_path: Path, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare's start takes the CPU for tens of milliseconds; the call that claimed one must not share it."""
    monkeypatch.setattr(supervisor_module, "SPARE_REPLACE_LATEST_SEC", 3600.0)  # only the call's end starts it
    code_a, code_b = function(tmp_path, "t1", "a"), function(tmp_path, "t1", "b")

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1"))
        await sup.deploy("t1.b", fn_spec(sandbox, code_b, "t1"))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        async with aiohttp.ClientSession() as session:
            async with sup.lease("t1.a") as url:
                assert "in warm spare pid" in log_text(tmp_path, "t1.a")
                assert sup.spares.count("t1") + sup.spares.starting("t1") == 0  # nothing starts during the call
                await get(session, url)
            await until_async("the replacement, once the call ended", lambda: sup.spares.count("t1") == 1, 20, POLL)
            # A function removed while its replacement is due starts none.
            async with sup.lease("t1.b"):
                pass
            await until_async("the next replacement", lambda: sup.spares.count("t1") == 1, 20, POLL)
            await sup.remove("t1.a")
            await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1", "v2"))
            await sup.endpoint("t1.a")  # claimed, no call ends
            assert "in warm spare pid" in log_text(tmp_path, "t1.a") and sup.spares.count("t1") == 0
            await sup.remove("t1.a")
            await sup.remove("t1.b")
        assert sup.spares.count("t1") + sup.spares.starting("t1") == 0 and sup.spares.tenants() == []

    run_scenario(tmp_path, sandbox, scenario)


def test_a_spare_of_one_tenant_never_serves_another(tmp_path: Path, sandbox: Sandbox) -> None:
    code1, code2 = function(tmp_path, "t1", "fn"), function(tmp_path, "t2", "fn")

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("t1.fn", fn_spec(sandbox, code1, "t1"))
        await until_async("t1's spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        t1_spare = sup.spares.spares("t1")[0]
        other = fn_spec(sandbox, code2, "t2", spares=False)
        assert sup.spares.take(other.argv, other.env, other.jail, sandbox) is None
        assert t1_spare.why_not(other.argv, other.env, other.jail) == "another tenant"
        # t2's code is outside t1's spare's mount view even under t1's name.
        disguised = fn_spec(sandbox, code2, "t1", spares=False)
        assert t1_spare.why_not(disguised.argv, disguised.env, disguised.jail) == "folders outside its mount view"
        await sup.deploy("t2.fn", other)
        async with aiohttp.ClientSession() as session, sup.lease("t2.fn") as url:
            body = await get(session, url)
        assert body["uid"] == tenant_uid("t2")
        assert sup.spares.spares("t1") == [t1_spare] and t1_spare.proc.returncode is None
        assert "warm spare" not in log_text(tmp_path, "t2.fn")

    run_scenario(tmp_path, sandbox, scenario)


def test_a_function_does_not_see_another_functions_env_or_secrets_through_spares(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    code_a, code_b = function(tmp_path, "t1", "a"), function(tmp_path, "t1", "b")

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1", env={"A_ONLY": "a-secret"},
                                         files=(("a-token", b"a-file-secret"),)))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        async with aiohttp.ClientSession() as session:
            async with sup.lease("t1.a") as url:
                assert (await get(session, url))["env"]["A_ONLY"] == "a-secret"
            await until_async("the replacement spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
            await sup.deploy("t1.b", fn_spec(sandbox, code_b, "t1", env={"B_ONLY": "b"}))
            async with sup.lease("t1.b") as url:
                body = await get(session, url)
        assert "in warm spare pid" in log_text(tmp_path, "t1.b")
        assert "A_ONLY" not in body["env"] and body["files"] == {}
        assert "a-secret" not in str(body) and "a-file-secret" not in str(body)

    run_scenario(tmp_path, sandbox, scenario)


def test_the_memory_limit_set_at_the_claim_kills_a_memory_bomb_with_a_clear_error(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    code = function(tmp_path, "t1", "hog")

    async def scenario(sup: Supervisor) -> None:
        # The spare starts with 512 MB; the function's 128 MB are set on its cgroup before the claim.
        await sup.deploy("t1.hog", fn_spec(sandbox, code, "t1", memory_mb=128, spare_memory_mb=512))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        async with aiohttp.ClientSession() as session:
            async with sup.lease("t1.hog") as url:
                assert (await get(session, url, mb="8"))["held"] == 8
            assert "in warm spare pid" in log_text(tmp_path, "t1.hog")
            with pytest.raises(supervisor_module.LimitExceeded, match="memory limit of 128 MB"):
                async with sup.lease("t1.hog") as url:
                    await get(session, url, mb="400")
        await until_async("the crash is recorded with its cause",
                          lambda: "memory limit of 128 MB" in (sup.status("t1.hog")["last_error"] or ""), 20, POLL)

    run_scenario(tmp_path, sandbox, scenario)


def test_functions_that_do_not_fit_and_disabled_spares_start_as_before(tmp_path: Path, sandbox: Sandbox) -> None:
    code = function(tmp_path, "t1", "fn")

    async def scenario(sup: Supervisor) -> None:
        # PYTHONHASHSEED is read when the interpreter starts: too late at a claim, so a fresh process.
        await sup.deploy("t1.fn", fn_spec(sandbox, code, "t1", env={"PYTHONHASHSEED": "7"}))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        async with aiohttp.ClientSession() as session, sup.lease("t1.fn") as url:
            body = await get(session, url)
        assert body["env"]["PYTHONHASHSEED"] == "7" and "warm spare" not in log_text(tmp_path, "t1.fn")
        assert sup.spares.count("t1") == 1  # still there for a function that fits

    run_scenario(tmp_path, sandbox, scenario)

    disabled = tmp_path / "disabled"

    async def without_spares(sup: Supervisor) -> None:
        await sup.deploy("t1.fn", fn_spec(sandbox, code, "t1"))
        async with aiohttp.ClientSession() as session, sup.lease("t1.fn") as url:
            assert (await get(session, url))["uid"] == tenant_uid("t1")
        assert sup.spares.tenants() == [] and spare_cgroups(sandbox) == []
        assert "warm spare" not in log_text(disabled, "t1.fn")

    run_scenario(disabled, sandbox, without_spares, warm_spares=0)


def test_removing_the_tenants_last_function_stops_its_spares(tmp_path: Path, sandbox: Sandbox) -> None:
    code_a, code_b = function(tmp_path, "t1", "a"), function(tmp_path, "t1", "b")

    async def scenario(sup: Supervisor) -> None:
        before = child_pids()
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1"))
        await sup.deploy("t1.b", fn_spec(sandbox, code_b, "t1"))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        assert len(spare_cgroups(sandbox)) >= 1 and child_pids() - before
        await sup.remove("t1.a")
        assert sup.spares.count("t1") == 1  # b still wants it
        await sup.remove("t1.b")
        assert sup.spares.tenants() == []
        assert spare_cgroups(sandbox) == []
        await until_async("the spare's processes to be gone", lambda: child_pids() - before == set(), 20, POLL)
        # A function redeployed so that it no longer uses spares (another runtime) takes its tenant's with it.
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1"))
        await until_async("the spare", lambda: sup.spares.count("t1") == 1, 20, POLL)
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1", "v2", spares=False))
        assert sup.spares.tenants() == [] and spare_cgroups(sandbox) == []
        await sup.remove("t1.a")
        # A removal while a spare is still starting leaves nothing behind either.
        await sup.deploy("t1.a", fn_spec(sandbox, code_a, "t1"))
        await sup.remove("t1.a")
        assert spare_cgroups(sandbox) == []
        await until_async("the starting spare to be gone", lambda: child_pids() - before == set(), 20, POLL)

    run_scenario(tmp_path, sandbox, scenario)


# --------------------------------------------------------------------------- Node

NODE = shutil.which(node_binary())
NODE_SERVER = REPO / "runtimes" / "nodejs20" / "server.js"
NODE_ARGV = (NODE or "node", str(NODE_SERVER))
NODE_HANDLER = """\
'use strict';
const fs = require('node:fs');
const path = require('node:path');
const v8 = require('node:v8');

const ENV_AT_LOAD = { ...process.env };

exports.handle = async (event) => {
  const query = event._query || {};
  const secretsDir = process.env.SLESS_SECRETS_DIR || '';
  const files = {};
  if (secretsDir && fs.existsSync(secretsDir)) {
    for (const name of fs.readdirSync(secretsDir).sort()) {
      files[name] = fs.readFileSync(path.join(secretsDir, name), 'utf8');
    }
  }
  const hog = [];
  for (let i = 0; i < Number(query.mb || '0'); i++) hog.push(Buffer.alloc(1 << 20, 1));
  return { pid: process.pid, uid: process.getuid(), env: { ...process.env }, env_at_load: ENV_AT_LOAD, files,
           cwd: process.cwd(), held: hog.length, heap_limit_mb: v8.getHeapStatistics().heap_size_limit / 1048576,
           sees: query.path ? fs.existsSync(query.path) : null,
           secrets_mode: Object.keys(files).length ? '0o' + (fs.statSync(secretsDir).mode & 0o777).toString(8) : null };
};
"""
NODE_RUNTIME = "nodejs20"

needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed")


def node_function(root: Path, tenant: str, name: str) -> Path:
    """``<root>/functions/<tenant>/<name>/v1`` holding the Node test handler."""
    code = root / "functions" / tenant / name / "v1"
    code.mkdir(parents=True)
    (code / "handler.js").write_text(NODE_HANDLER)
    return code


def node_spec(sandbox: Sandbox, code: Path, tenant: str, version: str = "v1", *, memory_mb: int = 256,
              env: dict[str, str] | None = None, files: tuple[tuple[str, bytes], ...] = (),
              spare_memory_mb: int | None = None) -> ProcessSpec:
    """A Node function of ``tenant`` as the router describes it, allowed to start from the tenant's Node spares."""
    limits = Limits.for_function(memory_mb, NODE_RUNTIME)
    template = SpareTemplate(tenant=tenant, argv=NODE_ARGV, env=tuple(sorted(BASE_ENV.items())),
                             roots=(code.parents[1],), runtime=NODE_RUNTIME,
                             limits=Limits.for_function(spare_memory_mb or memory_mb, NODE_RUNTIME))
    full_env = {**BASE_ENV, "SLESS_CODE_DIR": str(code), "FN_VERSION": version, **(env or {})}
    jail = JailSpec(tenant=tenant, limits=limits, ro_binds=(code,), files=files)
    return ProcessSpec(argv=list(NODE_ARGV), env=full_env, cwd=code, version=version, sandbox=sandbox, jail=jail,
                       runtime=NODE_RUNTIME, spare=template)


def node_spares(sup: Supervisor, tenant: str) -> int:
    return sup.spares.count(tenant, NODE_RUNTIME)


ODD_ENV = {"ODD_VALUE": "spaces and = signs; \"quotes\" \\ back\\slash\nnew line \u00e9 \u2603 $HOME `x`",
           "NODE_ENV": "production", "lower_case": "1", "EMPTY": ""}


@needs_node
def test_a_claimed_node_spare_serves_the_function_with_its_env_and_secret_files(
    tmp_path: Path, sandbox: Sandbox
) -> None:
    code = node_function(tmp_path, "t1", "js")
    other = node_function(tmp_path, "t2", "js")
    secret = (("token", b"s3cret-file-value"),)

    async def scenario(sup: Supervisor) -> None:
        spec = node_spec(sandbox, code, "t1", env={"API_KEY": "s3cret-env", **ODD_ENV}, files=secret)
        await sup.deploy("t1.js", spec)
        await until_async("the tenant's Node spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)
        spare = sup.spares.spares("t1", NODE_RUNTIME)[0]
        assert spare.why_not(spec.argv, spec.env, spec.jail) is None  # NODE_ENV is set at the claim: it fits
        # Before the claim: none of the function's values, none of its secrets, no other tenant's function.
        for block in environ_of_spares(sup, "t1", NODE_RUNTIME):
            assert b"s3cret" not in block and b"FN_VERSION" not in block and b"NODE_ENV" not in block
        inner = inner_pid(spare.proc.pid)
        assert inner is not None and not Path(f"/proc/{inner}/root{SPARE_SECRETS_DIR}").exists()
        assert Path(f"/proc/{inner}/root{code}").is_dir() and not Path(f"/proc/{inner}/root{other}").exists()
        stranger = node_spec(sandbox, other, "t2")
        assert spare.why_not(stranger.argv, stranger.env, stranger.jail) == "another tenant"
        claims = metrics.WARM_SPARE_CLAIMS.labels(NODE_RUNTIME)._value.get()
        async with aiohttp.ClientSession() as session, sup.lease("t1.js") as url:
            body = await get(session, url, path=str(other))
        assert sup.status("t1.js")["pid"] == spare.proc.pid  # the spare itself became the function's process
        assert body["uid"] == tenant_uid("t1") and body["pid"] < 10
        for source in ("env", "env_at_load"):  # the claim's environment was complete before the handler loaded
            assert body[source]["API_KEY"] == "s3cret-env" and body[source]["FN_VERSION"] == "v1"
            assert {k: body[source].get(k) for k in ODD_ENV} == ODD_ENV
            assert "SLESS_SPARE" not in body[source] and "SLESS_READY_FD" not in body[source]
        assert body["env"]["SLESS_SECRETS_DIR"] == SPARE_SECRETS_DIR
        assert body["files"] == {"token": "s3cret-file-value"} and body["secrets_mode"] == "0o500"
        assert body["cwd"] == str(code)
        assert body["sees"] is False  # another tenant's code is not in its mount view
        assert "in warm spare pid" in log_text(tmp_path, "t1.js")
        assert metrics.WARM_SPARE_CLAIMS.labels(NODE_RUNTIME)._value.get() == claims + 1
        # The replacement spare never saw the function's values.
        await until_async("the replacement spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)
        for block in environ_of_spares(sup, "t1", NODE_RUNTIME):
            assert b"s3cret" not in block and b"FN_VERSION" not in block
        assert "s3cret" not in log_text(tmp_path, "t1.js")
        # A redeploy takes the replacement, and the claimed one drains on SIGTERM as any process does.
        await sup.deploy("t1.js", node_spec(sandbox, code, "t1", "v2"))
        assert log_text(tmp_path, "t1.js").count("in warm spare pid") == 2
        async with aiohttp.ClientSession() as session, sup.lease("t1.js") as url:
            assert (await get(session, url))["env"]["FN_VERSION"] == "v2"
        await until_async("the first claimed spare to drain",
                          lambda: f"pid {spare.proc.pid} stopped (exit code 0)" in log_text(tmp_path, "t1.js"),
                          20, POLL)

    run_scenario(tmp_path, sandbox, scenario)


@needs_node
def test_a_node_function_that_changes_node_options_gets_a_fresh_start(tmp_path: Path, sandbox: Sandbox) -> None:
    code = node_function(tmp_path, "t1", "js")

    async def scenario(sup: Supervisor) -> None:
        # NODE_OPTIONS is read when node starts: too late at a claim, so a fresh process that honours it.
        spec = node_spec(sandbox, code, "t1", env={"NODE_OPTIONS": "--max-old-space-size=96"})
        await sup.deploy("t1.js", spec)
        await until_async("the Node spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)
        spare = sup.spares.spares("t1", NODE_RUNTIME)[0]
        assert spare.why_not(spec.argv, spec.env, spec.jail) == "other start-time variables"
        for variable in ("UV_THREADPOOL_SIZE", "LD_PRELOAD", "TZ", "NODE_PATH", "OPENSSL_CONF"):
            other = node_spec(sandbox, code, "t1", env={variable: "/x"})
            assert spare.why_not(other.argv, other.env, other.jail) == "other start-time variables", variable
        async with aiohttp.ClientSession() as session, sup.lease("t1.js") as url:
            body = await get(session, url)
        assert body["env"]["NODE_OPTIONS"] == "--max-old-space-size=96" and body["heap_limit_mb"] < 200
        assert "warm spare" not in log_text(tmp_path, "t1.js")
        assert node_spares(sup, "t1") == 1 and sup.spares.spares("t1", NODE_RUNTIME) == [spare]  # still there

    run_scenario(tmp_path, sandbox, scenario)


@needs_node
def test_a_tenant_keeps_a_spare_per_runtime_and_each_serves_only_its_own(tmp_path: Path, sandbox: Sandbox) -> None:
    py_code, js_code = function(tmp_path, "t1", "py"), node_function(tmp_path, "t1", "js")

    async def scenario(sup: Supervisor) -> None:
        before = child_pids()
        py, js = fn_spec(sandbox, py_code, "t1"), node_spec(sandbox, js_code, "t1")
        await sup.deploy("t1.py", py)
        await sup.deploy("t1.js", js)
        await until_async("a spare of each runtime", lambda: (sup.spares.count("t1", "python3.11"),
                                                              node_spares(sup, "t1")) == (1, 1), 30, POLL)
        py_spare = sup.spares.spares("t1", "python3.11")[0]
        js_spare = sup.spares.spares("t1", NODE_RUNTIME)[0]
        assert py_spare.why_not(js.argv, js.env, js.jail) == "another command"
        assert js_spare.why_not(py.argv, py.env, py.jail) == "another command"
        async with aiohttp.ClientSession() as session:
            async with sup.lease("t1.js") as url:
                await get(session, url)
            async with sup.lease("t1.py") as url:
                await get(session, url)
        assert sup.status("t1.js")["pid"] == js_spare.proc.pid and sup.status("t1.py")["pid"] == py_spare.proc.pid
        await until_async("the replacements", lambda: (sup.spares.count("t1", "python3.11"),
                                                       node_spares(sup, "t1")) == (1, 1), 30, POLL)
        # The tenant's last Node function gone: its Node spares go, its Python spare stays.
        await sup.remove("t1.js")
        assert sup.spares.spares("t1", NODE_RUNTIME) == [] and sup.spares.count("t1", "python3.11") == 1
        await sup.remove("t1.py")
        assert sup.spares.tenants() == [] and spare_cgroups(sandbox) == []
        await until_async("every process to be gone", lambda: child_pids() - before == set(), 20, POLL)

    run_scenario(tmp_path, sandbox, scenario)


@needs_node
def test_the_memory_limit_set_at_a_node_claim_kills_a_memory_bomb(tmp_path: Path, sandbox: Sandbox) -> None:
    code = node_function(tmp_path, "t1", "hog")

    async def scenario(sup: Supervisor) -> None:
        # The spare starts with 768 MB; the function's 128 MB are set on its cgroup before the claim.
        await sup.deploy("t1.hog", node_spec(sandbox, code, "t1", memory_mb=128, spare_memory_mb=768))
        await until_async("the Node spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)
        async with aiohttp.ClientSession() as session:
            async with sup.lease("t1.hog") as url:
                assert (await get(session, url, mb="8"))["held"] == 8
            assert "in warm spare pid" in log_text(tmp_path, "t1.hog")
            with pytest.raises(supervisor_module.LimitExceeded, match="memory limit of 128 MB"):
                async with sup.lease("t1.hog") as url:
                    await get(session, url, mb="400")

    run_scenario(tmp_path, sandbox, scenario)


@needs_node
def test_a_claimed_node_spare_whose_handler_fails_to_load_is_a_failed_start(tmp_path: Path, sandbox: Sandbox) -> None:
    code = node_function(tmp_path, "t1", "broken")
    (code / "handler.js").write_text("throw new Error('broken at load');\n")

    async def scenario(sup: Supervisor) -> None:
        await sup.deploy("t1.broken", node_spec(sandbox, code, "t1"))
        await until_async("the Node spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)
        with pytest.raises(supervisor_module.StartFailed, match="broken at load"):
            async with sup.lease("t1.broken"):
                pass
        assert "in warm spare pid" in log_text(tmp_path, "t1.broken")
        await until_async("the replacement spare", lambda: node_spares(sup, "t1") == 1, 30, POLL)

    run_scenario(tmp_path, sandbox, scenario)
