"""Teacher-forced head training that streams: ``python -m engine.heads.stream``.

Contract: the target reads chat conversations window by window (teacher forcing: the
engine's own forward at prompt-reading speed, far faster than the target writes), and each
window's features (with the fused layers' residual streams for an EAGLE-3 head) and
top-``k`` next-token probabilities go into a bounded replay buffer that the head trains
from; nothing but the checkpoint is written, so the data can be as large as the time
allows. A rerun with the same arguments resumes: the checkpoint holds the head, the
optimiser, the step and how many windows were read, and the window order is a pure
function of the sources and the seed. The first ``--held-out`` windows are kept aside
(``FILE.held.pt``) for the held-out figures written into the head file.

Sources, interleaved conversation by conversation (see :func:`conversations`):

* ``--conversations FILE...``: JSON lines of ``{"messages": [...]}``, such as the draft
  model's answers to the shipped prompts (``python -m engine.heads.answers --text-only``);
* ``--packages``: "write this function" and "what does this do" chats from the
  docstrings and source of installed, permissively licensed packages
  (:data:`engine.heads.vocab.PACKAGES`; each one's licence is checked at run time);
* ``--corpus``: the shipped standard-library corpus; ``--history DB``: the office's own.

The CE runs over the ``--ce-vocab`` most frequent ids of the shipped ranking
(:mod:`engine.spec.drafters.vocab`), the vocabulary the head drafts over.
"""

import argparse
import ast
import logging
import random
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.heads import corpus as corpus_mod
from engine.heads import history, vocab
from engine.heads.files import HeadInfo, save_head
from engine.heads.train import (
    Features,
    TrainSetup,
    answer_windows,
    extract,
    held_out,
    initial_head,
    load_target,
    optimiser,
    reduced_lm_head,
    report,
    resume,
    save_checkpoint,
    train_step,
)
from engine.spec.drafters.vocab import frequent_ids

log = logging.getLogger(__name__)

Chat = list[dict[str, str]]


FILES_PER_PACKAGE = 48  # source files read per package, spread over it


def package_chats(names: Sequence[str] = vocab.PACKAGES,
                  files: int = FILES_PER_PACKAGE) -> Iterator[Chat]:
    """Chats about the public, documented functions and classes of installed packages
    under a permissive licence (as :mod:`engine.heads.corpus` makes from the standard
    library), from up to ``files`` source files of each, spread over the package."""
    for package in vocab.packages(names):
        for path in vocab.spread(package.files, files)[:files]:
            try:
                source = path.read_text(encoding="utf-8")
                tree = ast.parse(source)
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            module = f"{package.name}.{path.stem}"
            yield from corpus_mod.records(module, source, tree)


def conversations(args: argparse.Namespace, seed: int) -> Iterator[Chat]:
    """Every source's conversations, shuffled each on its own (fixed ``seed``) and taken in
    turn, one conversation from each, until all run out."""
    sources: list[list[Chat]] = []
    for path in args.conversations or ():
        sources.append(corpus_mod.load(path))
    if args.packages:
        sources.append(list(package_chats()))
    if args.corpus:
        sources.append(corpus_mod.load(args.corpus))
    if args.history:
        sources.append(history.conversations(args.history))
    rng = random.Random(seed)
    for chats in sources:
        rng.shuffle(chats)
    longest = max((len(c) for c in sources), default=0)
    for i in range(longest):
        for chats in sources:
            if i < len(chats):
                yield chats[i]


Window = tuple[torch.Tensor, torch.Tensor]  # ids [L] and the answer mask [L] (answer_windows)


def stack(items: Sequence[Features]) -> Features:
    """Single-window features ``[1, L, ..]`` as one batch ``[B, L, ..]``."""
    masks = [f.mask for f in items if f.mask is not None]
    return Features(torch.cat([f.ids for f in items]), torch.cat([f.hidden for f in items]),
                    torch.cat([f.top_ids for f in items]), torch.cat([f.top_probs for f in items]),
                    torch.cat(masks) if len(masks) == len(items) else None)


def held_windows(model: Any, source: Iterator[Window], count: int, top_k: int,
                 taps: tuple[int, ...], path: Path) -> Features:
    """The first ``count`` windows' features, read once and kept in ``path``."""
    if path.is_file():
        saved = torch.load(path, weights_only=True)
        if saved.pop("taps", None) == list(taps) and len(saved["ids"]) == count:
            for _ in range(count):
                next(source)
            return Features(**saved)
    ids = torch.stack([next(source)[0] for _ in range(count)])
    data = extract(model, ids, top_k, progress=False, taps=taps)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({**vars(data), "taps": list(taps)}, tmp)
    tmp.replace(path)
    return data


def run(setup: TrainSetup, model: Any, source: Iterator[Window], total_windows: int,
        steps_per_window: float, buffer: int, top_k: int, seed: int = 0,
        answers_only: bool = False) -> tuple[list[float], int]:
    """Read up to ``total_windows`` windows of ``source`` through the target and train on
    a replay buffer of the last ``buffer``; resumes from ``setup.checkpoint``. With
    ``answers_only`` the losses count only the rows whose next token is an answer's (the
    rows drafting starts from; EAGLE masks its loss so), the rest being context. Returns
    every step's loss (earlier runs' too) and the windows read in all."""
    head, taps = setup.head.train(), setup.head.config.feature_layers
    opt = optimiser(setup)
    state = resume(setup, opt)
    step, losses = int(state.get("step", 0)), list(state.get("losses", []))
    read = int(state.get("windows", 0))
    for _ in range(read):  # the windows already read (and trained on) before
        next(source, None)
    recent: deque[Features] = deque(maxlen=buffer)
    rng = random.Random(seed + read)
    started, first, tokens = time.perf_counter(), step, 0
    for window, mask in source:
        if read >= total_windows:
            break
        features = extract(model, window[None], top_k, progress=False, taps=taps)
        if answers_only:
            features.mask = mask[None]
        recent.append(features)
        read += 1
        tokens += len(window)
        due = min(setup.steps, round(read * steps_per_window))
        while step < due:
            batch = stack(rng.sample(list(recent), min(setup.batch, len(recent))))
            loss, reg, ce = train_step(setup, opt, batch, step)
            step += 1
            losses.append(loss)
            rate = tokens / (time.perf_counter() - started)
            report(step, setup.steps, reg, ce, started, first,
                   f"{read}/{total_windows} windows, {rate:.0f} tok/s  ")
            if step % setup.checkpoint_every == 0 or step == setup.steps:
                save_checkpoint(setup.checkpoint, head, opt, step, losses, windows=read)
    save_checkpoint(setup.checkpoint, head, opt, step, losses, windows=read)
    sys.stderr.write("\n")
    if read < total_windows:
        log.info("the sources ran out after %d windows of %d", read, total_windows)
    return losses, read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.heads.stream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="model name or local model folder")
    p.add_argument("--out", required=True, type=Path, help="head file to write (.safetensors)")
    p.add_argument("--conversations", type=Path, nargs="+", default=None,
                   help="chats as JSON lines of {\"messages\": [...]}")
    p.add_argument("--packages", action="store_true",
                   help="chats from installed permissively licensed packages' code")
    p.add_argument("--corpus", type=Path, default=None, help="e.g. assets/heads/corpus.jsonl")
    p.add_argument("--history", type=Path, default=None, help="the app's history database")
    p.add_argument("--tokens", type=int, default=1_000_000, help="tokens to teacher-force")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--held-out", type=int, default=16, help="windows kept for the held-out test")
    p.add_argument("--top-k", type=int, default=32)
    p.add_argument("--ce-vocab", type=int, default=8192,
                   help="most frequent ids of the shipped ranking the CE runs over")
    p.add_argument("--steps-per-window", type=float, default=1.0)
    p.add_argument("--buffer", type=int, default=64, help="windows in the replay buffer")
    p.add_argument("--batch", type=int, default=4, help="windows per step")
    p.add_argument("--init", type=Path, default=None, help="head file to fine-tune")
    p.add_argument("--fuse", action="store_true", help="an EAGLE-3 head (see train --fuse)")
    p.add_argument("--intermediate", type=int, default=None, help="head MLP size (new heads)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--noise", type=float, default=0.05)
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--reg-weight", type=float, default=1.0)
    p.add_argument("--unroll", type=int, default=3, help="draft steps trained (training-time test)")
    p.add_argument("--later-weight", type=float, default=0.5)
    p.add_argument("--answers-only", action="store_true",
                   help="count the losses on answers' tokens only, the questions being context")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accel", default="auto")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if not (args.conversations or args.packages or args.corpus or args.history):
        p.error("name at least one source: --conversations, --packages, --corpus or --history")
    if min(args.tokens, args.seq_len, args.held_out, args.top_k, args.buffer, args.batch,
           args.unroll, args.ce_vocab) < 1 or args.steps_per_window <= 0:
        p.error("sizes, counts and --steps-per-window must be positive")
    for path in [*(args.conversations or ()), args.corpus, args.history]:
        if path is not None and not path.is_file():
            p.error(f"{path} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(args.seed)
    began = time.perf_counter()
    loaded = load_target(args.target, args.data_dir, args.accel)
    model, tok = loaded.model, loaded.tokenizer
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    size = int(embed.num_embeddings)
    ce_ids = frequent_ids(tok, size, args.ce_vocab)
    if ce_ids is None:
        raise SystemExit("no shipped vocabulary ranking fits this target's tokenizer; "
                         "use python -m engine.heads.train instead")
    lookup = torch.full((size,), -1, dtype=torch.long)
    lookup[ce_ids] = torch.arange(len(ce_ids))
    head, base = initial_head(args, loaded)
    taps = head.config.feature_layers
    source = answer_windows(tok, conversations(args, args.seed), args.seq_len)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    held = held_windows(model, source, args.held_out, args.top_k, taps,
                        out.with_name(out.name + ".held.pt"))
    total = args.tokens // args.seq_len
    steps = max(1, round(total * args.steps_per_window))
    setup = TrainSetup(head, embed, reduced_lm_head(lm_head, head.config.hidden_size, ce_ids),
                       lookup, steps, args.batch, args.lr, args.noise, args.ce_weight,
                       out.with_name(out.name + ".ckpt"), args.checkpoint_every, args.unroll,
                       args.later_weight, args.reg_weight)
    losses, read = run(setup, model, source, total, args.steps_per_window, args.buffer,
                       args.top_k, args.seed, args.answers_only)
    measured = held_out(head, embed, lm_head, held)
    extra: dict[str, Any] = {
        "held_out_tokens": int(held.ids.numel()), "steps": len(losses), "ce_vocab": len(ce_ids),
        "top_k": args.top_k, "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None, "unroll": args.unroll,
        "answers_only": args.answers_only,
        "seconds": round(time.perf_counter() - began), "teacher_forced": True,
        "corpus": ", ".join(s for s in (
            *(p.name for p in args.conversations or ()), "packages" if args.packages else "",
            args.corpus.name if args.corpus else "", "office history" if args.history else "")
            if s),
        "held_out_chain_accepted": round(measured.chain, 3)}
    if args.packages:  # what was read, under which licence
        extra["packages"] = {p.name: f"{p.version}, {p.licence}" for p in vocab.packages()}
    if base is not None:
        before = held_out(base, embed, lm_head, held)
        extra["init_held_out_acceptance"] = before.acceptance
        extra["init_held_out_chain_accepted"] = round(before.chain, 3)
    info = HeadInfo(loaded.name, loaded.sha256, size, head.config, read * args.seq_len,
                    round(measured.acceptance, 4), extra)
    save_head(head, info, out)
    log.info("held-out acceptance %.3f (first draft token), %.2f of 4-token chains accepted"
             "%s; %d windows read; wrote %s (%.1f MB)", measured.acceptance, measured.chain,
             "" if base is None else f" (the initial head: {before.acceptance:.3f}, "
             f"{before.chain:.2f})", read, out, out.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
