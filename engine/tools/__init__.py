"""Tools on the engine, each a command: they measure and demonstrate, never serve.

* ``bench``: the benchmark (``python -m engine.bench``), the judge of every speed and
  memory target: methods side by side in one run, identical-output check, JSON + Markdown;
* ``replay``: replays a benchmark's answers to explain a pass's accepted length;
* ``chat``: a terminal chat on the engine in one process, for machines without a screen.

Nothing outside ``engine.tools`` imports these modules, except tests.
"""
