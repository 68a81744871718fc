"""`sless completion bash|zsh|fish`: each script is valid for its shell and, run by that shell, offers the verbs,
sub-verbs and flags, and the tenant's function names after a verb that takes one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.platform import Tenant, sless_cli

pytestmark = pytest.mark.e2e

VENV_BIN = str(Path(sys.executable).parent)  # where the `sless` command is, which the scripts call for names


def shell_env(tenant: Tenant) -> dict[str, str]:
    return {**os.environ, "SLESS_TOKEN": tenant.token, "SLESS_URL": tenant.url,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def need(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed (apt-get install -y {shell})")
    return found


def bash_complete(tenant: Tenant, script: str, *words: str) -> list[str]:
    probe = (f'{script}\nCOMP_WORDS=({" ".join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; _sless; '
             'printf "%s\\n" "${COMPREPLY[@]}"')
    return subprocess.run([need("bash"), "-c", probe], capture_output=True, text=True, check=True, timeout=60,
                          env=shell_env(tenant)).stdout.split()


def zsh_complete(tenant: Tenant, script: str, *words: str) -> list[str]:
    """The words ``_sless`` offers, sorted, as zsh runs it: compadd and compdef stand in for the completion
    system's (which filters by the typed prefix and sorts: done here)."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    probe = (f"compdef() {{ : }}\ncompadd() {{ print -rl -- ${{(P)2}} }}\n{script}\n"
             f"words=({quoted}); CURRENT={len(words)}; _sless")
    out = subprocess.run([need("zsh"), "-f", "-c", probe], capture_output=True, text=True, check=True, timeout=60,
                         env=shell_env(tenant)).stdout.split()
    return sorted(w for w in out if w.startswith(words[-1]))


def fish_complete(tenant: Tenant, script_path: Path, line: str) -> list[str]:
    probe = f"source {script_path}; complete -C{line!r}"
    out = subprocess.run([need("fish"), "--no-config", "-c", probe], capture_output=True, text=True, check=True,
                         timeout=60, env=shell_env(tenant)).stdout
    return [entry.split("\t")[0] for entry in out.splitlines()]


@pytest.fixture
def two_functions(tenant: Tenant, tmp_path: Path) -> Tenant:
    for name in ("alpha", "alpine"):
        sless_cli(tenant, "init", str(tmp_path / name), "--runtime", "python3.11")
        sless_cli(tenant, "deploy", str(tmp_path / name))
    return tenant


@pytest.mark.parametrize(("shell", "check"), [("bash", ["-n"]), ("zsh", ["-n"]), ("fish", ["--no-execute"])])
def test_each_script_is_valid_for_its_shell(tenant: Tenant, tmp_path: Path, shell: str, check: list[str]) -> None:
    path = tmp_path / f"sless.{shell}"
    path.write_text(sless_cli(tenant, "completion", shell).stdout)
    done = subprocess.run([need(shell), *check, str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_bash_offers_the_new_verbs_and_function_names(two_functions: Tenant) -> None:
    script = sless_cli(two_functions, "completion", "bash").stdout
    assert bash_complete(two_functions, script, "sless", "cal") == ["calls", "call"]
    assert bash_complete(two_functions, script, "sless", "in") == ["invoke", "init"]
    assert bash_complete(two_functions, script, "sless", "env", "") == ["set", "unset", "--help", "--url", "--sub",
                                                                       "--data-dir", "--namespace", "--output",
                                                                       "alpha", "alpine"]
    assert bash_complete(two_functions, script, "sless", "invoke", "al") == ["alpha", "alpine"]
    assert bash_complete(two_functions, script, "sless", "env", "set", "alp") == ["alpha", "alpine"]
    assert {"--async", "--callback", "--header", "--method"} <= set(
        bash_complete(two_functions, script, "sless", "invoke", "alpha", "--"))
    assert bash_complete(two_functions, script, "sless", "invoke", "alpha", "al") == [], "only the first argument"
    assert bash_complete(two_functions, script, "sless", "trigger", "add", "al") == [], "a trigger's name is new"
    assert bash_complete(two_functions, script, "sless", "completion", "--h") == ["--help"]


def test_zsh_offers_verbs_flags_and_function_names(two_functions: Tenant) -> None:
    script = sless_cli(two_functions, "completion", "zsh").stdout
    assert zsh_complete(two_functions, script, "sless", "tr") == ["traffic", "trigger"]
    assert zsh_complete(two_functions, script, "sless", "trigger", "") == ["--help", "add", "disable", "enable",
                                                                          "ls", "rm"]
    assert zsh_complete(two_functions, script, "sless", "calls", "--st") == ["--state"]
    assert zsh_complete(two_functions, script, "sless", "get", "al") == ["alpha", "alpine"]
    assert zsh_complete(two_functions, script, "sless", "env", "unset", "alpi") == ["alpine"]
    assert zsh_complete(two_functions, script, "sless", "get", "alpha", "al") == []


def test_fish_offers_verbs_flags_and_function_names(two_functions: Tenant, tmp_path: Path) -> None:
    path = tmp_path / "sless.fish"
    path.write_text(sless_cli(two_functions, "completion", "fish").stdout)
    assert fish_complete(two_functions, path, "sless tr") == ["traffic", "trigger"]
    assert fish_complete(two_functions, path, "sless job ") == ["get", "ls", "rm", "run", "--help"]
    assert fish_complete(two_functions, path, "sless invoke alpha --as") == ["--async"]
    assert fish_complete(two_functions, path, "sless logs al") == ["alpha", "alpine"]
    assert fish_complete(two_functions, path, "sless env set alpi") == ["alpine"]
    assert fish_complete(two_functions, path, "sless logs alpha alph") == [], "only the first argument"
    assert "fish" in fish_complete(two_functions, path, "sless completion ")


def test_ls_quiet_prints_only_names(two_functions: Tenant) -> None:
    assert sless_cli(two_functions, "ls", "-q").stdout == "alpha\nalpine\n"
