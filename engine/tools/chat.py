"""Terminal chat against the engine: ``python -m engine.tools.chat``.

Streams each answer as it is generated and prints the speculation statistics after
it. Commands: ``/method NAME`` switches the drafting method, ``/k N`` the draft
length, ``/reset`` starts a new conversation, ``/quit`` leaves. Ctrl+C stops the
current answer (the partial answer is kept in the conversation).
"""

import argparse
import logging
import sys
import threading
from typing import TextIO

from engine.errors import EngineError
from engine.models.registry import PROFILES, Progress
from engine.protocol import (
    ACCELERATIONS,
    METHODS,
    Completion,
    PromptProgress,
    SpeculationStats,
    TextChunk,
)
from engine.spec.sampling import SamplingParams
from engine.spec.session import ADAPTIVE, ChatEngine, DraftLength


def format_stats(s: SpeculationStats) -> str:
    """One line of figures for the end of an answer."""
    parts = [f"{s.completion_tokens} tokens"]
    if s.tokens_per_second:
        parts.append(f"{s.tokens_per_second:.1f} tok/s")
    if s.time_to_first_token_s is not None:
        parts.append(f"first token {s.time_to_first_token_s:.2f} s")
    parts.append(f"method {s.method}" if s.enabled else "speculation off")
    if s.acceptance_rate is not None:
        parts.append(f"accepted {s.accepted}/{s.drafted} ({s.acceptance_rate:.0%})")
    if s.mean_accepted_length is not None:
        parts.append(f"{s.mean_accepted_length:.2f} tokens/pass")
    return " · ".join(parts)


def progress_printer(out: TextIO) -> Progress:
    def show(fraction: float, message: str) -> None:
        out.write(f"\r[{fraction:6.1%}] {message[:60]:<60}")
        out.flush()

    return show


def stream_answer(engine: ChatEngine, messages: list[dict[str, str]], args: argparse.Namespace,
                  out: TextIO) -> str:
    """Print one answer as it streams; return its text (partial if interrupted)."""
    cancel = threading.Event()
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    text = ""
    events = engine.generate(messages, params, max_tokens=args.max_tokens, cancel=cancel)
    try:
        for event in events:
            if isinstance(event, PromptProgress):
                end = "\n" if event.read == event.total else ""
                out.write(f"\r(reading the prompt: {event.read}/{event.total} tokens){end}")
                out.flush()
            elif isinstance(event, TextChunk):
                out.write(event.text)
                out.flush()
                text += event.text
            elif isinstance(event, Completion):
                note = " [stopped]" if event.finish_reason == "cancelled" else ""
                out.write(f"{note}\n  ({format_stats(event.stats)})\n")
    except KeyboardInterrupt:
        cancel.set()
        events.close()
        out.write(" [stopped]\n")
    return text


def command(engine: ChatEngine, line: str, out: TextIO) -> bool:
    """Handle a /command; return False to quit."""
    name, _, arg = line[1:].partition(" ")
    try:
        if name == "quit":
            return False
        if name == "method":
            engine.method = engine.check_method(arg.strip())
        elif name == "k":
            engine.num_draft_tokens = engine.check_num_draft_tokens(draft_length(arg.strip()))
        elif name != "reset":
            methods = ",".join(engine.methods)
            out.write(f"commands: /method {{{methods}}}, /k N|adaptive, /reset, /quit\n")
            return True
        out.write(f"  (method {engine.method}, k={engine.num_draft_tokens})\n")
    except (EngineError, ValueError) as exc:
        out.write(f"  {exc}\n")
    return True


def repl(engine: ChatEngine, args: argparse.Namespace, inp: TextIO, out: TextIO) -> None:
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    base = list(messages)
    while True:
        out.write("\nyou> ")
        out.flush()
        line = inp.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith("/"):
            if not command(engine, line, out):
                return
            if line == "/reset":
                messages = list(base)
            continue
        if not line:
            continue
        messages.append({"role": "user", "content": line})
        out.write("anve> ")
        try:
            answer = stream_answer(engine, messages, args, out)
        except EngineError as exc:
            out.write(f"\nerror: {exc}\n")
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": answer})


def draft_length(value: str) -> DraftLength:
    return ADAPTIVE if value == ADAPTIVE else int(value)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.chat", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="appliance")
    parser.add_argument("--target", help="named model, model folder or .gguf (overrides profile)")
    parser.add_argument("--draft", help="draft model: name, folder or .gguf")
    parser.add_argument("--method", choices=METHODS, help="drafting method (default: ngram)")
    parser.add_argument("--num-draft-tokens", type=draft_length, default="adaptive",
                        help="draft length 1..16 or \"adaptive\" (default)")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--system", default="", help="system prompt")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--accel", choices=ACCELERATIONS, default="auto",
                        help="linear-layer kernels (default auto: the GGUF's int4 codes)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    target, draft = PROFILES[args.profile]
    if args.target:
        target, draft = args.target, args.draft
    try:
        engine = ChatEngine.load(
            target, draft, dtype=args.dtype, data_dir=args.data_dir, accel=args.accel,
            progress=progress_printer(sys.stderr), method=args.method,
            num_draft_tokens=args.num_draft_tokens,
        )
    except EngineError as exc:
        sys.stderr.write(f"\nerror: {exc}\n")
        return 1
    sys.stderr.write(f"\nready: {target}" + (f" + draft {draft}" if draft else "")
                     + f", method {engine.method}. Type /help for commands.\n")
    repl(engine, args, sys.stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
