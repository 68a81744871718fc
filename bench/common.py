"""Shared benchmark plumbing: wrk on loopback, percentiles, and the printed table.

Loads are bounded in time (wrk -d) and connections; every target is 127.0.0.1.
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field

UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


@dataclass
class Load:
    """One wrk run: requests/s and latency percentiles in milliseconds."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not match:
        raise ValueError(f"cannot parse wrk latency {text!r}")
    return float(match.group(1)) * UNITS[match.group(2)]


def wrk(url: str, connections: int, seconds: float = 5, threads: int = 1, script: str | None = None,
        cpu: str | None = None) -> Load:
    """Keep-alive load with wrk; raises if wrk is missing (install it: apt-get install wrk).

    ``cpu``: the CPU list wrk is pinned to (``taskset -c``), so that it does not share the measured server's core.
    """
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: run scripts/install-test-services.sh")
    cmd = ["taskset", "-c", cpu] if cpu is not None else []
    cmd += ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "10s"]
    if script:
        cmd += ["-s", script]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True, timeout=seconds + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = 0
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non2xx:
        errors += int(non2xx.group(1))
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if sock:
        errors += sum(int(g) for g in sock.groups())
    return Load(rps, p50, p99, errors, total)


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@dataclass
class Table:
    """Rows of (measure, value, baseline, ratio, target, verdict), printed aligned."""

    title: str
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def add(self, measure: str, value: float, unit: str, baseline: float | None = None,
            baseline_name: str = "", target: str = "", ok: bool | None = None) -> None:
        ratio = f"{value / baseline:.2f}x" if baseline else "-"
        base = f"{baseline:.3f} {unit} ({baseline_name})" if baseline is not None else "-"
        verdict = "-" if ok is None else ("meets" if ok else "MISSES")
        self.rows.append((measure, f"{value:.3f} {unit}", base, ratio, target or "-", verdict))

    def print(self) -> None:
        header = ("measure", "value", "baseline (same run)", "ratio", "target", "verdict")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(len(header))]
        print(f"\n## {self.title}\n")
        for row in [header, tuple("-" * w for w in widths), *self.rows]:
            print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
