"""Soak: the app process survives tens of thousands of live updates (``tests/soak_app.py``).

The class of bug it catches: a Qt binding whose C++ methods return ``None`` or a bool
without taking a reference (PySide6 6.12.0 on Python 3.11 aborted the app during its
fourth answer with ``none_dealloc``). Every chunk the fake worker streams reaches the
chat as a live update and the speculation panel redraws thousands of times; the app
process must exit cleanly, show every answer whole, and keep the reference counts of
``None``, ``True`` and ``False``. On Python 3.12 and later these are immortal (their
counts are fixed), so there the counts hold trivially and the test still checks that
the app survives.
"""

import json
import subprocess
import sys
from pathlib import Path

from tests.app_support import FakeWorker
from tests.worker_process import REPO

ANSWERS = 6
CHARS, CHUNK = 14000, 4  # 3,500 streamed chunks an answer
TOKEN_UPDATES = ANSWERS * -(-CHARS // CHUNK)
REFCOUNT_SLACK = 64  # ordinary objects holding None come and go; the bug loses thousands


def test_the_app_survives_a_long_stream_with_its_singletons_intact(tmp_path: Path) -> None:
    assert TOKEN_UPDATES >= 20000
    with FakeWorker(chars=CHARS, chunk=CHUNK, interval=0.0002) as worker:
        done = subprocess.run(
            [sys.executable, "-m", "tests.soak_app", worker.url, str(tmp_path), str(ANSWERS)],
            capture_output=True, text=True, cwd=REPO, timeout=1800, check=False,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lengths"] == [CHARS] * ANSWERS
    assert result["progress"] >= TOKEN_UPDATES, result  # one live update per chunk
    assert result["refreshes"] >= ANSWERS, result  # thousands here; how many, the loop says
    for name, count in result["after"].items():
        assert count >= result["before"][name] - REFCOUNT_SLACK, (name, result)
