"""The worker's HTTP surface: OpenAI chat completions plus health, metrics and settings.

Routes: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``, ``GET`` and ``PUT /v1/speculation`` (the setting, and under ``auto``
the machine's calibration and the method ``auto`` picks per kind of prompt, with its
reason and every method's predicted speed), and ``GET``, ``POST`` (start) and
``DELETE`` (stop) ``/v1/heads/learning``, the admin's "learn from this office" run
(:mod:`engine.worker.learning`). Every error is OpenAI's shape
``{"error": {"message", "type", "code", "param"}}`` with a fitting status (400 bad
input, 401/403 auth, 404/405 routing, 409 a run already going, 413 body too large, 503
loading or queue full). A streamed answer that has to wait for others starts streaming at
once with its place in the queue; an error the engine finds once its turn comes (a
prompt too long, say) then arrives in the stream in the same shape.

Handlers only parse, queue and relay: generation runs on the scheduler's thread, so
the event loop never blocks and ``/health`` answers while an answer is generated.
Run the app with ``handler_cancellation=True``: a client that disconnects cancels its
handler, which withdraws its queued job or cancels the running one.
"""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from engine.cpu import kernels
from engine.errors import BadRequestError, EngineError
from engine.protocol import (
    COLD,
    PROTOCOL_VERSION,
    Completion,
    ContextWindow,
    PromptProgress,
    TextChunk,
)
from engine.worker.auth import Auth
from engine.worker.learning import (
    HeadLearning,
    LearningBusyError,
    LearningUnavailableError,
    check_conversations,
    check_tuning,
)
from engine.worker.metrics import CONTENT_TYPE, Metrics
from engine.worker.scheduler import (
    Job,
    NotReadyError,
    Queued,
    QueueFullError,
    Scheduler,
    Started,
)
from engine.worker.schema import (
    Answer,
    FieldError,
    chunk_json,
    completion_json,
    error_json,
    parse_chat_request,
    pieces_json,
    speculation_json,
    usage_json,
)
from engine.worker.settings import SpeculationSettings

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 2 << 20
LEARNING = "/v1/heads/learning"
ADMIN_ROUTES = frozenset({("PUT", "/v1/speculation"), ("POST", LEARNING), ("DELETE", LEARNING)})
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
LAG_NAP_S = 0.05
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Worker:
    """Everything the handlers share."""

    scheduler: Scheduler
    settings: SpeculationSettings
    metrics: Metrics
    auth: Auth = field(default_factory=Auth)
    learning: HeadLearning | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def model_id(self) -> str:
        models = self.scheduler.models
        return models[0].id if models else "anve"


WORKER = web.AppKey("worker", Worker)


# --- errors and auth ------------------------------------------------------------------


def status_of(exc: EngineError) -> int:
    if isinstance(exc, BadRequestError):
        return 400
    if isinstance(exc, NotReadyError | QueueFullError):
        return 503
    if isinstance(exc, LearningBusyError):
        return 409
    if isinstance(exc, LearningUnavailableError):
        return 404
    return 500


def error_response(
    worker: Worker, status: int, message: str, code: str, param: str | None = None
) -> web.Response:
    worker.metrics.errors.labels(code).inc()
    return web.json_response(error_json(status, message, code, param), status=status)


def _http_error(request: web.Request, exc: web.HTTPException) -> tuple[str, str]:
    """Message and code for aiohttp's own routing and size errors."""
    if exc.status == 404:
        return f"no such endpoint: {request.method} {request.path}", "not_found"
    if exc.status == 405:
        return f"{request.method} is not allowed on {request.path}", "method_not_allowed"
    if exc.status == 413:
        return exc.text or "the request body is too large", "request_too_large"
    return exc.text or exc.reason, "http_error"


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    worker = request.app[WORKER]
    try:
        return await handler(request)
    except EngineError as exc:
        param = exc.param if isinstance(exc, FieldError) else None
        return error_response(worker, status_of(exc), str(exc), exc.code, param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message, code = _http_error(request, exc)
        return error_response(worker, exc.status, message, code)
    except Exception:
        log.exception("unexpected error in %s %s", request.method, request.path)
        return error_response(worker, 500, "internal error; see the worker log", "internal_error")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    worker = request.app[WORKER]
    admin_route = (request.method, request.path) in ADMIN_ROUTES
    denied = worker.auth.check(request.headers.get("Authorization"), admin_route)
    if denied is not None:
        return error_response(worker, denied.status, denied.message, denied.code)
    return await handler(request)


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FieldError("body", f"the request body is not valid JSON: {exc}") from None


# --- small endpoints ------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    scheduler, status = worker.scheduler, worker.scheduler.status
    return web.json_response({
        "status": status.state,
        "progress": status.progress,
        "message": status.message,
        "queue": {"waiting": scheduler.waiting, "running": scheduler.running},
        "batch": worker.metrics.batch_report(scheduler.max_batch, scheduler.running),
        "speculation_load_off": scheduler.load() > worker.settings.config.load_threshold,
        "models": [m.id for m in scheduler.models],
        "kernels": kernels.report(),
        "plans": {m.role: m.plan for m in scheduler.models if m.plan is not None},
        "protocol_version": PROTOCOL_VERSION,
    })


async def list_models(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    worker.scheduler.require_ready()
    data = [
        {"id": m.id, "object": "model", "created": worker.started_at, "owned_by": "anve",
         "anve": {"role": m.role, "max_context": m.max_context, "memory_bytes": m.memory_bytes}}
        for m in worker.scheduler.models
    ]
    return web.json_response({"object": "list", "data": data})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[WORKER].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def speculation_body(worker: Worker) -> dict[str, Any]:
    """The setting, plus what ``auto`` chooses and why (``auto``: the calibration and, per
    kind of prompt and overall, the chosen method, the reason and each method's
    prediction; empty while the models load or on an engine without calibration)."""
    return {**worker.settings.to_dict(), "auto": worker.scheduler.report}


async def get_speculation(request: web.Request) -> web.Response:
    return web.json_response(speculation_body(request.app[WORKER]))


async def put_speculation(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    worker.scheduler.require_ready()
    config = worker.settings.update(await read_json(request))
    log.info("speculation setting changed: %s", config.to_dict())
    return web.json_response(speculation_body(worker))


def _learning(worker: Worker) -> HeadLearning:
    if worker.learning is None:
        raise LearningUnavailableError("this worker cannot train draft heads")
    return worker.learning


async def get_learning(request: web.Request) -> web.Response:
    return web.json_response(_learning(request.app[WORKER]).status.to_dict())


async def start_learning(request: web.Request) -> web.Response:
    worker = request.app[WORKER]
    learning = _learning(worker)
    worker.scheduler.require_ready()
    body = await read_json(request)
    learning.start(check_conversations(body), check_tuning(body))
    log.info("head learning started on %d conversations", learning.status.conversations)
    return web.json_response(learning.status.to_dict(), status=202)


async def stop_learning(request: web.Request) -> web.Response:
    learning = _learning(request.app[WORKER])
    await learning.stop()
    return web.json_response(learning.status.to_dict())


# --- chat completions ---------------------------------------------------------------


async def chat_completions(request: web.Request) -> web.StreamResponse:
    worker = request.app[WORKER]
    worker.scheduler.require_ready()
    settings = worker.settings
    chat = parse_chat_request(await read_json(request), settings.methods, settings.adaptive)
    decision = settings.decide(chat.speculation, worker.scheduler.load())
    if decision.disabled_reason == "load":
        worker.metrics.load_off.inc()
    job = Job(chat, decision, asyncio.get_running_loop())
    worker.scheduler.submit(job)
    try:
        first = await job.events.get()
        answer = Answer(worker.model_id)
        if chat.stream and isinstance(first, Queued):  # say so while it waits
            return await _stream(request, job, answer, first)
        while isinstance(first, Queued):
            first = await job.events.get()
        started = _expect_started(first)
        if chat.stream:
            return await _stream(request, job, answer, started)
        return await _collect(job, answer, started)
    finally:
        worker.scheduler.abandon(job)


def _expect_started(event: object) -> Started:
    """``event`` if the engine started the answer; its error raised; else out of order."""
    if isinstance(event, Started):
        return event
    if isinstance(event, EngineError):
        raise event
    raise EngineError(f"the engine answered out of order ({type(event).__name__})")


def _window_json(window: ContextWindow) -> dict[str, Any]:
    return {"dropped_messages": window.dropped_messages, "prompt_tokens": window.prompt_tokens}


def _final_fields(job: Job, completion: Completion, started: Started,
                  window: ContextWindow | None) -> dict[str, Any]:
    stats = completion.stats
    anve: dict[str, Any] = {"token_ids": list(completion.token_ids)}
    if job.request.cache == COLD:
        anve["cache"] = COLD
    if window is not None:
        anve["context_window"] = _window_json(window)
    return {
        "usage": usage_json(stats),
        "speculation": speculation_json(stats, job.decision, started.num_draft_tokens),
        "anve": anve,
    }


async def _collect(job: Job, answer: Answer, started: Started) -> web.Response:
    pieces: list[tuple[str, bool]] = []
    window: ContextWindow | None = None
    while True:
        event = await job.events.get()
        if isinstance(event, EngineError):
            raise event
        if isinstance(event, ContextWindow):
            window = event
        if isinstance(event, TextChunk):
            pieces += event.pieces
        if isinstance(event, Completion):
            break
    fields = _final_fields(job, event, started, window)
    fields["anve"] = {**pieces_json(merge_pieces(pieces)), **fields["anve"]}
    body = completion_json(answer, event.text, event.finish_reason, **fields)
    return web.json_response(body)


def merge_pieces(pieces: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Join neighbouring pieces with the same draft flag."""
    merged: list[tuple[str, bool]] = []
    for text, flag in pieces:
        if merged and merged[-1][1] == flag:
            merged[-1] = (merged[-1][0] + text, flag)
        elif text:
            merged.append((text, flag))
    return merged


async def _stream(
    request: web.Request, job: Job, answer: Answer, first: Started | Queued
) -> web.StreamResponse:
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    worker = request.app[WORKER]
    try:
        await _send(response, chunk_json(answer, {"role": "assistant", "content": ""},
                                         anve={"method": job.decision.method}))
        async for payload in _stream_payloads(worker, job, answer, first):
            await _send(response, payload)
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        log.info("a client went away mid-stream; its answer was cancelled")
    return response


async def _send(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode("utf-8") + b"\n\n")


def _queue_chunk(answer: Answer, ahead: int) -> dict[str, Any]:
    return chunk_json(answer, {}, anve={"queue": {"ahead": ahead}})


async def _stream_payloads(
    worker: Worker, job: Job, answer: Answer, first: Started | Queued
) -> AsyncIterator[dict[str, Any]]:
    """SSE payloads: one chunk per text event, then the final chunk (or an error). Chunks
    with an empty delta carry ``anve.queue`` (answers ahead of this one, while it waits;
    0 once it starts), ``anve.context_window`` (a rolling window left messages out) and
    ``anve.prompt_progress`` (while a long prompt is read)."""
    started = first if isinstance(first, Started) else None
    window: ContextWindow | None = None
    if isinstance(first, Queued):
        yield _queue_chunk(answer, first.ahead)
    while True:
        event = await job.events.get()
        if isinstance(event, Queued) and started is None:
            yield _queue_chunk(answer, event.ahead)
        elif isinstance(event, Started):
            started = event
            yield _queue_chunk(answer, 0)
        elif isinstance(event, ContextWindow):
            window = event
            yield chunk_json(answer, {}, anve={"context_window": _window_json(event)})
        elif isinstance(event, PromptProgress):
            progress = {"read": event.read, "total": event.total}
            yield chunk_json(answer, {}, anve={"prompt_progress": progress})
        elif isinstance(event, TextChunk) and event.text:
            anve = {**pieces_json(event.pieces), "tokens": len(event.token_ids),
                    "drafted": event.drafted, "accepted": event.accepted}
            yield chunk_json(answer, {"content": event.text}, anve=anve)
        elif isinstance(event, Completion):
            final = _final_fields(job, event, _expect_started(started), window)
            yield chunk_json(answer, {}, event.finish_reason, **final)
            return
        elif isinstance(event, EngineError):
            worker.metrics.errors.labels(event.code).inc()
            yield error_json(status_of(event), str(event), event.code)
            return


# --- the app --------------------------------------------------------------------------


async def _stop_learning(app: web.Application) -> AsyncIterator[None]:
    yield
    learning = app[WORKER].learning
    if learning is not None:
        await learning.stop()


async def _watch_loop_lag(app: web.Application) -> AsyncIterator[None]:
    """Measure how late the event loop wakes from short naps (``/metrics``)."""

    async def watch() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_NAP_S)
            app[WORKER].metrics.loop_lag.observe(max(0.0, loop.time() - before - LAG_NAP_S))

    task = asyncio.create_task(watch())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def create_app(worker: Worker, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> web.Application:
    """The aiohttp application; serve it with ``handler_cancellation=True``."""
    app = web.Application(
        client_max_size=max_body_bytes, middlewares=[errors_middleware, auth_middleware]
    )
    app[WORKER] = worker
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/speculation", get_speculation)
    app.router.add_put("/v1/speculation", put_speculation)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get(LEARNING, get_learning)
    app.router.add_post(LEARNING, start_learning)
    app.router.add_delete(LEARNING, stop_learning)
    app.cleanup_ctx.append(_watch_loop_lag)
    app.cleanup_ctx.append(_stop_learning)
    return app
