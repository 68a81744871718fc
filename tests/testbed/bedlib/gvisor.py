"""gVisor on the real node: runsc and its containerd shim, registered as the runtime handler ``runsc``.

The platform's optional stronger sandbox (a function's ``sandbox: "gvisor"``) names the RuntimeClass
``gvisor``, whose handler ``runsc`` is this. build-gvisor.sh builds both binaries from gVisor's Go
module into a cache keyed by version; the build starts in the background beside the node's other
builds (`start_build`) and is optional: a node without it runs everything else, and the gVisor test
says why it skipped. containerd runs the shim (``io.containerd.runsc.v1``, found on containerd's
PATH) with a ``runsc.toml`` that names the runsc binary, its state folder and the systrap platform.

Two things stand between gVisor as published and this machine kind, both handled here rather than
in the platform: the shim lowers its own oom_score_adj, which a root without CAP_SYS_RESOURCE may
not do (build-gvisor.sh patches that one call to go on, as containerd's restrict_oom_score_adj does
for runc), and containerd 1.6 does not read the shim's JSON start answer (the stand-in below).
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


# containerd 1.6 (the node's, Debian's) reads a shim's `start` output as a bare address; gVisor's shim is built
# on containerd 2's shim library and prints its bootstrap parameters as JSON ({"version":2,"address":"unix://...",
# "protocol":"ttrpc"}), which 1.6 dials as an address ("dial unix {...}: connect: invalid argument"). This
# stand-in, first on containerd's PATH, passes every call through and turns that JSON into the address.
_SHIM_ADAPTER = """#!/bin/sh
real={real}
for a in "$@"; do last=$a; done
[ "$last" = start ] || exec "$real" "$@"
out=$("$real" "$@") || {{ rc=$?; printf %s "$out"; exit $rc; }}
case $out in
  "{{"*) printf %s "$out" | sed -n 's/.*"address":"\\([^"]*\\)".*/\\1/p' | tr -d '\\n' ;;
  *) printf %s "$out" ;;
esac
"""


def shim_adapter(base: Path, gvisor_bin: Path) -> Path:
    """The folder holding the stand-in ``containerd-shim-runsc-v1`` (see _SHIM_ADAPTER) for GVISOR_BIN's shim."""
    folder = base / "shim-bin"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SHIM
    script.write_text(_SHIM_ADAPTER.format(real=gvisor_bin / SHIM))
    script.chmod(0o755)
    return folder


def containerd_env(base: Path, gvisor_bin: Path | None) -> dict[str, str] | None:
    """containerd's environment: its PATH leads to the shim (containerd finds shims by name on PATH)."""
    if gvisor_bin is None:
        return None
    path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    return {**os.environ, "PATH": f"{shim_adapter(base, gvisor_bin)}:{path}"}

