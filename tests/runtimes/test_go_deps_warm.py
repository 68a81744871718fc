"""A Go dependency image compiles the required modules once, and build.sh then finds them compiled.

The Kubernetes backend compiles every Go code change on the tenant's dependency image (``sless_core.buildcontext``,
``make_deps_context``). Its ``RUN`` step is run here as it is rendered, with the host's Go, against a module
proxy in a folder (``GOPROXY=file://``: no network); then ``build.sh`` compiles a function that imports the
module with ``GOPROXY=off`` (as the compile Job does) and ``-x``, which shows every compiler run: the
module's package must not be among them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sless_core.buildcontext import render_dockerfile

ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = ROOT / "runtimes" / "go1.23" / "build.sh"
DEP, VERSION = "example.test/dep", "v1.0.0"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go")


def add_module(root: Path, path: str, gomod: str, files: dict[str, str]) -> None:
    """Serve module PATH at VERSION from the GOPROXY folder ROOT."""
    at = root / path / "@v"
    at.mkdir(parents=True)
    (at / "list").write_text(f"{VERSION}\n")
    (at / f"{VERSION}.info").write_text(json.dumps({"Version": VERSION, "Time": "2026-01-01T00:00:00Z"}))
    (at / f"{VERSION}.mod").write_text(gomod)
    with zipfile.ZipFile(at / f"{VERSION}.zip", "w") as zf:
        zf.writestr(f"{path}@{VERSION}/go.mod", gomod)
        for name, text in files.items():
            zf.writestr(f"{path}@{VERSION}/{name}", text)


def module_proxy(root: Path) -> str:
    """A GOPROXY folder serving DEP at VERSION (one package, ``dep.Answer``)."""
    add_module(root, DEP, f"module {DEP}\n\ngo 1.23\n", {"dep.go": "package dep\n\nfunc Answer() int { return 42 }\n"})
    return f"file://{root}"


@pytest.fixture(scope="module")
def go_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the module's tests: the standard library compiles once (about 30 s), not per test.
    Each test's modules differ in content, so none finds another's packages compiled."""
    return tmp_path_factory.mktemp("gocache")


def go_env(tmp_path: Path, proxy: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLESS_", "GO"))}
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-modcacherw", GOSUMDB="off", GOPROXY=proxy,
               GOMODCACHE=str(tmp_path / "mod"), GOCACHE=str(cache), HOME=str(tmp_path))  # fmt: skip
    return env


def dependency_step(tmp_path: Path, code: Path, env: dict[str, str]) -> None:
    """The dependency image's RUN step, as rendered, in a folder holding only the manifests."""
    manifest = tmp_path / "app" / "manifest"
    manifest.mkdir(parents=True)
    names = {name for name in ("go.mod", "go.sum") if (code / name).exists()}
    for name in names:
        shutil.copy(code / name, manifest / name)
    dockerfile = render_dockerfile(Path("/nonexistent"), "go1.23", "-", "sless/go1.23:latest", "",
                                   manifest_names=names, deps_key="k" * 64)  # fmt: skip
    [run] = [line.removeprefix("RUN ") for line in dockerfile.splitlines() if line.startswith("RUN ")]
    step = run.replace("cd /app/manifest", f"cd {manifest}").replace(" && chown -R 1000:1000 /app/go", "")
    warmed = subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=600,
                            check=False)  # fmt: skip
    assert warmed.returncode == 0, warmed.stderr


def compile_offline(code: Path, out: Path, env: dict[str, str], goflags: str = "-modcacherw") -> str:
    """build.sh as the compile Job runs it (no proxy, no checksum database: modules only from the cache)."""
    built = subprocess.run([str(BUILD_SH), str(code), str(out)],
                           env={**env, "GOPROXY": "off", "GOSUMDB": "off", "GOFLAGS": goflags}, capture_output=True,
                           text=True, timeout=600, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    assert (out / "server").is_file()
    return built.stderr


def function_code(tmp_path: Path) -> Path:
    """A function that imports DEP, with a go.mod that names DEP alone (no go.sum)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "go.mod").write_text(f"module example.test/fn\n\ngo 1.23\n\nrequire {DEP} {VERSION}\n")
    (code / "handler.go").write_text(
        'package function\n\nimport (\n\t"context"\n\n\t"example.test/dep"\n)\n\n'
        "func Handle(ctx context.Context, event map[string]any) (any, error) { return dep.Answer(), nil }\n"
    )
    return code


def test_the_dependency_images_step_leaves_the_modules_compiled_for_build_sh(tmp_path: Path, go_cache: Path) -> None:
    env = go_env(tmp_path, module_proxy(tmp_path / "proxy"), go_cache)
    code = function_code(tmp_path)
    tidy = subprocess.run(["go", "mod", "tidy"], cwd=code, env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert tidy.returncode == 0, tidy.stderr
    dependency_step(tmp_path, code, env)
    # -x shows every compiler run: the module's package must not be among them
    stderr = compile_offline(code, tmp_path / "out", env, goflags="-modcacherw -x")
    compiled = [line for line in stderr.splitlines() if "/compile " in line and f" -p {DEP} " in line]
    assert compiled == [], compiled


def test_a_go_mod_without_go_sum_and_its_indirect_requirements_compiles_offline(tmp_path: Path,
                                                                               go_cache: Path) -> None:
    """As users write it by hand: only the direct requirement, no go.sum. The dependency image (which has the
    network) downloads the whole module graph, so the compile Job finds the indirect module too."""
    proxy = tmp_path / "proxy"
    add_module(proxy, "example.test/dep2", "module example.test/dep2\n\ngo 1.23\n",
               {"dep2.go": "package dep2\n\nfunc Two() int { return 2 }\n"})  # fmt: skip
    add_module(proxy, DEP, f"module {DEP}\n\ngo 1.23\n\nrequire example.test/dep2 {VERSION}\n",
               {"dep.go": 'package dep\n\nimport "example.test/dep2"\n\n'
                          "func Answer() int { return 40 + dep2.Two() }\n"})  # fmt: skip
    env = go_env(tmp_path, f"file://{proxy}", go_cache)
    code = function_code(tmp_path)
    dependency_step(tmp_path, code, env)
    compile_offline(code, tmp_path / "out", env)
