"""Foreign servers for the app's tests: vLLM's counters, a vLLM-shaped server, a server
that is not OpenAI-compatible, and a real llama.cpp server (``llama_cpp.server``).

* :class:`VllmMetrics` registers vLLM's counters with ``prometheus_client`` exactly as
  ``vllm/v1/spec_decode/metrics.py`` and ``vllm/v1/metrics/loggers.py`` do (names,
  help, ``model_name``/``engine`` labels, ``position`` per draft position, every
  engine's series created at start) and renders them with the same library.
* :class:`VllmLike` serves vLLM's routes on the test's event loop: ``/health`` (empty
  200), ``/version``, ``/metrics``, ``/v1/models`` and streamed ``/v1/chat/completions``
  behind ``--api-key`` (401 ``{"error": "Unauthorized"}`` on ``/v1`` routes). It counts
  each answer's drafts into the metrics, and can add another user's request or restart
  (fresh counters) while an answer streams. vLLM itself needs a GPU; this is how its
  counters and stream look.
* :class:`LlamaServerLike` serves ``llama-server``'s documented routes and stream (its
  ``/props`` and the ``timings`` with draft counts; the C++ server is not on PyPI).
* :class:`LlamaCppServer` runs ``python -m llama_cpp.server`` on loopback serving a GGUF.
"""

import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

VLLM_MODEL = "Qwen/Qwen2.5-Coder-7B-Instruct"


class VllmMetrics:
    """vLLM's counters, registered and rendered as vLLM does (k draft tokens per step)."""

    def __init__(self, k: int = 3, engines: tuple[str, ...] = ("0",)) -> None:
        self.registry = r = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                              labels, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens",
                                    "Number of draft tokens.", labels, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens",
                                "Number of accepted tokens.", labels, registry=r)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                               "Accepted tokens per draft position.", [*labels, "position"],
                               registry=r)
        self.generation = Counter("vllm:generation_tokens",
                                  "Number of generation tokens processed.", labels, registry=r)
        self.success = Counter("vllm:request_success",
                               "Count of successfully processed requests.",
                               [*labels, "finished_reason"], registry=r)
        self.running = Gauge("vllm:num_requests_running",
                             "Number of requests in model execution batches.", labels,
                             registry=r)
        self.k, self.engines = k, engines
        for engine in engines:  # vLLM creates every engine's series at start
            for counter in (self.drafts, self.draft_tokens, self.accepted, self.generation):
                counter.labels(VLLM_MODEL, engine)
            for reason in ("stop", "length", "abort"):
                self.success.labels(VLLM_MODEL, engine, reason)
            self.running.labels(VLLM_MODEL, engine).set(0)
            for pos in range(k):
                self.per_pos.labels(VLLM_MODEL, engine, str(pos))

    def step(self, accepted: int, engine: str = "0") -> None:
        """One verification step: k tokens drafted, the first ``accepted`` of them kept."""
        labels = (VLLM_MODEL, engine)
        self.drafts.labels(*labels).inc()
        self.draft_tokens.labels(*labels).inc(self.k)
        self.accepted.labels(*labels).inc(accepted)
        for pos in range(accepted):
            self.per_pos.labels(*labels, str(pos)).inc()
        self.generation.labels(*labels).inc(accepted + 1)

    def answer(self, drafts: int, accepted_per_draft: list[int], tokens: int,
               engine: str = "0", requests: int = 1) -> None:
        """Count a whole answer (``tokens`` generated over ``drafts`` steps)."""
        assert len(accepted_per_draft) == drafts
        labels = (VLLM_MODEL, engine)
        self.drafts.labels(*labels).inc(drafts)
        self.draft_tokens.labels(*labels).inc(drafts * self.k)
        self.accepted.labels(*labels).inc(sum(accepted_per_draft))
        for n in accepted_per_draft:
            for pos in range(n):
                self.per_pos.labels(*labels, str(pos)).inc()
        self.generation.labels(*labels).inc(tokens)
        self.success.labels(*labels, "stop").inc(requests)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


ANSWER_STEPS = [3, 3, 2, 0, 1, 3, 2, 2, 1, 1]  # accepted per step: 18 of 30, per pos 9/6/3


class VllmLike:
    """vLLM's HTTP surface on the current event loop (see the module docstring)."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.metrics = VllmMetrics()
        self.scenario = "alone"  # "shared" (a colleague's request too) or "restart"
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        self.url = await serve(self._runner)
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        wanted = f"Bearer {self.api_key}"
        if self.api_key and request.path.startswith("/v1") and (
            request.headers.get("Authorization") != wanted
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, _request: web.Request) -> web.Response:
        return web.json_response({"version": "0.11.0"})

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(text=self.metrics.text(),
                            content_type="text/plain", charset="utf-8")

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": VLLM_MODEL, "object": "model", "created": 1764400000, "owned_by": "vllm",
             "root": VLLM_MODEL, "parent": None, "max_model_len": 32768}]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("model") != VLLM_MODEL:
            return web.json_response({"object": "error", "message": f"The model "
                                      f"`{body.get('model')}` does not exist.",
                                      "type": "NotFoundError", "code": 404}, status=404)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1764400001,
                "model": VLLM_MODEL}
        await _event(response, {**base, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}]})
        tokens = 0
        for i, accepted in enumerate(ANSWER_STEPS):
            if i == 5 and self.scenario == "restart":
                self.metrics = VllmMetrics()  # the server restarted: counters from zero
            if i == 5 and self.scenario == "shared":
                self.metrics.answer(drafts=4, accepted_per_draft=[0, 0, 1, 0], tokens=5)
            self.metrics.step(accepted)
            tokens += accepted + 1
            text = " ".join(["word"] * (accepted + 1)) + " "
            await _event(response, {**base, "choices": [
                {"index": 0, "delta": {"content": text}, "logprobs": None,
                 "finish_reason": None}]})
            await asyncio.sleep(0.01)
        self.metrics.success.labels(VLLM_MODEL, "0", "stop").inc()
        await _event(response, {**base, "choices": [
            {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "stop",
             "stop_reason": None}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            await _event(response, {**base, "choices": [], "usage": {
                "prompt_tokens": 21, "total_tokens": 21 + tokens, "completion_tokens": tokens}})
        await response.write(b"data: [DONE]\n\n")
        return response


LLAMA_PROPS = {
    "default_generation_settings": {
        "id": 0, "id_task": -1, "n_ctx": 8192, "speculative": True, "is_processing": False,
        "params": {"n_predict": -1, "temperature": 0.8, "speculative.n_max": 16,
                   "speculative.n_min": 5, "speculative.p_min": 0.9, "timings_per_token": False},
    },
    "total_slots": 4, "model_path": "/models/qwen2.5-coder-7b-instruct-q4_k_m.gguf",
    "chat_template": "...", "build_info": "b9251-e2b129e1b",
}
LLAMA_MODEL = "qwen2.5-coder-7b-instruct-q4_k_m.gguf"


class LlamaServerLike:
    """``llama-server``'s HTTP surface as documented: ``/health``, ``/props`` and
    ``/v1/models`` open to all; other routes need ``--api-key``; a streamed answer ends
    with ``timings`` (``draft_n``, ``draft_n_accepted``) in its last chunks."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/health", self._health)
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        return await serve(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        public = request.path in ("/health", "/props", "/v1/models", "/models")
        if not public and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"code": 401, "message": "Invalid API Key",
                                                "type": "authentication_error"}}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _props(self, _request: web.Request) -> web.Response:
        return web.json_response(LLAMA_PROPS)

    async def _models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": LLAMA_MODEL, "object": "model", "created": 1735142223, "owned_by": "llamacpp",
             "meta": {"n_ctx_train": 32768, "size": 4683073952}}]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": list(range(len(str(body.get("content", "")))))})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"created": 1779349198, "id": "chatcmpl-nFCx", "model": LLAMA_MODEL,
                "system_fingerprint": "b9251-e2b129e1b", "object": "chat.completion.chunk"}
        words = ["Red", ",", " green", " and", " blue", "."]
        for word in words:
            await _event(response, {**base, "choices": [
                {"finish_reason": None, "index": 0, "delta": {"content": word}}]})
            await asyncio.sleep(0.01)
        timings = {"cache_n": 0, "prompt_n": 31, "prompt_ms": 128.3,
                   "prompt_per_token_ms": 4.14, "prompt_per_second": 241.6, "predicted_n": 6,
                   "predicted_ms": 186.1, "predicted_per_token_ms": 31.0,
                   "predicted_per_second": 32.24, "draft_n": 20, "draft_n_accepted": 17}
        await _event(response, {**base, "choices": [
            {"finish_reason": "stop", "index": 0, "delta": {}}], "timings": timings})
        if (body.get("stream_options") or {}).get("include_usage"):
            await _event(response, {**base, "choices": [], "usage": {
                "completion_tokens": 6, "prompt_tokens": 31, "total_tokens": 37},
                "timings": timings})
        await response.write(b"data: [DONE]\n\n")
        return response


class NotOpenAI:
    """A web server that is not a model server: an HTML page on every route."""

    def __init__(self) -> None:
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()

        async def page(_request: web.Request) -> web.Response:
            return web.Response(text="<html><body><h1>Intranet</h1></body></html>",
                                status=404, content_type="text/html")

        app.router.add_route("*", "/{tail:.*}", page)
        self._runner = web.AppRunner(app)
        return await serve(self._runner)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def serve(runner: web.AppRunner) -> str:
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def light_gguf() -> Path:
    """The light model's GGUF (SmolLM2 135M Q4_1), verified by size and SHA-256."""
    from engine.models.registry import check_file, get_spec, locate_part

    spec = get_spec("smollm2-135m-instruct")
    path = locate_part(spec.parts[0], spec)
    check_file(path, spec)
    return path


class LlamaCppServer:
    """``python -m llama_cpp.server`` serving ``model`` on loopback with an API key."""

    def __init__(self, model: Path, api_key: str, log_path: Path) -> None:
        self.model, self.api_key, self.log_path = model, api_key, log_path
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "LlamaCppServer":
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(self.model),
                   "--host", "127.0.0.1", "--port", str(self.port), "--api_key", self.api_key,
                   "--n_ctx", "2048", "--n_threads", "2"]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Until ``/v1/models`` answers (with the key), or fail with the server's log."""
        deadline = time.monotonic() + timeout_s
        request = urllib.request.Request(f"{self.url}/v1/models",
                                         headers={"Authorization": f"Bearer {self.api_key}"})
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"llama_cpp.server not ready in {timeout_s} s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:]

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
