"""The chat's application logic: history, sending, streaming into the models, saving.

Contract:

* Widgets call the public methods (``send``, ``stop``, ``regenerate``, ...); each
  returns at once and runs in the background on the event loop. Results show up in
  the two list models (:attr:`ChatController.conversations`, :attr:`messages`) and
  the signals below. Widgets never touch the database or the worker themselves.
* Nothing is lost: a question is stored before it is sent; the answer row is stored
  first as ``interrupted`` and saved every :data:`SAVE_EVERY_S` while it streams, then
  finalised (``complete``, ``interrupted`` with the partial text, or ``error``).
* One answer at a time (the worker serves one anyway): :attr:`busy_changed` says when.
* An answer that stopped at its token limit says so in its note and can be continued
  (:meth:`continue_answer`): the worker goes on from where it stopped and the new text
  is appended to the same message. An answer whose earlier messages a rolling context
  window left out (the conversation's ``context_overflow`` setting) says how many.
* An answer cut off because the connection to the worker broke says what happened in
  words (the raw error is in the log). The app tells the controller when its own worker
  stopped, was started again or could not be (:meth:`worker_stopped`,
  :meth:`worker_restarted`, :meth:`worker_gave_up`); the note then says so, stored too.
"""

import asyncio
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.answer import AnswerStats, merge_pieces, stored_stats
from app.client import COMPLETE as OUTCOME_COMPLETE
from app.client import ERROR as OUTCOME_ERROR
from app.client import (
    STOPPED,
    AnswerProgress,
    AnswerRequest,
    AnswerResult,
    Health,
    WorkerClient,
)
from app.export import render
from app.models.conversations import ConversationListModel
from app.models.messages import MessageListModel
from app.store import (
    COMPLETE,
    ERROR,
    INTERRUPTED,
    AsyncStore,
    ChatSettings,
    Conversation,
    Store,
    title_from,
)
from app.tasks import TaskSet

log = logging.getLogger(__name__)

SAVE_EVERY_S = 1.0
KEPT = "The partial answer is kept."
LOST_NOTE = f"Interrupted: the connection to the worker was lost. {KEPT}"
RESTARTING_NOTE = f"Interrupted: the worker stopped while answering and is being restarted. {KEPT}"
RESTARTED_NOTE = f"Interrupted: the worker stopped while answering and was restarted. {KEPT}"
GAVE_UP_NOTE = (f"Interrupted: the worker stopped while answering and could not be started "
                f"again. {KEPT}")
RESTARTED_NOTICE = ("The worker stopped while answering and was restarted; the partial answer "
                    "is kept.")
CONTEXT_FULL = "context_length_exceeded"
MAX_LOST = 20  # answers whose note waits for news of the worker


@dataclass(frozen=True)
class _Prefix:
    """The answer a continuation appends to."""

    text: str
    pieces: list[list[Any]]
    stats: AnswerStats | None
    note: str


@dataclass
class _Active:
    """The answer streaming now."""

    rid: str
    message_id: int
    conversation_id: int
    last_saved: float = 0.0
    saving: bool = False
    limit: int = 512  # the request's max_tokens
    prefix: _Prefix | None = None  # set when continuing an answer


def dropped_note(dropped: int) -> str:
    """What an answer says when a rolling window left earlier messages out."""
    if not dropped:
        return ""
    n = f"{dropped} earlier message{'s were' if dropped != 1 else ' was'}"
    return f"{n} left out: the conversation no longer fits the model's context."


def limit_note(stats: AnswerStats, limit: int) -> str:
    """What an answer that ended with ``finish_reason == "length"`` says."""
    if stats.completion_tokens and stats.completion_tokens < limit:
        return "Stopped where the conversation filled the model's context."
    return f"Stopped at the {limit:,}-token limit."


def outcome_status(result: AnswerResult, limit: int = 512) -> tuple[str, str]:
    """Stored status and the note shown with an answer (a lost connection is told by
    the controller, which knows what became of the worker)."""
    if result.outcome == OUTCOME_COMPLETE:
        if result.stats.finish_reason == "length":
            return COMPLETE, limit_note(result.stats, limit)
        return COMPLETE, ""
    if result.outcome == STOPPED:
        return INTERRUPTED, "Stopped."
    if result.outcome == OUTCOME_ERROR and result.code == CONTEXT_FULL:
        return ERROR, ("The conversation no longer fits the model's context. Start a new "
                       "chat, or choose “Leave out the oldest messages” in this "
                       f"conversation's settings. ({result.message})")
    if result.outcome == OUTCOME_ERROR:
        return ERROR, f"The worker could not answer: {result.message}"
    if result.connection_lost:
        return INTERRUPTED, LOST_NOTE
    return INTERRUPTED, f"Interrupted: {result.message}. {KEPT}"


def joined(*notes: str) -> str:
    return " ".join(n for n in notes if n)


def continued(prefix: _Prefix, stats: AnswerStats) -> AnswerStats:
    """A continuation's stats as the whole answer's: its tokens counted with the first
    part's (and their ids joined when both are known)."""
    if prefix.stats is None:
        return stats
    ids = (None if prefix.stats.token_ids is None or stats.token_ids is None
           else prefix.stats.token_ids + stats.token_ids)
    return replace(stats, completion_tokens=prefix.stats.completion_tokens
                   + stats.completion_tokens, token_ids=ids)


class ChatController(QObject):
    # ---- Signals -----------------------------------------------------------------
    conversation_opened = Signal(object)
    """The open conversation changed (a :class:`Conversation`, or None for a new one)."""
    conversation_renamed = Signal(int, str)
    """Conversation id and its new title."""
    conversation_deleted = Signal(int, str)
    """A conversation was hidden (id, title); :meth:`undo_delete` can bring it back."""
    busy_changed = Signal(bool)
    """Whether an answer is being sent or streamed."""
    notice_posted = Signal(str, str)
    """Something to tell the user: level ("info", "warning", "error") and text."""
    answer_progressed = Signal(object)
    """Live :class:`AnswerStats` of the streaming answer (throttled)."""
    answer_completed = Signal(int, object)
    """Message id and :class:`AnswerStats` of an answer that was finalised and saved."""
    history_loaded = Signal(list)
    """Stats of the latest stored answers (oldest first), once at start."""
    exported = Signal(str)
    """A conversation was written to this path."""

    def __init__(self, db: AsyncStore, client: WorkerClient, parent: QObject | None = None):
        super().__init__(parent)
        self.db = db
        self.client = client
        self.conversations = ConversationListModel(self)
        self.messages = MessageListModel(self)
        self.current: Conversation | None = None
        self.draft_settings = ChatSettings()
        self._active: _Active | None = None
        self._sending = False
        self._worker_down = False  # the app's own worker stopped and is not back yet
        self._lost: list[int] = []  # answers cut by a lost connection, news pending
        self._tasks = TaskSet(self._failed)
        client.answer_progressed.connect(self._progressed)
        client.answer_finished.connect(self._finished)
        client.health_changed.connect(self._health)

    # --- state ----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._sending or self._active is not None

    @property
    def settings(self) -> ChatSettings:
        return self.current.settings if self.current is not None else self.draft_settings

    def _set_sending(self, sending: bool) -> None:
        was = self.busy
        self._sending = sending
        if self.busy != was:
            self.busy_changed.emit(self.busy)

    def _failed(self, what: str, exc: BaseException) -> None:
        self._set_sending(False)
        self.notice_posted.emit("error", f"{what} failed: {exc}")

    async def wait(self) -> None:
        """Wait for everything running in the background (close, tests)."""
        await self._tasks.wait()

    # --- conversations ----------------------------------------------------------------

    def load(self) -> None:
        self._tasks.spawn(self._load(), "Loading the history")

    async def _load(self) -> None:
        await self.db.call(Store.purge_deleted)
        self.conversations.reset(await self.db.call(Store.conversations))
        stats = [stored_stats(s) for s in await self.db.call(Store.recent_stats)]
        self.history_loaded.emit([s for s in stats if s is not None])

    def new_conversation(self) -> None:
        self.current, self.draft_settings = None, ChatSettings()
        self.messages.reset([])
        self.conversation_opened.emit(None)

    def open_conversation(self, conversation_id: int) -> None:
        self._tasks.spawn(self._open(conversation_id), "Opening the conversation")

    async def _open(self, conversation_id: int) -> None:
        conversation = await self.db.call(Store.conversation, conversation_id)
        messages = await self.db.call(Store.messages, conversation_id)
        self.current = conversation
        self.messages.reset(messages)
        if self._active is not None and self._active.conversation_id == conversation_id:
            self.messages.mark_streaming(self._active.message_id)
        self.conversation_opened.emit(conversation)

    def rename(self, conversation_id: int, title: str) -> None:
        title = " ".join(title.split())
        if title:
            self._tasks.spawn(self._rename(conversation_id, title), "Renaming")

    async def _rename(self, conversation_id: int, title: str) -> None:
        await self.db.call(Store.rename, conversation_id, title)
        conversation = await self.db.call(Store.conversation, conversation_id)
        self.conversations.replace(conversation)
        if self.current is not None and self.current.id == conversation_id:
            self.current = conversation
        self.conversation_renamed.emit(conversation_id, title)

    def delete(self, conversation_id: int) -> None:
        """Hide a conversation, offering undo until :meth:`forget_deleted`."""
        if self._active is not None and self._active.conversation_id == conversation_id:
            self.stop()
        self._tasks.spawn(self._delete(conversation_id), "Deleting")

    async def _delete(self, conversation_id: int) -> None:
        await self.db.call(Store.purge_deleted)
        conversation = await self.db.call(Store.conversation, conversation_id)
        await self.db.call(Store.delete, conversation_id)
        self.conversations.remove(conversation_id)
        if self.current is not None and self.current.id == conversation_id:
            self.new_conversation()
        self.conversation_deleted.emit(conversation_id, conversation.title)

    def undo_delete(self, conversation_id: int) -> None:
        self._tasks.spawn(self._undo_delete(conversation_id), "Undoing the delete")

    async def _undo_delete(self, conversation_id: int) -> None:
        await self.db.call(Store.undelete, conversation_id)
        self.conversations.reset(await self.db.call(Store.conversations))

    def forget_deleted(self) -> None:
        self._tasks.spawn(self.db.call(Store.purge_deleted), "Deleting for good")

    def search(self, text: str) -> None:
        self._tasks.spawn(self._search(text.strip()), "Searching")

    async def _search(self, text: str) -> None:
        if text:
            self.conversations.reset(await self.db.call(Store.search, text), searching=True)
        else:
            self.conversations.reset(await self.db.call(Store.conversations))

    def set_settings(self, settings: ChatSettings) -> None:
        if self.current is None:
            self.draft_settings = settings
            return
        self.current = replace(self.current, settings=settings)
        self.conversations.replace(self.current)
        self._tasks.spawn(self.db.call(Store.set_settings, self.current.id, settings),
                          "Saving the settings")

    def export(self, path: Path, fmt: str) -> None:
        if self.current is not None:
            self._tasks.spawn(self._export(self.current, path, fmt), "Exporting")

    async def _export(self, conversation: Conversation, path: Path, fmt: str) -> None:
        messages = await self.db.call(Store.messages, conversation.id)
        text = render(fmt, conversation, messages)
        await asyncio.to_thread(path.write_text, text, encoding="utf-8")
        self.exported.emit(str(path))

    # --- asking -----------------------------------------------------------------------

    def send(self, text: str) -> bool:
        """Store and send a question; False when it cannot be sent now."""
        if not text.strip() or self.busy:
            return False
        self._set_sending(True)
        self._tasks.spawn(self._send(text.strip()), "Sending")
        return True

    async def _send(self, text: str) -> None:
        conversation = self.current
        if conversation is None:
            conversation = await self.db.call(
                Store.create_conversation, title_from(text), self.draft_settings
            )
            self.current = conversation
            self.conversation_opened.emit(conversation)
        question = await self.db.call(Store.add_message, conversation.id, "user", text)
        self.messages.append(question)
        await self._ask(conversation)

    async def _ask(self, conversation: Conversation) -> None:
        reply = await self.db.call(
            Store.add_message, conversation.id, "assistant", "", INTERRUPTED
        )
        prompt = self._prompt(conversation)
        self.messages.append(reply, streaming=True)
        self.conversations.put_first(replace(conversation, updated=reply.created))
        self._start(conversation, reply.id, prompt, None)

    def _start(self, conversation: Conversation, message_id: int,
               prompt: list[dict[str, str]], prefix: _Prefix | None) -> None:
        settings = conversation.settings
        rid = self.client.ask(AnswerRequest(
            prompt, settings.temperature, settings.max_tokens,
            continue_answer=prefix is not None, context_overflow=settings.context_overflow))
        self._active = _Active(rid, message_id, conversation.id,
                               asyncio.get_running_loop().time(), limit=settings.max_tokens,
                               prefix=prefix)
        self._sending = False

    def _prompt(self, conversation: Conversation) -> list[dict[str, str]]:
        system = conversation.settings.system_prompt.strip()
        head = [{"role": "system", "content": system}] if system else []
        return head + self.messages.history()

    def stop(self) -> None:
        if self._active is not None:
            self.client.cancel(self._active.rid)

    def regenerate(self) -> None:
        """Answer the last question again (its previous answer is replaced)."""
        last = self.messages.items[-1] if self.messages.items else None
        if self.busy or self.current is None or last is None:
            return
        self._set_sending(True)
        self._tasks.spawn(self._resend(self.current, last.id, None), "Regenerating")

    def edit_and_resend(self, message_id: int, text: str) -> None:
        """Replace a question (and everything after it) and ask it again."""
        if self.busy or self.current is None or not text.strip():
            return
        self._set_sending(True)
        self._tasks.spawn(self._resend(self.current, message_id, text.strip()), "Resending")

    def continue_answer(self) -> None:
        """Go on with the last answer where its token limit stopped it."""
        last = self.messages.items[-1] if self.messages.items else None
        if self.busy or self.current is None or last is None or not last.can_continue:
            return
        self._set_sending(True)
        self._tasks.spawn(self._continue(self.current, last.id), "Continuing the answer")

    async def _continue(self, conversation: Conversation, message_id: int) -> None:
        row = self.messages.row_of(message_id)
        if row is None:
            self._set_sending(False)
            return
        item = self.messages.items[row]
        prefix = _Prefix(item.content, [list(p) for p in item.pieces], item.stats, item.note)
        prompt = self._prompt(conversation)  # ends with this answer, not yet streaming
        await self.db.call(Store.update_message, message_id, item.content, status=INTERRUPTED)
        self.messages.mark_streaming(message_id, note="")
        self._start(conversation, message_id, prompt, prefix)

    async def _resend(self, conversation: Conversation, from_id: int, text: str | None) -> None:
        row = self.messages.row_of(from_id)
        if text is None and row is not None and self.messages.items[row].role == "user":
            from_id, row = -1, None  # the last message is a question: just answer it
        if row is not None:
            await self.db.call(Store.truncate, conversation.id, from_id)
            self.messages.remove_from(from_id)
        if text is not None:
            question = await self.db.call(Store.add_message, conversation.id, "user", text)
            self.messages.append(question)
        await self._ask(conversation)

    # --- the answer streaming ------------------------------------------------------------

    def _progressed(self, rid: str, progress: AnswerProgress) -> None:
        active = self._active
        if active is None or active.rid != rid:
            return
        text, pieces = self._joined(active, progress.text, progress.pieces)
        stats = progress.stats
        if active.prefix is not None and stats.completion_tokens:  # count the whole answer
            stats = continued(active.prefix, stats)
        self.messages.stream(active.message_id, text, pieces, stats,
                             dropped_note(progress.stats.dropped_messages))
        self.answer_progressed.emit(progress.stats)
        now = asyncio.get_running_loop().time()
        if not active.saving and now - active.last_saved >= SAVE_EVERY_S:
            active.saving, active.last_saved = True, now
            self._tasks.spawn(self._save_partial(active, text), "Saving the answer")

    @staticmethod
    def _joined(active: _Active, text: str, pieces: list[list[Any]]
                ) -> tuple[str, list[list[Any]]]:
        """The whole answer: a continuation's text after the part it continues."""
        if active.prefix is None:
            return text, pieces
        joined_pieces = [list(p) for p in active.prefix.pieces]
        merge_pieces(joined_pieces, pieces)
        return active.prefix.text + text, joined_pieces

    async def _save_partial(self, active: _Active, text: str) -> None:
        try:
            await self.db.call(Store.update_message, active.message_id, text)
        finally:
            active.saving = False

    def _finished(self, rid: str, result: AnswerResult) -> None:
        active = self._active
        if active is None or active.rid != rid:
            return
        self._active = None
        status, note = outcome_status(result, active.limit)
        if result.connection_lost and self._worker_down:
            note = RESTARTING_NOTE
        text, pieces = self._joined(active, result.text, result.pieces)
        stats, prefix = result.stats, active.prefix
        if result.outcome != STOPPED and status != COMPLETE:
            self.notice_posted.emit("error" if status == ERROR else "warning", note)
        if prefix is not None and status == ERROR:  # the answer stays as it was
            status, stats = COMPLETE, prefix.stats or stats
            note = joined(prefix.note, f"Could not continue: {result.message}")
        elif prefix is not None:
            stats = continued(prefix, stats)
        note = joined(dropped_note(result.stats.dropped_messages), note)
        self.messages.finish(active.message_id, text, pieces, status, stats, note)
        self.busy_changed.emit(self.busy)
        if result.connection_lost:
            self._lost = [*self._lost, active.message_id][-MAX_LOST:]
        stored = {"measured": stats.to_dict(), "outcome": result.outcome, "note": note,
                  "limit": active.limit}
        self._tasks.spawn(self._finalise(active, text, pieces, status, stats, stored),
                          "Saving the answer")

    async def _finalise(self, active: _Active, text: str, pieces: list[list[Any]],
                        status: str, stats: AnswerStats, stored: dict[str, Any]) -> None:
        await self.db.call(Store.update_message, active.message_id, text, status=status,
                           stats=stored, pieces=pieces)
        await self.db.call(Store.touch, active.conversation_id)
        self.answer_completed.emit(active.message_id, stats)

    # --- the app's own worker ----------------------------------------------------------

    def _health(self, health: Health) -> None:
        if health.ready and not self._worker_down:
            self._lost = []  # the connection broke, but the worker itself kept running

    def worker_stopped(self, why: str = "") -> None:
        """The app's worker ended unexpectedly (it will be started again)."""
        self._worker_down = True
        self._renote(RESTARTING_NOTE, keep=True)

    def worker_restarted(self, url: str = "") -> None:
        """The app's worker runs again (after :meth:`worker_stopped`)."""
        if not self._worker_down:
            return
        self._worker_down = False
        if self._lost:
            self.notice_posted.emit("info", RESTARTED_NOTICE)
        self._renote(RESTARTED_NOTE)

    def worker_gave_up(self, why: str = "") -> None:
        """The app's worker kept dying and is not started again."""
        self._worker_down = False
        self._renote(GAVE_UP_NOTE)

    def _renote(self, note: str, keep: bool = False) -> None:
        """Tell the answers cut by a lost connection what became of the worker."""
        for message_id in self._lost:
            row = self.messages.row_of(message_id)
            if row is not None:
                self.messages.set_note(message_id, joined(
                    dropped_note(self._dropped(row)), note))
            self._tasks.spawn(self._store_note(message_id, note), "Saving the answer")
        if not keep:
            self._lost = []

    def _dropped(self, row: int) -> int:
        stats = self.messages.items[row].stats
        return stats.dropped_messages if stats is not None else 0

    async def _store_note(self, message_id: int, note: str) -> None:
        message = await self.db.call(Store.message, message_id)
        dropped = stored_stats(message.stats)
        await self.db.call(Store.set_note, message_id, joined(
            dropped_note(dropped.dropped_messages if dropped else 0), note))
