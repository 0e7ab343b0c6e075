"""Prometheus metrics of one worker, in a registry of its own.

Contract: :class:`Metrics` owns a private ``CollectorRegistry`` (so several workers in
one test process never clash) and is safe to update from any thread. Counters count
finished requests, tokens and speculation (the same counters vLLM exports: passes,
draft tokens, accepted tokens, accepted tokens per position); gauges report the queue
and each loaded model's weight memory; histograms time the first token and the event
loop's lag. Under continuous batching, ``anve_batch_answers`` says how many answers the
last target pass served, ``anve_batch_answers_per_pass`` counts passes by that number,
``anve_answer_tokens_per_second`` is each finished answer's own speed and
``anve_tokens_per_second`` all answers' tokens together over the last
:data:`RATE_WINDOW_S` seconds. Nothing here sees text.
"""

import threading
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.protocol import SpeculationStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 16)
SPEED_BUCKETS = (1, 2, 5, 10, 15, 20, 30, 40, 60, 100)
RATE_WINDOW_S = 10.0
RECENT_ANSWERS = 16  # finished answers whose speeds /health averages


class Metrics:
    """All the worker's metrics; ``render()`` gives the Prometheus text format."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "anve_requests", "Chat completions finished, by finish reason", ["finish_reason"],
            registry=r,
        )
        self.errors = Counter(
            "anve_request_errors", "Requests answered with an error, by error code", ["code"],
            registry=r,
        )
        self.prompt_tokens = Counter("anve_prompt_tokens", "Prompt tokens processed", registry=r)
        self.completion_tokens = Counter(
            "anve_completion_tokens", "Answer tokens generated", registry=r
        )
        self._speculation_metrics(r)
        self.queue_waiting = Gauge("anve_queue_waiting", "Requests waiting", registry=r)
        self.queue_running = Gauge("anve_queue_running", "Requests generating now", registry=r)
        self.model_memory = Gauge(
            "anve_model_memory_bytes", "Weight memory of each loaded model", ["role", "model"],
            registry=r,
        )
        self.ttft = Histogram(
            "anve_time_to_first_token_seconds", "Time from start to first answer token",
            registry=r,
        )
        self.loop_lag = Histogram(
            "anve_event_loop_lag_seconds", "How late the event loop woke up (50 ms naps)",
            buckets=LAG_BUCKETS, registry=r,
        )
        self._batch_metrics(r)

    def _batch_metrics(self, r: CollectorRegistry) -> None:
        self.batch_answers = Gauge(
            "anve_batch_answers", "Answers the last target pass served together", registry=r
        )
        self.answers_per_pass = Histogram(
            "anve_batch_answers_per_pass", "Target passes by the answers they served",
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.answer_speed = Histogram(
            "anve_answer_tokens_per_second", "Each finished answer's tokens per second "
            "after its first token", buckets=SPEED_BUCKETS, registry=r,
        )
        self.total_speed = Gauge(
            "anve_tokens_per_second", f"Answer tokens per second of all answers together, "
            f"over the last {RATE_WINDOW_S:.0f} s", registry=r,
        )
        self.last_pass_answers = 0
        self.answer_speeds: deque[float] = deque(maxlen=RECENT_ANSWERS)  # tokens/s each
        self._recent: deque[tuple[float, int]] = deque()  # (monotonic time, tokens)
        self._recent_lock = threading.Lock()
        self.total_speed.set_function(self.tokens_per_second)

    def observe_pass(self, answers: int) -> None:
        """A target pass served ``answers`` answers."""
        self.last_pass_answers = answers
        self.batch_answers.set(answers)
        self.answers_per_pass.observe(answers)

    def observe_tokens(self, tokens: int, now: float | None = None) -> None:
        """An answer streamed ``tokens`` more tokens."""
        with self._recent_lock:
            self._recent.append((time.monotonic() if now is None else now, tokens))

    def tokens_per_second(self, now: float | None = None) -> float:
        """All answers' tokens per second over the last :data:`RATE_WINDOW_S` seconds."""
        now = time.monotonic() if now is None else now
        with self._recent_lock:
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()
            return sum(n for _, n in self._recent) / RATE_WINDOW_S

    def _speculation_metrics(self, r: CollectorRegistry) -> None:
        self.passes = Counter(
            "anve_spec_passes", "Target passes after the prompt", ["method"], registry=r
        )
        self.drafted = Counter(
            "anve_spec_draft_tokens", "Draft tokens proposed", ["method"], registry=r
        )
        self.accepted = Counter(
            "anve_spec_accepted_tokens", "Draft tokens accepted", ["method"], registry=r
        )
        self.accepted_per_position = Counter(
            "anve_spec_accepted_tokens_per_pos", "Passes whose i-th draft token was accepted",
            ["method", "position"], registry=r,
        )
        self.auto_off_passes = Counter(
            "anve_spec_auto_off_passes", "Passes the engine ran plain because drafting did not pay",
            ["method"], registry=r,
        )
        self.load_off = Counter(
            "anve_spec_load_off_requests", "Requests run without speculation because of load",
            registry=r,
        )

    def bind_queue(self, waiting: Callable[[], int], running: Callable[[], int]) -> None:
        """Read the queue depth at scrape time."""
        self.queue_waiting.set_function(waiting)
        self.queue_running.set_function(running)

    def observe_completion(self, stats: SpeculationStats, finish_reason: str) -> None:
        self.requests.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(stats.completion_tokens)
        method = stats.method
        self.passes.labels(method).inc(stats.passes)
        self.drafted.labels(method).inc(stats.drafted)
        self.accepted.labels(method).inc(stats.accepted)
        self.auto_off_passes.labels(method).inc(getattr(stats, "auto_off_passes", 0))
        for position, count in enumerate(stats.accepted_per_position):
            self.accepted_per_position.labels(method, str(position)).inc(count)
        if stats.time_to_first_token_s is not None:
            self.ttft.observe(stats.time_to_first_token_s)
        if stats.tokens_per_second is not None:
            self.answer_speed.observe(stats.tokens_per_second)
            self.answer_speeds.append(stats.tokens_per_second)

    def batch_report(self, slots: int, running: int) -> dict[str, object]:
        """What ``/health`` says about answers running together."""
        speeds = list(self.answer_speeds)
        return {"slots": slots, "running": running, "last_pass_answers": self.last_pass_answers,
                "tokens_per_second": self.tokens_per_second(),
                "answer_tokens_per_second": sum(speeds) / len(speeds) if speeds else None}

    def render(self) -> bytes:
        return generate_latest(self.registry)
