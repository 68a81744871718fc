"""What the platform's own steps in build and compile pods share: how they say why they failed.

The kubelet keeps a container's termination message (``/dev/termination-log``) and the operator shows it in the
Function's status, so a step that fails prints its one-line reason and leaves it there too.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

TERMINATION_LOG = Path("/dev/termination-log")
#: The kubelet keeps at most 4096 bytes of a termination message: the end of a long one is what matters.
MESSAGE_TAIL = 4000


def report(message: str) -> None:
    """Print MESSAGE and leave it as the container's termination message (outside a pod only the print)."""
    print(message, file=sys.stderr)
    with contextlib.suppress(OSError):  # not in a pod
        TERMINATION_LOG.write_text(message[-MESSAGE_TAIL:])


def succeed(result: dict[str, Any]) -> int:
    """Leave RESULT (JSON) as the termination message, where the operator reads it, and on stdout; exit 0."""
    text = json.dumps(result)
    with contextlib.suppress(OSError):  # not in a pod
        TERMINATION_LOG.write_text(text)
    print(text)
    return 0
