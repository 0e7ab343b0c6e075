"""The Admin page: passphrase gate, then the worker's speculation setting and models.

Contract: locked, it asks for the passphrase (or, the first time, to set one) through
:class:`AdminController`. Unlocked, it shows the setting the worker reports and edits
it; "Apply" sends only what differs, and the confirmation line shows what the worker
answered. It also lists the loaded models with their memory and the worker's address,
and names the engine behind it (our worker, vLLM, llama.cpp's server or another
OpenAI-compatible server). On a foreign engine the speculation controls are read-only
and say where that engine's speculation is configured. The "Server" card attaches the
app to any OpenAI-compatible server (address and access token) or back to the local
worker; a server that cannot be used says why in the window. The "Learn from this
office" card starts, follows and stops the worker's training of its draft head on the
office's own past chats (only on our worker).

Method "Automatic" (``auto``, our worker's default) lets the worker run the method its
calibration of this machine predicts fastest for each kind of question; under the form
the page shows what it picks and why, per kind (:func:`describe_auto`), from the
``auto`` object of ``GET /v1/speculation``. While the worker is still calibrating, the
page asks again every ``AUTO_POLL_S`` seconds. Choosing a method by name forces it.
"""

from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QCheckBox,
    QComboBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSpinBox,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.answer import method_name
from app.client import Health
from app.controllers.admin import AdminController
from app.engines import EngineInfo
from app.passphrase import MIN_LENGTH
from app.theme import pad_spin_box

METHOD_CHOICES = ("auto", "draft", "ngram", "suffix", "hybrid", "eagle", "hybrid-eagle")
RIGHT = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
AUTO_POLL_S = 2.0
KIND_NAMES = {"code": "Code", "editing": "Code editing", "summary": "Summaries",
              "chat": "Chat"}


def choice_label(method: str) -> str:
    """A method as the form's list names it."""
    if method == "auto":
        return "Automatic (fastest on this machine)"
    return method_name(method).capitalize()


def describe_auto(report: dict[str, Any]) -> list[str]:
    """Lines saying what ``auto`` runs and why: overall, then per kind of question, then
    the calibration it rests on (empty when the worker reports nothing)."""
    if not isinstance(report, dict) or not report:
        return []
    lines = []
    overall = report.get("overall") or {}
    if overall.get("method"):
        lines.append(f"Automatic runs {method_name(overall['method'])}: {overall.get('reason')}.")
    for kind, choice in (report.get("kinds") or {}).items():
        if isinstance(choice, dict) and choice.get("method"):
            lines.append(f"{KIND_NAMES.get(kind, kind)}: {method_name(choice['method'])} "
                         f"({choice.get('reason')})")
    head = report.get("head")
    if isinstance(head, dict) and head.get("kind"):
        lines.append(describe_head(head))
    calibration = report.get("calibration")
    if report.get("calibrating"):
        lines.append("Measuring this machine's costs in the background…")
    elif isinstance(calibration, dict):
        ratios = calibration.get("ratios") or {}
        source = {"cache": "measured at an earlier start", "live": "kept up to date by answers",
                  }.get(str(calibration.get("source")), "measured at start")
        lines.append(f"This machine: one decoding step {calibration.get('t1_ms', 0):.1f} ms; "
                     f"verifying 4 tokens costs {ratios.get('4', 0):.2f}, 8 tokens "
                     f"{ratios.get('8', 0):.2f}, 16 tokens {ratios.get('16', 0):.2f} steps "
                     f"({source}).")
    return lines


def describe_head(head: dict[str, Any]) -> str:
    """One line on the draft head the worker uses (``speculation_report()["head"]``)."""
    where = "shipped" if head.get("shipped") else "learned in this office"
    layers = head.get("feature_layers") or []
    fused = (f", fusing the target's layers {', '.join(str(int(n) + 1) for n in layers)} "
             "with its last" if layers else "")
    tokens = head.get("training_tokens")
    trained = f", trained on {int(tokens):,} tokens" if isinstance(tokens, int | float) else ""
    score = head.get("held_out_chain_accepted")
    accepted = (f"; {score:.2f} drafts accepted per 4-token chain on held-out text"
                if isinstance(score, int | float) else "")
    return f"Draft head: {head['kind']} ({where}{fused}{trained}){accepted}."


def describe_setting(setting: dict[str, Any]) -> str:
    k = setting.get("num_draft_tokens")
    drafts = "adaptive draft length" if k == "adaptive" else f"{k} draft tokens"
    state = "on" if setting.get("enabled") else "off"
    method = setting.get("method")
    named = "automatic method" if method == "auto" else method_name(method)
    return (f"speculation {state} · {named} · {drafts} · "
            f"switch off above {setting.get('load_threshold')} waiting")


def describe_learning(status: dict[str, Any]) -> tuple[str, str]:
    """The learning card's line and its style (``""``, ``"Ok"`` or ``"Error"``)."""
    state, message = status.get("state"), str(status.get("message") or "")
    new, old = status.get("held_out_acceptance"), status.get("previous")
    scores = ""
    if isinstance(new, int | float):
        scores = f" Drafts accepted on held-out chats: {new:.0%}"
        scores += f" (the previous head: {old:.0%})." if isinstance(old, int | float) else "."
    if state == "running":
        chats = int(status.get("conversations") or 0)
        return f"Learning from {chats} chats at low priority… {message}", ""
    if state == "installed":
        return f"Done: the new draft head is in use.{scores}", "Ok"
    if state == "kept":
        return f"Done: the current head drafts as well or better, so it stays.{scores}", ""
    if state == "stopped":
        return "Stopped; the current head stays.", ""
    if state == "failed":
        return f"Learning failed: {message}", "Error"
    return ("Not run since the worker started. Chats stay in the office: they go only to "
            "this appliance's worker."), ""


def megabytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def page_heading(title: str, sub: str) -> QWidget:
    box = QWidget()
    layout = QVBoxLayout(box)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.setSpacing(2)
    heading = QLabel(title)
    heading.setObjectName("PageTitle")
    note = QLabel(sub)
    note.setObjectName("PageSub")
    note.setWordWrap(True)
    layout.addWidget(heading)
    layout.addWidget(note)
    return box


def card_frame(title: str) -> tuple[QFrame, QVBoxLayout]:
    frame = QFrame()
    frame.setObjectName("Card")
    layout = QVBoxLayout(frame)
    layout.setContentsMargins(18, 14, 18, 16)
    layout.setSpacing(10)
    heading = QLabel(title)
    heading.setObjectName("CardTitle")
    layout.addWidget(heading)
    return frame, layout


def muted_note(text: str) -> QLabel:
    """A wrapping explanation in the muted colour, under a card's title."""
    note = QLabel(text)
    note.setObjectName("Muted")
    note.setWordWrap(True)
    return note


def model_cells(model: dict[str, Any]) -> list[str]:
    """Model, role, context, memory of one ``/v1/models`` entry (ours, vLLM's, llama.cpp's)."""
    info = model.get("anve") or {}
    meta = model.get("meta")
    meta = meta if isinstance(meta, dict) else {}
    role = str(info.get("role") or f"served by {model.get('owned_by') or 'the server'}")
    context = info.get("max_context") or model.get("max_model_len") or meta.get("n_ctx_train")
    memory = info.get("memory_bytes") or meta.get("size")
    return [str(model.get("id")), role, f"{int(context):,}" if context else "–",
            megabytes(int(memory)) if memory else "–"]


class AdminPage(QWidget):
    def __init__(self, controller: AdminController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Page")
        self.controller = controller
        self.setting: dict[str, Any] = {}
        self.applying = False  # an Apply was sent and the worker has not answered yet
        self.calibrating = False  # the worker's last report said it is still calibrating
        self.auto_poll = QTimer(self)
        self.auto_poll.setSingleShot(True)
        self.auto_poll.setInterval(int(AUTO_POLL_S * 1000))
        self.auto_poll.timeout.connect(self._poll_auto)
        self.stack = QStackedWidget()
        self.stack.addWidget(self._gate())
        self.stack.addWidget(self._controls())
        layout = QVBoxLayout(self)
        layout.setContentsMargins(32, 24, 32, 24)
        layout.setSpacing(18)
        layout.addWidget(page_heading(
            "Admin", "Speculative decoding for everyone who uses this appliance. Changes apply "
            "to the next answer."))
        layout.addWidget(self.stack, 1)
        controller.state_loaded.connect(self._state_loaded)
        controller.unlocked.connect(self._unlocked)
        controller.locked.connect(lambda: self.stack.setCurrentIndex(0))
        controller.refused.connect(self._refused)
        controller.client.speculation_received.connect(self.show_setting)
        controller.client.speculation_failed.connect(self._apply_failed)
        controller.client.models_received.connect(self.show_models)
        controller.server_loaded.connect(self.server_url.setText)
        controller.server_refused.connect(lambda why: self._server_status(why, "Error"))
        controller.server_chosen.connect(self._server_chosen)
        controller.learning_changed.connect(self.show_learning)
        controller.learning_refused.connect(lambda why: self._learning_status(why, "Error"))

    # --- the gate ---------------------------------------------------------------------------

    def _gate(self) -> QWidget:
        frame, layout = card_frame("Admin controls are locked")
        frame.setMaximumWidth(460)
        self.gate_text = QLabel("Enter the admin passphrase.")
        self.gate_text.setWordWrap(True)
        self.passphrase = QLineEdit()
        self.passphrase.setEchoMode(QLineEdit.EchoMode.Password)
        self.passphrase.setPlaceholderText("Passphrase")
        self.confirmation = QLineEdit()
        self.confirmation.setEchoMode(QLineEdit.EchoMode.Password)
        self.confirmation.setPlaceholderText("The same passphrase again")
        self.gate_error = QLabel()
        self.gate_error.setObjectName("Error")
        self.gate_error.hide()
        self.gate_button = QPushButton("Unlock")
        self.gate_button.setObjectName("Primary")
        self.gate_button.clicked.connect(self._gate_clicked)
        self.passphrase.returnPressed.connect(self._gate_clicked)
        self.confirmation.returnPressed.connect(self._gate_clicked)
        for widget in (self.gate_text, self.passphrase, self.confirmation, self.gate_error):
            layout.addWidget(widget)
        layout.addWidget(self.gate_button, 0, Qt.AlignmentFlag.AlignRight)
        holder = QWidget()
        outer = QVBoxLayout(holder)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(frame)
        outer.addStretch(1)
        self._state_loaded(False)
        return holder

    def _state_loaded(self, has_passphrase: bool) -> None:
        self.confirmation.setVisible(not has_passphrase)
        if has_passphrase:
            self.gate_text.setText("Enter the admin passphrase to change how ANVE drafts.")
            self.gate_button.setText("Unlock")
        else:
            self.gate_text.setText(f"No admin passphrase is set yet. Choose one (at least "
                                   f"{MIN_LENGTH} characters); it is stored only as a salted "
                                   "hash.")
            self.gate_button.setText("Set passphrase")

    def _gate_clicked(self) -> None:
        self.gate_error.hide()
        self.gate_button.setEnabled(False)
        if self.controller.has_passphrase:
            self.controller.unlock(self.passphrase.text())
        else:
            self.controller.set_passphrase(self.passphrase.text(), self.confirmation.text())

    def unlock_with(self, passphrase: str, confirmation: str | None = None) -> None:
        """Fill the gate and press its button (tests, keyboard users)."""
        self.passphrase.setText(passphrase)
        self.confirmation.setText(passphrase if confirmation is None else confirmation)
        self._gate_clicked()

    def _refused(self, why: str) -> None:
        self.gate_button.setEnabled(True)
        self.gate_error.setText(why)
        self.gate_error.show()
        self.passphrase.selectAll()

    def _unlocked(self) -> None:
        self.gate_button.setEnabled(True)
        self.passphrase.clear()
        self.confirmation.clear()
        self.gate_error.hide()
        self._state_loaded(True)
        self.stack.setCurrentIndex(1)

    # --- the controls ---------------------------------------------------------------------

    def _controls(self) -> QWidget:
        holder = QWidget()
        holder.setObjectName("Page")
        column = QVBoxLayout(holder)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(16)
        cards = (self._speculation_card(), self._learning_card(), self._worker_card(),
                 self._server_card())
        for card in cards:
            card.setMaximumWidth(760)
            column.addWidget(card)
        column.addStretch(1)
        scroll = QScrollArea()
        scroll.setObjectName("AdminScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(holder)
        return scroll

    def _learning_card(self) -> QWidget:
        frame, layout = card_frame("Learn from this office")
        note = muted_note("Train the EAGLE draft head on this office's past chats, in the "
                          "background at low priority. The new head replaces the current one "
                          "only if it drafts better on chats it did not train on; answers stay "
                          "the same.")
        self.learning_status = QLabel("")
        self.learning_status.setWordWrap(True)
        self.learn_button = QPushButton("Learn from past chats")
        self.learn_button.setObjectName("Primary")
        self.learn_button.clicked.connect(lambda: self.learn())
        self.stop_learning_button = QPushButton("Stop")
        self.stop_learning_button.clicked.connect(self.controller.stop_learning)
        self.stop_learning_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.stop_learning_button)
        buttons.addStretch()
        buttons.addWidget(self.learn_button)
        layout.addWidget(note)
        layout.addWidget(self.learning_status)
        layout.addLayout(buttons)
        self.learning_card = frame
        self.show_learning({"state": "idle"})
        return frame

    def learn(self, tuning: dict[str, int] | None = None) -> None:
        self._learning_status("Reading the chat history…", "")
        self.learn_button.setEnabled(False)
        if not self.controller.learn_from_office(tuning):
            self.learn_button.setEnabled(True)

    def show_learning(self, status: dict[str, Any]) -> None:
        running = status.get("state") == "running"
        self.learn_button.setEnabled(not running)
        self.stop_learning_button.setEnabled(running)
        self._learning_status(*describe_learning(status))

    def _learning_status(self, text: str, kind: str) -> None:
        if kind == "Error":
            self.learn_button.setEnabled(True)
        self.learning_status.setObjectName(kind)
        self.learning_status.setText(text)
        self.learning_status.style().polish(self.learning_status)

    def _speculation_card(self) -> QWidget:
        frame, layout = card_frame("Speculative decoding")
        self.enabled = QCheckBox("Draft tokens ahead and verify them (lossless)")
        self.method = QComboBox()
        for method in METHOD_CHOICES:
            self.method.addItem(choice_label(method), method)
        draft_row = self._draft_length(frame)
        self.threshold = pad_spin_box(QSpinBox())
        self.threshold.setRange(0, 1024)
        self.threshold.setSuffix(" waiting requests")
        form = QFormLayout()
        form.setVerticalSpacing(10)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        form.addRow("Method", self.method)
        form.addRow("Draft length", draft_row)
        form.addRow("Switch off above", self.threshold)
        apply = QPushButton("Apply")
        apply.setObjectName("Primary")
        apply.clicked.connect(self.apply)
        lock = QPushButton("Lock")
        lock.clicked.connect(self.controller.lock)
        self.apply_button = apply
        self.apply_status = QLabel("")
        self.apply_status.setWordWrap(True)
        self.auto_note = muted_note("")
        self.auto_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.auto_note.hide()
        self.foreign_note = QLabel("")
        self.foreign_note.setObjectName("Muted")
        self.foreign_note.setWordWrap(True)
        self.foreign_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.foreign_note.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(lock)
        buttons.addStretch()
        buttons.addWidget(apply)
        self.spec_form = QWidget()  # hidden on a foreign engine: its setting is not ours
        form_column = QVBoxLayout(self.spec_form)
        form_column.setContentsMargins(0, 0, 0, 0)
        form_column.addWidget(self.enabled)
        form_column.addLayout(form)
        layout.addWidget(self.foreign_note)
        layout.addWidget(self.spec_form)
        layout.addWidget(self.auto_note)
        layout.addWidget(self.apply_status)
        layout.addLayout(buttons)
        return frame

    def _draft_length(self, owner: QWidget) -> QHBoxLayout:
        """Adaptive, or fixed at 1-16 tokens."""
        self.adaptive = QRadioButton("Adaptive")
        self.adaptive.setToolTip("The engine picks the draft length per pass from measured costs")
        self.fixed = QRadioButton("Fixed")
        self.length = pad_spin_box(QSpinBox())
        self.length.setRange(1, 16)
        self.length.setSuffix(" tokens")
        group = QButtonGroup(owner)
        group.addButton(self.adaptive)
        group.addButton(self.fixed)
        self.fixed.toggled.connect(self.length.setEnabled)
        row = QHBoxLayout()
        row.setSpacing(8)
        row.addWidget(self.adaptive)
        row.addSpacing(16)  # the two choices apart; the length belongs to "Fixed"
        row.addWidget(self.fixed)
        row.addWidget(self.length)
        row.addStretch()
        return row

    def _worker_card(self) -> QWidget:
        frame, layout = card_frame("Worker")
        self.address = QLabel("–")
        self.address.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.state = QLabel("–")
        self.state.setWordWrap(True)
        self.engine = QLabel("–")
        self.engine.setWordWrap(True)
        self.engine_speculation = QLabel("–")
        self.engine_speculation.setWordWrap(True)
        self.kernels = QLabel("–")
        self.kernels.setWordWrap(True)
        self.forward = QLabel("–")
        self.forward.setWordWrap(True)
        self.batch = QLabel("–")
        self.batch.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Address", self.address)
        form.addRow("Engine", self.engine)
        form.addRow("Speculation", self.engine_speculation)
        form.addRow("CPU kernels", self.kernels)
        form.addRow("Forward pass", self.forward)
        form.addRow("Answers together", self.batch)
        form.addRow("State", self.state)
        self.models = QTableWidget(0, 4)
        self.models.setHorizontalHeaderLabels(["Model", "Role", "Context", "Memory"])
        self.models.verticalHeader().hide()
        self.models.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.models.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.models.setShowGrid(False)
        header = self.models.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        self.models.verticalHeader().setDefaultSectionSize(30)
        for column in (1, 2, 3):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        layout.addLayout(form)
        layout.addWidget(self.models)
        self._fit_table()
        return frame

    def _server_card(self) -> QWidget:
        frame, layout = card_frame("Server")
        note = muted_note("Attach this desktop to a model server in the office: an ANVE "
                          "worker, vLLM, llama.cpp's llama-server or any OpenAI-compatible "
                          "server. The choice is remembered.")
        self.server_url = QLineEdit()
        self.server_url.setPlaceholderText("http://gpu-server:8000")
        self.server_token = QLineEdit()
        self.server_token.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_token.setPlaceholderText("Access token (if the server needs one)")
        form = QFormLayout()
        form.addRow("Address", self.server_url)
        form.addRow("Token", self.server_token)
        self.connect_button = QPushButton("Connect")
        self.connect_button.setObjectName("Primary")
        self.connect_button.clicked.connect(self.connect_server)
        self.server_url.returnPressed.connect(self.connect_server)
        self.local_button = QPushButton("Use the local worker")
        self.local_button.clicked.connect(lambda: self.controller.use_local_worker())
        self.server_status = QLabel("")
        self.server_status.setWordWrap(True)
        self.server_status.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.local_button)
        buttons.addStretch()
        buttons.addWidget(self.connect_button)
        layout.addWidget(note)
        layout.addLayout(form)
        layout.addWidget(self.server_status)
        layout.addLayout(buttons)
        return frame

    def connect_server(self) -> None:
        self.controller.choose_server(self.server_url.text(), self.server_token.text())

    def _server_chosen(self, url: object, _token: object) -> None:
        if url is None:
            self.server_url.clear()
            self._server_status("Starting the local worker…", "")
        else:
            self._server_status(f"Connecting to {url}…", "")
        self.server_token.clear()

    def _server_status(self, text: str, kind: str) -> None:
        self.server_status.setObjectName(kind)
        self.server_status.setText(text)
        self.server_status.setVisible(bool(text))
        self.server_status.style().polish(self.server_status)

    def _fit_table(self) -> None:
        rows = max(1, self.models.rowCount())
        height = self.models.horizontalHeader().sizeHint().height() + rows * 30 + 6
        self.models.setFixedHeight(height)

    # --- data -------------------------------------------------------------------------------

    def show_setting(self, setting: dict[str, Any]) -> None:
        previous, self.setting = self.setting, dict(setting)
        self.enabled.setChecked(bool(setting.get("enabled")))
        available = set(setting.get("available_methods") or ())
        for i in range(self.method.count()):
            item = self.method.model().item(i)  # type: ignore[attr-defined]
            item.setEnabled(self.method.itemData(i) in available)
        index = self.method.findData(setting.get("method"))
        if index >= 0:
            self.method.setCurrentIndex(index)
        k = setting.get("num_draft_tokens")
        self.adaptive.setEnabled(bool(setting.get("adaptive_available")))
        self.adaptive.setChecked(k == "adaptive")
        self.fixed.setChecked(k != "adaptive")
        self.length.setValue(k if isinstance(k, int) else 4)
        self.length.setEnabled(k != "adaptive")
        self.threshold.setValue(int(setting.get("load_threshold") or 0))
        self.show_auto(setting.get("auto") or {})
        if previous and self.applying:
            self._status(f"The worker confirms: {describe_setting(setting)}.", "Ok")
        elif not previous:
            self._status("", "")
        self.applying = False

    def show_auto(self, report: dict[str, Any]) -> None:
        """What the automatic method picks and why; ask again while it is calibrating."""
        lines = describe_auto(report)
        self.auto_note.setText("\n".join(lines))
        self.auto_note.setVisible(bool(lines) and self.spec_form.isVisibleTo(self))
        self.calibrating = isinstance(report, dict) and bool(report.get("calibrating"))
        if self.calibrating:
            self.auto_poll.start()

    def _poll_auto(self) -> None:
        # Only while the page is on screen: a closed window's page (the app shut down, its
        # event loop gone) must not ask the client for anything.
        if self.isVisible() and self.controller.is_unlocked and not self.applying:
            self.controller.client.fetch_speculation()

    def hideEvent(self, event: QHideEvent) -> None:  # noqa: N802
        self.auto_poll.stop()
        super().hideEvent(event)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802
        super().showEvent(event)
        if self.calibrating:  # hidden while the worker calibrated: ask again soon
            self.auto_poll.start()

    def changes(self) -> dict[str, Any]:
        """What the form asks for that differs from the worker's setting."""
        wanted: dict[str, Any] = {
            "enabled": self.enabled.isChecked(),
            "method": self.method.currentData(),
            "num_draft_tokens": "adaptive" if self.adaptive.isChecked() else self.length.value(),
            "load_threshold": self.threshold.value(),
        }
        return {k: v for k, v in wanted.items() if self.setting.get(k) != v}

    def choose_method(self, method: str) -> None:
        self.method.setCurrentIndex(self.method.findData(method))

    def apply(self) -> None:
        changes = self.changes()
        if not changes:
            self._status("Nothing to change: the worker already runs this setting.", "")
            return
        self._status("Sending to the worker…", "")
        self.applying = self.controller.apply(changes)

    def _apply_failed(self, why: str) -> None:
        self.applying = False
        self._status(f"The worker refused: {why}", "Error")

    def _status(self, text: str, kind: str) -> None:
        self.apply_status.setObjectName(kind)
        self.apply_status.setText(text)
        self.apply_status.setVisible(bool(text))
        self.apply_status.style().polish(self.apply_status)

    def show_models(self, models: list[dict[str, Any]]) -> None:
        self.models.setRowCount(len(models))
        for row, model in enumerate(models):
            cells = model_cells(model)
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if column >= 2:
                    item.setTextAlignment(RIGHT)
                self.models.setItem(row, column, item)
        self._fit_table()

    def show_health(self, health: Health) -> None:
        self.address.setText(health.url or "–")
        self.state.setText(health.state if health.ready else health.blocked_reason() or "–")
        self.kernels.setText(health.kernels or "–")
        self.forward.setText(health.forward or "–")
        self.batch.setText(health.batch or "–")
        self.show_engine(health.engine)
        if health.state in ("refused", "incompatible", "unreachable"):
            self._server_status(health.blocked_reason() or health.message, "Error")
        elif health.ready:
            where = health.engine.name if health.engine else "the worker"
            self._server_status(f"Connected to {where} at {health.url}." if health.url else "",
                                "Ok")

    def show_engine(self, engine: EngineInfo | None) -> None:
        """Name the engine; on a foreign one, make the speculation controls read-only."""
        foreign = engine is not None and engine.foreign
        self.engine.setText(engine.name if engine else "–")
        if engine is None:
            speculation = "–"
        elif foreign:
            speculation = engine.speculation or "not known"
        else:
            speculation = "the setting above"
        self.engine_speculation.setText(speculation)
        for control in (self.enabled, self.method, self.adaptive, self.fixed, self.length,
                        self.threshold, self.apply_button):
            control.setEnabled(not foreign)
        if foreign and engine is not None:
            self.foreign_note.setText(f"{engine.name}: {engine.speculation}. "
                                      f"{engine.configured_where}")
        elif not foreign and self.setting:
            self.length.setEnabled(self.fixed.isChecked())
            self.adaptive.setEnabled(bool(self.setting.get("adaptive_available")))
        self.foreign_note.setVisible(foreign)
        self.learning_card.setVisible(not foreign)
        self.spec_form.setVisible(not foreign)
        self.auto_note.setVisible(not foreign and bool(self.auto_note.text()))
        self.apply_button.setVisible(not foreign)
