"""ANVE engine: models, lossless speculative decoding and drafters.

The engine never imports PySide6 or the ``app`` package; the desktop app talks to it
only through the worker's API. Everything here runs offline: importing the package
sets ``HF_HUB_OFFLINE=1`` so no code path can reach a model hub.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

__version__ = "0.1.0"
