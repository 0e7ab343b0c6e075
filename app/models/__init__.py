"""Qt list models: the app's state as views see it (no widgets, no I/O)."""
