"""A Go dependency image compiles the required modules once, and build.sh then finds them compiled.

The Kubernetes backend compiles every Go code change on the tenant's dependency image (``sless_api.buildcontext``,
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

from sless_api.buildcontext import render_dockerfile

ROOT = Path(__file__).resolve().parents[2]
BUILD_SH = ROOT / "runtimes" / "go1.23" / "build.sh"
DEP, VERSION = "example.test/dep", "v1.0.0"

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="needs Go")


def module_proxy(root: Path) -> str:
    """A GOPROXY folder serving DEP at VERSION (one package, ``dep.Answer``)."""
    at = root / DEP / "@v"
    at.mkdir(parents=True)
    (at / "list").write_text(f"{VERSION}\n")
    (at / f"{VERSION}.info").write_text(json.dumps({"Version": VERSION, "Time": "2026-01-01T00:00:00Z"}))
    mod = f"module {DEP}\n\ngo 1.23\n"
    (at / f"{VERSION}.mod").write_text(mod)
    with zipfile.ZipFile(at / f"{VERSION}.zip", "w") as zf:
        zf.writestr(f"{DEP}@{VERSION}/go.mod", mod)
        zf.writestr(f"{DEP}@{VERSION}/dep.go", "package dep\n\nfunc Answer() int { return 42 }\n")
    return f"file://{root}"


def test_the_dependency_images_step_leaves_the_modules_compiled_for_build_sh(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLESS_", "GO"))}
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-modcacherw", GOSUMDB="off",
               GOPROXY=module_proxy(tmp_path / "proxy"), GOMODCACHE=str(tmp_path / "mod"),
               GOCACHE=str(tmp_path / "cache"), HOME=str(tmp_path))  # fmt: skip
    code = tmp_path / "code"
    code.mkdir()
    (code / "go.mod").write_text(f"module example.test/fn\n\ngo 1.23\n\nrequire {DEP} {VERSION}\n")
    (code / "handler.go").write_text(
        'package function\n\nimport (\n\t"context"\n\n\t"example.test/dep"\n)\n\n'
        "func Handle(ctx context.Context, event map[string]any) (any, error) { return dep.Answer(), nil }\n"
    )
    tidy = subprocess.run(["go", "mod", "tidy"], cwd=code, env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert tidy.returncode == 0, tidy.stderr

    # the dependency image's RUN step, as rendered, in a folder holding only the manifests
    manifest = tmp_path / "app" / "manifest"
    manifest.mkdir(parents=True)
    for name in ("go.mod", "go.sum"):
        shutil.copy(code / name, manifest / name)
    dockerfile = render_dockerfile(Path("/nonexistent"), "go1.23", "-", "sless/go1.23:latest", "",
                                   manifest_names={"go.mod", "go.sum"}, deps_key="k" * 64)  # fmt: skip
    [run] = [line.removeprefix("RUN ") for line in dockerfile.splitlines() if line.startswith("RUN ")]
    step = run.replace("cd /app/manifest", f"cd {manifest}").replace(" && chown -R 1000:1000 /app/go", "")
    warmed = subprocess.run(["/bin/sh", "-c", step], env=env, capture_output=True, text=True, timeout=600,
                            check=False)  # fmt: skip
    assert warmed.returncode == 0, warmed.stderr

    # the compile Job: no network, and the module's package is not compiled again
    built = subprocess.run([str(BUILD_SH), str(code), str(tmp_path / "out")],
                           env={**env, "GOPROXY": "off", "GOFLAGS": "-modcacherw -x"}, capture_output=True,
                           text=True, timeout=600, check=False)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    compiled = [line for line in built.stderr.splitlines() if "/compile " in line and f" -p {DEP} " in line]
    assert compiled == [], compiled
    assert (tmp_path / "out" / "server").is_file()
