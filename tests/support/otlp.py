"""A real OTLP receiver for the tests: the session fixture ``otlp_receiver``.

It runs the suite's OpenTelemetry Collector (tests/testbed/otelcol, built by tests/testbed/build-otelcol.sh
into a cache outside the repository; scripts/test.sh builds it before the tests, and the fixture builds it
when it is missing: minutes cold, under a second once built). The collector listens on loopback only, OTLP
over HTTP (``endpoint``, what OTEL_EXPORTER_OTLP_ENDPOINT takes) and gRPC (``grpc_endpoint``), and writes
every request it receives, at once (no batching, a 10 ms flush), as one OTLP JSON line to a file that
``spans()`` reads back as simple dicts (:class:`Span`). ``wait_for(predicate, timeout)`` polls ``spans()``
until PREDICATE holds (see tests/support/poll.py: no fixed sleeps).

The receiver is shared by the session's tests: a test picks its own spans out, by a service name or a trace
id of its own. When the collector cannot be built or started, the fixture fails with the reason and the end
of its log: never a skip.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import pytest

from tests.support.poll import until
from tests.support.services import ServiceError, free_port

BUILD = Path(__file__).resolve().parents[1] / "testbed" / "build-otelcol.sh"
#: A cold build (module downloads, then compiling the collector) on a loaded 2-core machine; a built one is
#: found in well under a second.
BUILD_TIMEOUT = 1200
START_TIMEOUT = 60
STOP_TIMEOUT = 15
#: How often the file exporter flushes what it has written (its default is 1 s).
FLUSH_INTERVAL = "10ms"

#: OTLP's enums as the JSON encoding writes them (numbers; their names are accepted too).
SPAN_KINDS = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}


class Span(TypedDict):
    """One received span. Ids are lowercase hex; ``kind`` and ``status_code`` are OTLP's names without
    their prefix ("SERVER", "ERROR"); attributes are flattened to Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    name: str
    kind: str  # UNSPECIFIED, INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER
    service_name: str  # the resource attribute service.name ("" without one)
    resource: dict[str, Any]  # every resource attribute
    scope: str  # the instrumentation scope's name
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace_id, span_id) of each link
    events: list[str]  # the events' names
    start_ns: int
    end_ns: int
    status_code: str  # UNSET, OK, ERROR
    status_message: str


def any_value(value: dict[str, Any]) -> Any:
    """An OTLP JSON AnyValue as a Python value (str, int, float, bool, bytes, list, dict or None)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "intValue" in value:
        return int(value["intValue"])  # a 64-bit integer is a JSON string in OTLP JSON
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "bytesValue" in value:
        return base64.b64decode(value["bytesValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in (value["arrayValue"] or {}).get("values") or []]
    if "kvlistValue" in value:
        return attributes((value["kvlistValue"] or {}).get("values") or [])
    return None


def attributes(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP JSON key/value pairs as a dict."""
    return {pair["key"]: any_value(pair.get("value") or {}) for pair in pairs}


def _enum(value: Any, names: dict[int, str], prefix: str) -> str:
    if isinstance(value, str):  # a name, e.g. "SPAN_KIND_SERVER", where an encoder writes names
        return value.removeprefix(prefix)
    return names.get(int(value or 0), str(value))


def spans_of_request(request: dict[str, Any]) -> list[Span]:
    """The spans of one OTLP JSON ExportTraceServiceRequest (one line of the file exporter)."""
    found: list[Span] = []
    for resource_spans in request.get("resourceSpans") or []:
        resource = attributes((resource_spans.get("resource") or {}).get("attributes") or [])
        for scope_spans in resource_spans.get("scopeSpans") or []:
            scope = str((scope_spans.get("scope") or {}).get("name") or "")
            for span in scope_spans.get("spans") or []:
                status = span.get("status") or {}
                found.append(Span(
                    trace_id=str(span.get("traceId") or "").lower(),
                    span_id=str(span.get("spanId") or "").lower(),
                    parent_span_id=str(span.get("parentSpanId") or "").lower(),
                    name=str(span.get("name") or ""),
                    kind=_enum(span.get("kind"), SPAN_KINDS, "SPAN_KIND_"),
                    service_name=str(resource.get("service.name") or ""),
                    resource=resource,
                    scope=scope,
                    attributes=attributes(span.get("attributes") or []),
                    links=[(str(link.get("traceId") or "").lower(), str(link.get("spanId") or "").lower())
                           for link in span.get("links") or []],
                    events=[str(event.get("name") or "") for event in span.get("events") or []],
                    start_ns=int(span.get("startTimeUnixNano") or 0),
                    end_ns=int(span.get("endTimeUnixNano") or 0),
                    status_code=_enum(status.get("code"), STATUS_CODES, "STATUS_CODE_"),
                    status_message=str(status.get("message") or ""),
                ))  # fmt: skip
    return found


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def build_otelcol(log: Path | None = None) -> Path:
    """The collector binary: built by tests/testbed/build-otelcol.sh unless it already is (its last line is the
    path). ServiceError with the build's output when it fails."""
    try:
        proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                              check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{BUILD} did not finish within {BUILD_TIMEOUT}s") from exc
    if log is not None:
        log.write_text(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not os.access(lines[-1], os.X_OK):
        raise ServiceError(f"{BUILD} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}{proc.stdout[-1000:]}")
    return Path(lines[-1])


class OtlpReceiver:
    """One collector process: OTLP in on loopback, every received span readable through :meth:`spans`."""

    def __init__(self, binary: Path, base_dir: Path) -> None:
        self.binary = binary
        self.base_dir = base_dir
        base_dir.mkdir(parents=True, exist_ok=True)
        self.http_port = free_port()
        self.grpc_port = free_port()
        self.config = base_dir / "config.yaml"
        self.traces_file = base_dir / "traces.jsonl"
        self.log = base_dir / "otelcol.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._offset = 0  # how far traces_file has been parsed (whole lines only)
        self._spans: list[Span] = []
        # JSON is YAML: the collector reads this file as its configuration
        self.config.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {
                "http": {"endpoint": f"127.0.0.1:{self.http_port}"},
                "grpc": {"endpoint": f"127.0.0.1:{self.grpc_port}"},
            }}},
            "exporters": {"file": {"path": str(self.traces_file), "format": "json",
                                   "flush_interval": FLUSH_INTERVAL}},
            "service": {
                # no metrics server of its own (it would bind :8888); its log on stderr, into self.log
                "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info", "encoding": "console"}},
                "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["file"]}},
            },
        }, indent=2))  # fmt: skip

    @property
    def endpoint(self) -> str:
        """The OTLP/HTTP base URL (OTEL_EXPORTER_OTLP_ENDPOINT); traces go to ``{endpoint}/v1/traces``."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def traces_endpoint(self) -> str:
        """The OTLP/HTTP traces URL (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)."""
        return f"{self.endpoint}/v1/traces"

    @property
    def grpc_endpoint(self) -> str:
        """The OTLP/gRPC endpoint (plaintext)."""
        return f"http://127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([str(self.binary), "--config", f"file:{self.config}"], cwd=self.base_dir,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        try:
            until(f"the OTLP receiver answering on {self.endpoint}", self._answers, START_TIMEOUT, interval=0.1)
        except AssertionError as exc:
            raise ServiceError(f"{exc}\n{self.log_tail()}") from None

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServiceError(f"otelcol exited with {self.proc.returncode}:\n{self.log_tail()}")
        try:
            # GET is not OTLP: an answer at all (405) says the HTTP receiver is up
            with urllib.request.urlopen(self.traces_endpoint, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the collector's log, for an assertion message."""
        return f"--- {self.log} ---\n{_tail(self.log, lines)}"

    def spans(self) -> list[Span]:
        """Every span received so far, in the order received."""
        with self._lock:
            try:
                with self.traces_file.open("rb") as f:
                    f.seek(self._offset)
                    data = f.read()
            except FileNotFoundError:
                data = b""
            end = data.rfind(b"\n") + 1  # a line still being flushed is read next time
            for line in data[:end].splitlines():
                if line.strip():
                    self._spans.extend(spans_of_request(json.loads(line)))
            self._offset += end
            return list(self._spans)

    def wait_for(self, predicate: Callable[[list[Span]], bool], timeout: float = 30,
                 what: str = "the spans awaited") -> list[Span]:  # fmt: skip
        """Poll :meth:`spans` until PREDICATE holds for them and return them; AssertionError after TIMEOUT with
        what was received and the collector's log."""

        def probe() -> tuple[list[Span]] | None:
            spans = self.spans()
            return (spans,) if predicate(spans) else None  # a tuple: true even when the spans awaited are none

        try:
            return until(what, probe, timeout, interval=0.05)[0]
        except AssertionError as exc:
            received = "\n".join(f"  {s['service_name']} {s['name']} trace={s['trace_id']} span={s['span_id']} "
                                 f"parent={s['parent_span_id'] or '-'}" for s in self.spans()[-30:])  # fmt: skip
            alive = "running" if self.proc is not None and self.proc.poll() is None else "not running"
            raise AssertionError(f"{exc}; the receiver ({alive}) has {len(self.spans())} span(s), the last:\n"
                                 f"{received or '  (none)'}\n{self.log_tail()}") from None  # fmt: skip


@contextlib.contextmanager
def otlp_server(attempts: int = 2) -> Iterator[OtlpReceiver]:
    """A fresh collector in a temporary folder (built first when needed); stopped and removed at the end."""
    base = Path(tempfile.mkdtemp(prefix="sless-otlp-"))
    receiver: OtlpReceiver | None = None
    try:
        binary = build_otelcol(base / "build.log")
        last: Exception | None = None
        for attempt in range(attempts):  # a free port may be taken between free_port() and the bind
            candidate = OtlpReceiver(binary, base / f"run{attempt}")
            try:
                candidate.start()
            except (ServiceError, OSError) as exc:
                last = exc
                candidate.stop()
                continue
            receiver = candidate
            break
        if receiver is None:
            raise ServiceError(f"the OTLP receiver did not start after {attempts} attempts: {last}")
        yield receiver
    finally:
        if receiver is not None:
            receiver.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """The session's OTLP receiver (an :class:`OtlpReceiver`): ``endpoint``, ``spans()``, ``wait_for()``."""
    started = time.monotonic()
    try:
        cm = otlp_server()
        receiver = cm.__enter__()
    except (ServiceError, OSError) as exc:
        pytest.fail(f"the OTLP receiver could not be built or started ({time.monotonic() - started:.0f}s): {exc}",
                    pytrace=False)  # fmt: skip
    try:
        yield receiver
    finally:
        cm.__exit__(None, None, None)
