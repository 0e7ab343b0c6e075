"""The worker as a child process: ``python -m engine.worker --port 0 ...``, always stopped.

Contract: :func:`child_worker` starts the worker with this interpreter, its standard output
(where it prints its ``listening`` event, with the port it got) and standard error written
to ``worker.out`` and ``worker.err`` in ``log_dir``, and when the block ends stops it
(SIGTERM, then SIGKILL). The :class:`Child` it yields reads the port the worker got and
the tail of its log. Used by the held-out check (:mod:`engine.tools.heldout`) and the
tests; it imports nothing of the engine.
"""

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Child:
    proc: "subprocess.Popen[bytes]"
    out: Path  # its standard output: one JSON event per line
    err: Path  # its log

    def listening_port(self) -> int | None:
        """The port of its ``listening`` event, once it has printed one (its standard
        output holds nothing but JSON events: any other line raises ``ValueError``)."""
        for line in self.out.read_text(errors="replace").splitlines():
            event = json.loads(line)
            if event.get("event") == "listening":
                return int(event["port"])
        return None

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` of its log."""
        text = self.err.read_text(errors="replace") if self.err.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def child_worker(args: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, stop_s: float = 15.0) -> Iterator[Child]:
    """``python -m engine.worker --port 0 ARGS`` with ``env`` added to this process's
    environment, stopped when the block ends."""
    out, err = log_dir / "worker.out", log_dir / "worker.err"
    environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with out.open("wb") as out_fh, err.open("wb") as err_fh:
        proc = subprocess.Popen([sys.executable, "-m", "engine.worker", "--port", "0", *args],
                                stdout=out_fh, stderr=err_fh, cwd=cwd, env=environ)
    try:
        yield Child(proc, out, err)
    finally:
        proc.terminate()
        try:
            proc.wait(stop_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
