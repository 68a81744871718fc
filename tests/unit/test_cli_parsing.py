"""The CLI's argument parsing and formatting that need no server: headers, bodies, KEY=VALUE pairs, templates, the
completion table, a call's rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import pytest

from sless_api.cli import calls, completion, env, invoke, scaffold
from sless_api.cli.client import CliError
from sless_api.cli.commands import ClientEnv, parser


class Usage(Exception):
    pass


def usage_error(message: str) -> NoReturn:
    raise Usage(message)


@pytest.mark.parametrize(("text", "parsed"), [
    ("X-Test: one", ("X-Test", "one")),
    ("x-test:two words ", ("x-test", "two words")),
    ("Empty:", ("Empty", "")),
    ("Colon: a:b", ("Colon", "a:b")),
    ("no colon", None), (": no name", None), ("bad name: x", None), ("X-Test: a\r\nInjected: b", None),
])  # fmt: skip
def test_parse_header(text: str, parsed: tuple[str, str] | None) -> None:
    assert invoke.parse_header(text) == parsed


def test_read_body_from_text_a_file_and_its_content_type(tmp_path: Path) -> None:
    assert invoke.read_body(None) == (None, None)
    assert invoke.read_body("not json") == (b"not json", "application/json"), "inline data is labelled as before"
    assert invoke.read_body("\udcff") == (b"\xff", "application/json"), "argv's bytes that are not UTF-8, as they were"
    path = tmp_path / "b"
    path.write_bytes(b"\xff\x00")
    assert invoke.read_body(f"@{path}") == (b"\xff\x00", "application/octet-stream")
    path.write_text('{"a": 1}')
    assert invoke.read_body(f"@{path}") == (b'{"a": 1}', "application/json")
    with pytest.raises(CliError, match="cannot read"):
        invoke.read_body(f"@{path}.missing")


def test_parse_pairs_keeps_everything_after_the_first_equals() -> None:
    assert env.parse_pairs(["A=1", "B=x=y", "C="], usage_error) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(Usage, match="argument 2 after the name"):
        env.parse_pairs(["A=1", "B"], usage_error)
    assert env.env_text({"B": "2", "A": "1"}) == "A=1\nB=2"


@pytest.mark.parametrize("runtime", scaffold.RUNTIMES)
def test_each_template_names_its_function_and_runtime(runtime: str) -> None:
    files = scaffold.template_files(runtime, "greeter")
    assert json.loads(files["sless.json"]) == {"name": "greeter", "runtime": runtime}
    assert all("%(" not in text for text in files.values()), "every placeholder filled"
    assert any('"greeter"' in text for name, text in files.items() if name != "sless.json")


def test_completion_table_has_the_new_verbs() -> None:
    table = completion.words(parser(ClientEnv()))
    assert {"calls", "call", "env", "init"} <= set(table["sless"])
    assert table["sless env"][:2] == ["set", "unset"] and "--output" in table["sless env set"]
    assert table["sless completion"][:3] == ["bash", "zsh", "fish"]
    assert set(table) >= completion.FUNCTION_PATHS, "every path that takes a function's name exists"


def test_a_call_as_a_row_and_its_result() -> None:
    call: dict[str, Any] = {
        "id": "a" * 32, "function": "f", "state": "dead", "attempts": 4, "created_at": "2026-12-04T10:00:00Z",
        "result": {"status": 500, "headers": {"Content-Type": "text/plain"}, "body_base64": "AA==",
                   "truncated": True}, "error": "HTTP 500\nboom"}  # fmt: skip
    assert calls.call_row(call) == ("a" * 32, "f", "dead", "4", "2026-12-04T10:00:00Z", "500", "HTTP 500 boom")
    line = calls.result_line(call["result"])
    assert line.startswith("HTTP 500 text/plain") and "base64" in line and "truncated" in line
    assert calls.result_line(None) == "- (none yet)"
