"""gVisor on the real node: runsc and its containerd shim, registered as the runtime handler ``runsc``.

The platform's optional stronger sandbox (a function's ``sandbox: "gvisor"``) names the RuntimeClass
``gvisor``, whose handler ``runsc`` is this. build-gvisor.sh builds both binaries from gVisor's Go
module into a cache keyed by version; the build starts in the background beside the node's other
builds (`start_build`) and is optional: a node without it runs everything else, and the gVisor test
says why it skipped. containerd runs the shim (``io.containerd.runsc.v1``, found on containerd's
PATH) with a ``runsc.toml`` that names the runsc binary, its state folder and the systrap platform.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BUILD_SH = Path(__file__).resolve().parent.parent / "build-gvisor.sh"
HANDLER = "runsc"  # containerd's runtime name = the RuntimeClass's handler
RUNTIME_CLASS = "gvisor"
SHIM = "containerd-shim-runsc-v1"
PLATFORM = "systrap"  # ptrace is the slower fallback; KVM needs /dev/kvm


def start_build() -> subprocess.Popen[str] | None:
    """Start build-gvisor.sh in the background (a no-op when cached); None when turned off.

    ``SLESS_TESTBED_GVISOR=0`` leaves gVisor out (a machine where it cannot build or is not wanted).
    """
    if os.environ.get("SLESS_TESTBED_GVISOR", "1") == "0":
        return None
    return subprocess.Popen(["bash", str(BUILD_SH)], stdout=subprocess.PIPE, stderr=sys.stderr, text=True)


def finish_build(proc: subprocess.Popen[str] | None) -> Path | None:
    """Wait for START_BUILD's build; its folder, or None (logged) when it failed or was turned off.

    A failed gVisor build does not stop the node: the sandbox is optional, and its test skips naming it.
    """
    if proc is None:
        return None
    out, _ = proc.communicate()
    if proc.returncode != 0:
        print(f"[testbed-node] gVisor build failed (exit {proc.returncode}): the node runs without the "
              f"{HANDLER} handler", file=sys.stderr, flush=True)  # fmt: skip
        return None
    return Path(out.strip().splitlines()[-1])


def built() -> Path | None:
    """The folder of runsc and its shim when built (nothing is built here), else None."""
    if os.environ.get("SLESS_TESTBED_GVISOR", "1") == "0":
        return None
    proc = subprocess.run(["bash", str(BUILD_SH), "--check"], capture_output=True, text=True, check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


def shim_config(base: Path, gvisor_bin: Path) -> Path:
    """The shim's runsc.toml (containerd passes its path in the runtime's options): which runsc, where its
    state lives, and runsc's own flags (``[runsc_config]``: ``platform = "systrap"``, logs per container)."""
    logs = base / "runsc-logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = base / "runsc.toml"
    path.write_text(f"""binary_name = "{gvisor_bin / "runsc"}"
root = "{base / "runsc"}"
log_path = "{logs}/shim-%ID%.log"
log_level = "info"
[runsc_config]
  platform = "{PLATFORM}"
  debug-log = "{logs}/"
""")
    return path


def containerd_runtime(cri: str, config: Path) -> str:
    """The runtime section of containerd's config (version 2) that registers the handler."""
    return f"""    [{cri}.containerd.runtimes.{HANDLER}]
      runtime_type = "io.containerd.runsc.v1"
      [{cri}.containerd.runtimes.{HANDLER}.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "{config}"
"""


def containerd_env(gvisor_bin: Path | None) -> dict[str, str] | None:
    """containerd's environment: its PATH leads to the shim (containerd finds shims by name on PATH)."""
    if gvisor_bin is None:
        return None
    return {**os.environ, "PATH": f"{gvisor_bin}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}

