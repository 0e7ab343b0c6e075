"""The desktop app attached to servers that are not our worker (pytest-qt, offscreen).

* A real llama.cpp server on loopback (``python -m llama_cpp.server`` from
  ``llama-cpp-python[server]``, serving the light model's GGUF behind an API key): a
  wrong token is refused with a clear message; with the right one a message streams
  in, and the panel shows what that server reports (tokens, speed, first token) and
  says which speculation figures it does not report.
* llama.cpp's ``llama-server`` surface (:class:`tests.foreign_support.LlamaServerLike`):
  a wrong key is caught although its open routes answer; each answer's ``timings`` give
  the acceptance rate, and the panel says tokens per pass and per-position acceptance
  are not reported.
* vLLM's HTTP surface (:class:`tests.foreign_support.VllmLike`: its routes, stream and
  ``/metrics`` counters as vLLM registers them; vLLM itself needs a GPU): the panel
  shows acceptance, tokens per pass and per-position acceptance from the counters read
  around each answer, says when other requests ran meanwhile, and shows no figure but
  a note when the counters were reset. The admin section names the engine and its
  speculation controls are read-only.
* An unreachable URL, a wrong token and a web server that is not OpenAI-compatible:
  each a clear message in the window while the event loop keeps running, and the
  local worker can be chosen again.
"""

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import qasync
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.application import AnveApp
from app.client import AnswerResult
from app.engines import ANVE, LLAMA_CPP, OPENAI, RESET_NOTE, SHARED_NOTE, VLLM
from app.launcher import WorkerCommand
from app.paths import DATABASE_NAME
from app.store import COMPLETE, Store
from tests.app_support import finish, open_app, qasync_loop
from tests.foreign_support import (
    LlamaCppServer,
    LlamaServerLike,
    NotOpenAI,
    VllmLike,
    free_port,
    light_gguf,
)
from tests.tiny import save_tiny

WAIT_MS = 120_000
PASSPHRASE = "correct horse battery"


@pytest.fixture
def loop(qapp: QApplication) -> Iterator[qasync.QEventLoop]:
    with qasync_loop(qapp) as event_loop:
        yield event_loop


def unlock_admin(app: AnveApp, qtbot: QtBot) -> None:
    app.window.show_page("admin")
    with qtbot.waitSignal(app.admin.unlocked, timeout=WAIT_MS):
        app.window.admin_page.unlock_with(PASSPHRASE)


def ask(app: AnveApp, qtbot: QtBot, text: str, max_tokens: int = 24) -> None:
    app.window.show_page("chat")
    app.chat.set_settings(replace(app.chat.settings, temperature=0.0, max_tokens=max_tokens))
    with qtbot.waitSignal(app.chat.answer_completed, timeout=WAIT_MS):
        app.window.chat_page.composer.set_text(text)
        app.window.chat_page.composer.submit()


def banner_text(app: AnveApp) -> str:
    banner = app.window.banner
    return banner.text.text() if banner.isVisibleTo(app.window) else ""


def screenshot(app: AnveApp, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("ANVE_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    assert app.window.grab().save(str(path))
    print(f"\nscreenshot: {path}")
    return path


# --- a real llama.cpp server ------------------------------------------------------------------


def require_llama_cpp_server() -> None:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"llama-cpp-python[server] is not importable ({exc}); `bash setup.sh "
                    "test` installs it")


@pytest.mark.foreign_server
@pytest.mark.model
def test_a_real_llama_cpp_server_streams_and_the_panel_says_what_it_does_not_report(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    require_llama_cpp_server()
    with LlamaCppServer(light_gguf(), "office-key", tmp_path / "llama.log") as server:
        server.wait_ready()
        app = open_app(qtbot, tmp_path / "data", worker_url=server.url, token="not-the-key")
        try:
            qtbot.waitUntil(lambda: app.client.health.state == "refused", timeout=WAIT_MS)
            assert "refused" in banner_text(app) and "401" in banner_text(app)
            assert app.window.chat_page.composer.blocked is not None
            unlock_admin(app, qtbot)
            page = app.window.admin_page
            page.server_url.setText(f"{server.url}/v1")  # as an OpenAI base URL
            page.server_token.setText("office-key")
            page.connect_server()
            qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
            engine = app.client.health.engine
            assert engine is not None and engine.kind == OPENAI and engine.foreign
            assert "llama.cpp Python API" in engine.name  # its own title, from /openapi.json
            assert page.engine.text() == engine.name
            assert page.foreign_note.isVisibleTo(page) and not page.apply_button.isEnabled()
            assert not page.method.isEnabled() and "configured on the server" in (
                page.foreign_note.text())
            assert app.window.panel.worker.text().startswith(f"Server: {server.url}")
            qtbot.waitUntil(lambda: page.models.rowCount() == 1, timeout=WAIT_MS)
            cell = page.models.item(0, 0)
            assert cell is not None and cell.text().endswith(".gguf")

            progressed: list[str] = []
            app.client.answer_progressed.connect(lambda _rid, p: progressed.append(p.text))
            results: list[AnswerResult] = []
            app.client.answer_finished.connect(lambda _rid, result: results.append(result))
            ask(app, qtbot, "Name three colours.", max_tokens=24)
            item = app.chat.messages.items[-1]
            assert item.status == COMPLETE and item.content.strip()
            # chunk by chunk, however fast the server was (the view's updates are throttled)
            assert len(results[-1].timeline) >= 2, "the answer did not stream"
            assert "".join(text for _, text in results[-1].timeline) == item.content
            assert progressed and all(item.content.startswith(text) for text in progressed)
            stats = item.stats
            assert stats is not None and stats.engine == OPENAI
            assert stats.finish_reason in ("stop", "length")  # not cut short by our polling
            assert 0 < stats.completion_tokens <= 24 and stats.tokens_per_second
            panel = app.window.panel
            assert panel.speed.value.text() not in ("–", "n/a")
            assert panel.first_token.value.text().endswith(" s")
            assert panel.acceptance.value.text() == "n/a"
            assert panel.mean_length.value.text() == "n/a"
            assert "does not report the acceptance rate" in panel.acceptance.toolTip()
            assert panel.notes.isVisibleTo(panel) and (
                "Not reported by OpenAI-compatible server: acceptance rate, tokens per pass, "
                "acceptance by draft position." in panel.notes.text())
            assert panel.bars.rates == []
            assert panel.bars.empty_text == "not reported by this server"
            footer = app.window.chat_page.view.widgets[-1].footer.text()
            assert "tok/s" in footer and "other server" in footer and "0%" not in footer
            stored = Store.open(tmp_path / "data" / DATABASE_NAME).setting("worker")
            assert stored == {"url": server.url, "token": "office-key"}
            screenshot(app, tmp_path, "foreign-llama-cpp-python-chat")
            app.window.show_page("admin")
            screenshot(app, tmp_path, "foreign-llama-cpp-python-admin")
        finally:
            finish(qtbot, app.shutdown())
        assert server.proc is not None and server.proc.poll() is None  # attached: left running


# --- vLLM's surface ------------------------------------------------------------------------


def test_vllm_counters_fill_the_panel_and_its_speculation_is_read_only(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    vllm = VllmLike(api_key="vllm-key")
    url = finish(qtbot, vllm.start())
    app = open_app(qtbot, tmp_path, worker_url=url, token="vllm-key")
    try:
        qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
        engine = app.client.health.engine
        assert engine is not None and engine.kind == VLLM and engine.name == "vLLM 0.11.0"
        panel, page = app.window.panel, app.window.admin_page
        assert panel.pill.text() == "vLLM · speculation on"
        assert "3 draft tokens per pass" in panel.method.text()
        unlock_admin(app, qtbot)
        assert page.engine.text() == "vLLM 0.11.0"
        assert "--speculative-config" in page.foreign_note.text()
        assert not any(w.isEnabled() for w in (page.enabled, page.method, page.threshold,
                                                page.length, page.apply_button))
        assert not page.spec_form.isVisibleTo(page) and not page.apply_button.isVisibleTo(page)
        assert page.connect_button.isEnabled() and page.local_button.isEnabled()
        assert "needs an ANVE worker" in (app.window.demo_page.blocked or "")

        ask(app, qtbot, "Explain speculation.")  # alone on the server
        assert panel.acceptance.value.text() == "60%"  # 18 of 30 drafted tokens
        assert panel.mean_length.value.text() == "2.80"  # 1 + 18/10
        assert panel.bars.rates == pytest.approx([0.9, 0.6, 0.3])
        assert not panel.notes.isVisibleTo(panel)
        stats = app.chat.messages.items[-1].stats
        assert stats is not None and (stats.passes, stats.drafted, stats.accepted) == (10, 30, 18)
        assert stats.completion_tokens == 28

        vllm.scenario = "shared"  # a colleague's request runs while we are answered
        ask(app, qtbot, "Again, please.")
        assert SHARED_NOTE in panel.notes.text() and panel.notes.isVisibleTo(panel)
        assert panel.acceptance.value.text() == "45%"  # (18 + 1) / (30 + 12): the server's

        vllm.scenario = "restart"  # counters from zero halfway through the answer
        ask(app, qtbot, "Once more.")
        assert panel.acceptance.value.text() == "n/a" and panel.mean_length.value.text() == "n/a"
        assert RESET_NOTE in panel.notes.text() and "-" not in panel.acceptance.value.text()
        assert "No acceptance rate, tokens per pass" in panel.notes.text()
        assert RESET_NOTE in panel.acceptance.toolTip()
        assert "Not reported by" not in panel.notes.text()  # vLLM does report them
        assert panel.bars.rates == [] and panel.bars.empty_text == "none for this answer"
        assert app.chat.messages.items[-1].status == COMPLETE
        screenshot(app, tmp_path, "foreign-vllm-chat")
        app.window.show_page("admin")
        screenshot(app, tmp_path, "foreign-vllm-admin")
    finally:
        finish(qtbot, app.shutdown())
        finish(qtbot, vllm.stop())


def test_the_server_saved_in_admin_is_used_at_the_next_start(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    vllm = VllmLike(api_key="vllm-key")
    url = finish(qtbot, vllm.start())
    Store.open(tmp_path / DATABASE_NAME).set_setting("worker", {"url": url, "token": "vllm-key"})
    app = open_app(qtbot, tmp_path, command=WorkerCommand("light", ("--no-such-option",)))
    try:  # the launcher must never run: its worker would fail on that option
        qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
        engine = app.client.health.engine
        assert engine is not None and engine.kind == VLLM and app.launcher is None
        assert app.client.health.url == url
        assert app.window.admin_page.server_url.text() == url
    finally:
        finish(qtbot, app.shutdown())
        finish(qtbot, vllm.stop())


def test_llama_server_timings_give_the_acceptance_rate_and_the_rest_is_not_reported(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path
) -> None:
    llama = LlamaServerLike(api_key="office-key")
    url = finish(qtbot, llama.start())
    app = open_app(qtbot, tmp_path, worker_url=url, token="wrong")
    try:  # its /health, /props and /v1/models answer without the key: still refused
        qtbot.waitUntil(lambda: app.client.health.state == "refused", timeout=WAIT_MS)
        assert "HTTP 401: Invalid API Key" in banner_text(app)
        unlock_admin(app, qtbot)
        page = app.window.admin_page
        page.server_url.setText(url)
        page.server_token.setText("office-key")
        page.connect_server()
        qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
        engine = app.client.health.engine
        assert engine is not None and engine.kind == LLAMA_CPP
        assert page.engine.text() == "llama.cpp server b9251-e2b129e1b"
        assert "draft model (-md), 5–16 draft tokens per pass" in page.foreign_note.text()
        assert "-md DRAFT.gguf" in page.foreign_note.text()
        ask(app, qtbot, "Name three colours.")
        panel = app.window.panel
        assert panel.acceptance.value.text() == "85%"  # 17 of 20 drafted tokens
        assert panel.mean_length.value.text() == "n/a"
        assert panel.speed.value.text() == "32.2"  # the server's own decode speed
        assert ("Not reported by llama.cpp server: tokens per pass, acceptance by draft "
                "position.") in panel.notes.text()
        assert panel.bars.empty_text == "not reported by this server"
        stats = app.chat.messages.items[-1].stats
        assert stats is not None and (stats.drafted, stats.accepted) == (20, 17)
        assert stats.completion_tokens == 6 and stats.prompt_tokens == 31
        assert app.chat.messages.items[-1].content == "Red, green and blue."
        screenshot(app, tmp_path, "foreign-llama-server-chat")
    finally:
        finish(qtbot, app.shutdown())
        finish(qtbot, llama.stop())


# --- servers that cannot be used, and back to the local worker ------------------------------------


@pytest.fixture(scope="module")
def tiny_command(tmp_path_factory: pytest.TempPathFactory) -> WorkerCommand:
    tmp = tmp_path_factory.mktemp("foreign-models")
    target = save_tiny(tmp / "tiny-llama", max_positions=1024)
    return WorkerCommand("light", ("--target", str(target), "--data-dir", str(tmp / "data")))


def test_unreachable_wrong_token_and_not_openai_each_say_why_then_the_local_worker(
    loop: qasync.QEventLoop, qtbot: QtBot, tmp_path: Path, tiny_command: WorkerCommand
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    intranet, vllm = NotOpenAI(), VllmLike(api_key="vllm-key")
    intranet_url, vllm_url = finish(qtbot, intranet.start()), finish(qtbot, vllm.start())
    app = open_app(qtbot, tmp_path, worker_url=nobody, command=tiny_command)
    page, composer = app.window.admin_page, app.window.chat_page.composer
    try:
        assert app.launcher is None
        qtbot.waitUntil(lambda: app.client.health.state == "unreachable", timeout=WAIT_MS)
        assert "not answering (connection refused)" in banner_text(app)
        assert composer.blocked is not None and "connection refused" in composer.blocked
        unlock_admin(app, qtbot)
        assert "connection refused" in page.server_status.text()

        app.lag.reset()
        page.server_url.setText(intranet_url)
        page.connect_server()
        qtbot.waitUntil(lambda: app.client.health.state == "incompatible", timeout=WAIT_MS)
        for text in (banner_text(app), page.server_status.text(), composer.blocked or ""):
            assert "not an OpenAI-compatible server: GET /v1/models gave HTTP 404" in text

        page.server_url.setText(vllm_url)
        page.server_token.setText("a-wrong-key")
        page.connect_server()
        qtbot.waitUntil(lambda: app.client.health.state == "refused", timeout=WAIT_MS)
        assert "refused the access token (HTTP 401: Unauthorized)" in banner_text(app)
        assert "Check the access token" in page.server_status.text()
        lag = app.lag.summary()
        assert lag.samples > 0 and lag.max_ms < 1000, lag  # the window never froze

        page.server_url.setText("intranet:8080")
        page.connect_server()
        assert "is not a server address" in page.server_status.text()
        assert app.client.health.state == "refused"  # nothing changed

        page.local_button.click()
        qtbot.waitUntil(lambda: app.client.health.ready, timeout=WAIT_MS)
        assert app.launcher is not None and app.launcher.pid is not None
        engine = app.client.health.engine
        assert engine is not None and engine.kind == ANVE
        assert not banner_text(app) and composer.blocked is None
        qtbot.waitUntil(lambda: page.apply_button.isEnabled(), timeout=WAIT_MS)
        assert not page.foreign_note.isVisibleTo(page) and page.spec_form.isVisibleTo(page)
        ask(app, qtbot, "hello", max_tokens=6)
        assert app.chat.messages.items[-1].status == COMPLETE
        assert Store.open(tmp_path / DATABASE_NAME).setting("worker") is None
    finally:
        finish(qtbot, app.shutdown())
        finish(qtbot, intranet.stop())
        finish(qtbot, vllm.stop())
