"""Where ANVE keeps its data (history, converted models, trained heads) and its assets.

The data directory is the platform's user data dir (``platformdirs``) unless the
``ANVE_DATA_DIR`` environment variable or an explicit argument overrides it. The shipped
``assets/`` folder lies next to the ``engine`` package, in a checkout and in the wheel.
"""

import os
from pathlib import Path

import platformdirs

APP_NAME = "anve"
ASSETS = Path(__file__).resolve().parent.parent / "assets"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Return (and create) the data directory."""
    chosen = override or os.environ.get("ANVE_DATA_DIR") or platformdirs.user_data_dir(APP_NAME)
    path = Path(chosen).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Return (and create) the folder holding assembled GGUF files and converted caches."""
    path = data_dir(override) / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
