"""Learning from the office, started from the admin page: one background training run.

Contract: :meth:`HeadLearning.start` takes the office's past conversations (as the app
read them from its history), writes them to a private temporary file and runs
``python -m engine.heads.office`` on them in a child process at the lowest CPU priority,
so answers keep their speed. At most one run at a time (:class:`LearningBusyError`
otherwise). :attr:`HeadLearning.status` says what it is doing (``idle``, ``running``
with the child's latest progress line, ``installed``, ``kept``, ``stopped`` or
``failed`` with the reason). When a better head was installed, ``on_installed`` runs
so the engine swaps it in for the next answer; the status says ``installed`` only once
the event it returns is set (the engine drafts with the new head and offers it), so a
client that reads ``installed`` and then the methods finds the new head's. :meth:`stop`
ends the run explicitly; the temporary file is deleted whatever happens. Nothing leaves
this machine.
"""

import asyncio
import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engine.errors import BadRequestError, EngineError

log = logging.getLogger(__name__)

MIN_CONVERSATIONS = 4
MAX_CONVERSATIONS = 2000
ROLES = ("system", "user", "assistant")
TUNING = {"steps": (1, 2000), "seq_len": (16, 1024), "tokens": (256, 200_000)}
# the exception name before a traceback's last line: "engine.errors.XError: why" -> "why"
ERROR_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?\w+(?:Error|Exception): ")
REPO_ROOT = Path(__file__).resolve().parents[2]


class LearningBusyError(EngineError):
    """A training run is already going on."""

    code = "learning_busy"


class LearningUnavailableError(EngineError):
    """This worker was started without the means to train heads (tests, embedding)."""

    code = "not_found"


@dataclass(frozen=True)
class LearningStatus:
    state: str  # idle, running, installed, kept, stopped, failed
    message: str = ""
    conversations: int = 0
    started: float | None = None
    finished: float | None = None
    held_out_acceptance: float | None = None
    previous: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_conversations(body: Any) -> list[list[dict[str, str]]]:
    """The ``conversations`` of a request body, each a non-empty chat with an answer."""
    found = body.get("conversations") if isinstance(body, dict) else None
    if not isinstance(found, list):
        raise BadRequestError("send {\"conversations\": [[{\"role\", \"content\"}, ...], ...]}")
    chats = []
    for i, chat in enumerate(found[-MAX_CONVERSATIONS:]):
        if not isinstance(chat, list) or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
            for m in chat
        ):
            raise BadRequestError(f"conversation {i} is not a list of messages with a role "
                                  f"({', '.join(ROLES)}) and text content")
        if any(m["role"] == "assistant" and m["content"] for m in chat):
            chats.append([{"role": m["role"], "content": m["content"]} for m in chat])
    if len(chats) < MIN_CONVERSATIONS:
        raise BadRequestError(f"the history holds {len(chats)} answered conversations; "
                              f"learning needs at least {MIN_CONVERSATIONS}")
    return chats


def check_tuning(body: Any) -> dict[str, int]:
    """Optional ``steps``, ``seq_len``, ``tokens`` overrides, each within its range."""
    tuning = {}
    for key, (low, high) in TUNING.items():
        value = body.get(key) if isinstance(body, dict) else None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BadRequestError(f"{key} must be an integer from {low} to {high}")
        tuning[key] = value
    return tuning


def office_command(target: str, data_dir: str | None, chats: Path, report: Path,
                   tuning: dict[str, int]) -> list[str]:
    argv = [sys.executable, "-m", "engine.heads.office", "--target", target,
            "--conversations", str(chats), "--report", str(report)]
    if data_dir:
        argv += ["--data-dir", data_dir]
    for key, value in tuning.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


class HeadLearning:
    """The admin's "learn from this office" action for one worker's target."""

    def __init__(self, target: str, data_dir: str | None,
                 on_installed: Callable[[], threading.Event | None]) -> None:
        self.target, self.data_dir, self.on_installed = target, data_dir, on_installed
        self.status = LearningStatus("idle")
        self._process: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self, chats: Sequence[list[dict[str, str]]], tuning: dict[str, int]) -> None:
        """Begin a run in the background (call on the event loop)."""
        if self.running:
            raise LearningBusyError("the draft head is already learning; stop it or wait")
        self._stopping = False
        self.status = LearningStatus("running", "starting", len(chats), time.time())
        self._task = asyncio.ensure_future(self._run(list(chats), tuning))

    async def stop(self) -> None:
        """End the run now (nothing is installed); no-op when idle."""
        if not self.running:
            return
        self._stopping = True
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, chats: list[list[dict[str, str]]], tuning: dict[str, int]) -> None:
        with tempfile.TemporaryDirectory(prefix="anve-learning-") as tmp:
            path, report = Path(tmp) / "conversations.jsonl", Path(tmp) / "report.json"
            path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats),
                            encoding="utf-8")
            try:
                code, last = await self._child(
                    office_command(self.target, self.data_dir, path, report, tuning))
            except (OSError, asyncio.CancelledError) as exc:
                self._finish("failed", f"could not run the training: {exc}")
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            await self._conclude(code, last, report)

    async def _child(self, argv: list[str]) -> tuple[int, str]:
        """Run the training; keep its latest progress line in the status."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        self._process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env=env)
        if self._stopping:  # stopped while the child was starting
            self._process.terminate()
        assert self._process.stderr is not None
        last, buffer = "", b""
        while chunk := await self._process.stderr.read(4096):
            buffer += chunk
            *lines, buffer = buffer.replace(b"\r", b"\n").split(b"\n")
            for line in lines:
                text = line.decode("utf-8", "replace").strip()
                if text and "Loading weights" not in text:
                    last = ERROR_PREFIX.sub("", text)
                    self.status = replace(self.status, message=last[:300])
        return await self._process.wait(), last

    async def _conclude(self, code: int, last: str, report: Path) -> None:
        outcome = json.loads(report.read_text()) if report.is_file() else None
        if outcome is not None and outcome["installed"]:  # even if a stop came too late
            self.status = replace(self.status, message="the new head is saved; the engine "
                                  "takes it up between two answers")
            swapped = self.on_installed()
            if swapped is not None:
                await asyncio.to_thread(swapped.wait)
            self._finish("installed", "the new head drafts from the next answer on", outcome)
        elif self._stopping:
            self._finish("stopped", "stopped by the admin; the current head stays")
        elif outcome is None:
            self._finish("failed", last or f"the training ended with status {code}")
        else:
            self._finish("kept", "the new head was not better on held-out chats; the current "
                         "head stays", outcome)

    def _finish(self, state: str, message: str, outcome: dict[str, Any] | None = None) -> None:
        outcome = outcome or {}
        self.status = replace(
            self.status, state=state, message=message, finished=time.time(),
            held_out_acceptance=outcome.get("held_out_acceptance"),
            previous=outcome.get("previous"))
        self._process = None
        log.info("head learning %s: %s", state, message)
