"""Screenshots of the chat window, the speculation panel and the demo view, light and dark.

No worker is needed: the history holds realistic conversations and a demo run, and
the worker's state is shown through the views' own methods. The PNGs go to
``ANVE_SCREENSHOT_DIR`` or a temporary folder; the test prints where.
"""

import os
import random
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app import theme
from app.answer import AnswerStats
from app.application import AnveApp
from app.client import Health
from app.paths import DATABASE_NAME
from app.store import COMPLETE, INTERRUPTED, ChatSettings, Message, Store
from tests.app_support import finish, qasync_loop

QUESTION = "Write a Python function that parses durations like '1h30m' or '45m' into seconds."
ANSWER = """Here is a small, strict parser. It accepts hours, minutes and seconds in that \
order and rejects anything else:

```python
import re

_PART = re.compile(r"(\\d+)([hms])")


def parse_duration(text: str) -> int:
    \"\"\"Return the number of seconds in '1h30m', '45m' or '2h'.\"\"\"
    seconds, pos = 0, 0
    for match in _PART.finditer(text):
        if match.start() != pos:
            raise ValueError(f"unexpected text in {text!r}")
        value, unit = int(match.group(1)), match.group(2)
        seconds += value * {"h": 3600, "m": 60, "s": 1}[unit]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"not a duration: {text!r}")
    return seconds
```

- `parse_duration("1h30m")` returns **5400**.
- `parse_duration("45m")` returns **2700**.
- An empty string or `"1x"` raises `ValueError`.
"""
FOLLOW_UP = "Can it also accept spaces, like '1h 30m'?"
SHORT_ANSWER = ("Yes: strip the spaces first with `text.replace(\" \", \"\")`, or allow "
                "optional whitespace in the pattern with `\\s*` between the parts.")
MODELS = [
    {"id": "qwen2.5-coder-1.5b-instruct", "anve": {"role": "target", "max_context": 32768,
                                                   "memory_bytes": 2_059_603_456}},
    {"id": "qwen2.5-coder-0.5b-instruct", "anve": {"role": "draft", "max_context": 32768,
                                                   "memory_bytes": 851_916_544}},
]
LEARNING = {"state": "installed", "conversations": 212, "held_out_acceptance": 0.58,
            "previous": 0.41}
SETTING = {"enabled": True, "method": "draft", "num_draft_tokens": "adaptive",
           "load_threshold": 2, "available_methods": ["off", "ngram", "suffix", "draft"],
           "adaptive_available": True, "max_num_draft_tokens": 16}


def stats(tps: float, rate: float, tokens: int, per_position: tuple[int, ...]) -> AnswerStats:
    passes = max(1, round(tokens / (1 + sum(per_position) / 100)))
    return AnswerStats(
        method="draft", enabled=True, num_draft_tokens="adaptive", prompt_tokens=48,
        completion_tokens=tokens, passes=passes, drafted=int(passes * 4),
        accepted=int(passes * 4 * rate), acceptance_rate=rate,
        mean_accepted_length=tokens / passes,
        accepted_per_position=tuple(int(passes * p / 100) for p in per_position),
        tokens_per_second=tps, time_to_first_token_s=0.31, finish_reason="stop",
    )


def pieces_for(text: str, seed: int) -> list[list[object]]:
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(3, 18)
        pieces.append([text[i : i + n], rng.random() < 0.68])
        i += n
    return pieces


def fill_history(store: Store) -> int:
    lunch = store.create_conversation("Team lunch ideas for Friday")
    store.add_message(lunch.id, "user", "Suggest three ideas for a team lunch for twelve.")
    store.add_message(lunch.id, "assistant", "1. A pizza workshop…", COMPLETE)
    memo = store.create_conversation("Heating works in building B")
    store.add_message(memo.id, "user", "Summarise the facilities memo for floor three.")
    code = store.create_conversation("Parse durations in Python",
                                     ChatSettings(temperature=0.2, max_tokens=768))
    store.add_message(code.id, "user", QUESTION)
    for text, seed, measured in (
        (ANSWER, 1, stats(27.4, 0.78, 212, (91, 80, 66, 49, 35, 22))),
        (SHORT_ANSWER, 2, replace(stats(24.9, 0.71, 41, (88, 71, 52, 33)),
                                  prompt_tokens=297, cached_tokens=278)),  # a follow-up
    ):
        answer = store.add_message(code.id, "assistant", "", COMPLETE)
        store.update_message(answer.id, text, status=COMPLETE, pieces=pieces_for(text, seed),
                             stats={"measured": measured.to_dict(), "outcome": "complete"})
        if seed == 1:
            store.add_message(code.id, "user", FOLLOW_UP)
    plain = stats(11.8, 0.0, 212, ())
    plain = AnswerStats(method="off", completion_tokens=212, passes=212, tokens_per_second=11.8,
                        time_to_first_token_s=0.68, total_s=0.68 + 211 / 11.8, prompt_tokens=48,
                        finish_reason="stop", cache="cold")
    fast = replace(stats(27.4, 0.78, 212, (91, 80, 66, 49, 35, 22)), cache="cold",
                   time_to_first_token_s=0.71, total_s=0.71 + 211 / 27.4)  # both read the prompt
    words = ANSWER.split(" ")
    timeline_plain = [[0.3 + i / 11.8 * 2, w + " "] for i, w in enumerate(words)]
    timeline_fast = [[0.3 + i / 27.4 * 2, w + " "] for i, w in enumerate(words)]
    store.add_demo_run(QUESTION, "draft",
                       {"text": ANSWER, "stats": plain.to_dict(), "timeline": timeline_plain},
                       {"text": ANSWER, "stats": fast.to_dict(), "timeline": timeline_fast},
                       True, None, 27.4 / 11.8)
    return code.id


@pytest.fixture
def shots_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("ANVE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def app(qapp: QApplication, qtbot: QtBot, tmp_path: Path) -> Iterator[AnveApp]:
    with qasync_loop(qapp):
        store = Store.open(tmp_path / DATABASE_NAME)
        code_id = fill_history(store)
        store.close()
        theme.apply(qapp, "light")
        anve = AnveApp(tmp_path, worker_url="http://127.0.0.1:8765")
        qtbot.addWidget(anve.window)
        anve.window.resize(1320, 820)
        anve.window.show()
        for controller in (anve.chat, anve.demo, anve.admin):
            controller.load()
        anve.chat.open_conversation(code_id)
        qtbot.waitUntil(lambda: len(anve.chat.messages.items) == 4)
        qtbot.waitUntil(lambda: len(anve.demo.runs.items) == 1)
        yield anve
        finish(qtbot, anve.shutdown())


def show_worker(anve: AnveApp) -> None:
    window = anve.window
    window.show_health(Health("ready", 1.0, "ready", models=("qwen2.5-coder-1.5b-instruct",),
                              url="http://127.0.0.1:8765"))
    window.panel.show_setting(SETTING)
    history = [stats(20 + (i * 7) % 9 + i * 0.4, 0.55 + ((i * 13) % 30) / 100, 150, ())
               for i in range(18)]
    anve.answers.reset(history)
    window.panel.show_final(stats(27.4, 0.78, 212, (91, 80, 66, 49, 35, 22)))


def test_screenshots_light_and_dark(app: AnveApp, qapp: QApplication, qtbot: QtBot,
                                    shots_dir: Path) -> None:
    window = app.window
    show_worker(app)
    shots = []
    for scheme in ("light", "dark"):
        theme.apply(qapp, scheme)
        window.refresh_theme()
        window.show_page("chat")
        code = next(c for c in app.chat.conversations.items if c.title.startswith("Parse"))
        app.chat.open_conversation(code.id)
        qtbot.waitUntil(lambda: len(app.chat.messages.items) == 4)
        window.chat_page.colours.setChecked(scheme == "dark")
        qtbot.wait(150)
        shots.append(save(window.grab(), shots_dir / f"chat-{scheme}.png"))
        window.chat_page.open_settings()
        qtbot.wait(50)
        shots.append(save(window.chat_page.popover.grab(), shots_dir / f"settings-{scheme}.png"))
        window.chat_page.popover.hide()
        window.chat_page.view.verticalScrollBar().setValue(0)
        qtbot.wait(50)
        shots.append(save(window.chat_page.grab(), shots_dir / f"chat-top-{scheme}.png"))
        shots.append(save(window.panel.grab(), shots_dir / f"panel-{scheme}.png"))
        window.show_page("demo")
        window.demo_page.show_run(app.demo.runs.items[0])
        qtbot.wait(150)
        shots.append(save(window.grab(), shots_dir / f"demo-{scheme}.png"))
        window.show_page("admin")
        if not app.admin.is_unlocked:
            no_worker = [app.client.speculation_failed, app.client.learning_failed]
            with qtbot.waitSignals(no_worker):  # there is no worker behind the URL
                window.admin_page.unlock_with("correct horse battery")
            window.admin_page.show_learning(LEARNING)
            window.admin_page.show_setting(SETTING)
            window.admin_page.show_models(MODELS)
        qtbot.wait(50)
        shots.append(save(window.grab(), shots_dir / f"admin-{scheme}.png"))
        shots += states(app, qtbot, shots_dir, scheme)
    print(f"\nscreenshots saved in {shots_dir}")
    assert all(path.stat().st_size > 10_000 for path in shots)


def states(app: AnveApp, qtbot: QtBot, shots_dir: Path, scheme: str) -> list[Path]:
    """An answer reading its long prompt, then streaming, then cut at its token limit (with
    messages a rolling window left out); a new chat while the models load."""
    window, model = app.window, app.chat.messages
    window.show_page("chat")
    window.chat_page.colours.setChecked(False)
    model.append(Message(1000, 0, "user", "And in one line?", 0.0))
    model.append(Message(1001, 0, "assistant", "", INTERRUPTED), streaming=True)
    window.chat_page.composer.set_busy(True)
    model.stream(1001, "", [], AnswerStats(estimated=True, prompt_read=512, prompt_to_read=1117))
    qtbot.wait(50)
    reading = save(window.grab(), shots_dir / f"chat-reading-{scheme}.png")
    live = stats(26.1, 0.0, 18, (93, 74, 51))
    model.stream(1001, "Use `sum(int(n) * UNIT[u] for n, u in _PART.findall(text))`, but",
                 [], replace(live, acceptance_rate=None, estimated=True))
    window.panel.begin_answer()
    window.panel.show_live(replace(live, acceptance_rate=None, estimated=True))
    qtbot.wait(400)  # the panel shows live numbers four times a second
    streaming = save(window.grab(), shots_dir / f"chat-streaming-{scheme}.png")
    window.chat_page.composer.set_busy(False)
    window.panel.show_final(live)
    cut = replace(live, completion_tokens=768, finish_reason="length", dropped_messages=6,
                  acceptance_rate=0.71, estimated=False)
    model.finish(1001, "Use `sum(int(n) * UNIT[u] for n, u in _PART.findall(text))`, but "
                 "check first that the whole text was matched, or a typo such as",
                 [], COMPLETE, cut, "6 earlier messages were left out: the conversation no "
                 "longer fits the model's context. Stopped at the 768-token limit.")
    qtbot.wait(50)
    limit = save(window.grab(), shots_dir / f"chat-limit-{scheme}.png")
    model.remove_from(1000)
    window.show_health(Health("loading", 0.42, "converting qwen2.5-coder-1.5b-instruct "
                              "(GGUF to safetensors, once)", url="http://127.0.0.1:8765"))
    app.chat.new_conversation()
    qtbot.wait(100)
    loading = save(window.grab(), shots_dir / f"chat-loading-{scheme}.png")
    show_worker(app)
    return [reading, streaming, limit, loading]


def save(pixmap: object, path: Path) -> Path:
    assert pixmap.save(str(path))  # type: ignore[attr-defined]
    return path
