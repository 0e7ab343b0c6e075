"""The admin's "learn from this office" run through the worker API, on a tiny target.

The run is the real one: ``python -m engine.heads.office`` in a child process on the
conversations the request carried; a better head is installed in the data directory
and swapped into the running engine, which then offers ``eagle``.
"""

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.errors import BadRequestError
from engine.heads.files import find_head, read_info
from engine.spec.session import ChatEngine
from engine.worker.auth import Auth
from engine.worker.learning import HeadLearning, check_conversations, check_tuning
from tests.test_worker_app import USER, FakeEngine, assert_error, ready, serving, until

URL = "/v1/heads/learning"
ADMIN = {"Authorization": "Bearer a-token"}
USER_TOKEN = {"Authorization": "Bearer u-token"}
TUNING = {"steps": 4, "seq_len": 32, "tokens": 1200}
RUN_S = 240.0


def chats(n: int = 12) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Write function {c}."},
             {"role": "assistant", "content": f"def f{c}(a, b):\n    return a + b * {c}\n" * 3}]
            for c in range(n)]


def test_conversations_and_tuning_are_checked() -> None:
    assert len(check_conversations({"conversations": chats(5)})) == 5
    unanswered = [[{"role": "user", "content": "hi"}]] * 9
    with pytest.raises(BadRequestError, match="at least 4"):
        check_conversations({"conversations": chats(2) + unanswered})
    for bad in ({}, {"conversations": "x"}, {"conversations": [[{"role": "bot", "content": ""}]]},
                {"conversations": [[{"role": "user", "content": 3}]]}):
        with pytest.raises(BadRequestError):
            check_conversations(bad)
    assert check_tuning({"steps": 4}) == {"steps": 4}
    for bad in ({"steps": 0}, {"seq_len": True}, {"tokens": "many"}):
        with pytest.raises(BadRequestError):
            check_tuning(bad)


def learning_for(target: Path, data: Path) -> Any:
    return lambda scheduler: HeadLearning(str(target), str(data), scheduler.reload_head)


def test_learning_installs_a_head_and_the_worker_then_drafts_with_it(
    tiny_folder: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    engine = ChatEngine.load(str(tiny_folder), data_dir=data)
    assert "eagle" not in engine.methods and "hybrid-eagle" not in engine.methods

    async def scenario() -> None:
        auth = Auth("u-token", "a-token")
        async with serving(lambda progress: engine, auth=auth,
                           learning=learning_for(tiny_folder, data)) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            idle = await (await client.get(URL, headers=USER_TOKEN)).json()
            assert idle["state"] == "idle"
            body = {"conversations": chats(), **TUNING}
            assert (await client.post(URL, json=body, headers=USER_TOKEN)).status == 403
            few = await client.post(URL, json={"conversations": chats(2)}, headers=ADMIN)
            assert few.status == 400
            assert_error(await few.json(), "invalid_request")
            started = await client.post(URL, json=body, headers=ADMIN)
            assert started.status == 202 and (await started.json())["state"] == "running"
            busy = await client.post(URL, json=body, headers=ADMIN)
            assert busy.status == 409
            assert_error(await busy.json(), "learning_busy")
            assert worker.learning is not None
            await until(lambda: not worker.learning.running, timeout=RUN_S)
            done = await (await client.get(URL, headers=USER_TOKEN)).json()
            assert done["state"] == "installed", done
            assert done["conversations"] == 12 and done["held_out_acceptance"] is not None
            # "installed" means in use, alone and after the lookup
            assert {"eagle", "hybrid-eagle"} <= set(worker.settings.methods)
            for method in ("eagle", "hybrid-eagle"):
                answer = await client.post("/v1/chat/completions", headers=USER_TOKEN, json={
                    "messages": USER, "max_tokens": 4, "speculation": {"method": method}})
                assert answer.status == 200, await answer.text()

    asyncio.run(scenario())
    head = find_head(tiny_folder.name, data)
    assert head is not None and head.parent == data / "heads"
    assert read_info(head).extra["corpus"] == "office history"


def test_a_run_can_be_stopped_and_installs_nothing(tiny_folder: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = ChatEngine.load(str(tiny_folder), data_dir=data)

    async def scenario() -> None:
        async with serving(lambda progress: engine,
                           learning=learning_for(tiny_folder, data)) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            body = {"conversations": chats(), **TUNING, "steps": 2000}
            assert (await client.post(URL, json=body)).status == 202
            stopped = await (await client.delete(URL)).json()
            assert stopped["state"] == "stopped", stopped
            assert (await client.delete(URL)).status == 200  # idle: nothing to stop

    asyncio.run(scenario())
    assert find_head(tiny_folder.name, data) is None


def test_a_worker_without_learning_says_so() -> None:
    async def scenario() -> None:
        async with serving(ready(FakeEngine())) as (client, _worker):
            resp = await client.get(URL)
            assert resp.status == 404
            assert "cannot train" in (await resp.json())["error"]["message"]

    asyncio.run(scenario())


def test_a_failed_run_says_why_and_a_stop_before_the_child_starts_holds(tmp_path: Path) -> None:
    async def scenario() -> None:
        failing = HeadLearning(str(tmp_path / "no-such-model"), str(tmp_path), lambda: None)
        failing.start(chats(), {"steps": 2})
        while failing.running:
            await asyncio.sleep(0.05)
        assert failing.status.state == "failed"
        assert failing.status.message.startswith("unknown model"), failing.status
        stopped = HeadLearning(str(tmp_path / "no-such-model"), str(tmp_path), lambda: None)
        stopped.start(chats(), {"steps": 2})
        await stopped.stop()  # before the child process exists
        assert stopped.status.state == "stopped"

    asyncio.run(scenario())
