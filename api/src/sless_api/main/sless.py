"""The ``sless`` command: the REST API's client verbs (``cli``) and ``sless up`` (``main.up``), which runs the
platform itself and so is composed here, above every layer."""

from __future__ import annotations

import os
import sys

from sless_api.cli import commands
from sless_api.main import up


def main(argv: list[str] | None = None) -> int:
    return commands.main(argv, commands.ClientEnv.from_env(os.environ), extra=[up.register])


if __name__ == "__main__":
    sys.exit(main())
