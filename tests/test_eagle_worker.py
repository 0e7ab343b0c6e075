"""The worker API offers and serves ``eagle`` when the engine's target has a head."""

import asyncio
from pathlib import Path

from engine.heads.files import save_head
from engine.spec.session import ChatEngine
from tests.test_eagle import head_info, random_head
from tests.test_worker_app import USER, serving, until
from tests.tiny import tiny_loaded


def test_worker_accepts_eagle_when_a_head_is_loaded(tmp_path: Path) -> None:
    loaded = tiny_loaded("tiny-a", scale=4.0)
    path = save_head(random_head(loaded.model), head_info(loaded.model, "tiny-a"),
                     tmp_path / "h.safetensors")
    with_head, without = ChatEngine(loaded, head=path), ChatEngine(tiny_loaded("tiny-b"))
    body = {"messages": USER, "max_tokens": 6, "speculation": {"method": "eagle"}}

    async def scenario() -> None:
        async with serving(lambda progress: with_head) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            spec = await (await client.get("/v1/speculation")).json()
            assert "eagle" in spec["available_methods"]
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["speculation"]["method"] == "eagle"
        async with serving(lambda progress: without) as (client, worker):
            await until(lambda: worker.scheduler.status.state == "ready")
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status == 400

    asyncio.run(scenario())
