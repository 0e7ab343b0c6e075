"""The one QObject that talks to the worker: aiohttp on the app's qasync event loop.

Contract:

* Every request goes over HTTP to the worker's URL (``set_url``); nothing here
  touches widgets, the database or the worker process.
* :meth:`WorkerClient.start` polls ``GET /health`` (fast while loading, slower once
  ready) and emits :attr:`health_changed` with a :class:`Health` whenever it changes;
  after each ``ready`` it fetches the speculation setting and the model list.
* :meth:`WorkerClient.ask` streams one chat completion and returns its id at once.
  :attr:`answer_progressed` carries the text so far at most every ``throttle_s``
  (50 ms), so the window stays smooth however fast tokens come; exactly one
  :attr:`answer_finished` follows with an :class:`AnswerResult` whose ``outcome`` is
  ``complete``, ``stopped`` (:meth:`cancel`), ``interrupted`` (the connection broke:
  the worker died or went away; ``connection_lost`` is set and the raw error is only
  logged) or ``error`` (the worker refused or failed; ``code`` is its error code).
  :class:`AnswerRequest` can continue an answer cut at its limit (``continue_answer``:
  vLLM's ``continue_final_message``) and choose what our worker does with a
  conversation longer than the model's context (``context_overflow``).
* Admin changes (:meth:`update_speculation`) are confirmed from the worker's answer:
  :attr:`speculation_received` carries what the worker now says, never what was asked.
* Any OpenAI-compatible server works (:meth:`attach`). On connect the client detects
  what it talks to (:func:`app.engines.detect`: our worker, vLLM, llama.cpp's server or
  an unknown one); :attr:`Health.engine` says which. A foreign server's readiness is its
  ``GET /v1/models`` (not asked while it answers: some servers cut an answer short for
  any other request); its answers are mapped onto our figures (:func:`app.engines.
  foreign_stats`): vLLM's ``/metrics`` counters are read before and after each answer,
  llama.cpp's ``timings`` come with the answer, and whatever a server does not report is
  named in ``AnswerStats.unreported``. A refused token (``refused``) and a server that
  is not OpenAI-compatible (``incompatible``) are health states with a clear message.
"""

import asyncio
import contextlib
import itertools
import json
import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from PySide6.QtCore import QObject, Signal

from app.answer import AnswerStats, AnswerStream
from app.engines import (
    LLAMA_CPP,
    METRICS_FAILED_NOTE,
    VLLM,
    EngineInfo,
    Probes,
    Problem,
    Reply,
    SpecFigures,
    VllmCounters,
    detect,
    foreign_live,
    foreign_stats,
    is_anve_health,
    llama_cpp_figures,
    measure,
    refusal,
    unknown_figures,
    vllm_figures,
)

log = logging.getLogger(__name__)

LOADING_POLL_S = 0.3
READY_POLL_S = 2.0
HEALTH_TIMEOUT_S = 10.0
MISSED_BEFORE_UNREACHABLE = 3
COUNTERS_SETTLE_S = 0.3  # vLLM may publish an answer's last step just after its last chunk
COMPLETE, STOPPED, INTERRUPTED, ERROR = "complete", "stopped", "interrupted", "error"


class WorkerError(Exception):
    """The worker answered with an error object; the message is its own."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def describe_kernels(report: Any) -> str:
    """Our worker's ``/health`` ``kernels`` object in words ("" when it sent none)."""
    if not isinstance(report, dict):
        return ""
    name = report.get("variant")
    if not name:
        return "torch's kernels (ANVE's own are off or could not be built here)"
    rows = report.get("rows_per_pass")
    text = f"{name}, {rows} rows a pass" if isinstance(rows, int) and rows > 0 else str(name)
    return text + (" (forced)" if report.get("forced") else " (the best this CPU runs)")


def describe_plan(plan: Any) -> str:
    """A ``/health`` ``plans`` entry (how a model's forward runs) in words ("" when the
    worker sent none), e.g. "native kernels (avx512): 196 q4k, 56 q6k layers, output q6k;
    attention in C; 16 rows a verification, 64 a prompt read"."""
    if not isinstance(plan, dict):
        return ""
    formats = plan.get("formats")
    layers = ", ".join(f"{n} {name}" for name, n in sorted(formats.items())
                       if isinstance(n, int)) if isinstance(formats, dict) else ""
    if plan.get("backend") == "native":
        where = f"native kernels ({plan.get('variant')})"
    else:
        where = "torch reference" + (f" ({plan['why_reference']})"
                                     if plan.get("why_reference") else "")
    parts = [f"{where}: {layers or 'no'} layers, output {plan.get('output', '?')}",
             f"attention {plan.get('attention', '?')}"]
    if isinstance(plan.get("tree_rows"), int) and isinstance(plan.get("read_rows"), int):
        parts.append(f"{plan['tree_rows']} rows a verification, {plan['read_rows']} a prompt "
                     "read")
    return "; ".join(parts)


def describe_batch(batch: Any) -> str:
    """A ``/health`` ``batch`` entry in words ("" when the worker sent none), e.g. "up to 4
    answers together; 2 in the last pass; 31.0 tok/s in total, 14.2 per answer"."""
    if not isinstance(batch, dict) or not isinstance(batch.get("slots"), int):
        return ""
    slots = batch["slots"]
    parts = [f"up to {slots} answers together" if slots > 1 else "one answer at a time"]
    last = batch.get("last_pass_answers")
    if isinstance(last, int) and last > 0:
        parts.append(f"{last} in the last pass")
    total, each = batch.get("tokens_per_second"), batch.get("answer_tokens_per_second")
    if isinstance(total, int | float) and total > 0:
        speed = f"{total:.1f} tok/s in total"
        if isinstance(each, int | float):
            speed += f", {each:.1f} per answer"
        parts.append(speed)
    return "; ".join(parts)


@dataclass(frozen=True)
class Health:
    """The worker as the window should describe it."""

    state: str  # starting, loading, ready, error, unreachable, stopped, refused, incompatible
    progress: float = 0.0
    message: str = ""
    load_off: bool = False
    models: tuple[str, ...] = ()
    url: str | None = None
    engine: EngineInfo | None = None  # what the URL serves, once detected
    kernels: str = ""  # our worker's CPU kernels in words (describe_kernels)
    forward: str = ""  # how the target's forward runs, in words (describe_plan)
    batch: str = ""  # answers decoding together, in words (describe_batch)

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def blocked_reason(self) -> str | None:
        """Why questions cannot be sent now (None when they can)."""
        if self.state == "ready":
            return None
        if self.state == "loading":
            return f"Loading the models ({self.progress:.0%}): {self.message}"
        if self.state == "error" and self.engine is not None and self.engine.foreign:
            return f"{self.engine.name} at {self.url} answered with an error: {self.message}"
        if self.state == "error":
            return f"The models failed to load: {self.message}"
        if self.state == "unreachable":
            return f"The worker is not answering ({self.message}); retrying…"
        if self.state == "stopped":
            return f"The worker stopped ({self.message}); restarting it…"
        if self.state == "refused":
            return (f"{self.url} refused the connection: {self.message}. Check the access "
                    "token, or choose another server or the local worker in Admin.")
        if self.state == "incompatible":
            return (f"{self.url} cannot be used: {self.message}. Choose another server or the "
                    "local worker in Admin.")
        return self.message or "Starting the worker…"


@dataclass(frozen=True)
class AnswerRequest:
    messages: list[dict[str, str]]
    temperature: float = 0.7
    max_tokens: int = 512
    speculation: dict[str, Any] | None = None  # e.g. {"method": "off"}
    seed: int | None = None
    continue_answer: bool = False  # the last message is an answer to continue
    context_overflow: str | None = None  # our worker's anve.context_overflow
    cache: str | None = None  # our worker's anve.cache ("cold": nothing cached is reused)

    def body(self, engine: EngineInfo | None = None) -> dict[str, Any]:
        """The request for our worker, or plain OpenAI for a foreign ``engine``."""
        body: dict[str, Any] = {
            "model": "anve", "messages": self.messages, "stream": True,
            "temperature": self.temperature, "max_tokens": self.max_tokens,
        }
        if self.seed is not None:
            body["seed"] = self.seed
        if self.continue_answer:  # vLLM's fields; llama.cpp continues a final answer anyway
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        if engine is not None and engine.foreign:
            body["model"] = engine.models[0] if engine.models else "default"
            body["stream_options"] = {"include_usage": True}
            return body
        if self.speculation is not None:
            body["speculation"] = self.speculation
        anve = {name: value for name, value in (("context_overflow", self.context_overflow),
                                                ("cache", self.cache)) if value is not None}
        if anve:
            body["anve"] = anve
        return body


@dataclass(frozen=True)
class AnswerProgress:
    """The answer so far (throttled)."""

    text: str
    pieces: list[list[Any]]
    stats: AnswerStats


@dataclass(frozen=True)
class AnswerResult:
    outcome: str  # complete, stopped, interrupted, error
    text: str
    pieces: list[list[Any]]
    stats: AnswerStats
    timeline: list[tuple[float, str]] = field(default_factory=list)
    message: str = ""
    connection_lost: bool = False  # interrupted because the connection to the worker broke
    code: str = ""  # the worker's error code (``context_length_exceeded``, ...)


@dataclass(frozen=True)
class CountersRead:
    """One read of vLLM's ``/metrics``: whether it worked, and its speculation counters."""

    ok: bool
    counters: VllmCounters | None


def _behind(before: CountersRead, after: CountersRead, own_tokens: int) -> bool:
    """The server has not yet counted all of an answer's tokens."""
    if before.counters is None or after.counters is None:
        return False
    start, end = before.counters.generation_tokens, after.counters.generation_tokens
    return start is not None and end is not None and end - start < own_tokens


@dataclass
class _Stream:
    task: "asyncio.Task[None] | None" = None
    last_emit: float = 0.0
    pending: asyncio.TimerHandle | None = None


def parse_sse_line(line: bytes) -> dict[str, Any] | str | None:
    """One line of the event stream: a JSON payload, ``"[DONE]"``, or None."""
    text = line.decode("utf-8", errors="replace").strip()
    if not text.startswith("data:"):
        return None
    data = text[5:].strip()
    if data == "[DONE]":
        return data
    payload = json.loads(data)
    return payload if isinstance(payload, dict) else None


def error_code(body: Any) -> str:
    """The ``code`` of an OpenAI-style error body ('' when it has none)."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else ""


def error_message(body: Any, status: int) -> str:
    """The message of an OpenAI-style error body (vLLM's and FastAPI's shapes too)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message") or f"HTTP {status}")
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return f"{body[key]} (HTTP {status})"
    return f"the worker answered HTTP {status}"


class WorkerClient(QObject):
    """HTTP client of one worker (its URL may change when the worker restarts)."""

    # ---- Signals -----------------------------------------------------------------
    health_changed = Signal(object)
    """A new :class:`Health` (state, progress, message)."""
    answer_started = Signal(str)
    """An answer with this id was sent."""
    answer_progressed = Signal(str, object)
    """Answer id and :class:`AnswerProgress`, at most every ``throttle_s``."""
    answer_finished = Signal(str, object)
    """Answer id and its :class:`AnswerResult`; sent exactly once per answer."""
    speculation_received = Signal(dict)
    """The worker's speculation setting (``GET``/``PUT /v1/speculation``)."""
    speculation_failed = Signal(str)
    """A setting change was refused; the worker's message."""
    learning_received = Signal(dict)
    """The worker's head-learning status (``GET``/``POST``/``DELETE /v1/heads/learning``)."""
    learning_failed = Signal(str)
    """Reading, starting or stopping the head learning failed; why."""
    models_received = Signal(list)
    """``GET /v1/models`` data: ``[{id, anve: {role, max_context, memory_bytes}}]``."""
    engine_detected = Signal(object)
    """What the URL serves (:class:`app.engines.EngineInfo`), after each (re)detection."""

    def __init__(
        self, url: str | None = None, *, token: str | None = None,
        admin_token: str | None = None, throttle_s: float = 0.05,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.url = url
        self.throttle_s = throttle_s
        self._token, self._admin_token = token, admin_token
        self._session: aiohttp.ClientSession | None = None
        self._streams: dict[str, _Stream] = {}
        self._ids = itertools.count(1)
        self._poller: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._missed = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sent: dict[str, int] = {}  # per settings path: requests sent, answers applied
        self._applied: dict[str, int] = {}
        self.engine: EngineInfo | None = None
        self.health = Health("starting", message="Starting the worker…")

    # --- lifecycle ------------------------------------------------------------------

    def attach(self, url: str | None, token: str | None) -> None:
        """Talk to another server with another access token (None: no token)."""
        if token != self._token:
            self._token = token
            if self._session is not None:
                self._spawn(self._session.close())
                self._session = None
        self.set_url(url)

    def set_url(self, url: str | None, why: str = "") -> None:
        """Talk to another worker (a restarted one; None while there is none, ``why``)."""
        self.url = url
        self._missed = 0
        self.engine = None
        if url is None and why:
            self._set_health(Health("stopped", message=why))
        else:
            self._set_health(Health("starting", message="Starting the worker…", url=url))
        if self._wake is not None:
            self._wake.set()

    def start(self) -> None:
        """Begin polling ``/health`` (call with the event loop running)."""
        if self._poller is None:
            self._wake = asyncio.Event()
            self._poller = asyncio.ensure_future(self._poll_health())

    async def close(self) -> None:
        """Stop polling and every answer, and close the HTTP session."""
        for rid in list(self._streams):
            self.cancel(rid)
        tasks = [t for t in [self._poller, *self._tasks] if t is not None]
        tasks += [s.task for s in self._streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._poller = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- health ---------------------------------------------------------------------

    def _set_health(self, health: Health) -> None:
        if health != self.health:
            was_ready, self.health = self.health.ready, health
            self.health_changed.emit(health)
            if health.ready and not was_ready:
                self.fetch_speculation()
                self.fetch_models()

    @property
    def foreign(self) -> bool:
        """Attached to a server that is not our worker."""
        return self.engine is not None and self.engine.foreign

    async def _poll_health(self) -> None:
        assert self._wake is not None
        while True:
            url = self.url
            # A foreign server is not asked while it answers: its answer shows it is alive,
            # and some (llama-cpp-python) cut an answer short for any other request.
            if url is not None and not (self.foreign and self._streams):
                health = await self._health_once(url)
                if url == self.url:
                    self._set_health(health)
            slow = self.health.ready or self.health.state in ("refused", "incompatible")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), READY_POLL_S if slow else LOADING_POLL_S)
            self._wake.clear()

    async def _health_once(self, url: str) -> Health:
        try:
            if self.engine is None:
                found = await self._detect(url)
                if url != self.url:
                    return self.health
                if isinstance(found, Problem):
                    self._missed = 0
                    log.warning("cannot use %s: %s", url, found.message)
                    return Health(found.state, message=found.message, url=url)
                self.engine = found
                log.info("%s serves %s (speculation: %s)", url, found.name, found.speculation)
                self.engine_detected.emit(found)
            if self.engine.foreign:
                return await self._foreign_health(url, self.engine)
            reply = await self._get(url, "/health")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return self._missed_health(url, exc)
        self._missed = 0
        problem = refusal(reply)
        if problem is not None:
            return Health(problem.state, message=problem.message, url=url, engine=self.engine)
        body = reply.body if isinstance(reply.body, dict) else {}
        return Health(
            state=str(body.get("status", "error")), progress=float(body.get("progress", 0.0)),
            message=str(body.get("message", "")), load_off=bool(body.get("speculation_load_off")),
            models=tuple(body.get("models") or ()), url=url, engine=self.engine,
            kernels=describe_kernels(body.get("kernels")),
            forward=describe_plan((body.get("plans") or {}).get("target")),
            batch=describe_batch(body.get("batch")),
        )

    async def _foreign_health(self, url: str, engine: EngineInfo) -> Health:
        """A foreign server is ready when it lists its models (503 while it loads)."""
        reply = await self._get(url, "/v1/models")
        self._missed = 0
        problem = refusal(reply)
        if problem is not None:
            return Health(problem.state, message=problem.message, url=url, engine=engine)
        if reply.status == 503:
            return Health("loading", message=error_message(reply.body, 503), url=url,
                          engine=engine)
        data = reply.body.get("data") if isinstance(reply.body, dict) else None
        if reply.status != 200 or not isinstance(data, list):
            return Health("error", message=error_message(reply.body, reply.status), url=url,
                          engine=engine)
        models = tuple(str(m.get("id")) for m in data if isinstance(m, dict))
        return Health("ready", 1.0, "ready", models=models, url=url, engine=engine)

    async def _detect(self, url: str) -> EngineInfo | Problem:
        """Ask the routes that tell engines apart (see :func:`app.engines.detect`)."""
        health = await self._get(url, "/health")
        if is_anve_health(health) or refusal(health) is not None:
            return detect(Probes(health=health))
        models = await self._get(url, "/v1/models")
        optional = await asyncio.gather(
            *(self._optional(url, path, text=path == "/metrics")
              for path in ("/props", "/metrics", "/version", "/openapi.json")))
        found = detect(Probes(health, models, *optional))
        if isinstance(found, EngineInfo) and found.kind == LLAMA_CPP:
            # llama-server answers /health, /props and /v1/models without the key: try it
            # on a small route that needs it, rather than fail at the first question.
            timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            async with self._http().post(f"{url}/tokenize", json={"content": "a"},
                                         timeout=timeout) as resp:
                found = refusal(Reply(resp.status, await _json_or_none(resp))) or found
        return found

    async def _get(self, url: str, path: str, *, text: bool = False) -> Reply:
        """``GET url+path`` as a :class:`Reply` (body None when it is not JSON)."""
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with self._http().get(f"{url}{path}", timeout=timeout) as resp:
            body = await resp.text() if text else await _json_or_none(resp)
            return Reply(resp.status, body)

    async def _optional(self, url: str, path: str, *, text: bool = False) -> Reply | None:
        try:
            return await self._get(url, path, text=text)
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    def _missed_health(self, url: str, exc: Exception) -> Health:
        self._missed += 1
        refused = isinstance(exc, aiohttp.ClientConnectorError)
        if refused or self._missed >= MISSED_BEFORE_UNREACHABLE:
            reason = unreachable_reason(exc)
            self.engine = None  # detect again when it answers: it may be another server now
            return Health("unreachable", message=reason, url=url)
        return self.health

    # --- answers --------------------------------------------------------------------

    def ask(self, request: AnswerRequest) -> str:
        """Start streaming an answer; returns its id."""
        rid = f"answer-{next(self._ids)}"
        stream = _Stream()
        self._streams[rid] = stream
        stream.task = asyncio.ensure_future(self._answer(rid, request))
        return rid

    def cancel(self, rid: str) -> None:
        """Stop an answer; its result says ``stopped`` and keeps the text so far."""
        stream = self._streams.get(rid)
        if stream is not None and stream.task is not None:
            stream.task.cancel()

    @property
    def answering(self) -> bool:
        return bool(self._streams)

    async def _answer(self, rid: str, request: AnswerRequest) -> None:
        loop = asyncio.get_running_loop()
        answer = AnswerStream(started=loop.time())
        outcome, message, lost, code = COMPLETE, "", False, ""
        engine = self.engine if self.foreign else None
        figures: SpecFigures | None = None
        self.answer_started.emit(rid)
        try:
            before = await self._vllm_counters() if engine and engine.kind == VLLM else None
            done = await self._read_stream(rid, request, answer, engine)
            ended = answer.final is not None if engine is None else (
                answer.finish_reason is not None)
            if not ended:
                outcome, message = INTERRUPTED, "the worker ended the answer early"
                if engine is not None and done:
                    message = ("the server ended the answer without a finish reason (another "
                               "request may have interrupted it)")
            elif engine is not None:
                figures = await self._figures(engine, answer, before)
        except asyncio.CancelledError:
            outcome, message = STOPPED, "stopped"
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            log.warning("answer %s: the connection to the worker broke: %r", rid, exc)
            outcome, message, lost = INTERRUPTED, "lost the connection to the worker", True
        except WorkerError as exc:
            outcome, message, code = ERROR, str(exc), exc.code
        except ValueError as exc:
            outcome, message = ERROR, str(exc)
        stream = self._streams.pop(rid)
        if stream.pending is not None:
            stream.pending.cancel()
        stats = answer.stats(loop.time())
        if engine is not None:
            stats = (foreign_stats(engine, measure(answer, loop.time()), figures)
                     if figures is not None else foreign_live(engine, stats))
        result = AnswerResult(outcome, answer.text, [list(p) for p in answer.pieces],
                              stats, answer.timeline, message, lost, code)
        log.info("answer %s: %s, %d characters %s", rid, outcome, len(answer.text), message)
        self.answer_finished.emit(rid, result)

    async def _read_stream(
        self, rid: str, request: AnswerRequest, answer: AnswerStream, engine: EngineInfo | None
    ) -> bool:
        """Read one streamed answer into ``answer``; True when ``[DONE]`` ended it."""
        if self.url is None:
            raise aiohttp.ClientConnectionError("the worker is not running")
        loop = asyncio.get_running_loop()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
        url = f"{self.url}/v1/chat/completions"
        async with self._http().post(url, json=request.body(engine), timeout=timeout) as resp:
            if resp.status != 200:
                body = await _json_or_none(resp)
                raise WorkerError(error_message(body, resp.status), error_code(body))
            async for line in resp.content:
                payload = parse_sse_line(line)
                if payload == "[DONE]":
                    return True
                if not isinstance(payload, dict):
                    continue
                if "error" in payload:
                    raise WorkerError(error_message(payload, 500), error_code(payload))
                answer.add(payload, loop.time())
                self._progressed(rid, answer)
        return False

    async def _figures(
        self, engine: EngineInfo, answer: AnswerStream, before: "CountersRead | None"
    ) -> SpecFigures:
        """The speculation figures a foreign engine reports for the answer just read."""
        if engine.kind == LLAMA_CPP:
            return llama_cpp_figures(answer.timings, engine.speculative)
        if engine.kind != VLLM or before is None:
            return unknown_figures()
        own = measure(answer, asyncio.get_running_loop().time()).completion_tokens
        after = await self._vllm_counters()
        if _behind(before, after, own):  # the answer's last step is not published yet
            await asyncio.sleep(COUNTERS_SETTLE_S)
            after = await self._vllm_counters()
        if not (before.ok and after.ok):
            return SpecFigures(unreported=unknown_figures().unreported,
                               notes=(METRICS_FAILED_NOTE,))
        return vllm_figures(before.counters, after.counters, own)

    async def _vllm_counters(self) -> "CountersRead":
        """vLLM's counters now (``ok`` False when ``/metrics`` could not be read)."""
        reply = None if self.url is None else await self._optional(
            self.url, "/metrics", text=True)
        if reply is None or reply.status != 200 or not isinstance(reply.body, str):
            return CountersRead(False, None)
        return CountersRead(True, VllmCounters.read(reply.body))

    def _progressed(self, rid: str, answer: AnswerStream) -> None:
        """Emit the answer so far, at most every ``throttle_s``."""
        stream = self._streams[rid]
        loop = asyncio.get_running_loop()
        due = stream.last_emit + self.throttle_s
        if loop.time() >= due:
            self._emit_progress(rid, answer)
        elif stream.pending is None:
            stream.pending = loop.call_at(due, self._emit_progress, rid, answer)

    def _emit_progress(self, rid: str, answer: AnswerStream) -> None:
        stream = self._streams.get(rid)
        if stream is None:
            return
        now = asyncio.get_running_loop().time()
        stream.last_emit, stream.pending = now, None
        live = answer.live_stats(now)
        if self.foreign and self.engine is not None:
            live = foreign_live(self.engine, live)
        progress = AnswerProgress(answer.text, [list(p) for p in answer.pieces], live)
        self.answer_progressed.emit(rid, progress)

    # --- settings and models -----------------------------------------------------------

    def fetch_speculation(self) -> None:
        # only our worker has the setting: a foreign engine's is set where it is started
        if not self.foreign:
            self._spawn(self._speculation("GET", None))

    def update_speculation(self, changes: dict[str, Any]) -> None:
        """``PUT /v1/speculation``; the worker's confirmation arrives as a signal."""
        if self.foreign and self.engine is not None:
            self.speculation_failed.emit(self.engine.configured_where)
            return
        self._spawn(self._speculation("PUT", changes))

    async def _speculation(self, method: str, body: dict[str, Any] | None) -> None:
        await self._setting_call(method, "/v1/speculation", body, self.speculation_received,
                                 self.speculation_failed)

    def fetch_learning(self) -> None:
        """``GET /v1/heads/learning``: what the head learning is doing."""
        self._learning("GET", None)

    def start_learning(self, chats: list[list[dict[str, str]]],
                       tuning: dict[str, int] | None = None) -> None:
        """Start learning from ``chats`` (the office's past conversations) on the worker."""
        self._learning("POST", {"conversations": chats, **(tuning or {})})

    def stop_learning(self) -> None:
        self._learning("DELETE", None)

    def _learning(self, method: str, body: dict[str, Any] | None) -> None:
        if self.foreign and self.engine is not None:
            self.learning_failed.emit(f"{self.engine.name} has no draft head to train; "
                                      "only an ANVE worker learns from the office")
            return
        self._spawn(self._setting_call(method, "/v1/heads/learning", body,
                                       self.learning_received, self.learning_failed))

    async def _setting_call(self, method: str, path: str, body: dict[str, Any] | None,
                            received: Any, failed: Any) -> None:
        """One request to our worker's settings API; the answer or the reason is emitted.

        An answer is dropped when the answer to a request sent later on the same path came
        first: a slow ``GET`` must not undo what a ``PUT``/``POST`` after it reported.
        """
        if self.url is None:
            failed.emit("the worker is not running")
            return
        sent = self._sent[path] = self._sent.get(path, 0) + 1
        headers = {}
        if method != "GET" and self._admin_token:
            headers["Authorization"] = f"Bearer {self._admin_token}"
        try:
            async with self._http().request(
                method, f"{self.url}{path}", json=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S),
            ) as resp:
                data = await _json_or_none(resp)
                if resp.status not in (200, 202) or not isinstance(data, dict):
                    raise WorkerError(error_message(data, resp.status))
        except (aiohttp.ClientError, TimeoutError, WorkerError) as exc:
            log.warning("%s %s failed: %s", method, path, exc)
            failed.emit(str(exc) or type(exc).__name__)
            return
        if sent < self._applied.get(path, 0):
            log.debug("%s %s answered after a later request's answer; dropped", method, path)
            return
        self._applied[path] = sent
        received.emit(data)

    def fetch_models(self) -> None:
        if not (self.foreign and self._streams):  # see _poll_health
            self._spawn(self._models())

    async def _models(self) -> None:
        if self.url is None:
            return
        try:
            async with self._http().get(
                f"{self.url}/v1/models", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
            ) as resp:
                data = await _json_or_none(resp)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("listing the models failed: %s", exc)
            return
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            self.models_received.emit(data["data"])


def normalise_url(text: str) -> str:
    """A server's base URL as the client uses it: ``http(s)://host[:port][/prefix]``.

    OpenAI base URLs are accepted too (a trailing ``/v1`` or ``/`` is dropped); anything
    else raises ValueError with a message for the window.
    """
    url = text.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"{text.strip() or 'an empty address'} is not a server address; "
                         "write it as http://host:port")
    try:
        parsed.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        raise ValueError(f"{text.strip()} has no valid port ({exc})") from None
    return url


def unreachable_reason(exc: Exception) -> str:
    """Why a server cannot be reached, in words."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "connection refused"
        return f"cannot connect: {exc.os_error.strerror or exc.os_error}"
    if isinstance(exc, aiohttp.InvalidURL):
        return f"not a valid address: {exc}"
    return str(exc) or type(exc).__name__


async def _json_or_none(resp: aiohttp.ClientResponse) -> Any:
    try:
        return await resp.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return None
