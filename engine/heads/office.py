"""Learn from the office: fine-tune the target's head on its own past chats, swap if better.

``python -m engine.heads.office --target NAME --history DB`` lowers its own CPU priority
to the minimum (``os.nice``), reads the app's history database read-only (or, with
``--conversations FILE``, the same chats as JSON lines, which is how the worker hands
over what the admin page sent it), fine-tunes
the installed head of ``NAME`` (or trains a first one) with :mod:`engine.heads.train`
on those conversations, and installs the result as ``<data dir>/heads/NAME.safetensors``
(which the engine prefers to the shipped head) only if its acceptance on held-out
history (the last share of the conversation windows, unseen in training) beats the
current head's on the same windows. Nothing is sent anywhere. Exit status: 0 when the
new head was installed, 3 when the current head was kept; ``--report FILE`` also writes
the outcome as JSON (``installed``, ``held_out_acceptance``, ``previous``, ``head``).
"""

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from engine import paths
from engine.heads import train
from engine.heads.files import find_head, head_file_name, read_info
from engine.models import cache

log = logging.getLogger(__name__)
KEPT = 3


def install(candidate: Path, name: str, data_dir: str | None) -> Path:
    """Copy ``candidate`` into the data directory's heads, replacing atomically."""
    dest = paths.data_dir(data_dir) / "heads" / head_file_name(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.copyfile(candidate, tmp)
    os.replace(tmp, dest)
    return dest


def train_args(args: argparse.Namespace, out: Path, current: Path | None) -> list[str]:
    source = ["--history", str(args.history)] if args.history else [
        "--conversations", str(args.conversations)]
    argv = ["--target", args.target, "--out", str(out), *source,
            "--steps", str(args.steps), "--tokens", str(args.tokens), "--seq-len",
            str(args.seq_len), "--held-out", str(args.held_out), "--lr", str(args.lr),
            "--unroll", str(args.unroll)]
    if current is not None:
        argv += ["--init", str(current)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    return argv


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.heads.office", description=__doc__)
    p.add_argument("--target", required=True, help="model name or local model folder")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--history", type=Path,
                        help="the app's history database (history.sqlite3 in its data folder)")
    source.add_argument("--conversations", type=Path,
                        help="the office's chats as JSON lines of {\"messages\": [...]}")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--held-out", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--unroll", type=int, default=2,
                   help="draft steps trained per position (see engine.heads.train)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--report", type=Path, default=None, help="write the outcome here (JSON)")
    return p.parse_args(argv)


def report(path: Path | None, installed: bool, new: float, old: float, head: Path | None) -> None:
    """Write the outcome for whoever started this run (the worker reads it)."""
    if path is not None:
        outcome = {"installed": installed, "held_out_acceptance": new,
                   "previous": old if old >= 0 else None, "head": str(head) if head else None}
        path.write_text(json.dumps(outcome), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.nice(19)
    name = cache.resolve_source(args.target)[0]
    current = find_head(name, args.data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        candidate = Path(tmp) / head_file_name(name)
        train.main(train_args(args, candidate, current))
        info = read_info(candidate)
        new = info.held_out_acceptance or 0.0
        old = info.extra.get("init_held_out_acceptance", -1.0) if current else -1.0
        if new <= old:
            log.info("kept %s: held-out acceptance %.3f, the new head %.3f", current, old, new)
            report(args.report, False, new, old, current)
            return KEPT
        dest = install(candidate, name, args.data_dir)
    report(args.report, True, new, old, dest)
    log.info("installed %s: held-out acceptance %.3f (was %.3f)", dest, new, old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
