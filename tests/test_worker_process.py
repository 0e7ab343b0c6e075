"""The real worker process on tiny models, driven by the official ``openai`` client and raw HTTP.

One worker serves the whole module (target: the tiny Llama; draft: an identical copy
in another folder, so draft tokens are accepted). Its greedy answer to PROMPT never
ends early. A test that needs an answer still running while it acts holds it
(:class:`tests.worker_process.Hold`): the answer sends its first chunks and then waits
for the test, however fast the machine. Tests that change the global setting restore
it. No timing is asserted; ``/health``'s latency while generating is a ``perf`` test.
"""

import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from engine.cpu import kernels
from tests.conftest import LIGHT
from tests.tiny import save_tiny
from tests.worker_process import Hold, Http, WorkerProcess, link_light_cache, start_worker

PROMPT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "def add(a, b): the quick brown fox"}
]
N = 24  # answer tokens in most tests
CONTEXT = 4096
LONG = 400  # answer tokens of a held answer: more than any hold lets through
BATCH = 2  # answers the worker decodes together (--max-batch)
PERF_LONG = 4000  # answer tokens generated (unheld) while /health's latency is measured
ISSUE_FIELDS = {
    "method", "enabled", "passes", "drafted", "accepted", "acceptance_rate",
    "mean_accepted_length", "accepted_per_position", "tokens_per_second",
    "time_to_first_token_s",
}


@pytest.fixture(scope="module")
def hold(tmp_path_factory: pytest.TempPathFactory) -> Hold:
    return Hold(tmp_path_factory.mktemp("hold") / "hold")


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory, hold: Hold) -> Iterator[WorkerProcess]:
    tmp = tmp_path_factory.mktemp("worker")
    # The tiny Llama of tests.tiny with room for LONG answers; the draft is an identical copy.
    target = save_tiny(tmp / "tiny-llama", max_positions=CONTEXT)
    draft = save_tiny(tmp / "tiny-draft", max_positions=CONTEXT)
    args = ["--profile", "light", "--target", str(target), "--draft", str(draft),
            "--method", "draft", "--data-dir", str(tmp / "data"), "--max-batch", str(BATCH)]
    with start_worker(args, tmp, hold) as proc:
        proc.wait_ready()
        yield proc


@pytest.fixture(scope="module")
def client(worker: WorkerProcess) -> OpenAI:
    return OpenAI(base_url=f"{worker.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(worker: WorkerProcess) -> Http:
    return Http(worker.port)


@pytest.fixture(scope="module")
def reference(client: OpenAI) -> str:
    """The greedy answer without speculation."""
    return ask(client, N, speculation={"method": "off"})["text"]


def ask(client: OpenAI, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy non-streamed answer: its text, finish reason and speculation object."""
    resp = client.chat.completions.create(
        model="tiny-llama", messages=PROMPT, max_tokens=max_tokens, temperature=0,
        extra_body=extra,
    )
    return {"text": resp.choices[0].message.content, "finish": resp.choices[0].finish_reason,
            "usage": resp.usage, **(resp.model_extra or {})}


def stream(client: OpenAI, max_tokens: int, **extra: Any) -> tuple[str, list[Any]]:
    chunks = list(client.chat.completions.create(
        model="tiny-llama", messages=PROMPT, max_tokens=max_tokens, temperature=0,
        stream=True, extra_body=extra,
    ))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def health(http: Http) -> Any:
    return http.get("/health").json()


def metric(http: Http, series: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def until(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def put_setting(http: Http, **body: Any) -> Any:
    resp = http.request("PUT", "/v1/speculation", body)
    assert resp.status == 200, resp.text
    return resp.json()


@pytest.fixture
def restore_setting(http: Http) -> Iterator[None]:
    before = http.get("/v1/speculation").json()
    yield
    keep = ("enabled", "method", "num_draft_tokens", "load_threshold")
    put_setting(http, **{k: before[k] for k in keep})


# --- the openai client --------------------------------------------------------------------


def test_openai_client_gets_answers_and_speculation(client: OpenAI, reference: str) -> None:
    assert [m.id for m in client.models.list()] == ["tiny-llama", "tiny-draft"]
    # a fixed draft length: adaptive, a draft as dear as the target (its copy) is not used
    answer = ask(client, N, speculation={"num_draft_tokens": 3})
    assert (answer["text"], answer["finish"]) == (reference, "length")
    assert answer["usage"].completion_tokens == N
    spec = answer["speculation"]
    assert set(spec) >= ISSUE_FIELDS
    assert spec["method"] == "draft" and spec["enabled"] and spec["accepted"] > 0
    again = ask(client, N)["usage"]  # the same prompt: all but its last token are cached
    assert again.prompt_tokens_details is not None
    assert again.prompt_tokens_details.cached_tokens == again.prompt_tokens - 1
    assert "".join(text for text, _ in answer["anve"]["pieces"]) == reference
    assert len(answer["anve"]["token_ids"]) == N

    text, chunks = stream(client, N, speculation={"num_draft_tokens": 3})
    assert text == reference
    pieces = [p for c in chunks for p in (c.model_extra or {}).get("anve", {}).get("pieces", [])]
    assert "".join(p[0] for p in pieces) == reference
    assert any(from_draft for _, from_draft in pieces)
    streamed = [(c.model_extra or {}).get("anve", {}) for c in chunks]
    assert sum(a.get("accepted", 0) for a in streamed) <= sum(a.get("drafted", 0) for a in streamed)
    assert sum(a.get("drafted", 0) for a in streamed) > 0
    final = chunks[-1]
    assert final.choices[0].finish_reason == "length"
    assert final.usage is not None and final.usage.completion_tokens == N
    assert set((final.model_extra or {})["speculation"]) >= ISSUE_FIELDS
    assert (final.model_extra or {})["anve"]["token_ids"] == answer["anve"]["token_ids"]


def test_a_long_prompt_streams_its_reading_to_the_openai_client(client: OpenAI) -> None:
    document = [{"role": "user", "content": "the quick brown fox jumps " * 80}]
    chunks = list(client.chat.completions.create(
        model="tiny-llama", messages=document, max_tokens=4, temperature=0, stream=True,  # type: ignore[arg-type]
    ))
    reading = [(c.model_extra or {}).get("anve", {}).get("prompt_progress") for c in chunks]
    reading = [r for r in reading if r is not None]
    total = reading[0]["total"]
    assert total > 256 and reading[0]["read"] == 0 and reading[-1] == {"read": total,
                                                                       "total": total}
    assert [r["read"] for r in reading] == sorted(r["read"] for r in reading)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    whole = client.chat.completions.create(
        model="tiny-llama", messages=document, max_tokens=4, temperature=0,  # type: ignore[arg-type]
    )
    assert text == whole.choices[0].message.content  # the progress chunks carry no text


def test_the_demos_cold_runs_start_from_equal_cache_states(
    client: OpenAI, reference: str
) -> None:
    ask(client, N)  # the office asked this before: a warm run finds it cached
    warm = ask(client, N, speculation={"method": "draft"})["usage"]
    assert warm.prompt_tokens_details is not None
    assert warm.prompt_tokens_details.cached_tokens == warm.prompt_tokens - 1
    runs = [ask(client, N, speculation={"method": m}, anve={"cache": "cold"})
            for m in ("off", "draft", "suffix")]
    for run in runs:
        assert run["text"] == reference
        assert run["anve"]["cache"] == "cold"
        assert run["usage"].prompt_tokens_details.cached_tokens == 0
        spec = run["speculation"]
        assert spec["total_s"] >= spec["time_to_first_token_s"] > 0
    after = ask(client, N)["usage"]  # the office's cache was left as it was
    assert after.prompt_tokens_details.cached_tokens == after.prompt_tokens - 1


@pytest.mark.parametrize(
    ("method", "k"),
    [("off", 3), ("ngram", 3), ("suffix", 3), ("draft", 3), ("draft", "adaptive")],
)
def test_greedy_answers_are_identical_with_every_method(
    client: OpenAI, http: Http, reference: str, method: str, k: int | str
) -> None:
    if k == "adaptive" and not http.get("/v1/speculation").json()["adaptive_available"]:
        pytest.skip("this engine has no adaptive draft length")
    answer = ask(client, N, speculation={"method": method, "num_draft_tokens": k})
    assert answer["text"] == reference
    assert answer["speculation"]["method"] == method
    assert answer["speculation"]["enabled"] == (method != "off")


def test_live_switch_leaves_the_running_answer_alone(
    client: OpenAI, http: Http, hold: Hold, restore_setting: None
) -> None:
    put_setting(http, method="draft", enabled=True)
    full = ask(client, 3 * N, speculation={"method": "off"})["text"]
    with hold.after(1):
        chunks = client.chat.completions.create(
            model="tiny-llama", messages=PROMPT, max_tokens=3 * N, temperature=0,
            stream=True,
        )
        first = next(c for c in chunks if c.choices and c.choices[0].delta.content)
        put_setting(http, method="ngram")  # while the answer above is held mid-stream
    rest = list(chunks)
    text = (first.choices[0].delta.content or "") + "".join(
        c.choices[0].delta.content or "" for c in rest if c.choices
    )
    assert text == full
    assert (rest[-1].model_extra or {})["speculation"]["method"] == "draft"
    assert ask(client, 8)["speculation"]["method"] == "ngram"


def test_four_concurrent_clients_all_get_complete_answers(
    client: OpenAI, reference: str
) -> None:
    def one(i: int) -> str:
        return stream(client, N)[0] if i % 2 else ask(client, N)["text"]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, range(4)))
    assert answers == [reference] * 4


# --- load, disconnects and latency ---------------------------------------------------------


class LongStream:
    """A long streamed answer read by hand, so the test decides when to hang up."""

    def __init__(self, http: Http, max_tokens: int = LONG, **extra: Any) -> None:
        body = {"messages": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                **extra}
        self.conn, self.response = http.open("POST", "/v1/chat/completions", body)

    def first_content(self) -> str:
        while line := self.response.readline().decode():
            if '"content": "' in line and '"role"' not in line:
                return line
        raise AssertionError("the stream ended without content")

    def hang_up(self) -> None:
        self.response.close()
        self.conn.close()


def test_a_disconnect_mid_stream_cancels_and_frees_the_queue(
    client: OpenAI, http: Http, hold: Hold
) -> None:
    series = 'anve_requests_total{finish_reason="cancelled"}'
    cancelled = metric(http, series)
    with hold.after(1):  # the answer cannot end but by the hang-up
        long = LongStream(http, speculation={"method": "off"})
        long.first_content()
        long.hang_up()
        until(lambda: metric(http, series) == cancelled + 1)
    until(lambda: health(http)["queue"] == {"waiting": 0, "running": 0})
    assert ask(client, 4)["finish"] == "length"  # the queue moved on


def test_speculation_switches_off_under_load_and_back_on(
    client: OpenAI, http: Http, hold: Hold, restore_setting: None
) -> None:
    put_setting(http, enabled=True, method="draft", load_threshold=1)
    with ThreadPoolExecutor(2) as pool, hold.after(1):  # on failure: released, then joined
        busy = [LongStream(http, speculation={"method": "off"}) for _ in range(BATCH)]
        for stream in busy:  # every slot holds an answer that cannot end
            stream.first_content()
        until(lambda: health(http)["queue"] == {"waiting": 0, "running": BATCH})
        second = pool.submit(ask, client, 4)  # would wait alone: load 1, not above 1
        until(lambda: health(http)["queue"]["waiting"] == 1)
        third = pool.submit(ask, client, 4)  # would be the second waiting: load 2
        until(lambda: health(http)["queue"]["waiting"] == 2)
        assert health(http)["speculation_load_off"] is True
        for stream in busy:
            stream.hang_up()
        hold.release()
        kept, dropped = second.result()["speculation"], third.result()["speculation"]
    assert kept["enabled"] and kept["method"] == "draft"
    assert not dropped["enabled"] and dropped["disabled_reason"] == "load"
    until(lambda: health(http)["queue"] == {"waiting": 0, "running": 0})
    assert health(http)["speculation_load_off"] is False
    assert ask(client, 4)["speculation"]["enabled"]
    assert metric(http, "anve_spec_load_off_requests_total") >= 1


def test_health_answers_while_an_answer_runs(http: Http, hold: Hold) -> None:
    with hold.after(1):
        busy = LongStream(http, speculation={"method": "off"})
        busy.first_content()
        for _ in range(3):
            assert health(http)["queue"] == {"waiting": 0, "running": 1}
        busy.hang_up()
    until(lambda: health(http)["queue"]["running"] == 0)


@pytest.mark.perf
def test_health_answers_quickly_while_generating(http: Http) -> None:
    busy = LongStream(http, PERF_LONG, speculation={"method": "off"})
    busy.first_content()
    times = []
    for _ in range(10):
        start = time.perf_counter()
        assert health(http)["queue"]["running"] == 1
        times.append(time.perf_counter() - start)
    busy.hang_up()
    print(f"/health while generating: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms")
    assert statistics.median(times) < 0.25  # the issue asks for 100 ms; shared CI CPUs vary


# --- bad input -------------------------------------------------------------------------------


BAD_REQUESTS = [
    ("malformed JSON", {"raw": b'{"messages": [}'}, 400, "body"),
    ("not an object", {"body": ["messages"]}, 400, "body"),
    ("missing messages", {"body": {"max_tokens": 3}}, 400, "messages"),
    ("messages not a list", {"body": {"messages": "hello"}}, 400, "messages"),
    ("unknown role", {"body": {"messages": [{"role": "bot", "content": "x"}]}}, 400, "messages"),
    ("temperature type", {"body": {"messages": PROMPT, "temperature": "hot"}}, 400,
     "temperature"),
    ("max_tokens type", {"body": {"messages": PROMPT, "max_tokens": "5"}}, 400, "max_tokens"),
    ("stream type", {"body": {"messages": PROMPT, "stream": "yes"}}, 400, "stream"),
    ("stop type", {"body": {"messages": PROMPT, "stop": 7}}, 400, "stop"),
    ("unloaded method", {"body": {"messages": PROMPT, "speculation": {"method": "eagle"}}},
     400, "speculation"),
    ("over-long prompt", {"body": {"messages": [{"role": "user", "content": "fox " * CONTEXT}]}},
     400, None),
    ("oversize body", {"raw": b"x" * (3 << 20)}, 413, None),
]


@pytest.mark.parametrize(("name", "request_kwargs", "status", "param"), BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_requests_get_4xx_in_openai_shape(
    http: Http, name: str, request_kwargs: dict[str, Any], status: int,
    param: str | None,
) -> None:
    resp = http.request("POST", "/v1/chat/completions", **request_kwargs)
    assert resp.status == status, resp.text
    error = resp.json()["error"]
    assert error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param
    if name == "over-long prompt":
        assert error["code"] == "context_length_exceeded"
    assert health(http)["status"] == "ready"


@pytest.mark.parametrize(
    "body", [{"method": "magic"}, {"method": "eagle"}, {"num_draft_tokens": 0},
             {"load_threshold": -1}, {"enabled": "no"}, {"colour": "green"}],
)
def test_bad_settings_get_400_saying_what_is_allowed(http: Http, body: Any) -> None:
    def setting() -> dict[str, Any]:
        """The setting without ``auto``, the live report beside it: the worker's background
        calibration may finish between two reads and change that report."""
        return {k: v for k, v in http.get("/v1/speculation").json().items() if k != "auto"}

    before = setting()
    resp = http.request("PUT", "/v1/speculation", body)
    assert resp.status == 400
    assert resp.json()["error"]["message"]
    assert setting() == before


@pytest.mark.model
def test_health_names_the_kernel_variant_and_forward_plan_a_worker_was_forced_to_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What /health reports is what the worker process chose: force the baseline, read it
    back, kernels and the target's forward plan alike (the best variant this CPU runs is
    chosen otherwise). The light model runs on our kernels: a native plan."""
    if (why := kernels.why_not("avx2")) is not None or not kernels.available():
        pytest.skip(why or "the native kernels do not run here")
    monkeypatch.setenv("ANVE_KERNELS", "avx2")
    link_light_cache(tmp_path / "data" / "models")  # loads, as the plan is the point here
    args = ["--profile", "light", "--target", LIGHT, "--method", "off",
            "--data-dir", str(tmp_path / "data")]
    with start_worker(args, tmp_path) as proc:
        health = proc.wait_ready()
    report, plan = health["kernels"], health["plans"]["target"]
    assert report["variant"] == "avx2" and report["forced"] is True
    assert report["rows_per_pass"] == 8
    assert plan["backend"] == "native" and plan["variant"] == "avx2"
    assert plan["rows_per_pass"] == 8 and plan["row_invariant"] is True
    assert sum(plan["formats"].values()) == 30 * 7 and "draft" not in health["plans"]
