"""``python -m engine.models``: install, prepare or list the named models."""

import sys

from engine.models.loading import main

sys.exit(main())
