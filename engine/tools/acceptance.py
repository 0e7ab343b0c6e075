"""How often EAGLE heads would be right on the benchmark: ``python -m engine.tools.acceptance``.

Contract: the target answers the benchmark's prompts (:data:`engine.tools.bench.PROMPTS`,
``--per-kind`` of each kind, chat template applied) greedily, as its plain decoding does
(batched, which on the native path is bit for bit the one-by-one answer), and reads each
prompt with its answer once more, teacher-forced, keeping the features every given head
needs. Each head is then measured on the answer's rows only, the rows drafting starts
from (:func:`engine.heads.train.held_out` with ``first``): the share of first draft tokens
that are the target's own (and of positions where the target's token is among the head's 2
or 4 likeliest: what a tree branching at its first position could find), and the drafts
accepted per ``--steps``-token greedy chain, by kind and overall. No timing: the figures
depend on the models and prompts alone, so they compare heads in a few minutes where the
benchmark takes a quarter of an hour, and one plus the chain figure estimates the
benchmark's tokens per pass of fixed-length chains.

``--answers FILE`` keeps the target's answers and reuses them while the target, the prompts
and ``--max-tokens`` are the same.
"""

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.errors import IncompatibleModelsError
from engine.heads import answers
from engine.heads.files import HeadFileError, find_head, load_head
from engine.heads.model import EagleHead
from engine.heads.train import (
    TOP_WIDTHS,
    Features,
    HeldOut,
    extract,
    held_out,
    load_target,
)
from engine.spec.runner import ModelRunner
from engine.tools.bench import KINDS, PROMPTS, load_prompts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answered:
    """One benchmark prompt and the target's greedy answer to it."""

    kind: str
    prompt: list[int]  # chat-templated prompt ids
    answer: list[int]  # the answer's ids (its end-of-turn token included, if it ended)


def target_answers(loaded: Any, prompts: Sequence[dict[str, str]], max_tokens: int
                   ) -> list[Answered]:
    """The target's greedy answers to ``prompts``, all written together."""
    ids = [answers.prompt_ids(loaded.tokenizer, [{"role": "user", "content": p["prompt"]}])
           for p in prompts]
    runners = [ModelRunner(loaded.model) for _ in ids]
    done = answers.answer_batch(runners, ids, max_tokens, loaded.eos_ids, top_k=1)
    return [Answered(p["kind"], prompt, answer)
            for p, prompt, (_, answer) in zip(prompts, ids, done, strict=True)]


def cached_answers(path: Path | None, loaded: Any, prompts: Sequence[dict[str, str]],
                   max_tokens: int) -> list[Answered]:
    """:func:`target_answers`, read from ``path`` when it holds them for this target,
    these prompts and this limit, and written there otherwise."""
    key = {"target": loaded.name, "sha256": loaded.sha256, "max_tokens": max_tokens,
           "prompts": [p["prompt"] for p in prompts]}
    if path is not None and path.is_file():
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if {k: saved.get(k) for k in key} == key:
                return [Answered(**a) for a in saved["answers"]]
            log.info("%s holds answers to other prompts or by another model: answering anew",
                     path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise SystemExit(f"{path} is not an answers file of this command ({e}); "
                             "name another file or remove it") from None
    found = target_answers(loaded, prompts, max_tokens)
    if path is not None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({**key, "answers": [vars(a) for a in found]}),
                       encoding="utf-8")
        tmp.replace(path)
    return found


def head_features(data: Features, taps: Sequence[int], wanted: Sequence[int],
                  hidden_size: int) -> Features:
    """``data`` (features after the layers ``taps``, then the final state) cut down to what
    a head fusing the layers ``wanted`` reads: those layers' blocks, then the final state."""
    h = hidden_size
    blocks = [data.hidden[..., taps.index(layer) * h : (taps.index(layer) + 1) * h]
              for layer in wanted]
    return Features(data.ids, torch.cat([*blocks, data.hidden[..., -h:]], dim=-1),
                    data.top_ids, data.top_probs)


def measure(loaded: Any, heads: Sequence[EagleHead], answered: Sequence[Answered],
            steps: int) -> list[dict[str, HeldOut]]:
    """Each head's counts on the answers' rows, by kind (and ``"overall"``)."""
    model = loaded.model
    embed, lm_head = model.get_input_embeddings(), model.get_output_embeddings()
    taps = tuple(sorted({layer for h in heads for layer in h.config.feature_layers}))
    found: list[dict[str, HeldOut]] = [{} for _ in heads]
    for n, a in enumerate(answered, 1):
        ids = torch.tensor([a.prompt + a.answer], dtype=torch.long)  # [1, T]
        data = extract(model, ids, top_k=1, progress=False, taps=taps)
        for head, counts in zip(heads, found, strict=True):
            mine = head_features(data, taps, head.config.feature_layers,
                                 head.config.hidden_size)
            # row len(prompt) - 1 is the first a drafter starts from: it reads the last
            # prompt row's features and the answer's first token
            got = held_out(head, embed, lm_head, mine, steps, first=len(a.prompt) - 1)
            for key in (a.kind, "overall"):
                counts[key] = counts[key] + got if key in counts else got
        sys.stderr.write(f"\rteacher-forced {n}/{len(answered)} answers ")
    sys.stderr.write("\n")
    return found


def table(names: Sequence[str], found: Sequence[dict[str, HeldOut]], steps: int) -> str:
    """Markdown: one row per head and kind."""
    widths = " | ".join(f"in its top {w}" for w in TOP_WIDTHS)
    lines = [f"| head | kind | first draft right | {widths} | drafts accepted per {steps}-token "
             "chain | about tokens per pass |", "| --- | --- | --- |" + " --- |" * len(TOP_WIDTHS)
             + " --- | --- |"]
    for name, counts in zip(names, found, strict=True):
        for kind in (*KINDS, "overall"):
            if kind in counts:
                c = counts[kind]
                within = " | ".join(f"{c.within(w):.3f}" for w in TOP_WIDTHS)
                lines.append(f"| {name} | {kind} | {c.acceptance:.3f} | {within} | "
                             f"{c.chain:.2f} | {1 + c.chain:.2f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.tools.acceptance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="model name or local model folder")
    p.add_argument("--head", type=Path, action="append", default=None,
                   help="head file to measure (again for more; default: the office's own, else the "
                        "shipped one)")
    p.add_argument("--per-kind", type=int, default=4, help="benchmark prompts of each kind")
    p.add_argument("--prompts", type=Path, default=PROMPTS, help="the benchmark's prompts")
    p.add_argument("--max-tokens", type=int, default=128, help="answer length limit")
    p.add_argument("--steps", type=int, default=4, help="draft tokens per chain")
    p.add_argument("--answers", type=Path, default=None,
                   help="file that keeps the target's answers for the next run")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--accel", default="auto")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if min(args.per_kind, args.max_tokens, args.steps) < 1:
        p.error("--per-kind, --max-tokens and --steps must be positive")
    for path in [*(args.head or ()), args.prompts]:
        if not path.is_file():
            p.error(f"{path} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        prompts = load_prompts(args.prompts, args.per_kind)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{args.prompts} is not a benchmark prompts file ({e})") from None
    if not prompts:
        raise SystemExit(f"{args.prompts} holds no prompts of the kinds {', '.join(KINDS)}")
    loaded = load_target(args.target, args.data_dir, args.accel)
    default = find_head(loaded.name, args.data_dir)
    if not args.head and default is None:
        raise SystemExit(f"no head for {loaded.name} is installed or shipped; name one with --head")
    paths: list[Path] = args.head or [default]
    heads = []
    for path in paths:
        try:
            heads.append(load_head(path, loaded.name, loaded.sha256, loaded.model)[0].eval())
        except (HeadFileError, IncompatibleModelsError, OSError) as e:
            raise SystemExit(f"{path}: {e}") from None
    answered = cached_answers(args.answers, loaded, prompts, args.max_tokens)
    found = measure(loaded, heads, answered, args.steps)
    names = [p.name for p in paths]
    if len(set(names)) < len(names):  # heads of one target share a file name
        names = [str(p) for p in paths]
    sys.stdout.write(table(names, found, args.steps) + "\n")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "target": loaded.name, "prompts": len(answered), "steps": args.steps,
            "heads": [{"file": str(p), **{k: {**vars(c), "acceptance": c.acceptance,
                                              "chain": c.chain,
                                              **{f"within_{w}": c.within(w) for w in TOP_WIDTHS}}
                                          for k, c in counts.items()}}
                      for p, counts in zip(paths, found, strict=True)]}, indent=1),
            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
