"""The target's own answers as head-training data: ``python -m engine.heads.answers``.

Contract: :func:`prompts` builds a fixed, shuffled list of chat prompts of the four kinds
the appliance serves (code to write, code to edit, a document to summarise, free chat)
from the Python standard library's source and from hand-written office topics; none is a
benchmark or demo prompt. :func:`answer` lets the target answer one prompt greedily (the
plain loop on a :class:`~engine.spec.runner.ModelRunner`, so the answer is exactly the
target's) and records, for every position of prompt + answer, the target's final normed
hidden state and its top-``k`` next-token probabilities: the same labels
:func:`engine.heads.train.extract` computes, taken from the run itself, so no second
target pass is needed. :func:`answer_batch` answers several prompts together, one
batched step per token for all of them (the weights read once for all; the same answers,
bit for bit, where the forward runs natively). The command appends records to ``--out`` (a
``torch.save`` file, rewritten atomically every few answers, resumed by a rerun; with
``--skip N`` it starts at prompt ``N``) and the conversations as JSON lines to ``--out`` +
``.jsonl``; ``train --answers FILE`` trains on them. With ``--text-only`` only the
conversations are written (each line names its prompt, and a rerun resumes after the last
one): the way a cheaper model (the draft model) writes chats for teacher forcing
(``train --conversations FILE.jsonl``), where its own labels would be of no use. With
``--invent`` (and ``--text-only``) the model also writes the questions
(:func:`invent_questions`, after Magpie: it continues its chat template where the user's
message begins, at temperature 1 over its top-``k``, the questions opening with the
``OPENERS`` in turn, each drawn again, up to three times, when it is not mostly in Latin
letters): varied prompts that no template makes, each reproducible from ``--seed`` and
its index.

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
from collections.abc import Callable, Iterator, Sequence
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


@torch.inference_mode()
def answer_batch(runners: Sequence[ModelRunner], prompts: Sequence[list[int]], max_tokens: int,
                 eos_ids: frozenset[int], top_k: int,
                 generators: Sequence[torch.Generator] | None = None,
                 ) -> list[tuple[Record, list[int]]]:
    """Greedy answers to several prompts at once, as :func:`answer` gives them one by one.

    With ``generators`` (one per prompt) each token is drawn instead from that step's
    top-``top_k`` probabilities (temperature 1), with the prompt's own generator, so a
    prompt's continuation does not depend on the others in its batch.

    Each prompt is filled by its own runner (one per prompt, all on the same model), then
    every answer still going gets its next token from one
    :meth:`~engine.cpu.forward.Forward.step_many` over all of them: the weights are read once
    per step for the whole batch, and each answer's numbers are bit for bit :func:`answer`'s
    where the forward runs natively (elsewhere each answer is stepped on its own).
    """
    if not runners or len(runners) < len(prompts):
        raise ValueError("batched answers need one runner per prompt")
    if generators is not None and len(generators) != len(prompts):
        raise ValueError("sampled answers need one generator per prompt")
    model_forward = runners[0].model_forward
    going = []
    for n, (runner, prompt) in enumerate(zip(runners, prompts, strict=False)):
        runner.reset()
        runner.keep_hidden(True)
        top_ids, top_probs = _top(runner.forward(prompt, rows=len(prompt)), top_k)  # [T, K]
        assert runner.hidden is not None
        going.append(_Going(runner.cache, list(prompt), [], [top_ids], [top_probs],
                            [runner.hidden], None if generators is None else generators[n]))
    active = list(going)
    while active:
        for a in active:
            token = a.next_token()
            a.ids.append(token)
            a.answer.append(token)
        active = [a for a in active if token_goes_on(a.answer, eos_ids, max_tokens)]
        if not active:
            break
        outs = model_forward.step_many([([a.ids[-1]], a.cache) for a in active], keep=True)
        for a, (logits, hidden) in zip(active, outs, strict=True):  # [1, V], [1, H]
            top_ids, top_probs = _top(logits, top_k)
            a.top_ids.append(top_ids)
            a.top_probs.append(top_probs)
            assert hidden is not None
            a.hidden.append(hidden)
    return [a.record() for a in going]


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
    found: dict[int, list[int]] = {}
    for attempt in range(tries):
        todo = [n for n, i in enumerate(indices) if i not in found]
        if not todo:
            break
        generators = [torch.Generator().manual_seed((seed * 1_000_003 + indices[n]) * 31
                                                    + attempt) for n in todo]
        written = answer_batch(runners, [starts[n] for n in todo], max_tokens, eos_ids, top_k,
                               generators)
        for n, (_, ids) in zip(todo, written, strict=True):
            i = indices[n]
            question = [t for t in ids if t not in eos_ids]  # after the start
            if keep(question) or attempt == tries - 1:
                found[i] = question
    return [found[i] for i in indices]


def mostly_latin(text: str, share: float = 0.95) -> bool:
    """Whether at least ``share`` of the text's letters are ASCII (office questions in
    English; the models also write Chinese and other scripts when left to themselves)."""
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) >= share * len(letters)


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
                   help="answers generated together (1: one by one, exactly as plain decoding)")
    p.add_argument("--skip", type=int, default=0,
                   help="start at this prompt of the list (the head to fine-tune has seen those "
                        "before it)")
    p.add_argument("--text-only", action="store_true",
                   help="write only the conversations (FILE.jsonl), not the labels: for chats "
                        "written by another model, to be teacher-forced through the target")
    p.add_argument("--invent", action="store_true",
                   help="answer questions the model writes itself (Magpie) instead of the "
                        "shipped list: varied prompts no template makes; with --text-only")
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
    if args.invent and not args.text_only:
        p.error("--invent writes conversations only: add --text-only")
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
        start = args.skip + len(records)
    from engine.heads.train import load_target

    loaded = load_target(args.target, args.data_dir, args.accel)
    runners, tok = [ModelRunner(loaded.model) for _ in range(args.batch)], loaded.tokenizer
    batched = args.batch > 1
    listed = [] if args.invent else prompts()
    end = args.skip + args.prompts if args.invent else min(args.skip + args.prompts, len(listed))
    prefix = user_turn_prefix(tok) if args.invent else []
    started, tokens, answered = time.perf_counter(), 0, 0
    pending: list[str] = []  # conversations written with the records that hold them
    with text_path.open("a", encoding="utf-8") as text:
        for at in range(start, end, args.batch):
            indices = range(at, min(at + args.batch, end))
            if args.invent:
                opened = [tok.encode(OPENERS[i % len(OPENERS)], add_special_tokens=False)
                          for i in indices]
                asked = invent_questions(
                    runners, [prefix + o for o in opened], loaded.eos_ids, indices, args.seed,
                    args.question_tokens, args.top_k,
                    lambda q: mostly_latin(tok.decode(q, skip_special_tokens=True)))
                chunk = [("invented", tok.decode(o + q, skip_special_tokens=True).strip())
                         for o, q in zip(opened, asked, strict=True)]
            else:
                chunk = listed[at : indices.stop]
            chats = [[{"role": "user", "content": prompt}] for _, prompt in chunk]
            ids = [prompt_ids(tok, m) for m in chats]
            if batched:
                done = answer_batch(runners, ids, args.max_tokens, loaded.eos_ids, args.top_k)
            else:
                done = [answer(runners[0], one, args.max_tokens, loaded.eos_ids, args.top_k)
                        for one in ids]
            for n, ((kind, _), messages, (record, answer_ids)) in enumerate(
                    zip(chunk, chats, done, strict=True)):
                if not args.text_only:
                    records.append(record)
                tokens += len(answer_ids)
                reply = tok.decode(answer_ids, skip_special_tokens=True)
                entry: dict[str, Any] = {"kind": kind, "prompt": at + n}
                if args.invent:
                    entry["seed"] = args.seed
                entry["messages"] = [*messages, {"role": "assistant", "content": reply}]
                pending.append(json.dumps(entry, ensure_ascii=False))
            answered += len(chunk)
            if len(pending) >= args.save_every or indices.stop == end:
                if not args.text_only:
                    save_records(args.out, records, args.skip)
                text.write("".join(line + "\n" for line in pending))
                text.flush()
                pending.clear()
            rate = tokens / (time.perf_counter() - started)
            sys.stderr.write(f"\ranswered {start + answered} prompts, {rate:.1f} answer tok/s ")
    sys.stderr.write("\n")
    log.info("%d answers in %s", start - args.skip + answered,
             text_path if args.text_only else args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
