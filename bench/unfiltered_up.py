"""``sless up`` with its sandbox's syscall filter switched off: the baseline of ``bench.coldstart``'s filter rows.

Run as ``python -m bench.unfiltered_up up ...`` (the CLI's own arguments). Only for measuring what the filter
costs; the platform itself has no way to run sandboxed tenants without it.
"""

from __future__ import annotations

import sys
from typing import Any

from sless_api.backends.standalone.host.sandbox import Sandbox
from sless_api.main import sless as cli

_detect = Sandbox.detect


def _unfiltered(cls: type[Sandbox], *args: Any, **kwargs: Any) -> Sandbox:
    made = _detect(*args, **kwargs)
    made.syscall_filter = False
    made.reason += " (syscall filter switched off by bench.unfiltered_up)"
    return made


if __name__ == "__main__":
    Sandbox.detect = classmethod(_unfiltered)  # type: ignore[method-assign,assignment]
    sys.exit(cli.main(sys.argv[1:]))
