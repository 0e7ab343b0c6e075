"""Token frequencies of the target's outputs, for trimmed draft vocabularies:
``python -m engine.heads.vocab``.

Contract: :func:`build` counts, for one tokenizer, how often each token id occurs in four
offline sources and writes a frequency-ranked list of ids (:class:`engine.spec.drafters.vocab.
Ranking`, ``assets/heads/<name>.vocab.safetensors``: int32 ids, most frequent first, with
the tokenizer's hash, the sources, their licences and token counts as metadata). Each
source's counts are divided by its own total before they are added, so each weighs the
same whatever its size:

* ``code``: the Python source of permissively licensed packages installed in this
  interpreter's environment (:data:`PACKAGES`, at most ``--code-chars`` characters each,
  licences read from their metadata and recorded), tokenized as text;
* ``docs``: English prose about code: the Python reference's topics (``pydoc_data``, PSF
  licence) and the same packages' descriptions (their metadata), tokenized as text;
* ``target-code``: the target's greedy next token, teacher-forced, at every answer position
  of the standard-library corpus (``assets/heads/corpus.jsonl``, PSF licence): what the
  target would write there;
* ``target-chat``: the target's own greedy answers to chat prompts (``--chat FILE``: the
  ``.jsonl`` conversations :mod:`engine.heads.answers` writes), their answer text tokenized:
  exactly the target's outputs;

plus a prior for what the samples miss: ``--prior-weight`` times the shares ``1 / (id +
PRIOR_OFFSET)`` (normalised), since BPE ids follow merge order (low ids are frequent in the
tokenizer's own training text), so ids never seen in the samples follow in id order.

Commands: ``build`` counts and writes the asset; ``held-out`` turns the tail of an
answers file into a held-out file (records with a ``.json`` of kinds beside them);
``measure`` reports, per kept size and kind (code, summary, chat), the share of held-out
answer tokens kept, the draft model's and the EAGLE head's accepted drafts per greedy chain
(teacher-forced replays, see :mod:`engine.tools.replay`) and the draft step costs, timed
interleaved in one process. None of the benchmark's or demo's prompts is counted; they are
held out for ``measure`` (docs/vocab.md has the commands and figures).
"""

import argparse
import importlib.metadata as md
import json
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.heads import corpus as corpus_mod
from engine.spec.drafters.vocab import ASSETS, SUFFIX, Ranking, save_ranking, tokenizer_hash

log = logging.getLogger(__name__)

# Distributions whose Python source is counted: MIT, BSD, Apache-2.0 or PSF (checked again
# against their metadata at run time; one that is missing or not permissive is skipped).
PACKAGES = (
    "requests", "urllib3", "click", "rich", "pydantic", "fastapi", "starlette", "Jinja2",
    "Pygments", "packaging", "setuptools", "pytest", "attrs", "networkx", "sympy", "numpy",
    "transformers", "huggingface_hub", "psutil", "platformdirs", "idna", "python-dateutil",
    "uvicorn", "anyio", "filelock", "typer", "PyYAML", "tabulate", "h11", "sortedcontainers",
    "mypy", "accelerate", "openai", "aiohttp", "fsspec", "markdown-it-py", "diskcache",
    "sqlite-utils", "typing_extensions", "pluggy", "charset-normalizer", "safetensors",
)
PERMISSIVE = ("MIT", "BSD", "APACHE", "PSF", "PYTHON SOFTWARE FOUNDATION", "0BSD", "ISC")
NOT_PERMISSIVE = ("GPL", "MPL", "MOZILLA", "EUPL", "CDDL")


def licence(dist: md.Distribution) -> str:
    """A distribution's declared licence (expression, field or classifiers)."""
    meta: Any = dist.metadata  # an email.message.Message underneath
    found = meta.get("License-Expression") or ""
    if not found:
        classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                       if c.startswith("License ::")]
        found = " AND ".join(classifiers) or (meta.get("License") or "").split("\n")[0]
    return found.strip()[:80]


def permissive(text: str) -> bool:
    upper = text.upper()
    return any(p in upper for p in PERMISSIVE) and not any(n in upper for n in NOT_PERMISSIVE)


@dataclass(frozen=True)
class Package:
    """One counted distribution."""

    name: str
    version: str
    licence: str
    files: tuple[Path, ...]


def packages(names: Sequence[str] = PACKAGES) -> Iterator[Package]:
    """The installed, permissively licensed distributions of ``names`` with their ``.py``
    files (sorted; skipped ones are logged)."""
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            log.info("skipping %s: not installed", name)
            continue
        lic = licence(dist)
        if not permissive(lic):
            log.info("skipping %s: licence %r", name, lic)
            continue
        files = sorted(Path(str(f.locate())) for f in dist.files or () if str(f).endswith(".py"))
        yield Package(dist.metadata["Name"], dist.version, lic, tuple(f for f in files
                                                                      if f.is_file()))


def spread(files: Sequence[Path], parts: int) -> list[Path]:
    """``files`` reordered to spread over the whole list: every ``len // parts``-th file
    first, then the ones after those, and so on, so that the first ``parts`` of them do
    not all come from one big subpackage."""
    step = max(1, len(files) // parts)
    return [f for s in range(step) for f in files[s::step]]


def code_texts(package: Package, max_chars: int) -> Iterator[str]:
    """Source files of ``package`` until ``max_chars`` characters are given, spread over the
    package (:func:`spread`) so one big subpackage does not fill the budget."""
    left = max_chars
    for path in spread(package.files, 64):
        if left <= 0:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield text[:left]
        left -= len(text)


def count_text(tokenizer: Any, texts: Iterator[str], vocab_size: int) -> np.ndarray:
    """Token counts ``[vocab_size]`` int64 of ``texts`` tokenized without special tokens."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[:vocab_size]
    return counts


def answer_spans(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], int]:
    """A chat-templated conversation's ids and where its last assistant answer begins."""
    from engine.heads.answers import prompt_ids
    from engine.heads.train import chat_ids

    return chat_ids(tokenizer, messages), len(prompt_ids(tokenizer, messages[:-1]))


@torch.inference_mode()
def count_target(model: Any, tokenizer: Any, conversations: Sequence[list[dict[str, str]]],
                 vocab_size: int, max_tokens: int, max_len: int = 768) -> tuple[np.ndarray, int]:
    """Counts ``[vocab_size]`` of the target's greedy next token at each answer position of
    ``conversations`` (teacher-forced: one prompt reading per conversation, at most
    ``max_len`` tokens), until ``max_tokens`` positions are counted; and the positions
    counted."""
    from engine.spec.runner import ModelRunner

    runner = ModelRunner(model)
    counts = np.zeros(vocab_size, dtype=np.int64)
    done, started = 0, time.perf_counter()
    for i, messages in enumerate(conversations):
        if done >= max_tokens:
            break
        if not messages or messages[-1].get("role") != "assistant":
            continue
        ids, start = answer_spans(tokenizer, messages)
        ids = ids[:max_len]
        if start >= len(ids):
            continue
        runner.reset()
        logits = runner.forward(ids, rows=len(ids) - start + 1)  # [rows, V]
        greedy = logits[:-1].argmax(-1).numpy()  # the target's token at each answer position
        counts += np.bincount(greedy, minlength=vocab_size)[:vocab_size]
        done += len(greedy)
        if i % 16 == 15:
            log.info("target: %d answer positions, %.0f tok/s", done,
                     done / (time.perf_counter() - started))
    return counts, done


def read_chats(paths: Sequence[Path]) -> list[list[dict[str, str]]]:
    """Conversations of :mod:`engine.heads.answers`' ``.jsonl`` files (or corpus files)."""
    found = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                found.append(record["messages"] if isinstance(record, dict) else record)
    return found


PRIOR_OFFSET = 3000
PRIOR_WEIGHT = 2.0


def rank(shares: Sequence[np.ndarray], prior_weight: float = 0.0,
         offset: int = PRIOR_OFFSET) -> np.ndarray:
    """Every id, by the sum of each source's count / its total, plus ``prior_weight`` times
    the id-order prior ``1 / (id + offset)`` (normalised): most frequent first, ties by
    lower id; without a prior only ids counted at least once."""
    total = np.sum([s / max(1, s.sum()) for s in shares], axis=0)
    if prior_weight > 0:
        prior = 1.0 / (np.arange(len(total)) + offset)
        total = total + prior_weight * prior / prior.sum()
    order = np.lexsort((np.arange(len(total)), -total))
    return order[total[order] > 0]


def coverage(ids: torch.Tensor, tokens: torch.Tensor) -> float:
    """Share of ``tokens`` inside ``ids``."""
    if not len(tokens):
        return float("nan")
    return float(torch.isin(tokens, ids).float().mean())


@dataclass
class Counts:
    """Per-source counts and what they came from."""

    counts: dict[str, np.ndarray]
    sources: dict[str, Any]


def doc_texts(pkgs: Sequence[Package]) -> Iterator[str]:
    """The Python reference's topics, then each package's description."""
    try:
        from pydoc_data import topics  # type: ignore[import-not-found]

        yield from topics.topics.values()
    except ImportError:
        log.info("no pydoc_data in this Python: its topics are not counted")
    for p in pkgs:
        meta: Any = md.distribution(p.name).metadata
        yield str(meta.get_payload() or meta.get("Description") or "")


def build(loaded: Any, chat: Sequence[Path], code_chars: int, target_tokens: int,
          chat_count: int | None = None, corpus: Path = corpus_mod.DEFAULT) -> Counts:
    """Count the sources of the module docstring for the loaded target (of the chat
    files, the first ``chat_count`` conversations of each)."""
    tok, model = loaded.tokenizer, loaded.model
    vocab = int(model.get_output_embeddings().out_features)
    pkgs = list(packages())
    started = time.perf_counter()
    code = np.zeros(vocab, dtype=np.int64)
    listed = []
    for p in pkgs:
        c = count_text(tok, code_texts(p, code_chars), vocab)
        code += c
        listed.append({"name": p.name, "version": p.version, "licence": p.licence,
                       "tokens": int(c.sum())})
    docs = count_text(tok, doc_texts(pkgs), vocab)
    log.info("code and docs: %d + %d tokens of %d packages in %.0f s", code.sum(), docs.sum(),
             len(pkgs), time.perf_counter() - started)
    target_code, n_code = count_target(model, tok, corpus_mod.load(corpus), vocab,
                                       target_tokens)
    chats = [c for path in chat for c in read_chats([path])[:chat_count]]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    target_chat = count_text(tok, (m[-1]["content"] for m in chats if m), vocab)
    if isinstance(end, int) and 0 <= end < vocab:
        target_chat[end] += len(chats)  # each answer ends its turn
    sources = {
        "code": {"what": "Python source of installed packages, tokenized",
                 "chars_per_package": code_chars, "packages": listed, "tokens": int(code.sum())},
        "docs": {"what": "pydoc_data topics (PSF) and the packages' descriptions, tokenized",
                 "tokens": int(docs.sum())},
        "target-code": {"what": "target's greedy token, teacher-forced over answers of "
                                f"{corpus.name} (CPython 3.11 standard library, PSF licence)",
                        "tokens": n_code},
        "target-chat": {"what": "target's own greedy answers (engine.heads.answers) in "
                                + ", ".join(p.name for p in chat),
                        "conversations": len(chats), "tokens": int(target_chat.sum())},
    }
    return Counts({"code": code, "docs": docs, "target-code": target_code,
                   "target-chat": target_chat}, sources)


@dataclass
class Held:
    """One held-out answer: the target's record (prompt + answer) and where the answer starts."""

    kind: str
    ids: torch.Tensor  # [L] prompt + answer (the last answer token not fed)
    hidden: torch.Tensor  # [L, H] target features
    top_ids: torch.Tensor  # [L, K] target's top next tokens
    start: int  # index of the first answer token in ``ids``
    answer: torch.Tensor  # [A] the whole answer


def held_out_records(path: Path) -> list[Held]:
    """The records of an :mod:`engine.heads.answers`-format file with their kinds (``.json``
    beside it: ``kind``, ``prompt_ids``, ``answer_ids`` per record)."""
    from engine.heads import answers

    rows = json.loads(path.with_suffix(".json").read_text())
    return [Held(row["kind"], r.ids.long(), r.hidden.float(), r.top_ids.long(),
                 len(row["prompt_ids"]), torch.tensor(row["answer_ids"], dtype=torch.long))
            for r, row in zip(answers.load_records(path), rows, strict=True)]


def kinds_file(tokenizer: Any, path: Path, first: int, kind: str, out: Path) -> None:
    """Records ``first ..`` of an :mod:`engine.heads.answers` file (prompts from its
    ``.jsonl``) written as a held-out file of ``kind`` (:func:`held_out_records`)."""
    from engine.heads import answers

    records = answers.load_records(path)[first:]
    chats = read_chats([path.with_name(path.name + ".jsonl")])[first:]
    rows = []
    for r, messages in zip(records, chats, strict=False):
        prompt = answers.prompt_ids(tokenizer, messages[:-1])
        if r.ids[: len(prompt)].tolist() != prompt:
            raise SystemExit(f"{path}: a record does not start with its conversation's prompt")
        rows.append({"kind": kind, "prompt_ids": prompt,
                     "answer_ids": [*r.ids[len(prompt):].tolist(), int(r.top_ids[-1, 0])]})
    answers.save_records(out, records[: len(rows)])
    out.with_suffix(".json").write_text(json.dumps(rows))


def masks(variants: dict[str, torch.Tensor], vocab: int) -> dict[str, torch.Tensor]:
    """Kept ids -> boolean masks ``[V]``."""
    out = {}
    for name, ids in variants.items():
        m = torch.zeros(vocab, dtype=torch.bool)
        m[ids[ids < vocab]] = True
        out[name] = m
    return out


def chains(guess: torch.Tensor, confident: torch.Tensor, right: torch.Tensor, k: int
           ) -> tuple[float, float]:
    """Accepted and drafted tokens summed over greedy chains of up to ``k`` drafts.

    ``guess``/``confident``/``right`` ``[S, C]``: at step ``s`` of chain ``c`` whether the
    draft equals the target's token, whether the drafter would go on after it (its
    confidence at least the stop), and whether the text there is the target's. A chain is
    accepted while drafts are right; it drafts on while confident (teacher-forced: what it
    drafts after its first miss is not known, so those steps count as drafted while the
    teacher-forced confidence says so)."""
    alive = torch.ones(guess.shape[1], dtype=torch.bool)
    going = torch.ones(guess.shape[1], dtype=torch.bool)
    accepted = drafted = 0.0
    for s in range(min(k, guess.shape[0])):
        drafted += float(going.sum())
        alive = alive & going & guess[s] & right[s]
        accepted += float(alive.sum())
        going = going & confident[s]
    return accepted, drafted


@torch.inference_mode()
def draft_model_acceptance(runner: Any, held: Sequence[Held], variants: dict[str, torch.Tensor],
                           k: int = 4, stop: float = 0.8) -> dict[tuple[str, str], list[float]]:
    """Per (kind, variant): [accepted, drafted, chains] of the draft model's greedy chains
    from every answer position, teacher-forced (see :mod:`engine.tools.replay`: exact for the
    accepted length), its logits restricted to each variant's ids."""
    out: dict[tuple[str, str], list[float]] = {}
    for h in held:
        full = torch.cat([h.ids[: h.start], h.answer])  # [L + 1]
        runner.reset()
        logits = runner.forward(full[:-1].tolist(), rows=len(h.answer))  # [A, V] -> answer
        vocab = logits.shape[-1]
        n = len(h.answer)
        for name, mask in masks(variants, vocab).items():
            masked = logits.masked_fill(~mask, -torch.inf)
            probs = masked.softmax(-1)
            conf, guess = probs.max(-1)  # [A] prediction of answer token t
            hit = guess == h.answer
            c = max(0, n - k + 1)  # chains starting at answer token a, checked to a + k - 1
            idx = torch.arange(c)[None, :] + torch.arange(k)[:, None]  # [k, C]
            acc, dra = chains(hit[idx], conf[idx] >= stop, torch.ones_like(hit[idx]), k)
            row = out.setdefault((h.kind, name), [0.0, 0.0, 0.0])
            row[0] += acc
            row[1] += dra
            row[2] += c
    return out


@torch.inference_mode()
def eagle_acceptance(head: Any, embed: Any, lm_head: Any, held: Sequence[Held],
                     variants: dict[str, torch.Tensor], k: int = 4, stop: float = 0.3
                     ) -> dict[tuple[str, str], list[float]]:
    """Per (kind, variant): [accepted, drafted, chains] of the EAGLE head's greedy chains
    from every answer position, as :func:`engine.heads.train.held_out` counts them (the
    head's own features fed back, the text teacher-forced), its logits restricted to each
    variant's ids and stopped after a draft below ``stop`` confidence."""
    from engine.heads.model import draft_steps

    out: dict[tuple[str, str], list[float]] = {}
    for h in held:
        ids, top = h.ids, h.top_ids[:, 0]
        greedy = top[:-1] == ids[1:]  # [n] token t + 1 is the target's greedy choice
        n = len(ids) - 1
        first = max(0, h.start - 2)  # row j drafts token j + 2 first: chains in the answer
        c = max(0, n - k - first)
        if c <= 0:
            continue
        embeds = embed(ids[None, 1:]).float()  # [1, n, H]
        preds = [p[0] for p in draft_steps(head, h.hidden[None, :-1], embeds, k)]
        j = torch.arange(first, first + c)
        logits = [lm_head(p[j]) for p in preds]  # [C, V] per step: step s drafts token j + s + 1
        for name, mask in masks(variants, logits[0].shape[-1]).items():
            hit, conf, right = [], [], []
            for s, step in enumerate(logits, 1):
                probs = step.masked_fill(~mask, -torch.inf).softmax(-1)
                cs, gs = probs.max(-1)
                hit.append(gs == top[j + s])
                conf.append(cs >= stop)
                right.append(greedy[j + s])
            acc, dra = chains(torch.stack(hit), torch.stack(conf), torch.stack(right), k)
            row = out.setdefault((h.kind, name), [0.0, 0.0, 0.0])
            row[0] += acc
            row[1] += dra
            row[2] += c
    return out


def median_ms(fn: Any, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def interleaved(cases: dict[str, Any], rounds: int, reps: int) -> dict[str, float]:
    """Median milliseconds of each callable, the cases taking turns round by round (a slow
    spell of a shared machine falls on all alike)."""
    seen: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            seen[name] += median_ms(cases[name], reps)
    return {name: float(np.median(v)) for name, v in seen.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.heads.vocab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--accel", default="auto")
    p.add_argument("--data-dir", default=None)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="count the sources and write the ranked ids")
    b.add_argument("--name", default="qwen2.5", help=f"asset name: assets/heads/NAME{SUFFIX}")
    b.add_argument("--out", type=Path, default=None, help="file to write (default: the asset)")
    b.add_argument("--chat", type=Path, nargs="*", default=[],
                   help="chat answers (.jsonl of engine.heads.answers) to teacher-force")
    b.add_argument("--chat-count", type=int, default=None,
                   help="read only the first N conversations of each --chat file")
    b.add_argument("--code-chars", type=int, default=400_000)
    b.add_argument("--target-tokens", type=int, default=40_000,
                   help="answer positions teacher-forced per target source")
    b.add_argument("--keep", type=int, default=65536, help="ids kept in the ranking")
    b.add_argument("--prior-weight", type=float, default=PRIOR_WEIGHT,
                   help="weight of the id-order prior against each source's 1")
    b.add_argument("--counts", type=Path, default=None,
                   help="cache of the counts (.npz): reused when present")
    k = sub.add_parser("held-out", help="make a held-out file from an answers file's tail")
    k.add_argument("answers", type=Path)
    k.add_argument("--first", type=int, required=True)
    k.add_argument("--kind", required=True)
    k.add_argument("--out", type=Path, required=True)
    m = sub.add_parser("measure", help="coverage, acceptance and step costs per kept size")
    m.add_argument("--held-out", type=Path, nargs="+", required=True,
                   help="held-out answers (records with a .json of kinds beside them)")
    m.add_argument("--ranking", type=Path, default=ASSETS / f"qwen2.5{SUFFIX}")
    m.add_argument("--sizes", type=int, nargs="+", default=[16384, 24576, 32768])
    m.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    m.add_argument("--rounds", type=int, default=9, help="interleaved timing rounds")
    m.add_argument("--reps", type=int, default=10, help="timed calls per case and round")
    m.add_argument("--skip-acceptance", action="store_true")
    return p.parse_args(argv)


GROUPS = {"code": ("code completion", "code editing", "held-out code"),
          "chat": ("free chat", "held-out chat"), "summary": ("summary",)}


def group_of(kind: str) -> str:
    return next((g for g, kinds in GROUPS.items() if kind in kinds), kind)


def grouped(table: dict[tuple[str, str], list[float]]) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for (kind, name), row in table.items():
        acc = out.setdefault((group_of(kind), name), [0.0] * len(row))
        for i, v in enumerate(row):
            acc[i] += v
    return out


def layer_bytes(layer: Any) -> int:
    """Bytes of a layer's tensors (parameters and buffers)."""
    return sum(t.numel() * t.element_size() for t in [*layer.parameters(), *layer.buffers()])


def _build(args: argparse.Namespace, loaded: Any) -> int:
    if args.counts is not None and args.counts.is_file():
        saved = np.load(args.counts, allow_pickle=False)
        counts = Counts({k: saved[k] for k in saved.files if k != "sources"},
                        json.loads(str(saved["sources"])))
    else:
        counts = build(loaded, args.chat, args.code_chars, args.target_tokens, args.chat_count)
        if args.counts is not None:
            arrays: dict[str, Any] = {"sources": np.array(json.dumps(counts.sources)),
                                      **counts.counts}
            np.savez(args.counts, **arrays)
    shares = list(counts.counts.values())
    ranked = torch.from_numpy(rank(shares, args.prior_weight)[: args.keep].copy())
    counted = int((np.sum(shares, axis=0) > 0).sum())
    info = {"target": loaded.name, "sources": counts.sources, "counted_ids": counted,
            "ranking": f"sum over sources of count / source total, plus {args.prior_weight} x "
                       f"the prior 1 / (id + {PRIOR_OFFSET}) normalised; ties by lower id",
            "tool": "python -m engine.heads.vocab build"}
    out = args.out or ASSETS / f"{args.name}{SUFFIX}"
    save_ranking(out, Ranking(ranked, tokenizer_hash(loaded.tokenizer), info))
    print(f"wrote {out}: {len(ranked)} ids ({counted} counted); "
          + ", ".join(f"{k} {v['tokens']:,} tokens" for k, v in counts.sources.items()))
    return 0


def _measure(args: argparse.Namespace, target: Any) -> int:
    from engine.heads.files import find_head, load_head
    from engine.models import cache
    from engine.models.loading import load_prepared
    from engine.spec.drafters.draft_model import DraftModelDrafter
    from engine.spec.drafters.eagle import EagleDrafter, quantize_head
    from engine.spec.drafters.vocab import load_ranking, short_head
    from engine.spec.runner import ModelRunner

    ranking = load_ranking(args.ranking)
    if ranking.tokenizer_sha256 != tokenizer_hash(target.tokenizer):
        raise SystemExit(f"{args.ranking} was made for another tokenizer")
    held = [h for path in args.held_out for h in held_out_records(path)]
    eos = sorted(target.eos_ids)
    extra = torch.tensor(eos, dtype=torch.long)
    variants = {"ids < 65,536": torch.cat([torch.arange(65536), extra]).unique()}
    for n in args.sizes:
        variants[f"top {n:,}"] = torch.cat([ranking.top(n), extra]).unique()
    print(f"`uptime` at start: {uptime()}")
    print("\n### Coverage (share of held-out answer tokens inside the kept ids)\n")
    tokens: dict[str, list[torch.Tensor]] = {}
    for h in held:
        tokens.setdefault(group_of(h.kind), []).append(h.answer)
    groups = {g: torch.cat(t) for g, t in tokens.items()}
    print("| kept ids | " + " | ".join(f"{g} ({len(t):,} tokens)" for g, t in groups.items())
          + " |\n|---|" + "---|" * len(groups))
    for name, ids in variants.items():
        print(f"| {name} | " + " | ".join(f"{coverage(ids, t):.4f}" for t in groups.values())
              + " |")
    draft = load_prepared(cache.prepare(args.draft, args.data_dir), "float32", args.accel)
    head_path = find_head(target.name, args.data_dir)
    assert head_path is not None, "no EAGLE head for the target"
    head, _ = load_head(head_path, target.name, target.sha256, target.model)
    if not args.skip_acceptance:
        # every variant's ids in one gathered int4 head (as drafting rounds them): the
        # masks below pick each variant's logits out of it
        union = torch.cat(list(variants.values())).unique()
        dm = ModelRunner(draft.model, short_head(draft.model.get_output_embeddings(), [],
                                                 int4=True, ids=union))
        dm_table = grouped(draft_model_acceptance(dm, held, variants))
        del dm
        full_head = short_head(target.model.get_output_embeddings(), [], int4=True, ids=union)
        eagle_table = grouped(eagle_acceptance(head, target.model.get_input_embeddings(),
                                               full_head, held, variants))
        del full_head
        for title, table in (("draft model (0.5B, stop at 0.8)", dm_table),
                             ("EAGLE head (stop at 0.3)", eagle_table)):
            print(f"\n### Acceptance, {title}: accepted per 4-token greedy chain "
                  "(accepted / drafted)\n")
            print("| kept ids | " + " | ".join(groups) + " |\n|---|" + "---|" * len(groups))
            for name in variants:
                cells = []
                for g in groups:
                    acc, dra, n = table.get((g, name), [0.0, 0.0, 0.0])
                    cells.append(f"{acc / max(1, n):.3f} ({acc / max(1, dra):.3f})")
                print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\n### Draft step cost (ms, medians of {args.rounds} interleaved rounds x "
          f"{args.reps} calls)\n")
    context = held[0].ids[:256].tolist()
    quantized = quantize_head(head)
    setups: dict[str, dict[str, Any]] = {"full vocabulary": {"draft_vocab": 1 << 30}}
    setups["ids < 65,536"] = {"draft_vocab": 65536}
    for n in args.sizes:
        setups[f"top {n:,}"] = {"draft_vocab": n, "tokenizer": target.tokenizer}
    import psutil

    rss = psutil.Process().memory_info().rss
    eagles, drafts, info = {}, {}, {}
    for name, kw in setups.items():
        eagles[name] = EagleDrafter(quantized, target.model, keep_ids=eos, **kw)
        drafts[name] = DraftModelDrafter(draft, target.vocab_size, draft_vocab=kw["draft_vocab"],
                                         ranked_vocab="tokenizer" in kw)
        now = psutil.Process().memory_info().rss
        info[name] = (layer_bytes(eagles[name].lm_head), (now - rss) / 2**20)
        rss = now
    runner = ModelRunner(target.model)
    runner.forward(context, rows=1)
    x = held[0].hidden[100:101]  # a real feature [1, H]
    for d in drafts.values():
        d.runner.forward(context, rows=1)
    cases: dict[str, Any] = {}

    def target_step() -> None:
        runner.forward(context[-1:])
        runner.truncate(len(context))

    cases["target step"] = target_step
    for name in setups:
        cases[f"eagle lm_head {name}"] = lambda e=eagles[name]: e.lm_head(x)

        def draft_step(d: Any = drafts[name]) -> None:
            d.runner.forward(context[-1:])
            d.runner.truncate(len(context))

        cases[f"draft model step {name}"] = draft_step
    eagle = eagles["full vocabulary"]
    eagle.features = held[0].hidden[:len(context)]
    eagle.prefill(context)

    def head_layer() -> None:
        eagle._step(x, [context[-1]])
        eagle.kv.truncate(len(context) - 2)

    cases["eagle head layer"] = head_layer
    with torch.inference_mode():
        times = interleaved(cases, args.rounds, args.reps)
    t1, layer = times["target step"], times["eagle head layer"]
    full_e = times["eagle lm_head full vocabulary"]
    full_d = times["draft model step full vocabulary"]
    print(f"target step {t1:.2f} ms; EAGLE head layer {layer:.2f} ms\n")
    print("| kept ids | EAGLE lm_head ms (× full) | EAGLE draft step / target step | "
          "draft model step ms (× full) | draft step / target step | EAGLE lm_head MB | "
          "RSS growth MB |\n|---|---|---|---|---|---|---|")
    for name in setups:
        e_ms, d_ms = times[f"eagle lm_head {name}"], times[f"draft model step {name}"]
        print(f"| {name} | {e_ms:.2f} ({e_ms / full_e:.2f}) | {(layer + e_ms) / t1:.3f} | "
              f"{d_ms:.2f} ({d_ms / full_d:.2f}) | {d_ms / t1:.3f} | {info[name][0] / 2**20:.1f} | "
              f"{info[name][1]:.0f} |")
    print(f"\n`uptime` at end: {uptime()}")
    return 0


def uptime() -> str:
    import subprocess

    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from engine.heads.train import load_target

    loaded = load_target(args.target, args.data_dir, args.accel)
    if args.command == "build":
        return _build(args, loaded)
    if args.command == "held-out":
        kinds_file(loaded.tokenizer, args.answers, args.first, args.kind, args.out)
        return 0
    return _measure(args, loaded)


if __name__ == "__main__":
    sys.exit(main())
