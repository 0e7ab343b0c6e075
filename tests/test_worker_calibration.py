"""The worker calibrates its engine in the background, giving way to answers, and
reports what ``auto`` chooses: in-process, over real HTTP, with a fake engine."""

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

from tests.test_worker_app import USER, FakeEngine, ready, serving, until


class CalibratingEngine(FakeEngine):
    """A fake engine whose calibration is three slices; the first waits until the test
    releases it, so an answer can arrive mid-calibration. ``log`` is the order of events."""

    method = "auto"
    methods = ["auto", "off", "ngram", "suffix"]  # noqa: RUF012 (the fake's class table)

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.in_first_slice, self.release = threading.Event(), threading.Event()
        self.calibrated = False

    def calibrate(self, cache: str | None) -> Iterator[None]:
        self.log.append(f"cache {cache}")
        for i in range(3):
            self.log.append(f"slice {i}")
            if i == 0:
                self.in_first_slice.set()
                self.release.wait()
            yield
        self.calibrated = True

    def generate(self, messages: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.log.append("answer")
        return super().generate(messages, *args, **kwargs)

    def speculation_report(self) -> dict[str, Any]:
        chosen = "ngram" if self.calibrated else "ngram (not measured yet)"
        return {"overall": {"method": "ngram", "reason": chosen, "predictions": []}}


def test_calibration_gives_way_to_an_answer_and_is_then_reported() -> None:
    engine = CalibratingEngine()

    async def scenario() -> None:
        async with serving(ready(engine)) as (client, worker):
            try:
                await until(engine.in_first_slice.is_set)
                body = await (await client.get("/v1/speculation")).json()
                assert body["method"] == "auto" and "auto" in body["available_methods"]
                assert body["auto"]["calibrating"] is True
                answer = asyncio.ensure_future(client.post(
                    "/v1/chat/completions", json={"messages": USER, "max_tokens": 2}))
                await until(lambda: worker.scheduler.waiting == 1)
            finally:
                engine.release.set()
            assert (await (await answer).json())["choices"][0]["message"]["content"]
            await until(lambda: not worker.scheduler.calibrating)
            body = await (await client.get("/v1/speculation")).json()
            assert body["auto"] == {"overall": {"method": "ngram", "reason": "ngram",
                                                "predictions": []}, "calibrating": False}

    asyncio.run(scenario())
    assert engine.log == ["cache None", "slice 0", "answer", "slice 1", "slice 2"]


def test_an_engine_without_calibration_reports_nothing_to_choose() -> None:
    async def scenario() -> None:
        async with serving(ready(FakeEngine())) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            body = await (await client.get("/v1/speculation")).json()
            assert body["auto"] == {} and body["method"] == "ngram"

    asyncio.run(scenario())
