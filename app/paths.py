"""Where the desktop app keeps its data: the same folder as the engine.

Contract: :func:`data_dir` is the platform's user data dir (``platformdirs``), or
``ANVE_DATA_DIR`` when set; it is created on first use. This mirrors
``engine.paths.data_dir`` (the app must not import the engine beyond its protocol).
"""

import os
from pathlib import Path

import platformdirs

APP_NAME = "anve"
DATABASE_NAME = "history.sqlite3"


def data_dir() -> Path:
    """Return (and create) the data directory."""
    path = Path(os.environ.get("ANVE_DATA_DIR") or platformdirs.user_data_dir(APP_NAME))
    path = path.expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def database_path() -> Path:
    return data_dir() / DATABASE_NAME


def assets_dir() -> Path:
    """The shipped ``assets/`` folder (icons, theme, demo prompts)."""
    return Path(__file__).resolve().parent.parent / "assets"
