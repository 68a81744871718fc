"""sless Python runtime: the HTTP server's entry script; the server itself is ``sless_server.py``.

Python caches the bytecode of imported modules in ``__pycache__`` but never of the script it runs, so
the script is kept this small: the server's code then loads precompiled (the platform compiles the
runtime's modules when it starts, the image when it is built) instead of being compiled again at every
cold start, which took tens of milliseconds.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
import sless_server  # noqa: E402  (removes this directory from sys.path again: the user's modules win)

if __name__ == "__main__":
    sless_server.main()
