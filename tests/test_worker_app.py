"""The worker app in-process over real HTTP with a fake engine: loading, queue, errors, auth.

A fake engine makes these fast and deterministic; ``test_worker_process.py`` runs the
real worker process on tiny models.
"""

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import SimpleNamespace
from typing import Any, ClassVar

from aiohttp.test_utils import TestClient, TestServer

from engine.errors import BadRequestError, EngineError, PromptTooLongError
from engine.protocol import (
    ROLLING_WINDOW,
    Completion,
    ContextWindow,
    PromptProgress,
    SpeculationStats,
    TextChunk,
)
from engine.worker.auth import Auth
from engine.worker.learning import HeadLearning
from engine.worker.metrics import Metrics
from engine.worker.scheduler import Scheduler
from engine.worker.server import Worker, create_app
from engine.worker.settings import SpeculationSettings

USER = [{"role": "user", "content": "hi"}]
READING = [PromptProgress(0, 300), PromptProgress(128, 300), PromptProgress(300, 300)]


class FakeEngine:
    """Answers ``w0 w1 ...``; every odd word counts as drafted. With a ``gate``, each answer
    sends ``free`` words and then waits until the test sets the gate (or the answer is
    cancelled: a hang-up, the scheduler's stop); never a timed wait. The question
    "a long document" is read in chunks first (:data:`READING`). Continuing an answer of n
    words goes on from ``wn``; a rolling window leaves out all but the first and the last
    two messages of a conversation longer than three."""

    target = SimpleNamespace(name="fake", max_context=64, memory_bytes=1234, plan=None)
    draft = None
    method = "ngram"
    num_draft_tokens = 3
    methods: ClassVar[list[str]] = ["off", "ngram", "suffix"]

    def __init__(self, gate: threading.Event | None = None, free: int = 0) -> None:
        self.gate, self.free = gate, free
        self.seen: list[str] = []
        self.caches: list[str] = []  # each answer's cache state, as the worker passed it

    def generate(self, messages: Any, params: Any = None, *, max_tokens: int = 512,
                 method: str | None = None, cancel: threading.Event | None = None,
                 overflow: str = "stop", continue_final: bool = False, cache: str = "warm",
                 **_: Any) -> Iterator[Any]:
        if len(messages[-1]["content"]) > 100:
            raise PromptTooLongError("the conversation is too long")
        if messages[-1]["content"] == "crash":
            raise RuntimeError("a bug in the engine")
        self.seen.append(messages[-1]["content"])
        self.caches.append(cache)
        start = len(messages[-1]["content"].split()) if continue_final else 0
        words = self._words(max_tokens, method or self.method, cancel or threading.Event(),
                            start)
        if messages[-1]["content"] == "a long document":
            return itertools.chain(READING, words)
        if overflow == ROLLING_WINDOW and len(messages) > 3:
            return itertools.chain([ContextWindow(len(messages) - 3, 40)], words)
        return words

    def check_num_draft_tokens(self, k: Any) -> int:
        if not isinstance(k, int):
            raise BadRequestError("fixed draft lengths only")
        return k

    def open_slots(self, count: int) -> int:
        return 1  # one answer at a time: its gate holds the engine thread

    def _words(
        self, n: int, method: str, cancel: threading.Event, start: int = 0
    ) -> Iterator[TextChunk | Completion]:
        text, reason = "", "length"
        for i in range(start, start + n):
            if self.gate is not None and len(text.split()) >= self.free:
                while not self.gate.is_set() and not cancel.wait(0.01):
                    pass
            if cancel.is_set():
                reason = "cancelled"
                break
            text += f"w{i} "
            yield TextChunk(f"w{i} ", ((f"w{i} ", i % 2 == 1),), (i,))
        stats = SpeculationStats(method, method != "off", prompt_tokens=3,
                                 completion_tokens=len(text.split()), passes=len(text.split()))
        yield Completion(text, reason, (), stats)


@contextlib.asynccontextmanager
async def serving(
    loader: Callable[[Any], Any], auth: Auth | None = None,
    learning: Callable[[Scheduler], HeadLearning] | None = None, **app_kwargs: Any
) -> AsyncIterator[tuple[TestClient, Worker]]:
    settings, metrics = SpeculationSettings(), Metrics()
    scheduler = Scheduler(loader, settings, metrics, max_waiting=2)
    worker = Worker(scheduler, settings, metrics, auth or Auth(),
                    learning(scheduler) if learning else None)
    async with TestClient(TestServer(create_app(worker, **app_kwargs))) as client:
        scheduler.start()
        yield client, worker
        scheduler.stop()


async def until(check: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait for ``check``; the timeout is only there to end a hang."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def assert_error(body: dict[str, Any], code: str) -> None:
    assert set(body) == {"error"}
    assert {"message", "type", "code", "param"} <= set(body["error"])
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]


def ready(engine: FakeEngine) -> Callable[[Any], FakeEngine]:
    return lambda progress: engine


# --- loading ------------------------------------------------------------------------------


def test_health_reports_loading_progress_then_ready() -> None:
    release = threading.Event()

    def loader(progress: Callable[[float, str], None]) -> FakeEngine:
        progress(0.5, "converting fake")
        release.wait(10)
        return FakeEngine()

    async def scenario() -> None:
        async with serving(loader) as (client, worker):
            await until(lambda: worker.scheduler.status.progress == 0.5)
            health = await (await client.get("/health")).json()
            assert (health["status"], health["progress"]) == ("loading", 0.5)
            assert health["message"] == "converting fake"
            for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                                 ("PUT", "/v1/speculation")):
                resp = await client.request(method, path, json={"messages": USER})
                assert resp.status == 503
                assert_error(await resp.json(), "model_not_ready")
            assert (await (await client.get("/v1/speculation")).json())["method"] is None
            release.set()
            await until(lambda: worker.scheduler.status.state == "ready")
            resp = await client.post("/v1/chat/completions", json={"messages": USER,
                                                                    "max_tokens": 2})
            assert (await resp.json())["choices"][0]["message"]["content"] == "w0 w1 "

    asyncio.run(scenario())


def test_a_failed_load_is_reported() -> None:
    def loader(progress: Callable[[float, str], None]) -> FakeEngine:
        raise EngineError("not enough memory for fake")

    async def scenario() -> None:
        async with serving(loader) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "error")
            health = await (await client.get("/health")).json()
            assert health["message"] == "not enough memory for fake"
            resp = await client.post("/v1/chat/completions", json={"messages": USER})
            assert resp.status == 503
            assert "failed to load: not enough memory" in (await resp.json())["error"]["message"]

    asyncio.run(scenario())


# --- answers and the queue ------------------------------------------------------------------


def test_stream_carries_pieces_usage_and_speculation() -> None:
    async def scenario() -> None:
        async with serving(ready(FakeEngine())) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            resp = await client.post("/v1/chat/completions",
                                     json={"messages": USER, "max_tokens": 3, "stream": True})
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            lines = [ln for ln in (await resp.text()).split("\n") if ln]
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            pieces = [p for c in chunks[1:-1] for p in c["anve"]["pieces"]]
            assert pieces == [["w0 ", False], ["w1 ", True], ["w2 ", False]]
            final = chunks[-1]
            assert final["choices"][0]["finish_reason"] == "length"
            assert final["usage"]["completion_tokens"] == 3
            assert final["speculation"]["method"] == "ngram"
            assert final["speculation"]["num_draft_tokens"] == 3
            assert final["speculation"]["trial"] is False  # not auto's trial of a runner-up

    asyncio.run(scenario())


def test_a_long_prompt_streams_its_reading_progress_before_the_text() -> None:
    async def scenario() -> None:
        async with serving(ready(FakeEngine())) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            ask = {"messages": [{"role": "user", "content": "a long document"}], "max_tokens": 2}
            resp = await client.post("/v1/chat/completions", json={**ask, "stream": True})
            lines = [ln for ln in (await resp.text()).split("\n") if ln]
            chunks = [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]
            reading = [c["anve"]["prompt_progress"] for c in chunks[1:4]]
            assert reading == [{"read": 0, "total": 300}, {"read": 128, "total": 300},
                               {"read": 300, "total": 300}]
            assert all(c["choices"][0]["delta"] == {} for c in chunks[1:4])  # no text yet
            assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "w0 w1 "
            whole = await (await client.post("/v1/chat/completions", json=ask)).json()
            assert whole["choices"][0]["message"]["content"] == "w0 w1 "

    asyncio.run(scenario())


def sse_chunks(body: str) -> list[dict[str, Any]]:
    lines = [ln for ln in body.split("\n") if ln]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def test_a_rolling_window_says_what_it_left_out_and_answers_continue() -> None:
    chat = [{"role": "system", "content": "s"}, *[{"role": r, "content": "x"} for r in
                                                  ("user", "assistant") * 2], USER[0]]
    url = "/v1/chat/completions"

    async def scenario() -> None:
        async with serving(ready(FakeEngine())) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            ask = {"messages": chat, "max_tokens": 2, "anve": {"context_overflow": ROLLING_WINDOW}}
            chunks = sse_chunks(await (await client.post(url, json={**ask, "stream": True})).text())
            assert chunks[0]["anve"] == {"method": "ngram"}  # known before the first token
            window = {"dropped_messages": 3, "prompt_tokens": 40}
            assert chunks[1]["anve"] == {"context_window": window}
            assert chunks[1]["choices"][0]["delta"] == {}
            assert chunks[-1]["anve"]["context_window"] == window
            whole = await (await client.post(url, json=ask)).json()
            assert whole["anve"]["context_window"] == window
            plain = sse_chunks(await (await client.post(
                url, json={"messages": chat, "max_tokens": 1, "stream": True})).text())
            assert not any("context_window" in c.get("anve", {}) for c in plain)  # stop: none
            partial = [*USER, {"role": "assistant", "content": "w0 w1 "}]
            go_on = {"messages": partial, "max_tokens": 2, "continue_final_message": True,
                     "add_generation_prompt": False}
            more = await (await client.post(url, json=go_on)).json()
            assert more["choices"][0]["message"]["content"] == "w2 w3 "
            for body, param in (
                ({**go_on, "add_generation_prompt": True}, "add_generation_prompt"),
                ({"messages": USER, "add_generation_prompt": False}, "add_generation_prompt"),
                ({**go_on, "messages": USER}, "messages"),
                ({**ask, "anve": {"context_overflow": "truncate_middle"}},
                 "anve.context_overflow"),
                ({**ask, "anve": "rolling"}, "anve"),
            ):
                resp = await client.post(url, json=body)
                assert resp.status == 400
                error = await resp.json()
                assert_error(error, "invalid_request")
                assert error["error"]["param"] == param

    asyncio.run(scenario())


def test_a_cold_answer_reaches_the_engine_and_says_so() -> None:
    url = "/v1/chat/completions"

    async def scenario() -> None:
        engine = FakeEngine()
        async with serving(ready(engine)) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            cold = {"messages": USER, "max_tokens": 2, "anve": {"cache": "cold"}}
            chunks = sse_chunks(await (await client.post(url, json={**cold, "stream": True})
                                       ).text())
            assert chunks[-1]["anve"]["cache"] == "cold"
            assert chunks[-1]["speculation"]["total_s"] is not None
            whole = await (await client.post(url, json=cold)).json()
            assert whole["anve"]["cache"] == "cold"
            warm = await (await client.post(url, json={**cold, "anve": {"cache": "warm"}})).json()
            default = await (await client.post(url, json={"messages": USER, "max_tokens": 1})
                             ).json()
            assert "cache" not in warm["anve"] and "cache" not in default["anve"]
            assert engine.caches == ["cold", "cold", "warm", "warm"]
            for bad in ("frozen", True, None, ["cold"]):
                resp = await client.post(url, json={**cold, "anve": {"cache": bad}})
                assert resp.status == 400, bad
                error = await resp.json()
                assert_error(error, "invalid_request")
                assert error["error"]["param"] == "anve.cache"
                assert "warm, cold" in error["error"]["message"]
            assert len(engine.caches) == 4  # refused before the engine saw them

    asyncio.run(scenario())


def test_a_waiting_stream_hears_its_place_in_the_queue() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)

    async def scenario() -> None:
        async with serving(ready(engine)) as (client, worker):
            sched = worker.scheduler
            await until(lambda: sched.status.state == "ready")
            ask = {"messages": USER, "max_tokens": 1}
            first = asyncio.create_task(client.post("/v1/chat/completions", json=ask))
            await until(lambda: sched.running == 1)
            # a waiting stream gets its headers and place at once, not when its turn comes
            second = await client.post("/v1/chat/completions", json={**ask, "stream": True})
            third = await client.post("/v1/chat/completions", json={**ask, "stream": True})
            assert second.status == third.status == 200 and sched.waiting == 2
            gate.set()
            for resp, places in ((second, [1, 0]), (third, [2, 1, 0])):
                chunks = sse_chunks(await resp.text())
                queue = [c["anve"]["queue"]["ahead"] for c in chunks
                         if "queue" in c.get("anve", {})]
                assert queue == places
                assert all(c["choices"][0]["delta"] in ({}, {"role": "assistant", "content": ""})
                           for c in chunks if "queue" in c.get("anve", {}))
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
                assert text == "w0 " and chunks[-1]["choices"][0]["finish_reason"] == "length"
            assert (await first).status == 200
            alone = sse_chunks(await (await client.post(
                "/v1/chat/completions", json={**ask, "stream": True})).text())
            assert not any("queue" in c.get("anve", {}) for c in alone)  # served at once

    asyncio.run(scenario())


def test_an_error_found_after_waiting_comes_in_the_stream() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)

    async def scenario() -> None:
        async with serving(ready(engine)) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            ask = {"messages": USER, "max_tokens": 1}
            first = asyncio.create_task(client.post("/v1/chat/completions", json=ask))
            await until(lambda: worker.scheduler.running == 1)
            long = {"messages": [{"role": "user", "content": "x" * 200}], "stream": True}
            resp = await client.post("/v1/chat/completions", json=long)
            assert resp.status == 200  # already streaming its place when the engine refuses it
            gate.set()
            chunks = sse_chunks(await resp.text())
            assert chunks[-1]["error"]["code"] == "context_length_exceeded"
            assert (await first).status == 200

    asyncio.run(scenario())


def test_fifo_order_queue_limit_and_withdrawal() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate)

    async def ask(client: TestClient, content: str) -> Any:
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
        return await client.post("/v1/chat/completions", json=body)

    async def scenario() -> None:
        async with serving(ready(engine)) as (client, worker):
            sched = worker.scheduler
            await until(lambda: sched.status.state == "ready")
            first = asyncio.create_task(ask(client, "first"))
            await until(lambda: sched.running == 1)
            second = asyncio.create_task(ask(client, "second"))
            await until(lambda: sched.waiting == 1)
            leaving = asyncio.create_task(ask(client, "leaving"))
            await until(lambda: sched.waiting == 2)
            full = await ask(client, "one too many")
            assert full.status == 503
            assert_error(await full.json(), "queue_full")
            leaving.cancel()  # like a client that hangs up while waiting
            await until(lambda: sched.waiting == 1)
            third = asyncio.create_task(ask(client, "third"))
            await until(lambda: sched.waiting == 2)
            gate.set()
            for task in (first, second, third):
                assert (await task).status == 200
            assert engine.seen == ["first", "second", "third"]

    asyncio.run(scenario())


def test_disconnect_cancels_the_running_answer() -> None:
    gate = threading.Event()
    engine = FakeEngine(gate=gate, free=1)  # the answer cannot end but by the hang-up

    async def scenario() -> None:
        async with serving(ready(engine)) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            resp = await client.post("/v1/chat/completions",
                                     json={"messages": USER, "max_tokens": 5000, "stream": True})
            await resp.content.readline()
            resp.close()
            await until(lambda: worker.scheduler.running == 0)
            metrics = (await (await client.get("/metrics")).read()).decode()
            assert 'anve_requests_total{finish_reason="cancelled"} 1.0' in metrics
            gate.set()
            answer = await client.post("/v1/chat/completions",
                                       json={"messages": USER, "max_tokens": 2})
            assert (await answer.json())["choices"][0]["finish_reason"] == "length"

    asyncio.run(scenario())


# --- errors and auth --------------------------------------------------------------------------


def test_errors_have_openai_shape_and_the_worker_keeps_serving() -> None:
    async def scenario() -> None:
        async with serving(ready(FakeEngine()), max_body_bytes=4096) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            url = "/v1/chat/completions"
            cases = [
                (client.post(url, data=b"{not json"), 400, "invalid_request"),
                (client.post(url, json={"max_tokens": 3}), 400, "invalid_request"),
                (client.post(url, json={"messages": [{"role": "user", "content": "x" * 200}]}),
                 400, "context_length_exceeded"),
                (client.post(url, json={"messages": USER, "stream": True,
                                        "speculation": {"method": "draft"}}),
                 400, "invalid_request"),
                (client.post(url, data=b"x" * 10_000), 413, "request_too_large"),
                (client.get(url), 405, "method_not_allowed"),
                (client.get("/v2/nothing"), 404, "not_found"),
                (client.post(url, json={"messages": [{"role": "user", "content": "crash"}]}),
                 500, "engine_error"),
            ]
            for request, status, code in cases:
                resp = await request
                assert resp.status == status
                assert_error(await resp.json(), code)
            resp = await client.post(url, json={"messages": USER, "max_tokens": 1})
            assert resp.status == 200

    asyncio.run(scenario())


def test_tokens_are_checked_and_admin_is_separate() -> None:
    user, admin = {"Authorization": "Bearer u-token"}, {"Authorization": "Bearer a-token"}

    async def scenario() -> None:
        auth = Auth("u-token", "a-token")
        async with serving(ready(FakeEngine()), auth=auth) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            assert (await client.get("/health")).status == 401
            wrong = await client.get("/health", headers={"Authorization": "Bearer nope"})
            assert wrong.status == 401
            assert_error(await wrong.json(), "invalid_api_key")
            assert (await client.get("/health", headers=user)).status == 200
            body = {"method": "suffix"}
            refused = await client.put("/v1/speculation", json=body, headers=user)
            assert refused.status == 403
            assert_error(await refused.json(), "permission_denied")
            done = await client.put("/v1/speculation", json=body, headers=admin)
            assert (await done.json())["method"] == "suffix"

    asyncio.run(scenario())
