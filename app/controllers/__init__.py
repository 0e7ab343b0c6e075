"""Application logic between the widgets and the worker client / history store."""
