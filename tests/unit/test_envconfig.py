"""The shared typed reads of configuration variables (sless_core.envconfig), and the operator's start-up refusal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sless_core.envconfig import ConfigError, EnvReader


def test_unset_and_blank_values_give_the_default() -> None:
    reader = EnvReader({"SLESS_X": "  "})
    assert reader.text("SLESS_X", "d") == "d"
    assert reader.optional("SLESS_X") is None
    assert reader.integer("SLESS_X", 7) == 7
    assert reader.number("SLESS_MISSING", 1.5) == 1.5
    assert reader.boolean("SLESS_X", True) is True
    assert reader.choice("SLESS_X", "auto", ("auto", "off")) == "auto"


def test_values_are_parsed_and_stripped() -> None:
    reader = EnvReader({"I": " 42 ", "N": "0.25", "T": " Yes", "F": "off", "C": " OFF ", "S": " text "})
    assert reader.integer("I", 0, 1, 100) == 42
    assert reader.number("N", 0.0, 0, 1) == 0.25
    assert reader.boolean("T", False) is True
    assert reader.boolean("F", True) is False
    assert reader.choice("C", "auto", ("auto", "off")) == "off"
    assert reader.text("S", "") == "text"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.integer("SLESS_N", 1), "SLESS_N must be an integer, got 'x'"),
        (lambda r: r.integer("SLESS_LOW", 1, low=1), "SLESS_LOW must be at least 1, got 0"),
        (lambda r: r.integer("SLESS_HIGH", 1, high=10), "SLESS_HIGH must be at most 10, got 11"),
        (lambda r: r.integer("SLESS_HIGH", 1, 1, 10), "SLESS_HIGH must be between 1 and 10, got 11"),
        (lambda r: r.number("SLESS_N", 1.0), "SLESS_N must be a number, got 'x'"),
        (lambda r: r.number("SLESS_INF", 1.0), "SLESS_INF must be a finite number, got 'inf'"),
        (lambda r: r.number("SLESS_LOW", 1.0, low=0.5), "SLESS_LOW must be at least 0.5, got 0"),
        (lambda r: r.boolean("SLESS_N", False), "SLESS_N must be true or false, got 'x'"),
        (lambda r: r.choice("SLESS_N", "a", ("a", "b")), "SLESS_N must be one of a, b, got 'x'"),
        (lambda r: r.text("SLESS_MISSING", "", required=True), "SLESS_MISSING is required"),
    ],
)
def test_every_bad_value_names_the_variable(call, message: str) -> None:  # type: ignore[no-untyped-def]
    reader = EnvReader({"SLESS_N": "x", "SLESS_LOW": "0", "SLESS_HIGH": "11", "SLESS_INF": "inf"})
    with pytest.raises(ConfigError) as caught:
        call(reader)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("name", "value"),
    [("SLESS_OPERATOR_API_CONCURRENCY", "many"), ("SLESS_BUILD_CACHE", "maybe"),
     ("SLESS_OPERATOR_OFFICIAL_CLIENT", "2")],
)
def test_the_operator_refuses_a_bad_value_in_one_line(name: str, value: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLESS_")} | {name: value}
    done = subprocess.run([sys.executable, "-m", "sless_operator.main"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"sless-operator: {name} must be")
