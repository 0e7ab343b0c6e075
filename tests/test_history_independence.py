"""Answers independent of history (issue #26): a greedy answer is what a freshly started
engine answers with speculation off, whatever the engine served before.

The unit tests feed one sequence of ids into a runner in different ways (whole, after a
cached prefix, one at a time, as a verification longer than a verification step,
after a parked cache) and ask for the same bits in every cached position. The stress
tests send a seeded random sequence of requests to one light-model engine and to one real
worker with concurrent clients: every method, conversations coming back, follow-ups,
edited earlier messages (prompts that diverge from a parked cache), stops mid-answer and
mid-prompt, ``max_tokens: 1``; each answer is compared with the fresh engine's plain
answer to the same messages. Stops are by token counts and events, never by time.
"""

import json
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.cpu.quantize import accelerate
from engine.protocol import Completion, PromptProgress, TextChunk
from engine.spec.runner import ModelRunner
from engine.spec.sampling import SamplingParams
from engine.spec.session import ChatEngine
from tests.conftest import LIGHT
from tests.test_fastlinear import NATIVE, gguf_model
from tests.worker_process import Http, link_light_cache, start_worker

GREEDY = SamplingParams(temperature=0.0)
IDS = [(7 * i * i + 3 * i + 11) % 317 + 3 for i in range(45)]  # 45 ids: > 2 * TREE_ROWS


def cache_state(runner: ModelRunner) -> list[torch.Tensor]:
    """Every cached key and value (and feature) of ``runner`` for its ids."""
    n = len(runner.ids)
    out = [t[:, :n].clone() for layer in runner.cache.layers
           for t in (layer.keys, layer.values)]
    return out + ([runner.hidden.clone()] if runner.hidden is not None else [])


def assert_same_bits(a: list[torch.Tensor], b: list[torch.Tensor], what: str) -> None:
    assert len(a) == len(b), what
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.shape == y.shape and torch.equal(x, y), f"{what}: tensor {i} differs"


@pytest.mark.parametrize("native", NATIVE)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_cache_holds_the_same_bits_however_its_ids_were_fed(
    tmp_path: Path, kind: str, native: bool
) -> None:
    """transformers' own forward over a prompt blocked its attention by the query count
    and, natively, differed from the step in the last bits: a prompt read whole left other
    bits than the same ids read after a cached prefix, or decoded. The engine's forward
    must not."""
    model, path = gguf_model(tmp_path, kind)
    accelerate(model, path, "int4+int8", native=native)
    for keep in (False, True):  # features kept (EAGLE) or not
        fed_every_way(model, keep, native)


def fed_every_way(model: Any, keep: bool, native: bool) -> None:
    def runner() -> ModelRunner:
        made = ModelRunner(model)
        made.keep_hidden(keep)
        assert (made.model_forward.plan.backend == "native") == native
        return made

    whole = runner()
    last = whole.sync(IDS)
    assert last is not None
    expected = cache_state(whole)

    def check(other: ModelRunner, logits: torch.Tensor | None, what: str) -> None:
        assert other.ids == IDS, what
        assert_same_bits(cache_state(other), expected, what)
        if logits is not None:
            assert torch.equal(logits, last), f"{what}: the last logits differ"

    prefixed = runner()
    prefixed.sync(IDS[:7])
    check(prefixed, prefixed.sync(IDS), "read after a cached prefix")
    stepped = runner()
    singles = [stepped.forward([token])[-1] for token in IDS]  # [V] after each id
    check(stepped, singles[-1], "decoded one at a time")
    verified = runner()
    verified.sync(IDS[:20])
    rows = verified.forward(IDS[20:], rows=len(IDS) - 20)  # 25 rows in one verification
    check(verified, rows[-1], "verified 25 rows at once")
    assert torch.equal(rows, torch.stack(singles[20:])), "a verification row differs"
    other = [*IDS[:30], *range(40, 80)]  # another conversation sharing 30 ids
    swapped = runner()
    swapped.sync(other)
    assert swapped.resume([9, 9, 9]) == 0  # a third one: ``other`` is parked ...
    swapped.sync([9, 9, 9])
    assert swapped.resume(IDS) == 30  # ... and swapped back in
    check(swapped, swapped.sync(IDS), "read after a parked conversation's prefix")
    copied = runner()
    copied.sync(other)
    assert copied.resume(IDS) == 30 and copied.parked  # a copy of the shared 30 goes on
    check(copied, copied.sync(IDS), "read after a copied prefix (KVCache.prefix)")


# --- the light model ------------------------------------------------------------------

QUESTIONS = [
    "Write a Python function that reads a CSV file of expenses with columns date, employee, "
    "category, amount and returns the total amount per employee per month as a dictionary. "
    "Use only the standard library.",
    "Explain in simple words what a firewall does.",
    "Suggest a friendly way to remind colleagues to submit their timesheets on Friday.",
    "Fix the bug in this code and show the corrected version:\n"
    "def mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n"
    "    return total / len(x)\n",
    "Repeat this sentence exactly, then translate it to French: "
    "'The meeting with the finance team moves to Thursday at ten in room B.'",
]
MEMO = (  # a prompt longer than the engine's reading chunk (128 tokens)
    "Summarise this memo for the staff, quoting the exact room numbers and dates.\n\n"
    + " ".join(f"Item {i}: the printer in room {100 + i} moves to room {200 + i} on "
               f"December {i + 1}." for i in range(9))
)
FOLLOW_UPS = ["Make it shorter.", "Now explain it to a new colleague.",
              "Give one more example.", "Thanks! What should I check first?"]
TOKENS = 24  # the longest answer asked for; references are this long


class References:
    """Plain greedy answers of a freshly started engine, computed once per messages."""

    def __init__(self, engine: ChatEngine) -> None:
        self.engine = engine
        self.known: dict[str, Completion] = {}

    def __call__(self, messages: list[dict[str, str]]) -> Completion:
        key = json.dumps(messages)
        if key not in self.known:
            self.engine.runner.reset()  # no cached or parked conversation: as started
            *_, done = self.engine.generate(messages, GREEDY, max_tokens=TOKENS, method="off")
            assert isinstance(done, Completion)
            self.known[key] = done
        return self.known[key]


@pytest.fixture(scope="module")
def references(light_engine: ChatEngine) -> References:
    return References(light_engine)


class Asker:
    """Sends the seeded random requests of one stress run to ``engine``, checking each."""

    def __init__(self, engine: ChatEngine, references: References, seed: int) -> None:
        self.engine, self.references = engine, references
        self.rng = random.Random(seed)
        self.conversations: list[list[dict[str, str]]] = []  # each ends with an answer
        self.kinds: dict[str, int] = {}

    def messages(self) -> list[dict[str, str]]:
        """The next request's messages: a new question, one coming back, a follow-up, or
        an earlier question edited (its conversation's cache then diverges)."""
        rng, chats = self.rng, self.conversations
        kind = rng.choice(["new", "again", "follow", "follow", "edit"]) if chats else "new"
        if kind == "edit" and not any(len(c) > 2 for c in chats):
            kind = "follow"
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "new":
            return [{"role": "user", "content": rng.choice([*QUESTIONS, MEMO])}]
        if kind == "again":
            return rng.choice(chats)[:-1]
        if kind == "follow":
            return [*rng.choice(chats), {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
        chat = rng.choice([c for c in chats if len(c) > 2])
        at = rng.choice([i for i, m in enumerate(chat[:-1]) if m["role"] == "user"])
        edited = rng.choice([q for q in [*QUESTIONS, *FOLLOW_UPS] if q != chat[at]["content"]])
        return [*chat[:at], {"role": "user", "content": edited}]

    def ask(self, number: int) -> None:
        rng, engine = self.rng, self.engine
        messages = self.messages()
        method = rng.choice(engine.methods)
        k: int | str = rng.choice(["adaptive", "adaptive", 1, 3, 16])  # 16: 17 rows verified
        max_tokens = rng.choice([1, 8, TOKENS, TOKENS])
        stop_after = rng.choice([None, None, None, None, 1, 2])  # chunks, then Stop
        stop_reading = rng.random() < 0.1  # Stop while a long prompt is read
        for name in ("eagle", "draft"):  # trees (several branches in one pass) now and then
            if name in engine.drafters:
                engine.drafters[name].branches = rng.choice([0, 0, 2])
        cancel = threading.Event()
        events = engine.generate(messages, GREEDY, max_tokens=max_tokens, method=method,
                                 num_draft_tokens=k, cancel=cancel)
        chunks, done = 0, None
        for event in events:
            chunks += isinstance(event, TextChunk)
            if chunks == stop_after or (stop_reading and isinstance(event, PromptProgress)):
                cancel.set()
            if isinstance(event, Completion):
                done = event
        assert done is not None
        what = (f"request {number}: {method}, num_draft_tokens {k}, max_tokens {max_tokens}, "
                f"{len(messages)} messages, {done.finish_reason}")
        reference = self.references(messages).token_ids
        if done.finish_reason == "cancelled":
            assert done.token_ids == reference[: len(done.token_ids)], what
        else:
            assert done.token_ids == reference[:max_tokens], what
        self.conversations.append([*messages, {"role": "assistant", "content": done.text}])


def assert_cache_as_fresh(runner: ModelRunner) -> None:
    """The runner's current cache holds what a fresh runner computes for its ids."""
    fresh = ModelRunner(runner.model)
    fresh.keep_hidden(runner.hidden is not None)
    fresh.sync(runner.ids)
    assert_same_bits(cache_state(runner), cache_state(fresh), "the cache after the requests")


@pytest.fixture(scope="module")
def stressed(light_engine: ChatEngine) -> ChatEngine:
    """A second engine on the light model, with the same model as its draft model (so
    that ``draft`` and ``hybrid`` run: the light profile has no draft model)."""
    target = light_engine.target
    return ChatEngine(target, target, corpus=["def mean(xs):\n    return sum(xs) / len(xs)\n"])


@pytest.mark.model
def test_random_requests_to_one_engine_answer_as_a_fresh_engine(
    stressed: ChatEngine, references: References
) -> None:
    assert {"off", "ngram", "suffix", "draft", "hybrid", "eagle", "hybrid-eagle"} <= set(
        stressed.methods)
    asker = Asker(stressed, references, seed=26)
    checked = 0
    for number in range(16):
        asker.ask(number)
        if stressed.runner.ids:  # a request stopped while a prompt was read may leave none
            assert_cache_as_fresh(stressed.runner)
            checked += 1
    assert set(asker.kinds) == {"new", "again", "follow", "edit"} and checked >= 8
    draft = stressed.drafters["draft"]
    assert_cache_as_fresh(draft.runner)  # type: ignore[attr-defined]


def client_requests(seed: int, methods: list[str]) -> Iterator[tuple[list[dict[str, str]], Any]]:
    """One client's conversation as request bodies: each is sent with the messages so far;
    the caller sends the answer's text back (``generator.send``) for the next turn."""
    rng = random.Random(seed)
    chat = [{"role": "user", "content": rng.choice([*QUESTIONS, MEMO])}]
    for turn in range(4):
        method = rng.choice(methods)
        max_tokens = 1 if turn == 1 else TOKENS  # a one-token answer, then the whole one
        body = {"messages": chat, "max_tokens": max_tokens, "temperature": 0,
                "speculation": {"method": method}}
        text = yield chat, body
        if turn == 1:
            continue
        if turn == 2 and rng.random() < 0.5:  # an earlier question edited
            chat = [{"role": "user", "content": rng.choice(QUESTIONS)}]
        else:
            chat = [*chat, {"role": "assistant", "content": text},
                    {"role": "user", "content": rng.choice(FOLLOW_UPS)}]


@pytest.mark.model
def test_concurrent_clients_of_one_worker_get_a_fresh_engines_answers(
    tmp_path: Path, references: References
) -> None:
    link_light_cache(tmp_path / "data" / "models")
    args = ["--profile", "light", "--target", LIGHT, "--draft", LIGHT, "--log-level", "WARNING",
            "--data-dir", str(tmp_path / "data")]
    answers: list[tuple[list[dict[str, str]], int, list[int]]] = []
    failures: list[str] = []
    with start_worker(args, tmp_path) as worker:
        worker.wait_ready()
        methods = ["off", "ngram", "suffix", "draft", "hybrid", "eagle", "hybrid-eagle"]
        http = Http(worker.port)

        def client(seed: int) -> None:
            requests = client_requests(seed, methods)
            try:
                chat, body = next(requests)
                while True:
                    if seed == 0 and len(answers) == 2:  # a client that hangs up mid-answer
                        conn, resp = http.open("POST", "/v1/chat/completions",
                                               {**body, "stream": True})
                        resp.readline()
                        conn.close()
                    reply = http.request("POST", "/v1/chat/completions", body)
                    if reply.status != 200:
                        failures.append(f"{reply.status}: {reply.text}")
                        return
                    done = reply.json()
                    answers.append((chat, body["max_tokens"], done["anve"]["token_ids"]))
                    chat, body = requests.send(done["choices"][0]["message"]["content"])
            except StopIteration:
                return

        clients = [threading.Thread(target=client, args=(seed,)) for seed in range(2)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()
    assert not failures
    assert len(answers) == 8
    for messages, max_tokens, token_ids in answers:
        assert tuple(token_ids) == references(messages).token_ids[:max_tokens], messages
