"""``sless invoke``: call a function over HTTP as any client would, synchronously or as a queued async call.

The request is built here from the flags (method, headers, a body inline, from a file or from stdin) and sent to
``/fn/{ns}/{name}``; the answer is written as it came. ``--async`` only adds ``Prefer: respond-async`` (and
``--callback`` its header): the platform decides everything else, and its 202 answer says where the call's outcome
will be.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from sless_api.cli.client import Client, CliError, emit

#: a header name as HTTP allows it (RFC 9110 "token")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
CALLBACK_HEADER = "X-Sless-Callback-Url"

Verb = Callable[[argparse.Namespace, Client], int]


def parse_header(text: str) -> tuple[str, str] | None:
    """``'Name: value'`` as (name, value); None when it is not a header (no colon, a bad name, a line break)."""
    name, sep, value = text.partition(":")
    if not sep or not _HEADER_NAME.fullmatch(name) or any(c in value for c in "\r\n\0"):
        return None
    return name, value.strip()


def latin1(text: str) -> bool:
    """Whether TEXT can be a header's value on the wire (HTTP/1.1 sends them as ISO-8859-1)."""
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def read_body(data: str | None) -> tuple[bytes | None, str | None]:
    """The request body ``--data`` names and the Content-Type it gets unless ``-H`` sets one: inline text as JSON
    (as it always was), ``@PATH`` a file's bytes and ``-`` stdin's, JSON when they parse as JSON, else opaque."""
    if data is None:
        return None, None
    if data != "-" and not data.startswith("@"):
        return data.encode("utf-8", "surrogateescape"), "application/json"  # argv's bytes as they were typed
    if data == "-":
        body = sys.stdin.buffer.read()
    else:
        path = Path(data[1:])
        try:
            body = path.read_bytes()
        except OSError as exc:
            raise CliError(f"--data {data}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    try:
        json.loads(body)
    except ValueError:  # not UTF-8, or not JSON
        return body, "application/octet-stream"
    return body, "application/json"


def request_headers(args: argparse.Namespace, usage_error: Callable[[str], NoReturn]) -> dict[str, str]:
    """The headers the flags ask for; a malformed ``-H`` or a ``--callback`` without ``--async`` is a usage
    error (exit 2), named before anything is sent."""
    if not _HEADER_NAME.fullmatch(args.method):
        usage_error(f"--method expects an HTTP method (GET, PUT, ...), not {args.method!r}")
    headers: dict[str, str] = {}
    for text in args.header:
        parsed = parse_header(text)
        if parsed is None:
            usage_error(f"--header expects 'Name: value' (a header name, a colon, a value), not {text!r}")
        if not latin1(parsed[1]):
            usage_error(f"--header {parsed[0]}: a header's value is ISO-8859-1 text (percent-encode other characters)")
        headers[parsed[0]] = parsed[1]
    if args.callback is not None and not args.is_async:
        usage_error("--callback needs --async: the platform calls the URL back when a queued call finishes")
    if args.callback is not None and (not args.callback.isascii() or parse_header(f"X: {args.callback}") is None):
        usage_error("--callback expects a URL in ASCII on one line (percent-encode other characters)")
    if args.is_async:
        headers["Prefer"] = "respond-async"
        if args.callback is not None:
            headers[CALLBACK_HEADER] = args.callback
    return headers


def cmd_invoke(args: argparse.Namespace, client: Client) -> int:
    headers = request_headers(args, args.usage_error)
    body, content_type = read_body(args.data)
    if content_type and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = content_type
    url = f"{client.url}/fn/{client.namespace()}/{quote(args.name, safe='')}{args.path}"
    resp = client.http.request(args.method.upper(), url, data=body, headers=headers, timeout=args.timeout)
    if args.is_async and resp.status_code == 202:
        return print_accepted(client, resp.json(), args.output == "json")
    write_answer(resp.content, resp.headers.get("Content-Type", ""))
    if resp.status_code >= 400:  # the body may be the function's own: the status says it failed
        print(f"sless: {args.name} answered HTTP {resp.status_code} {resp.reason}", file=sys.stderr)
        return 1
    return 0


def print_accepted(client: Client, accepted: dict[str, Any], as_json: bool) -> int:
    """The 202 of a queued call: its id and where its state and result will be (``sless call ID`` reads it)."""
    url = f"{client.url}{accepted['status_url']}"
    emit(accepted, as_json, f"call {accepted['id']} {accepted['state']}: {url}")
    if not as_json:
        print(f"`sless call {accepted['id']}` shows its state and result", file=sys.stderr)
    return 0


def write_answer(body: bytes, content_type: str) -> None:
    """An answer as it came: text (JSON, text/*) with a final newline for the terminal, anything else (an image,
    an archive, bytes that are not UTF-8) byte for byte, nothing added."""
    textual = content_type.startswith("text/") or "json" in content_type or not content_type
    if textual:
        try:
            text = body.decode()
        except UnicodeDecodeError:
            textual = False
    if not textual:
        sys.stdout.flush()
        sys.stdout.buffer.write(body)
        sys.stdout.buffer.flush()
        return
    if text:
        sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))


def register(verbs: Any, with_client: Callable[[argparse.ArgumentParser, Verb], None]) -> None:
    """Add ``invoke`` to the ``sless`` parser; WITH_CLIENT adds --url/--output/... and binds the verb."""
    invoke = verbs.add_parser(
        "invoke", help="call a function over HTTP (--async: queue it and print the call's id)",
        description="Call a function as an HTTP client would. The answer's body is written as it came; a status "
                    "of 400 or more exits 1. --async queues the call (Prefer: respond-async) and prints its id "
                    "and status URL: `sless call ID` shows its state and result.")
    invoke.add_argument("name")
    invoke.add_argument("--data", "-d", metavar="DATA|@FILE|-",
                        help="the request body: text (sent as JSON), @FILE a file's bytes, - standard input")
    invoke.add_argument("--method", "-X", default="POST", help="the HTTP method (default: POST)")
    invoke.add_argument("--header", "-H", action="append", default=[], metavar="'NAME: VALUE'",
                        help="a request header; repeat for more")
    invoke.add_argument("--path", default="", help="a path (and query) after the function's URL: /items?id=1")
    invoke.add_argument("--async", dest="is_async", action="store_true",
                        help="queue the call (202) instead of waiting for its answer")
    invoke.add_argument("--callback", metavar="URL",
                        help="with --async: the URL the platform POSTs the outcome to (X-Sless-Callback-Url)")
    invoke.add_argument("--timeout", type=float, default=930)
    invoke.set_defaults(usage_error=invoke.error)
    with_client(invoke, cmd_invoke)
