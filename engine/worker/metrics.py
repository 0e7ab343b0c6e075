"""Prometheus metrics of one worker, in a registry of its own.

Contract: :class:`Metrics` owns a private ``CollectorRegistry`` (so several workers in
one test process never clash) and is safe to update from any thread. Counters count
finished requests, tokens and speculation (the same counters vLLM exports: passes,
draft tokens, accepted tokens, accepted tokens per position); gauges report the queue
and each loaded model's weight memory; histograms time the first token and the event
loop's lag. Nothing here sees text.
"""

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from engine.protocol import SpeculationStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


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

    def render(self) -> bytes:
        return generate_latest(self.registry)
