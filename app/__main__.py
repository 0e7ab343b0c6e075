"""``python -m app``: the same as the ``anve`` command."""

import sys

from app.main import main

sys.exit(main())
