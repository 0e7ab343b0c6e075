"""The admin page says what the automatic method runs and why, from the worker's
``auto`` report, and lets an admin force a method instead."""

from pathlib import Path

from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app import theme
from app.application import AnveApp
from app.client import Health
from app.widgets.admin_page import describe_auto, describe_setting
from tests.app_support import finish, qasync_loop

REPORT = {
    "calibrating": False,
    "calibration": {"t1_ms": 25.0, "ratios": {"4": 1.67, "8": 3.21, "16": 6.1},
                    "source": "live"},
    "overall": {"method": "ngram", "reason": "ngram: 1.20× predicted on this machine; "
                "draft model: 0.90×", "kind": None, "predictions": []},
    "kinds": {"summary": {"method": "ngram", "reason": "ngram: 1.45× predicted on this "
                          "machine; draft model: 1.02×"},
              "chat": {"method": "ngram", "reason": "no method predicted faster than plain "
                       "decoding (ngram: 1.00×; draft model: 0.84×); ngram drafts only where "
                       "a pass pays and keeps measuring"}},
}
SETTING = {"enabled": True, "method": "auto", "num_draft_tokens": "adaptive",
           "load_threshold": 2, "available_methods": ["auto", "off", "ngram", "draft"],
           "adaptive_available": True, "auto": REPORT}


def test_the_report_reads_as_lines_per_kind_and_the_machine() -> None:
    lines = describe_auto(REPORT)
    assert lines[0] == ("Automatic runs n-gram lookup: ngram: 1.20× predicted on this "
                        "machine; draft model: 0.90×.")
    assert lines[1].startswith("Summaries: n-gram lookup (ngram: 1.45×")
    assert lines[2].startswith("Chat: n-gram lookup (no method predicted faster")
    assert lines[3] == ("This machine: one decoding step 25.0 ms; verifying 4 tokens costs "
                        "1.67, 8 tokens 3.21, 16 tokens 6.10 steps (kept up to date by "
                        "answers).")
    assert describe_auto({}) == []
    assert describe_auto({**REPORT, "calibrating": True})[-1].startswith("Measuring")
    assert "automatic method" in describe_setting(SETTING)


def test_the_report_names_the_draft_head_in_use() -> None:
    head = {"kind": "EAGLE-3", "file": "qwen.safetensors", "shipped": True,
            "feature_layers": [1, 13], "training_tokens": 250_000, "teacher_forced": True,
            "held_out_acceptance": 0.6, "held_out_chain_accepted": 1.234}
    lines = describe_auto({**REPORT, "head": head})
    assert lines[3] == ("Draft head: EAGLE-3 (shipped, fusing the target's layers 2, 14 with "
                        "its last, trained on 250,000 tokens); 1.23 drafts accepted per "
                        "4-token chain on held-out text.")
    old = {"kind": "EAGLE-1", "shipped": False, "feature_layers": []}
    assert "Draft head: EAGLE-1 (learned in this office)." in describe_auto({**REPORT,
                                                                           "head": old})
    assert not any(line.startswith("Draft head") for line in describe_auto(
        {**REPORT, "head": None}))


def test_the_page_shows_the_choice_and_an_admin_can_force_a_method(
        qapp: QApplication, qtbot: QtBot, tmp_path: Path) -> None:
    theme.apply(qapp, "light")
    with qasync_loop(qapp):
        anve = AnveApp(tmp_path, worker_url="http://127.0.0.1:9")  # no worker is needed
        window, page = anve.window, anve.window.admin_page
        qtbot.addWidget(window)
        window.resize(1100, 900)
        window.show()
        window.show_health(Health("ready", 1.0, "ready", url="http://127.0.0.1:9"))
        window.show_page("admin")
        page.stack.setCurrentIndex(1)
        page.show_setting(SETTING)
        assert page.method.currentData() == "auto"
        assert page.method.currentText().startswith("Automatic")
        assert page.auto_note.isVisibleTo(page) and "1.20×" in page.auto_note.text()
        for _ in range(3):
            qapp.processEvents()
        window.grab().save(str(tmp_path / "admin-auto.png"))
        page.choose_method("draft")
        assert page.changes() == {"method": "draft"}
        page.show_setting({**SETTING, "auto": {}})
        assert not page.auto_note.isVisibleTo(page)
        finish(qtbot, anve.shutdown())


def test_a_hidden_page_stops_asking_the_worker(
        qapp: QApplication, qtbot: QtBot, tmp_path: Path) -> None:
    """A closed window's page must not poll: the app's event loop may be gone (a leaked
    page's timer once fired in a later test with no loop)."""
    with qasync_loop(qapp):
        anve = AnveApp(tmp_path, worker_url="http://127.0.0.1:9")
        window, page = anve.window, anve.window.admin_page
        qtbot.addWidget(window)
        asked: list[int] = []
        anve.client.fetch_speculation = lambda: asked.append(1)  # type: ignore[method-assign]
        anve.admin.is_unlocked = True
        window.show()
        window.show_page("admin")
        page.stack.setCurrentIndex(1)
        page.show_auto({**REPORT, "calibrating": True})
        assert page.auto_poll.isActive()
        page._poll_auto()
        assert asked == [1]
        window.hide()
        assert not page.auto_poll.isActive()
        page._poll_auto()
        assert asked == [1]
        window.show()
        assert page.auto_poll.isActive()
        finish(qtbot, anve.shutdown())
