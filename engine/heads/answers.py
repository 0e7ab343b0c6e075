"""The target's own answers as head-training data: ``python -m engine.heads.answers``.

Contract: :func:`prompts` builds a fixed, shuffled list of chat prompts of the four kinds
the appliance serves (code to write, code to edit, a document to summarise, free chat)
from the Python standard library's source and from hand-written office topics; none is a
benchmark or demo prompt. :func:`answer` lets the target answer one prompt greedily (the
plain loop on a :class:`~engine.spec.runner.ModelRunner`, so the answer is exactly the
target's) and records, for every position of prompt + answer, the target's final normed
hidden state and its top-``k`` next-token probabilities: the same labels
:func:`engine.heads.train.extract` computes, taken from the run itself, so no second
target pass is needed. :func:`run_tasks` runs several generations together, one batched
step per token for all of them (the weights read once for all; the same answers, bit for
bit, where the forward runs natively), a finished generation's place taken at once by the
next (continuous batching); :func:`answer_batch` answers a list of prompts so. The command
appends records to ``--out`` (a ``torch.save`` file, rewritten atomically every few
answers, resumed by a rerun; with ``--skip N`` it starts at prompt ``N``) and the
conversations as JSON lines to ``--out`` + ``.jsonl``; ``train --answers FILE`` trains on
them. With ``--text-only`` only the conversations are written (each line names its prompt,
and a rerun resumes after the last one): the way a cheaper model (the draft model) writes
chats for teacher forcing (``train --conversations FILE.jsonl``), where its own labels
would be of no use. With ``--invent`` the model also writes the questions
(:func:`invent_questions`, after Magpie: it continues its chat template where the user's
message begins, at temperature 1 over its top-``k``, the questions opening with the
``OPENERS`` in turn, each drawn again, up to three times, when it is not mostly in Latin
letters or runs to its length limit, :func:`usable_question`): varied prompts that no
template makes, each reproducible from ``--seed`` and its index. Without ``--text-only``
the target's answers to them come with their labels, as the listed prompts' do.
Conversations finish out of order; both files hold them in prompt order, so a rerun
resumes after the last one written.

Why: EAGLE heads accept most on text like the target's own output (the head learns to
predict the target, and the target's answers are what it drafts at run time); the
standard-library corpus is text the target would not have written.
"""

import argparse
import ast
import json
import logging
import pickle
import random
import sys
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.heads import corpus as corpus_mod
from engine.spec.runner import ModelRunner

log = logging.getLogger(__name__)

EDITS = (
    "Add type hints and a short docstring to this code. Show the updated code.",
    "Rewrite this code so it is easier to read, with clearer variable names. Show the result.",
    "Add error handling for bad input to this code and explain the change briefly.",
    "Write pytest unit tests for this code.",
    "Explain step by step what this code does.",
    "Add logging calls at the important steps of this code. Show the updated code.",
)
WRITES = (
    "Write a Python {kind} `{name}` that {what}.",
    "Implement `{name}` in Python: a {kind} that {what}. Show the code.",
    "I need a Python {kind} called `{name}` that {what}. Can you write it?",
)
SUMMARIES = (
    "Summarise this documentation in a few sentences for a colleague.",
    "List the main points of this text as short bullets, keeping its exact names.",
    "What does this text say? Answer in two or three sentences, quoting key terms.",
)
TOPICS = (
    "planning a team offsite", "writing a clear project status update", "running a short "
    "stand-up meeting", "onboarding a new colleague", "keeping passwords safe",
    "backing up work files", "naming shared folders", "organising a shared calendar",
    "giving constructive feedback", "asking for a deadline extension", "reducing paper use "
    "in the office", "preparing for a job interview", "writing meeting minutes",
    "handling an upset customer on the phone", "prioritising a long to-do list",
    "sharing large files with a client", "setting up a second monitor", "choosing a "
    "strong password", "spotting a phishing email", "taking useful notes", "working from "
    "home productively", "booking business travel", "planning a budget for a small "
    "event", "making a spreadsheet easier to read", "writing a polite reminder email",
    "presenting numbers in a chart", "keeping a desk tidy", "saving energy at work",
    "reviewing a colleague's document", "learning a new software tool quickly",
    "avoiding burnout", "running a brainstorming session", "writing a job advertisement",
    "greeting visitors at reception", "ordering office supplies", "archiving old emails",
    "explaining a delay to a client", "using version control for documents",
    "planning a fire drill", "welcoming an intern",
)
CHATS = (
    "Give me three practical tips on {topic}.",
    "Explain briefly why {topic} matters and how to start.",
    "Write a short email to my team about {topic}.",
    "What are common mistakes in {topic}, and how do I avoid them?",
)
MORE_CHATS = (
    "How would you explain {topic} to a new colleague in a few sentences?",
    "Make a short checklist for {topic}.",
)
TERMS = (
    "a VPN", "two-factor authentication", "cloud storage", "an API", "a pivot table",
    "encryption", "a router", "an incremental backup", "malware", "a database",
    "an operating system update", "a QR code", "the Bcc field of an email", "a shared drive",
    "a CSV file", "the browser cache", "single sign-on", "a domain name",
    "a password manager", "a screen reader", "an IP address", "a ticketing system",
    "a project roadmap", "a KPI", "a purchase order", "a non-disclosure agreement",
    "a service level agreement", "version history in a document", "a mail merge",
    "a video call's screen sharing",
)
TERM_CHATS = (
    "Explain in a few plain sentences what {term} is.",
    "Why would an office use {term}? Answer briefly with an example.",
)
NAMES = ("Maria Lopez", "Kenji Sato", "Aisha Bello", "Jonas Weber", "Elena Petrova",
         "Omar Haddad", "Grace Kim", "Lukas Novak", "Sara Jensen", "Ravi Menon")
SUBJECTS = ("the printer on floor {n}", "the car park", "the new expense form", "room {r}",
            "the Wi-Fi in building {b}", "the quarterly report", "the summer party")
DOCUMENT = (
    "{title}, {day} {month}. From: {a}. To: all staff.\n\n"
    "Regarding {subject}: from {day} {month} to {day2} {month}, {change}. "
    "Please contact {b} on extension {ext} with questions. {extra}"
)
CHANGES = ("it will be closed for maintenance", "a new booking rule applies",
           "the opening hours change to 8:00-17:00", "requests go through the help desk",
           "only badge holders have access")
EXTRAS = ("Thank you for your patience.", "Reminders will follow by email.",
          "The previous rules apply again afterwards.", "Late requests cannot be accepted.")


@dataclass
class Record:
    """One answered prompt: its ids and the target's labels at every position."""

    ids: torch.Tensor  # [T] prompt + answer token ids
    hidden: torch.Tensor  # [T, H] final normed hidden states (float16)
    top_ids: torch.Tensor  # [T, K] the target's most likely next tokens
    top_probs: torch.Tensor  # [T, K] their probabilities (float16)


def _code_prompts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """Write-this and edit-this prompts from the standard library's public functions."""
    for _, source in corpus_mod.module_sources():
        for d in corpus_mod.definitions(ast.parse(source), source):
            if len(d.doc) >= corpus_mod.MIN_DOC_CHARS:
                what = corpus_mod.first_line(d.doc)
                yield "code", rng.choice(WRITES).format(kind=d.kind, name=d.name, what=what)
                yield "summary", f"{rng.choice(SUMMARIES)}\n\n{d.doc.strip()[:1500]}"
            if 200 <= len(d.code) <= 1200:
                yield "edit", f"{rng.choice(EDITS)}\n\n```python\n{d.code}\n```"


def _office_prompts(rng: random.Random) -> Iterator[tuple[str, str]]:
    """Free-chat questions and short office documents to summarise."""
    for topic in TOPICS:
        for template in rng.sample(CHATS, 2):
            yield "chat", template.format(topic=topic)
    months = ("March", "April", "May", "June", "September", "October")
    for _ in range(60):
        a, b = rng.sample(NAMES, 2)
        day = rng.randint(1, 20)
        doc = DOCUMENT.format(
            title=rng.choice(("Notice", "Memo", "Update")), day=day, day2=day + rng.randint(1, 8),
            month=rng.choice(months), a=a, b=b, ext=rng.randint(200, 499),
            subject=rng.choice(SUBJECTS).format(n=rng.randint(1, 5), r=rng.randint(100, 450),
                                                b=rng.choice("ABCD")),
            change=rng.choice(CHANGES), extra=rng.choice(EXTRAS))
        yield "summary", f"{rng.choice(SUMMARIES)}\n\n{doc}"


def _more_chat_prompts() -> list[tuple[str, str]]:
    """Free-chat prompts added later (the first list runs out of them after about 330
    prompts): kept after the first list so that answers files made from it stay valid."""
    texts = [t.format(topic=topic) for topic in TOPICS for t in MORE_CHATS]
    texts += [t.format(term=term) for term in TERMS for t in TERM_CHATS]
    random.Random(1).shuffle(texts)
    return [("chat", text) for text in texts]


def prompts(seed: int = 0) -> list[tuple[str, str]]:
    """All prompts as ``(kind, text)`` in a fixed order: the first list interleaved by
    kind, then more free chat (:func:`_more_chat_prompts`)."""
    rng = random.Random(seed)
    by_kind: dict[str, list[str]] = {}
    for kind, text in [*_code_prompts(rng), *_office_prompts(rng)]:
        by_kind.setdefault(kind, []).append(text)
    for texts in by_kind.values():
        rng.shuffle(texts)
    out: list[tuple[str, str]] = []
    for i in range(max(len(t) for t in by_kind.values())):
        out += [(kind, texts[i]) for kind, texts in sorted(by_kind.items()) if i < len(texts)]
    return out + _more_chat_prompts()


@torch.inference_mode()
def answer(runner: ModelRunner, prompt: list[int], max_tokens: int, eos_ids: frozenset[int],
           top_k: int) -> tuple[Record, list[int]]:
    """The target's greedy answer to ``prompt`` with its labels at every position."""
    runner.reset()
    runner.keep_hidden(True)
    tops = [_top(runner.forward(prompt, rows=len(prompt)), top_k)]  # [T, K] each
    answer_ids: list[int] = []
    while True:
        answer_ids.append(int(tops[-1][0][-1, 0]))
        if not token_goes_on(answer_ids, eos_ids, max_tokens):
            break
        tops.append(_top(runner.forward(answer_ids[-1:]), top_k))  # [1, K] each
    assert runner.hidden is not None  # the last answer token is never fed: it has no feature
    record = Record(torch.tensor(runner.ids), runner.hidden.to(torch.float16),
                    torch.cat([ids for ids, _ in tops]).to(torch.int32),
                    torch.cat([probs for _, probs in tops]).to(torch.float16))
    return record, answer_ids


def _top(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    top = logits.float().softmax(-1).topk(top_k, dim=-1)  # [rows, K] each
    return top.indices, top.values


@dataclass
class _Going:
    """One answer of a batch while it is being generated."""

    cache: Any
    ids: list[int]  # prompt + answer so far
    answer: list[int]
    top_ids: list[torch.Tensor]  # [rows, K] per step
    top_probs: list[torch.Tensor]
    hidden: list[torch.Tensor]  # [rows, H] per step
    generator: torch.Generator | None = None  # sampling (None: greedy)
    limit: int = 1 << 30  # answer tokens at most

    def next_token(self) -> int:
        """The greedy token, or one drawn from the last step's top-k probabilities."""
        ids, probs = self.top_ids[-1][-1], self.top_probs[-1][-1]  # [K] each
        if self.generator is None:
            return int(ids[0])
        return int(ids[torch.multinomial(probs.float(), 1, generator=self.generator)])

    def record(self) -> tuple[Record, list[int]]:
        fed = self.ids[: len(self.ids) - 1]  # the last answer token is never fed
        return Record(torch.tensor(fed), torch.cat(self.hidden).to(torch.float16),
                      torch.cat(self.top_ids).to(torch.int32),
                      torch.cat(self.top_probs).to(torch.float16)), self.answer


@dataclass
class Ask:
    """One generation a task asks for: ``prompt`` continued up to ``max_tokens`` tokens (or
    an end token), greedily or, with ``generator``, drawn from each step's top-k
    probabilities (temperature 1). With ``labels`` the answer comes with its
    :class:`Record` (features and top-k at every position); without, only the prompt's
    last position goes through the output layer."""

    prompt: list[int]
    max_tokens: int
    generator: torch.Generator | None = None
    labels: bool = True


Answered = tuple[Record | None, list[int]]  # what a task gets back for an Ask
# a conversation of the command: kind, messages, the answer's record (None: text only), ids
Finished = tuple[str, list[dict[str, str]], Record | None, list[int]]
Task = Generator[Ask, Answered, Any]  # asks for generations, returns its result


@torch.inference_mode()
def run_tasks(runners: Sequence[ModelRunner], tasks: Iterable[tuple[int, Task]],
              eos_ids: frozenset[int], top_k: int) -> Iterator[tuple[int, Any]]:
    """Drive ``tasks`` (``(index, task)``, each a generator that yields :class:`Ask` and
    returns its result) with continuous batching; yield ``(index, result)`` as tasks
    finish, which need not be in their order.

    Up to ``len(runners)`` generations run at once, each prompt filled by its own runner
    (all on the same model); then every generation still going gets its next token from
    one :meth:`~engine.cpu.forward.Forward.step_many` over all of them, so the weights are
    read once per step for the whole batch. A slot whose generation ends takes its
    task's next :class:`Ask`, or the next task, before the following step: the batch
    stays full while tasks remain (a batch that waited for its longest answer ran most
    of its steps on a few rows). An ask reads only what its slot's cache does not already
    hold of its prompt (a question drawn again, or answered, continues the cache its
    drawing left, and the chat template's opening is read once per slot); one with labels
    reuses the cache only where the slot's last generation kept labels too, and takes
    theirs for the positions it keeps. Each generation's numbers are bit for bit those of
    :func:`answer` (greedy) where the forward runs natively, whatever runs beside it or
    ran before it in its slot. An ask without a prompt is a ``ValueError``.
    """
    if not runners:
        raise ValueError("generating needs at least one runner")
    model_forward = runners[0].model_forward
    queue = iter(tasks)
    slots: list[tuple[int, Task, _Going, bool] | None] = [None] * len(runners)
    # per slot: the top-k ids and probabilities [L, K] of the L positions its cache holds,
    # when its last generation kept labels (its runner then keeps their features)
    held: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(runners)

    def draw(going: _Going) -> bool:
        """Add the generation's next token; whether it goes on after it."""
        token = going.next_token()
        going.ids.append(token)
        going.answer.append(token)
        return token_goes_on(going.answer, eos_ids, going.limit)

    def finish(n: int, going: _Going, labels: bool) -> Answered:
        """What a finished generation gives its task; its slot's runner now names the ids
        its cache holds (the batched steps grew the cache only)."""
        runner = runners[n]
        runner.ids = going.ids[: len(going.cache)]
        if not labels:
            return None, going.answer
        runner.hidden = torch.cat(going.hidden)  # [L, H]
        held[n] = torch.cat(going.top_ids), torch.cat(going.top_probs)
        return going.record()

    def settle(n: int, index: int, task: Task, sent: Answered | None
               ) -> Iterator[tuple[int, Any]]:
        """Give ``task`` what it asked for (nothing at its start) and fill slot ``n`` with
        its next generation, its first token drawn, or with the next task's; yield the
        tasks that finish meanwhile."""
        while True:
            try:
                ask = task.send(sent) if sent is not None else next(task)
            except StopIteration as done:
                yield index, done.value
                following = next(queue, None)
                if following is None:
                    slots[n] = None
                    return
                (index, task), sent = following, None
                continue
            runner, prompt, before = runners[n], list(ask.prompt), held[n]
            if not prompt:
                raise ValueError("a generation needs a prompt of at least one token")
            if ask.labels and (before is None or runner.hidden is None):  # read it all
                runner.reset()
                runner.keep_hidden(True)
            elif not ask.labels:
                runner.keep_hidden(False)
                held[n] = before = None
            # what the slot's cache holds of the prompt is kept (its last id read again)
            runner.truncate(min(runner.common_prefix(prompt), len(prompt) - 1))
            kept = len(runner.ids)
            new = prompt[kept:]
            top_ids, top_probs = _top(runner.forward(new, rows=len(new) if ask.labels else 1),
                                      top_k)  # [rows, K]
            hidden = []
            if ask.labels:  # the kept positions' labels, then the new ones'
                assert runner.hidden is not None
                hidden = [runner.hidden]  # [len(prompt), H]
                if before is not None:
                    top_ids = torch.cat([before[0][:kept], top_ids])
                    top_probs = torch.cat([before[1][:kept], top_probs])
                held[n] = None  # the generation holds them now
            going = _Going(runner.cache, prompt, [], [top_ids], [top_probs], hidden,
                           ask.generator, ask.max_tokens)
            if draw(going):
                slots[n] = (index, task, going, ask.labels)
                return
            sent = finish(n, going, ask.labels)

    for n in range(len(runners)):
        first = next(queue, None)
        if first is None:
            break
        yield from settle(n, *first, None)
    while any(slots):
        active = [slot for slot in slots if slot is not None]
        keep = any(labels for *_, labels in active)
        outs = model_forward.step_many([([g.ids[-1]], g.cache) for _, _, g, _ in active],
                                       keep=keep)
        for (_, _, g, labels), (logits, hidden) in zip(active, outs, strict=True):
            top_ids, top_probs = _top(logits, top_k)  # [1, K] each
            g.top_ids.append(top_ids)
            g.top_probs.append(top_probs)
            if labels:
                assert hidden is not None
                g.hidden.append(hidden)
        for n, slot in enumerate(slots):
            if slot is None or draw(slot[2]):
                continue
            index, task, going, labels = slot
            yield from settle(n, index, task, finish(n, going, labels))


def _one(ask: Ask) -> Generator[Ask, Answered, Answered]:
    """A task of one generation."""
    return (yield ask)


def answer_batch(runners: Sequence[ModelRunner], prompts: Sequence[list[int]], max_tokens: int,
                 eos_ids: frozenset[int], top_k: int,
                 generators: Sequence[torch.Generator] | None = None,
                 ) -> list[tuple[Record, list[int]]]:
    """Greedy answers to several prompts at once (:func:`run_tasks`), as :func:`answer`
    gives them one by one, in the prompts' order.

    With ``generators`` (one per prompt) each token is drawn instead from that step's
    top-``top_k`` probabilities (temperature 1), with the prompt's own generator, so a
    prompt's continuation does not depend on the others in its batch.
    """
    if not runners or len(runners) < len(prompts):
        raise ValueError("batched answers need one runner per prompt")
    if generators is not None and len(generators) != len(prompts):
        raise ValueError("sampled answers need one generator per prompt")
    tasks = ((n, _one(Ask(list(p), max_tokens, None if generators is None else generators[n])))
             for n, p in enumerate(prompts))
    done = dict(run_tasks(runners, tasks, eos_ids, top_k))
    return [done[n] for n in range(len(prompts))]


# question i begins with OPENERS[i % len(OPENERS)]
OPENERS = ("", "How", "What", "Can you", "Please", "Write", "Explain", "Summarise", "I",
           "Could you", "Why", "My", "Our", "Help me")


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` chat-templated as a prompt for the assistant's answer, as token ids."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def user_turn_prefix(tokenizer: Any) -> list[int]:
    """The ids of a chat up to where its user's first message begins (the template's
    system prompt included): what a model continues to write a question of its own."""
    marker = "\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    if marker not in text:
        raise ValueError("this model's chat template does not show the user's message")
    return list(tokenizer.encode(text[: text.index(marker)], add_special_tokens=False))


def question_task(start: list[int], index: int, seed: int, max_tokens: int,
                  eos_ids: frozenset[int], keep: Callable[[list[int]], bool] = lambda _: True,
                  tries: int = 3, labels: bool = False) -> Generator[Ask, Answered, list[int]]:
    """A task (:func:`run_tasks`) that returns question ``index`` continuing ``start``, as
    :func:`invent_questions` describes it. ``labels``: draw it keeping labels (unused
    here), so that an answer with labels that follows in the slot reuses its cache."""
    question: list[int] = []
    for attempt in range(tries):
        generator = torch.Generator().manual_seed((seed * 1_000_003 + index) * 31 + attempt)
        _, ids = yield Ask(list(start), max_tokens, generator, labels)
        question = [t for t in ids if t not in eos_ids]  # after the start
        if keep(question):
            break
    return question


def invent_questions(runners: Sequence[ModelRunner], starts: Sequence[list[int]],
                     eos_ids: frozenset[int], indices: Sequence[int], seed: int,
                     max_tokens: int, top_k: int,
                     keep: Callable[[list[int]], bool] = lambda _: True, tries: int = 3,
                     ) -> list[list[int]]:
    """Questions the model writes itself, each continuing its ``starts`` (the chat up to
    the user's message, :func:`user_turn_prefix`, and perhaps the message's first words),
    as Magpie (Xu et al. 2024, arXiv 2406.08464) makes instruction data from an aligned
    model alone; returned without their starts. Question ``i`` (of ``indices``) is drawn
    with a generator seeded by ``seed``, ``i`` and the try, so it is the same in any batch
    and on any rerun (given the same kernels); one that ``keep`` refuses is drawn again, up
    to ``tries`` draws (the last is kept). A question ends at an end token (dropped) or
    after ``max_tokens``."""
    tasks = ((n, question_task(starts[n], i, seed, max_tokens, eos_ids, keep, tries))
             for n, i in enumerate(indices))
    found = dict(run_tasks(runners, tasks, eos_ids, top_k))
    return [found[n] for n in range(len(indices))]


def mostly_latin(text: str, share: float = 0.95) -> bool:
    """Whether at least ``share`` of the text's letters are ASCII (office questions in
    English; the models also write Chinese and other scripts when left to themselves)."""
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) >= share * len(letters)


def usable_question(text: str, tokens: int, limit: int) -> bool:
    """Whether an invented question (``tokens`` long, its end token not counted) is kept:
    mostly in Latin letters (:func:`mostly_latin`) and ended by the model before ``limit``
    tokens. One that runs to the limit has most often gone on into an answer of its own
    (seen in about two of five questions the 1.5B target wrote), which the answer then
    only continues."""
    return tokens < limit and mostly_latin(text)


def token_goes_on(answer: list[int], eos_ids: frozenset[int], max_tokens: int) -> bool:
    """Whether an answer ending so gets another token."""
    return answer[-1] not in eos_ids and len(answer) < max_tokens


def _load(path: Path) -> tuple[list[Record], int]:
    """The records in ``path`` and the index of the prompt the first one answers."""
    if not path.is_file():
        return [], 0
    try:
        saved = torch.load(path, weights_only=True)
        return [Record(**r) for r in saved["records"]], int(saved.get("first", 0))
    except (OSError, RuntimeError, KeyError, TypeError, ValueError, EOFError,
            pickle.UnpicklingError) as exc:
        raise SystemExit(f"{path} is not an answers file of this command: {exc}") from exc


def load_records(path: Path) -> list[Record]:
    """Records written by this command (empty when the file does not exist yet)."""
    return _load(path)[0]


def save_records(path: Path, records: list[Record], first: int = 0) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"records": [vars(r) for r in records], "first": first}, tmp)
    tmp.replace(path)


def pack(records: list[Record], seq_len: int) -> dict[str, torch.Tensor]:
    """Records concatenated and cut into ``[N, seq_len]`` windows (a partial tail dropped),
    as the fields of :class:`engine.heads.train.Features`."""
    fields = {name: torch.cat([getattr(r, name) for r in records])
              for name in ("ids", "hidden", "top_ids", "top_probs")}
    n = len(fields["ids"]) // seq_len
    return {name: t[: n * seq_len].reshape(n, seq_len, *t.shape[1:])
            for name, t in fields.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.heads.answers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="model name or local model folder")
    p.add_argument("--out", required=True, type=Path, help="answers file to write or extend")
    p.add_argument("--prompts", type=int, default=10_000, help="answer at most this many")
    p.add_argument("--max-tokens", type=int, default=192, help="answer length limit")
    p.add_argument("--top-k", type=int, default=32)
    p.add_argument("--save-every", type=int, default=8)
    p.add_argument("--batch", type=int, default=8,
                   help="generations run together, a finished one's place taken at once by "
                        "the next (1: one by one, exactly as plain decoding)")
    p.add_argument("--skip", type=int, default=0,
                   help="start at this prompt of the list (the head to fine-tune has seen those "
                        "before it)")
    p.add_argument("--text-only", action="store_true",
                   help="write only the conversations (FILE.jsonl), not the labels: for chats "
                        "written by another model, to be teacher-forced through the target")
    p.add_argument("--invent", action="store_true",
                   help="answer questions the model writes itself (Magpie) instead of the "
                        "shipped list: varied prompts no template makes")
    p.add_argument("--question-tokens", type=int, default=160,
                   help="length limit of an invented question")
    p.add_argument("--seed", type=int, default=0, help="the invented questions' seed")
    p.add_argument("--accel", default="auto")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if min(args.prompts, args.max_tokens, args.top_k, args.save_every, args.batch,
           args.question_tokens) < 1:
        p.error("--prompts, --max-tokens, --top-k, --save-every, --batch and "
                "--question-tokens must be positive")
    if args.skip < 0:
        p.error("--skip must not be negative")
    return args


def answered_prompts(path: Path) -> list[int]:
    """The prompt indices of the conversations in ``path`` (JSON lines; an older line
    without one counts as unknown, -1); a damaged line is a clear error."""
    if not path.is_file():
        return []
    found = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                found.append(int(json.loads(line).get("prompt", -1)))
            except (ValueError, TypeError, AttributeError) as exc:
                raise SystemExit(f"{path}, line {n}, is not a conversation of this command "
                                 f"({exc}); move the file aside") from exc
    return found


def check_source(path: Path, invent: bool, seed: int) -> None:
    """Refuse to extend ``path`` with conversations of another source: invented questions
    (and their seed) or the shipped list, as its first line says."""
    with path.open(encoding="utf-8") as f:
        first = json.loads(f.readline())
    was = first.get("kind") == "invented"
    if was != invent:
        raise SystemExit(f"{path} holds {'invented' if was else 'listed'} questions: "
                         f"{'add' if was else 'leave out'} --invent, or write another file")
    if invent and int(first.get("seed", 0)) != seed:
        raise SystemExit(f"{path} holds questions of --seed {first.get('seed', 0)}: rerun "
                         "with it, or write another file")


def match_text(path: Path, records: int, invent: bool, seed: int) -> None:
    """Make the conversations file ``path`` hold the conversations of an answers file's
    ``records`` records: lines beyond them (written just before a run stopped, their
    records not yet saved) are dropped, to be answered again. A file with fewer lines, or
    lines and no records (text written by ``--text-only``), or of another source, is
    refused."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []
    if not lines and not records:
        return
    if not records:
        raise SystemExit(f"{path} holds conversations without labels (--text-only): write "
                         "another file, or add --text-only to extend it")
    if lines:
        check_source(path, invent, seed)
    if len(lines) < records:
        raise SystemExit(f"{path} holds {len(lines)} conversations for {records} answers: "
                         "write another file")
    if len(lines) > records:
        path.write_text("".join(lines[:records]), encoding="utf-8")
        log.info("dropped %d conversations of %s whose labels were not saved",
                 len(lines) - records, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    text_path = args.out.with_name(args.out.name + ".jsonl")
    if args.text_only:
        earlier = answered_prompts(text_path)
        if earlier and earlier[0] != args.skip:
            raise SystemExit(f"{text_path} holds answers from prompt {earlier[0]} on: rerun "
                             f"with --skip {earlier[0]} to extend it, or write another file")
        if earlier:
            check_source(text_path, args.invent, args.seed)
        records: list[Record] = []
        start = args.skip + len(earlier)
    else:
        records, first = _load(args.out)
        if records and first != args.skip:
            raise SystemExit(f"{args.out} holds answers from prompt {first} on: rerun with "
                             f"--skip {first} to extend it, or write another file")
        match_text(text_path, len(records), args.invent, args.seed)
        start = args.skip + len(records)
    from engine.heads.train import load_target

    loaded = load_target(args.target, args.data_dir, args.accel)
    runners, tok = [ModelRunner(loaded.model) for _ in range(args.batch)], loaded.tokenizer
    listed = [] if args.invent else prompts()
    end = args.skip + args.prompts if args.invent else min(args.skip + args.prompts, len(listed))
    prefix = user_turn_prefix(tok) if args.invent else []

    def conversation(index: int) -> Generator[Ask, Answered, Finished]:
        """Prompt ``index`` (invented first, with --invent) and the target's answer."""
        if args.invent:
            opened = tok.encode(OPENERS[index % len(OPENERS)], add_special_tokens=False)
            question = yield from question_task(
                prefix + opened, index, args.seed, args.question_tokens, loaded.eos_ids,
                lambda q: usable_question(tok.decode(q, skip_special_tokens=True), len(q),
                                          args.question_tokens),
                labels=not args.text_only)
            kind, text = "invented", tok.decode(opened + question, skip_special_tokens=True).strip()
        else:
            kind, text = listed[index]
        messages = [{"role": "user", "content": text}]
        record, answer_ids = yield Ask(prompt_ids(tok, messages), args.max_tokens,
                                       labels=not args.text_only)
        return kind, messages, record, answer_ids

    started, tokens, answered = time.perf_counter(), 0, 0
    pending: list[str] = []  # conversations written with the records that hold them
    finished: dict[int, Finished] = {}  # done, waiting for an earlier prompt to finish
    written = start  # the next prompt to write: files hold a prefix of the prompts
    tasks = ((i, conversation(i)) for i in range(start, end))
    with text_path.open("a", encoding="utf-8") as text:
        for index, done in run_tasks(runners, tasks, loaded.eos_ids, args.top_k):
            finished[index] = done
            while written in finished:
                kind, messages, record, answer_ids = finished.pop(written)
                if record is not None:
                    records.append(record)
                tokens += len(answer_ids)
                reply = tok.decode(answer_ids, skip_special_tokens=True)
                entry: dict[str, Any] = {"kind": kind, "prompt": written}
                if args.invent:
                    entry["seed"] = args.seed
                entry["messages"] = [*messages, {"role": "assistant", "content": reply}]
                pending.append(json.dumps(entry, ensure_ascii=False))
                written += 1
                answered += 1
            if len(pending) >= args.save_every or (written == end and pending):
                text.write("".join(line + "\n" for line in pending))
                text.flush()
                if not args.text_only:  # after the text: a crash between leaves extra lines
                    save_records(args.out, records, args.skip)
                pending.clear()
            rate = tokens / (time.perf_counter() - started)
            sys.stderr.write(f"\ranswered {start + answered} prompts, {rate:.1f} answer tok/s ")
    sys.stderr.write("\n")
    log.info("%d answers in %s", start - args.skip + answered,
             text_path if args.text_only else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
