"""One call's output as a runtime reports it in ``X-Sless-Output`` and as the platform keeps it with the record.

The runtimes send the lines a call wrote before its answer (runtimes/README.md, "Output of a call") as padded
base64 of ``{"lines": [{"stream", "text", "ts"}], "truncated"}``. The header is the function's to write, so it is
untrusted input: everything is checked again here, in the invocation log's writer thread (never on the call's
path), and a value that is not what the contract says is dropped whole rather than stored in part.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable
from typing import Any

#: The response header a runtime sets; the platform's, never shown to a caller.
OUTPUT_HEADER = "x-sless-output"
#: Bytes of text (UTF-8) a call keeps with its record, as the runtimes cap the header (runtimes/README.md); the
#: live stores (a process's output on `sless up`, a pod's log) keep up to 64 KiB of a call while they have it.
MAX_TEXT_BYTES = 16 * 1024
#: Lines a call keeps: empty lines cost no text, so their number is capped on its own (runtimes/README.md).
MAX_LINES = 1024
#: Longest header value read: 16 KiB of text with every character escaped in JSON and 1,024 lines' framing, in
#: base64 (about 200 KiB at worst).
MAX_HEADER_BYTES = 256 * 1024
#: "log": a line from a pod's log, which does not tell the two apart (a Kubernetes run's output, sless_core.runrecord).
STREAMS = frozenset({"stdout", "stderr", "log"})


def encode(lines: Iterable[tuple[str, str, float]], truncated: bool = False) -> bytes:
    """``(stream, text, ts)`` lines in the header's form, capped as a runtime caps them: once a line does not
    fit in ``MAX_TEXT_BYTES``, it and the later ones are left out and the output says ``truncated``."""
    kept: list[dict[str, Any]] = []
    size = 0
    for stream, text, ts in lines:
        size += len(text.encode("utf-8", "replace"))
        if size > MAX_TEXT_BYTES or len(kept) >= MAX_LINES:
            truncated = True
            break
        kept.append({"stream": stream, "text": text, "ts": round(ts, 3)})
    body = json.dumps({"lines": kept, "truncated": truncated}, ensure_ascii=False, separators=(",", ":"))
    return base64.b64encode(body.encode("utf-8"))


def decode(value: bytes | str) -> dict[str, Any] | None:
    """The output as the API shows it (``{"lines": [...], "truncated": bool}``), or None when the value is
    not a well-formed one within the caps."""
    if len(value) > MAX_HEADER_BYTES:
        return None
    try:
        parsed = json.loads(base64.b64decode(value, validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("lines"), list):
        return None
    truncated = parsed.get("truncated", False)
    if not isinstance(truncated, bool):
        return None
    if len(parsed["lines"]) > MAX_LINES:  # more than a runtime sends: the first ones, said to be cut
        truncated = True
    lines: list[dict[str, Any]] = []
    size = 0
    for item in parsed["lines"][:MAX_LINES]:
        line = _line(item)
        if line is None:
            return None
        size += len(line["text"].encode("utf-8"))
        if size > MAX_TEXT_BYTES:
            return None
        lines.append(line)
    return {"lines": lines, "truncated": truncated} if lines or truncated else None


def _line(item: object) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        return None
    stream, text, ts = item.get("stream"), item.get("text"), item.get("ts")
    if stream not in STREAMS or not isinstance(text, str) or not isinstance(ts, int | float) or isinstance(ts, bool):
        return None
    if not math.isfinite(ts) or not 0 <= ts < 1e11:
        return None
    # PostgreSQL text holds no NUL; a lone surrogate cannot be encoded to UTF-8 (JSON lets both through).
    clean = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return {"stream": stream, "text": clean, "ts": round(float(ts), 3)}


def stored(output: dict[str, Any]) -> str:
    """The decoded output as it is kept in the invocation log (JSON text)."""
    return json.dumps(output, ensure_ascii=False, separators=(",", ":"))


def loaded(text: str | None) -> dict[str, Any] | None:
    """The kept output back (``stored``'s inverse); None when the record has none."""
    if not text:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None
