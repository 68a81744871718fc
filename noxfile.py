"""One part of the test suite at a time, each session preparing only what that part needs.

`scripts/test.sh` (CI, through `.ci/run`) stays the one command that installs, builds and runs everything; the
`ci` session runs it. The other sessions call the same set-up scripts, but only those their tests need:

- bootstrap: `scripts/bootstrap.sh` (the project's .venv; quick when pyproject.toml did not change)
- services: `scripts/install-test-services.sh` (PostgreSQL server binaries, RabbitMQ, wrk, bubblewrap, passt,
  Chromium and its driver, buildah, the S3 server `moto_server`); installed only, the fixtures start private
  servers on loopback (tests/support/services.py, tests/support/rabbitmq.py)
- test bed: `tests/testbed/build.sh` (etcd, the Kubernetes binaries, kwok, helm; cached, 10-20 min cold)
- KEDA on the test bed: `tests/testbed/build-keda.sh` (operator and metrics adapter; cached, ~6 min cold)
- real node: `scripts/install-realnode.sh` and `testbed build --real-node` (root; ~20-27 min cold)
- Vault: `tests/install/build-vault.sh`; Ansible collections: `scripts/install-collections.sh`

Every session uses the existing .venv (no virtualenv of nox's own). Arguments after `--` go to pytest
(`.venv/bin/nox -s unit -- -k auth -x`); for `molecule` they name the scenarios, for `ci` they go to
scripts/test.sh. pytest's exit code 5 (no tests collected) fails the session, as it does in scripts/test.sh.
`.venv/bin/nox` alone runs `lint` and `unit` only.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox
from nox.command import CommandFailed

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "unit"]  # the cheap ones: nothing installed, started or built beyond the venv

ROOT = Path(__file__).resolve().parent
VENV_BIN = ROOT / ".venv" / "bin"
# one real node per machine: the lock scripts/test.sh and molecule/README.md take (a fixed, shared path)
REALNODE_LOCK = "/tmp/sless-realnode.lock"  # noqa: S108
MOLECULE_SCENARIOS = ("default", "e2e", "stress", "functions")  # scripts/test.sh's, in its order
NO_TESTS_COLLECTED = 5


def _tool(name: str) -> str:
    return str(VENV_BIN / name)


def _bootstrap(session: nox.Session) -> None:
    """The project's .venv with sless and its dev tools (scripts/bootstrap.sh)."""
    session.run("bash", "scripts/bootstrap.sh", external=True)


def _services(session: nox.Session) -> None:
    """Install the test services (started by the tests' fixtures, not here)."""
    session.run("bash", "scripts/install-test-services.sh", external=True)


def _testbed(session: nox.Session) -> None:
    """The Kubernetes test bed's binaries (built once, cached; timings on stderr, the bin folder on stdout)."""
    session.run("bash", "tests/testbed/build.sh", external=True)


def _keda(session: nox.Session) -> None:
    """KEDA's operator and metrics adapter for the `keda` fixture (built once, cached; ~6 min cold)."""
    session.run("bash", "tests/testbed/build-keda.sh", external=True)


def _vault(session: nox.Session) -> None:
    """The Vault server of the install tests (built once, cached)."""
    session.run("bash", "tests/install/build-vault.sh", external=True)


def _collections(session: nox.Session) -> None:
    """The Ansible collections of requirements.yml and sless.platform, into .ansible/collections."""
    session.run("bash", "scripts/install-collections.sh", external=True)


def _require_root(session: nox.Session, what: str) -> None:
    if os.geteuid() != 0:
        session.error(f"{what} needs root")


def _pytest(session: nox.Session, *args: str, env: dict[str, str] | None = None, lock: str | None = None) -> None:
    """pytest with ARGS and the session's posargs; "no tests collected" (exit 5) is a failure."""
    argv = [_tool("pytest"), "-p", "no:cacheprovider", *args, *session.posargs]
    if lock:
        argv = ["flock", "-o", lock, *argv]  # -o: the processes pytest starts do not hold it
    try:
        session.run(*argv, env=env or {}, external=True, success_codes=[0])
    except CommandFailed as exc:
        if exc.return_code == NO_TESTS_COLLECTED:
            session.error("pytest collected no tests: that is a failure (check the path, -m and -k)")
        raise


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """Linters; starts nothing (venv only): ruff, mypy, lint-imports, scripts/lint-install.sh.

    Bootstrap, then ruff, mypy, lint-imports and scripts/lint-install.sh (helm lint, yamllint, ansible-lint,
    the chart and role tests; it installs the Ansible collections and needs helm: the test bed's, when built,
    or one on PATH). Every linter runs; the session fails if one did.
    """
    _bootstrap(session)
    failed: list[str] = []
    for name, argv in (
        ("ruff", [_tool("ruff"), "check", "."]),
        ("mypy", [_tool("mypy")]),
        ("lint-imports", [_tool("lint-imports")]),
        ("lint-install", ["bash", "scripts/lint-install.sh"]),
    ):
        try:
            session.run(*argv, external=True)
        except CommandFailed:
            failed.append(name)
    if failed:
        session.error(f"lint failed: {', '.join(failed)}")


@nox.session(python=False)
def unit(session: nox.Session) -> None:
    """pytest tests/unit; starts nothing (venv only: bootstrap)."""
    _bootstrap(session)
    _pytest(session, "tests/unit")


@nox.session(python=False)
def integration(session: nox.Session) -> None:
    """pytest tests/integration; installs the test services (fixtures start PostgreSQL, RabbitMQ, S3).

    Bootstrap and scripts/install-test-services.sh; the fixtures start the servers on loopback. As root the
    warm-spare and supervisor tests also run (per-tenant uids, cgroups); not beside a running real node, whose
    kube-router wipes their iptables port guard (scripts/test.sh runs them under the real node's lock).
    """
    _services(session)
    _bootstrap(session)
    _pytest(session, "tests/integration")


@nox.session(python=False)
def e2e(session: nox.Session) -> None:
    """pytest tests/e2e; installs the test services (`sless up` as a real process, fixtures start servers).

    Bootstrap and scripts/install-test-services.sh (PostgreSQL, RabbitMQ, S3, bubblewrap and passt for the
    sandbox, Chromium for the browser tests); no test bed.
    """
    _services(session)
    _bootstrap(session)
    _pytest(session, "tests/e2e")


@nox.session(python=False)
def k8s(session: nox.Session) -> None:
    """pytest -m k8s; installs the test services, builds the test bed's binaries, KEDA and Vault (all cached).

    Bootstrap, scripts/install-test-services.sh, scripts/install-collections.sh, tests/install/build-vault.sh
    (the k8s-marked Vault tests of tests/install), tests/testbed/build.sh and tests/testbed/build-keda.sh (the
    `keda` fixture's; both skipped with SLESS_TESTBED_EXISTING=1 and KUBECONFIG: that cluster is used). Covers
    tests/k8s, the kubernetes cases of tests/backends and tests/install's Vault tests; the fixture starts a
    control plane with kwok nodes, and KEDA on it for the tests that ask.
    """
    _services(session)
    _bootstrap(session)
    _collections(session)
    _vault(session)
    if os.environ.get("SLESS_TESTBED_EXISTING") != "1":
        _testbed(session)
        _keda(session)
    _pytest(session, "-m", "k8s")


@nox.session(python=False)
def realnode(session: nox.Session) -> None:
    """SLESS_REALNODE=1 pytest -m realnode (root); installs the services, the real node's packages, builds it.

    scripts/install-test-services.sh (S3 and PostgreSQL for some real-node tests), scripts/install-realnode.sh
    (containerd, runc, CNI plugins, ipset, debootstrap, buildah), bootstrap, `testbed build --real-node` (the
    test bed's binaries, CoreDNS, registry, kaniko, kube-router, gVisor, the images; cached) and
    tests/testbed/build-keda.sh (KEDA for the elastic functions' tests; cached). pytest runs under the real
    node's lock (/tmp/sless-realnode.lock), as in scripts/test.sh.
    """
    _require_root(session, "the real node")
    _services(session)
    session.run("bash", "scripts/install-realnode.sh", external=True)
    _bootstrap(session)
    session.run(_tool("python"), "tests/testbed/testbed", "build", "--real-node", external=True)
    _keda(session)
    _pytest(session, "-m", "realnode", env={"SLESS_REALNODE": "1"}, lock=REALNODE_LOCK)


@nox.session(python=False)
def runtimes(session: nox.Session) -> None:
    """pytest tests/runtimes; starts nothing but the runtimes' own processes (venv only: bootstrap).

    Each runtime as a real process against one contract suite; bootstrap checks for Node.js and Go.
    """
    _bootstrap(session)
    _pytest(session, "tests/runtimes")


@nox.session(python=False)
def install(session: nox.Session) -> None:
    """pytest tests/install; installs the services and collections, builds the test bed and Vault (cached).

    Bootstrap, scripts/install-test-services.sh (buildah for the runtime images), scripts/install-collections.sh,
    tests/install/build-vault.sh, tests/testbed/build.sh (helm, and the control plane of the Vault tests). The
    chart over `helm template`, the roles, the runtime images' builds, Vault secrets on the test bed.
    """
    _services(session)
    _bootstrap(session)
    _collections(session)
    _vault(session)
    _testbed(session)
    _pytest(session, "tests/install")


@nox.session(python=False)
def backends(session: nox.Session) -> None:
    """pytest tests/backends; installs the test services, builds the test bed's binaries and KEDA (cached).

    Bootstrap, scripts/install-test-services.sh (RabbitMQ, S3), tests/testbed/build.sh and
    tests/testbed/build-keda.sh (both skipped with SLESS_TESTBED_EXISTING=1). The REST contract against
    `sless up` and against the kubernetes backend with its operator on the test bed (KEDA for its scaling).
    """
    _services(session)
    _bootstrap(session)
    if os.environ.get("SLESS_TESTBED_EXISTING") != "1":
        _testbed(session)
        _keda(session)
    _pytest(session, "tests/backends")


@nox.session(python=False)
def molecule(session: nox.Session) -> None:
    """molecule/run.sh per scenario (args choose them); installs the services, run.sh builds what it needs.

    scripts/install-test-services.sh, bootstrap, as root for e2e-real scripts/install-realnode.sh; then
    molecule/run.sh for each scenario, one after the other (they share Vault's and S3's fixed ports), each
    building its test bed binaries and Vault (cached). Scenarios: the positional arguments, else default, e2e,
    stress and functions, and as root e2e-real (under the real node's lock; SLESS_SKIP_REALNODE=1 leaves it out),
    as scripts/test.sh runs them. SLESS_STRESS_DURATION defaults to 15 s, as there.
    """
    scenarios = list(session.posargs)
    if not scenarios:
        scenarios = list(MOLECULE_SCENARIOS)
        if os.geteuid() == 0 and "1" not in (
            os.environ.get("SLESS_SKIP_REALNODE"),
            os.environ.get("SLESS_TESTBED_EXISTING"),
        ):
            scenarios.append("e2e-real")
    _services(session)
    if "e2e-real" in scenarios:
        _require_root(session, "the e2e-real scenario")
        session.run("bash", "scripts/install-realnode.sh", external=True)
    _bootstrap(session)
    env = {"SLESS_STRESS_DURATION": os.environ.get("SLESS_STRESS_DURATION", "15")}
    failed: list[str] = []
    for scenario in scenarios:
        argv = ["bash", "molecule/run.sh", scenario]
        if scenario == "e2e-real":
            argv = ["flock", "-o", REALNODE_LOCK, *argv]
        try:
            session.run(*argv, env=env, external=True)
        except CommandFailed:
            failed.append(scenario)
    if failed:
        session.error(f"molecule scenarios failed: {', '.join(failed)}")


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """scripts/test.sh: everything, as CI runs it (services, real node as root, venv, Vault, test bed).

    Lints, then pytest in three lanes and the Molecule scenarios. Arguments after `--` go to scripts/test.sh
    (one pytest run with them instead of the lanes, then the scenarios).
    """
    session.run("bash", "scripts/test.sh", *session.posargs, external=True)
