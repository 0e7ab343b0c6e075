"""The worker process: an OpenAI-compatible HTTP server hosting the models.

Modules: ``server`` (aiohttp routes), ``scheduler`` (the engine thread and its FIFO
queue), ``settings`` (the global speculation setting and the load switch-off),
``schema`` (the OpenAI wire format), ``metrics`` (Prometheus), ``auth`` (tokens),
``__main__`` (the ``anve-worker`` command), ``process`` (the worker as a child process,
for tools and tests). Importing this package is cheap; the
engine (torch) is imported by ``settings``, ``schema`` and the modules that use them.
"""
