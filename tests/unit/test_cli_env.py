"""The ``sless`` command's environment is read once, into ``ClientEnv`` (its entry point, ``main.sless``, does it):
its values, and what an unset or empty variable means."""

from __future__ import annotations

from pathlib import Path

from sless_api.cli.commands import DEFAULT_URL, ClientEnv, local_secret


def test_the_environment_names_every_option() -> None:
    env = ClientEnv.from_env({"SLESS_URL": "http://api:1", "SLESS_TOKEN": "t", "SLESS_SUB": "me",
                              "SLESS_DATA_DIR": "/d", "SLESS_JWT_SECRET": " s \n", "SLESS_JWT_ISSUER": "iss",
                              "SLESS_JWT_AUDIENCE": "aud"})  # fmt: skip
    assert env == ClientEnv("http://api:1", "t", "me", Path("/d"), "s", "iss", "aud")


def test_unset_or_empty_variables_take_the_defaults() -> None:
    env = ClientEnv.from_env({"SLESS_URL": "", "SLESS_SUB": ""})
    assert (env.url, env.token, env.sub, env.jwt_secret) == (DEFAULT_URL, "", "developer", "")
    assert env.data_dir == Path.home() / ".local/share/sless"


def test_a_configured_secret_wins_over_the_data_dirs(tmp_path: Path) -> None:
    assert local_secret(tmp_path / "data", "configured") == "configured"
    assert not (tmp_path / "data").exists()  # nothing generated
    generated = local_secret(tmp_path / "data")
    assert generated and local_secret(tmp_path / "data") == generated  # one secret per data dir
    assert ((tmp_path / "data").stat().st_mode & 0o777) == 0o700
