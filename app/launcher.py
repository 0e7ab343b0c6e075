"""Start, watch, restart and stop a worker process that the app owns.

Contract:

* :meth:`WorkerLauncher.start` runs ``python -m engine.worker --host 127.0.0.1
  --port 0 --profile P [extra]`` as a child process and returns at once; the worker's
  ``listening`` line on stdout becomes :attr:`listened` (its URL). Its log (stderr)
  goes to ``worker.log`` in the data directory.
* When the process ends without :meth:`stop` having been called, :attr:`exited` says
  why (exit code or signal, and the log's last line) and the launcher starts it again
  after a back-off (1 s, doubling up to 30 s while it keeps dying young), giving up
  after :data:`MAX_QUICK_FAILURES` quick failures in a row (:attr:`gave_up`).
* :meth:`stop` ends the process (SIGTERM, then SIGKILL after ``timeout_ms``). The app
  only ever stops a worker it started; an attached worker has no launcher. On Linux the
  worker also gets SIGTERM if the app itself dies (``PR_SET_PDEATHSIG``, set by a
  one-line ``python -c`` guard that then execs the worker), so no orphan holds the
  models' memory.
"""

import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

log = logging.getLogger(__name__)

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
YOUNG_S = 60.0
MAX_QUICK_FAILURES = 5
REPO = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
ORPHAN_GUARD = (
    "import ctypes, os, signal, sys; "
    f"ctypes.CDLL(None).prctl({PR_SET_PDEATHSIG}, signal.SIGTERM); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@dataclass(frozen=True)
class WorkerCommand:
    """How to run the worker: a profile and any further worker options."""

    profile: str = "appliance"
    extra: tuple[str, ...] = ()
    python: str = sys.executable

    def arguments(self) -> list[str]:
        worker = ["-m", "engine.worker", "--host", "127.0.0.1", "--port", "0",
                  "--profile", self.profile, *self.extra]
        return ["-c", ORPHAN_GUARD, *worker] if sys.platform.startswith("linux") else worker


def last_line(path: Path) -> str:
    """The last non-empty line of a log file ('' if none)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return next((line for line in reversed(lines) if line.strip()), "")


class WorkerLauncher(QObject):
    """Owns one worker process at a time."""

    # ---- Signals -----------------------------------------------------------------
    launched = Signal(int)
    """A worker process started; its pid."""
    listened = Signal(str)
    """The worker is listening at this URL (models may still be loading)."""
    exited = Signal(str)
    """The worker ended unexpectedly; why, in words."""
    restart_scheduled = Signal(float)
    """The worker will be started again in this many seconds."""
    gave_up = Signal(str)
    """The worker kept dying; it is not restarted again. Why, in words."""

    def __init__(
        self, command: WorkerCommand, log_path: Path, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.command = command
        self.log_path = log_path
        self.url: str | None = None
        self._process: QProcess | None = None
        self._stdout = b""
        self._stopping = False
        self._started_at = 0.0
        self._quick_failures = 0
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.start)

    @property
    def pid(self) -> int | None:
        if self._process is None:
            return None
        return int(self._process.processId()) or None

    def start(self) -> None:
        """Start the worker (no-op if one is running)."""
        if self._process is not None:
            return
        self._stopping, self._stdout, self.url = False, b"", None
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        process.setProcessEnvironment(env)
        if (REPO / "engine").is_dir():
            process.setWorkingDirectory(str(REPO))
        process.setStandardErrorFile(str(self.log_path), QProcess.OpenModeFlag.Truncate)
        process.readyReadStandardOutput.connect(self._read_stdout)
        process.finished.connect(self._finished)
        process.errorOccurred.connect(self._failed_to_start)
        process.started.connect(lambda: self.launched.emit(self.pid or 0))
        self._process = process
        self._started_at = time.monotonic()
        log.info("starting the worker: %s %s", self.command.python,
                 " ".join(self.command.arguments()))
        process.start(self.command.python, self.command.arguments())

    def stop(self, timeout_ms: int = 8000) -> None:
        """End the worker and do not restart it."""
        self._stopping = True
        self._timer.stop()
        process, self._process = self._process, None
        if process is None or process.state() == QProcess.ProcessState.NotRunning:
            return
        process.finished.disconnect(self._finished)
        process.terminate()
        if not process.waitForFinished(timeout_ms):
            log.warning("the worker did not stop in %d ms; killing it", timeout_ms)
            process.kill()
            process.waitForFinished(2000)
        log.info("worker stopped")

    def _read_stdout(self) -> None:
        if self._process is None:
            return
        self._stdout += bytes(self._process.readAllStandardOutput().data())
        *lines, self._stdout = self._stdout.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                log.debug("worker stdout: %s", line.decode(errors="replace"))
                continue
            if isinstance(event, dict) and event.get("event") == "listening":
                self.url = str(event["url"])
                log.info("the worker listens at %s", self.url)
                self.listened.emit(self.url)

    def _failed_to_start(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and self._process is not None:
            self._process = None
            self._died(f"could not start {self.command.python}: {error.name}")

    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self._stopping:
            return
        self._process = None
        if status == QProcess.ExitStatus.CrashExit:
            why = "the worker was killed or crashed"
        else:
            why = f"the worker exited with code {code}"
        detail = last_line(self.log_path)
        self._died(f"{why}: {detail}" if detail else why)

    def _died(self, why: str) -> None:
        log.warning("%s", why)
        self.url = None
        self.exited.emit(why)
        young = time.monotonic() - self._started_at < YOUNG_S
        self._quick_failures = self._quick_failures + 1 if young else 0
        if self._quick_failures >= MAX_QUICK_FAILURES:
            self.gave_up.emit(f"{why} ({self._quick_failures} times in a row; not restarting)")
            return
        delay = min(FIRST_DELAY_S * 2 ** max(self._quick_failures - 1, 0), MAX_DELAY_S)
        self.restart_scheduled.emit(delay)
        self._timer.start(int(delay * 1000))
