"""Continuous batching in the worker's scheduler, on the light model's native forward.

Each answer in a batch is token for token what it is alone, whatever joins or leaves;
waits are on states (answers, events), never on times."""

import asyncio
import threading
from collections.abc import Iterator

import pytest

from engine.errors import EngineError
from engine.protocol import Completion, TextChunk
from engine.spec.sampling import SamplingParams
from engine.spec.session import ChatEngine
from engine.worker.metrics import Metrics
from engine.worker.scheduler import Job, JobEvent, Scheduler, Started
from engine.worker.schema import ChatRequest
from engine.worker.settings import Decision, SpeculationSettings
from tests.conftest import LIGHT

QUESTIONS = [
    "Write a Python function that reverses a string.",
    "What is the capital of France?",
    "List three colours.",
    "Explain what a hash map is in one sentence.",
]
METHODS = ["off", "ngram", "suffix", "off"]  # one batch mixes methods
TOKENS = 24


@pytest.fixture(scope="module")
def engine() -> ChatEngine:
    """An engine of its own: serving in slots changes how it parks its caches."""
    return ChatEngine.load(LIGHT)


@pytest.fixture(scope="module")
def alone(engine: ChatEngine) -> dict[tuple[str, str], tuple[int, ...]]:
    """Every question's greedy answer with each method, served alone and cold."""
    out = {}
    for question in QUESTIONS:
        for method in set(METHODS):
            events = list(engine.generate(ask(question), max_tokens=TOKENS, method=method,
                                          cache="cold"))
            done = events[-1]
            assert isinstance(done, Completion)
            out[question, method] = done.token_ids
    return out


@pytest.fixture(scope="module")
def scheduler(engine: ChatEngine, alone: object) -> Iterator[Scheduler]:
    scheduler = Scheduler(lambda progress: engine, SpeculationSettings(), Metrics(),
                          max_batch=4)
    scheduler.start()
    ready = threading.Event()
    while not ready.wait(0.01):  # a state: the engine is loaded and its slots open
        if scheduler.status.state != "loading":
            ready.set()
    assert scheduler.status.state == "ready" and scheduler.max_batch == 4
    yield scheduler
    scheduler.stop()


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def job(question: str, method: str, tokens: int = TOKENS) -> Job:
    request = ChatRequest(ask(question), SamplingParams(), max_tokens=tokens)
    k = None if method == "off" else 4
    return Job(request, Decision(method, k), asyncio.get_running_loop())


async def finish(job: Job) -> tuple[list[JobEvent], Completion]:
    events: list[JobEvent] = []
    while True:
        event = await job.events.get()
        events.append(event)
        if isinstance(event, EngineError):
            raise event
        if isinstance(event, Completion):
            return events, event


async def first_text(job: Job) -> list[JobEvent]:
    seen: list[JobEvent] = []
    while not any(isinstance(e, TextChunk) and e.token_ids for e in seen):
        seen.append(await job.events.get())
    return seen


def test_answers_are_the_same_at_concurrency_1_2_and_4(
    scheduler: Scheduler, alone: dict[tuple[str, str], tuple[int, ...]]
) -> None:
    async def run() -> None:
        for together in (1, 2, 4):
            for start in range(0, len(QUESTIONS), together):
                picked = list(zip(QUESTIONS, METHODS, strict=True))[start : start + together]
                jobs = [job(q, m) for q, m in picked]
                for j in jobs:
                    scheduler.submit(j)
                done = await asyncio.gather(*(finish(j) for j in jobs))
                for (question, method), (events, completion) in zip(picked, done, strict=True):
                    assert completion.token_ids == alone[question, method], (together, method)
                    assert completion.finish_reason == "length"
                    assert isinstance(events[0], Started)
    asyncio.run(run())
    assert scheduler.metrics.answers_per_pass.collect()[0].samples  # passes were counted
    served = {s.labels["le"]: s.value for s in scheduler.metrics.answers_per_pass.collect()[0]
              .samples if s.name.endswith("_bucket")}
    assert served["3.0"] < served["4.0"]  # some passes carried four answers


def test_stopping_one_answer_leaves_the_others_intact(
    scheduler: Scheduler, alone: dict[tuple[str, str], tuple[int, ...]]
) -> None:
    async def run() -> None:
        jobs = [job(q, m) for q, m in zip(QUESTIONS[:3], METHODS[:3], strict=True)]
        for j in jobs:
            scheduler.submit(j)
        await first_text(jobs[1])
        scheduler.abandon(jobs[1])
        results = await asyncio.gather(*(finish(j) for j in jobs))
        assert results[1][1].finish_reason == "cancelled"
        assert len(results[1][1].token_ids) < TOKENS
        for k in (0, 2):
            assert results[k][1].token_ids == alone[QUESTIONS[k], METHODS[k]]
    asyncio.run(run())


def test_a_request_joins_a_running_batch_at_the_next_pass(
    scheduler: Scheduler, alone: dict[tuple[str, str], tuple[int, ...]]
) -> None:
    async def run() -> None:
        long = job(QUESTIONS[0], "off", tokens=4 * TOKENS)
        scheduler.submit(long)
        await first_text(long)
        short = job(QUESTIONS[2], "ngram")
        scheduler.submit(short)
        order: list[str] = []

        async def track(name: str, j: Job) -> Completion:
            _, completion = await finish(j)
            order.append(name)
            return completion

        long_done, short_done = await asyncio.gather(track("long", long), track("short", short))
        assert order == ["short", "long"]  # it did not wait for the long answer
        assert short_done.token_ids == alone[QUESTIONS[2], "ngram"]
        assert long_done.token_ids[:TOKENS] == alone[QUESTIONS[0], "off"]
    asyncio.run(run())


def test_a_client_that_reads_nothing_does_not_stall_the_batch(
    scheduler: Scheduler, alone: dict[tuple[str, str], tuple[int, ...]]
) -> None:
    async def run() -> None:
        slow = job(QUESTIONS[3], "off")
        scheduler.submit(slow)  # nobody reads its events until the others are done
        others = [job(q, m) for q, m in zip(QUESTIONS[:2], METHODS[:2], strict=True)]
        for j in others:
            scheduler.submit(j)
        for j, question, method in zip(others, QUESTIONS, METHODS, strict=False):
            _, completion = await finish(j)
            assert completion.token_ids == alone[question, method]
        _, late = await finish(slow)
        assert late.token_ids == alone[QUESTIONS[3], "off"]
    asyncio.run(run())


def test_waiting_jobs_hear_their_place_once_every_slot_is_busy(scheduler: Scheduler) -> None:
    async def run() -> None:
        jobs = [job(QUESTIONS[i % 4], "off", tokens=2 * TOKENS) for i in range(6)]
        for j in jobs:
            scheduler.submit(j)
        results = await asyncio.gather(*(finish(j) for j in jobs))
        queued = [[e.ahead for e in events if type(e).__name__ == "Queued"]
                  for events, _ in results]
        assert queued[:4] == [[], [], [], []]  # four slots: served at once
        assert queued[4][0] == 4 and queued[5][0] == 5
        assert all(c.finish_reason in ("length", "stop") and c.token_ids for _, c in results)
    asyncio.run(run())
