"""``python -m engine.bench``: the benchmark's command; the code is :mod:`engine.tools.bench`."""

import sys

from engine.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())
