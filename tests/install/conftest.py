"""Fixtures of the install tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.install import vaultbed
from tests.support.services import free_port


@pytest.fixture(scope="module")
def vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real Vault server of the module's own (dev mode, a free loopback port): its state folder."""
    state = tmp_path_factory.mktemp("vault") / "state"
    try:
        vaultbed.up(state, free_port())
    except vaultbed.VaultBedError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield state
    finally:
        vaultbed.down(state)
