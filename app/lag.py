"""Event-loop lag: how late the loop wakes from short naps. No Qt here.

Contract: :class:`LagMeter` runs as an asyncio task on the app's loop, napping
``interval`` seconds at a time and recording how much later than asked it woke.
:meth:`LagMeter.reset` starts a new window; :meth:`LagMeter.summary` gives the count,
the 95th percentile and the maximum in milliseconds.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LagSummary:
    samples: int
    p95_ms: float
    max_ms: float

    def __str__(self) -> str:
        return f"{self.samples} samples, p95 {self.p95_ms:.1f} ms, max {self.max_ms:.1f} ms"


class LagMeter:
    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.interval)
            self.samples.append(max(0.0, loop.time() - before - self.interval))

    def reset(self) -> None:
        self.samples = []

    def summary(self) -> LagSummary:
        if not self.samples:
            return LagSummary(0, 0.0, 0.0)
        ordered = sorted(self.samples)
        p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
        return LagSummary(len(ordered), p95 * 1000, ordered[-1] * 1000)
