"""``python -m sless_api``: the ``sless`` command."""

import sys

from sless_api.main.sless import main

sys.exit(main())
