"""The worker launcher's command line and its orphan guard (no Qt event loop needed)."""

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from app.launcher import ORPHAN_GUARD, WorkerCommand, last_line
from app.main import build_parser, worker_command

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], "-c", "import time; time.sleep(60)"])
print(child.pid, flush=True)
child.wait()
"""


def test_command_runs_the_worker_module_on_loopback() -> None:
    args = WorkerCommand("light", ("--target", "/models/t")).arguments()
    tail = args[args.index("-m"):]
    assert tail == ["-m", "engine.worker", "--host", "127.0.0.1", "--port", "0",
                    "--profile", "light", "--target", "/models/t"]


def test_cli_passes_profile_and_models_through() -> None:
    args = build_parser().parse_args(["--profile", "light", "--target", "t", "--draft", "d"])
    assert worker_command(args) == WorkerCommand("light", ("--target", "t", "--draft", "d"))
    assert build_parser().parse_args(["--worker", "http://10.0.0.5:8765"]).worker


def until(check: Callable[[], bool], failure: str, timeout: float = 60.0) -> None:
    """Wait for ``check``; the timeout is only there to end a hang."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


def test_a_worker_does_not_outlive_a_killed_app() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, ORPHAN_GUARD],
                              stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    worker = [sys.executable, "-c", "import time; time.sleep(60)"]  # once the guard has set
    until(lambda: child.cmdline() == worker, "the guard did not exec")  # its death signal
    parent.kill()
    parent.wait(10)
    until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE,
          "the worker outlived the app")


def test_last_line_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("a\nerror: out of memory\n\n")
    assert last_line(log) == "error: out of memory"
    assert last_line(log.with_name("missing.log")) == ""

