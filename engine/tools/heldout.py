"""The held-out check through the worker's API: ``python -m engine.tools.heldout``.

Contract: starts a fresh worker (``python -m engine.worker``) in an empty data folder of
its own that shares only the converted models of ``--models-from`` (default: the data
folder the app uses), so it calibrates the machine and starts ``auto`` from the shipped
observations as a newly installed appliance does. Once it is ready and calibrated, each
prompt of ``--prompts`` (the benchmark's file format, ``{"prompts": [{"kind", "prompt"}]}``;
default ``assets/bench/heldout.json``, prompts the priors were never made from) is
answered by each method of ``--methods`` (``auto``: the worker's default) and with
speculation off. Both answers of a pair:

* are greedy, up to ``--max-tokens`` new tokens, through ``/v1/chat/completions``;
* are served with ``anve.cache: "cold"``: each reads the whole prompt, and neither drafts
  from the other's answer (the suffix memory) or leaves a trace in the caches;
* take turns in an order that alternates from prompt to prompt and from round to round
  (``--rounds``), so a slow spell of the shared machine falls on both alike.

Per pair: the method that ran (marked where the worker says it was ``auto``'s one-time
trial of a runner-up not yet timed on the machine), both answers' times from request to
last token (the worker's ``total_s``), their ratio, whether the token ids are equal, and
where each answer's time went: the seconds to its first token (the same cold prompt read on both
sides, so a difference is the machine's speed moving between them) and the milliseconds
of a target pass after it. Per method:
overall (the plain answers' time over the method's), per kind, the lowest pair, the
identical count, and what ``auto`` ran. The worker's answers keep teaching its ``auto``
as they would in an office. Writes ``heldout-<profile>-<date>.json`` and ``.md`` into
``--out``. A worker that exits, fails to load its models, or is not ready within
``--ready-timeout``, stops the check with the reason; an answer that fails later stops it
too, and the pairs finished by then are still written, marked as stopped early.
``--data-dir`` names the worker's data folder instead of a new temporary one (what it
already holds, such as a calibration, is then used).
"""

import argparse
import contextlib
import http.client
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.paths import ASSETS, models_dir
from engine.protocol import METHODS
from engine.tools.bench import KINDS, TRIAL_NOTE, machine, ran_as, simd_flags
from engine.worker.process import Child, child_worker

log = logging.getLogger(__name__)

PROMPTS = ASSETS / "bench" / "heldout.json"
OFF = "off"


class HeldOutError(RuntimeError):
    """A prompts file, worker or answer the check cannot use; the message says why."""


@dataclass(frozen=True)
class Prompt:
    kind: str
    prompt: str


@dataclass(frozen=True)
class Pair:
    """One prompt answered with a method and with speculation off."""

    round: int
    kind: str
    method: str  # as asked
    ran: str  # what the worker ran (auto's choice)
    total_s: float
    plain_s: float
    first: str  # which of the two ran first
    identical: bool
    tokens: int
    tokens_per_pass: float | None
    # where each answer's time went (None where the worker did not say): the seconds to
    # its first token, the target reading the same prompt on both sides (both are cold),
    # so two that differ show the machine's speed moving between them; and its target
    # passes, the one that gave the first token included
    first_token_s: float | None = None
    plain_first_token_s: float | None = None
    passes: int = 0
    plain_passes: int = 0
    trial: bool = False  # auto ran a runner-up once to time it (the worker's ``trial``)

    @property
    def ran_as(self) -> str:
        """What ran, marked where it was auto's one-time trial of a runner-up."""
        return ran_as(self.ran, self.trial)

    @property
    def speedup(self) -> float:
        return self.plain_s / self.total_s if self.total_s > 0 else 0.0

    @property
    def pass_ms(self) -> tuple[float | None, float | None]:
        """Milliseconds a pass after the first token, the method's and plain's."""
        return (per_pass(self.total_s, self.first_token_s, self.passes),
                per_pass(self.plain_s, self.plain_first_token_s, self.plain_passes))


def per_pass(total_s: float, first_token_s: float | None, passes: int) -> float | None:
    """The time after the first token over the passes after it (the worker counts the
    pass that gave the first token among its ``passes``)."""
    if first_token_s is None or passes <= 1:
        return None
    return 1000 * (total_s - first_token_s) / (passes - 1)


def load_prompts(path: Path) -> list[Prompt]:
    """The prompts of ``path``; :class:`HeldOutError` naming what is wrong otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HeldOutError(f"cannot read the prompts file {path}: {exc}") from None
    entries = data.get("prompts") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise HeldOutError(f"{path}: expected {{\"prompts\": [{{\"kind\": ..., "
                           "\"prompt\": ...}]} with at least one prompt")
    prompts = []
    for i, entry in enumerate(entries):
        kind = entry.get("kind") if isinstance(entry, dict) else None
        text = entry.get("prompt") if isinstance(entry, dict) else None
        if kind not in KINDS:
            raise HeldOutError(f"{path}: prompt {i} has kind {kind!r}; "
                               f"kinds are {', '.join(KINDS)}")
        if not isinstance(text, str) or not text.strip():
            raise HeldOutError(f"{path}: prompt {i} has no text")
        prompts.append(Prompt(kind, text))
    return prompts


def order(round_: int, index: int, method: str) -> tuple[str, str]:
    """The pair in the order it runs: the method first where the round plus the prompt's
    index is even, speculation off first elsewhere (ABBA over prompts and rounds)."""
    return (method, OFF) if (round_ + index) % 2 == 0 else (OFF, method)


def parse_methods(text: str) -> list[str]:
    """``"auto,ngram"`` -> ``["auto", "ngram"]``; ``off`` is always the other side."""
    methods = [m.strip() for m in text.split(",") if m.strip()]
    wrong = [m for m in methods if m == OFF or m not in ("auto", *METHODS)]
    if not methods or wrong:
        raise HeldOutError(f"--methods takes auto or {', '.join(m for m in METHODS if m != OFF)}"
                           f" (comma-separated), not {text!r}")
    return methods


class Client:
    """Plain HTTP to a worker on the loopback (stdlib only)."""

    def __init__(self, port: int, timeout: float = 3600.0) -> None:
        self.port, self.timeout = port, timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, data, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise HeldOutError(f"{method} {path} answered {resp.status}: {payload[:300]!r}")
        return json.loads(payload)

    def answer(self, prompt: str, method: str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": prompt}],
                                "max_tokens": max_tokens, "temperature": 0,
                                "anve": {"cache": "cold"}}
        if method != "auto":  # auto: the worker's own default
            body["speculation"] = {"method": method}
        reply = self.call("POST", "/v1/chat/completions", body)
        return {"ids": reply["anve"]["token_ids"], "spec": reply["speculation"]}


@dataclass
class Worker:
    child: Child
    port: int = 0

    def _alive(self) -> None:
        proc = self.child.proc
        if proc.poll() is not None:
            raise HeldOutError(f"the worker exited ({proc.returncode}):\n{self.child.tail()}")

    def wait(self, timeout: float) -> Client:
        """Wait until it listens, has loaded and has calibrated the machine."""
        deadline = time.monotonic() + timeout
        while not self.port:
            self._alive()
            try:
                self.port = self.child.listening_port() or 0
            except (ValueError, AttributeError) as exc:
                raise HeldOutError(f"the worker printed something other than its events: "
                                   f"{exc}\n{self.child.tail()}") from None
            if not self.port:
                self._deadline(deadline, timeout)
        client = Client(self.port)
        while True:
            self._alive()
            with contextlib.suppress(OSError):
                health = client.call("GET", "/health")
                if health.get("status") == "error":
                    raise HeldOutError(f"the worker could not load its models: "
                                       f"{health.get('message')}")
                if health.get("status") == "ready":
                    auto = client.call("GET", "/v1/speculation").get("auto") or {}
                    if auto.get("calibration") and not auto.get("calibrating"):
                        return client
            self._deadline(deadline, timeout)

    def _deadline(self, deadline: float, timeout: float) -> None:
        if time.monotonic() > deadline:
            raise HeldOutError(f"the worker was not ready and calibrated within {timeout:.0f} s:"
                               f"\n{self.child.tail()}")
        time.sleep(0.5)


@contextlib.contextmanager
def fresh_worker(worker_args: Sequence[str], data: Path, models: Path) -> Iterator[Worker]:
    """The worker on the data folder ``data`` (its ``models`` linked to ``models``),
    stopped afterwards."""
    data.mkdir(parents=True, exist_ok=True)
    link = data / "models"
    if not link.exists():
        link.symlink_to(models.resolve(), target_is_directory=True)
    with child_worker(["--data-dir", str(data), *worker_args], data,
                      env={"HF_HUB_OFFLINE": "1"}, stop_s=30.0) as child:
        yield Worker(child)


def run_pairs(client: Client, prompts: Sequence[Prompt], methods: Sequence[str],
              rounds: int, max_tokens: int, pairs: list[Pair]) -> None:
    """Every prompt with every method and off, the pairs' order alternating (see
    :func:`order`), each appended to ``pairs`` once both answers are in; an answer that
    fails raises :class:`HeldOutError` and leaves the finished pairs there."""
    for r in range(rounds):
        for i, p in enumerate(prompts):
            for method in methods:
                sides = order(r, i, method)
                try:
                    got = {m: client.answer(p.prompt, m, max_tokens) for m in sides}
                except (HeldOutError, OSError, http.client.HTTPException, KeyError,
                        TypeError, ValueError) as exc:
                    raise HeldOutError(f"round {r}, prompt {i} ({p.kind}), {method}: the "
                                       f"worker's answer failed ({type(exc).__name__}: {exc})"
                                       ) from None
                spec, plain = got[method]["spec"], got[OFF]["spec"]
                pair = Pair(r, p.kind, method, str(spec.get("method")), float(spec["total_s"]),
                            float(plain["total_s"]), sides[0],
                            got[method]["ids"] == got[OFF]["ids"], len(got[method]["ids"]),
                            spec.get("mean_accepted_length"),
                            spec.get("time_to_first_token_s"), plain.get("time_to_first_token_s"),
                            int(spec.get("passes") or 0), int(plain.get("passes") or 0),
                            bool(spec.get("trial")))
                log.info("%-15s %-8s ran %-13s %.2fx (%.1f s against %.1f s, %s first)%s",
                         p.kind, method, pair.ran_as, pair.speedup, pair.total_s, pair.plain_s,
                         sides[0], "" if pair.identical else " DIFFERENT")
                pairs.append(pair)


def summarise(pairs: Sequence[Pair], methods: Sequence[str]) -> list[dict[str, Any]]:
    """Per method: overall and per-kind ratios (summed times), lowest pair, identical."""
    out = []
    for method in methods:
        own = [p for p in pairs if p.method == method]
        if not own:
            continue
        kinds = {}
        for kind in KINDS:
            of_kind = [p for p in own if p.kind == kind]
            if of_kind:
                kinds[kind] = (sum(p.plain_s for p in of_kind) / sum(p.total_s for p in of_kind))
        lowest = min(own, key=lambda p: p.speedup)
        ran = dict(Counter(p.ran for p in own))
        out.append({"method": method,
                    "overall": sum(p.plain_s for p in own) / sum(p.total_s for p in own),
                    "kinds": kinds, "lowest": lowest.speedup, "lowest_kind": lowest.kind,
                    "lowest_ran": lowest.ran_as, "identical": sum(p.identical for p in own),
                    "pairs": len(own), "plain_s": sum(p.plain_s for p in own), "ran": ran,
                    "trials": sum(p.trial for p in own)})
    return out


def markdown(summary: Sequence[dict[str, Any]], pairs: Sequence[Pair], meta: dict[str, Any]) -> str:
    """The run as Markdown: a header, the summary table, then every pair."""
    lines = [f"Held-out check {meta['date']} · {meta['machine']} ({' '.join(meta['cpu_flags'])})"
             f" · `{meta['command']}` · {meta['prompts']} prompts × {meta['rounds']} round(s)"
             f" · ≤{meta['max_tokens']} new tokens · greedy · both sides cold", "",
             *([f"**Stopped early**: {meta['stopped']}", ""] if meta.get("stopped") else []),
             "| method | overall | " + " | ".join(KINDS) + " | lowest pair | identical | ran |",
             "| --- | ---: | " + " | ".join("---:" for _ in KINDS) + " | ---: | :---: | --- |"]
    for s in summary:
        kinds = " | ".join(f"{s['kinds'][k]:.2f}×" if k in s["kinds"] else "–" for k in KINDS)
        ran = ", ".join(f"{m} ×{n}" for m, n in sorted(s["ran"].items()))
        lines.append(f"| {s['method']} | {s['overall']:.2f}× | {kinds} | {s['lowest']:.2f}× "
                     f"({s['lowest_kind']}, {s['lowest_ran']}) | {s['identical']}/{s['pairs']}"
                     f" | {ran} |")
    lines += ["", "| round | kind | method | ran | first | seconds | plain seconds | speedup"
              " | tokens | tokens/pass | first token s³ | ms a pass³ | identical |",
              "| ---: | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| :---: |"]
    for p in pairs:
        tpp = "–" if p.tokens_per_pass is None else f"{p.tokens_per_pass:.2f}"
        lines.append(f"| {p.round} | {p.kind} | {p.method} | {p.ran_as} | {p.first} | "
                     f"{p.total_s:.2f} | {p.plain_s:.2f} | {p.speedup:.2f}× | {p.tokens} | {tpp}"
                     f" | {both((p.first_token_s, p.plain_first_token_s), '.2f')}"
                     f" | {both(p.pass_ms, '.0f')} | {'yes' if p.identical else 'NO'} |")
    lines += ["", "³ the method's answer / plain's. Both read the same prompt cold before their "
              "first token, so two first-token times that differ show the machine's speed "
              "moving between the two answers; a pass is the target's after the first token "
              "(plain's: one token)."]
    if any(p.trial for p in pairs):
        lines.append(TRIAL_NOTE)
    return "\n".join(lines) + "\n"


def both(values: tuple[float | None, float | None], spec: str) -> str:
    return " / ".join("–" if v is None else format(v, spec) for v in values)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.tools.heldout",
                                description=__doc__.split("\n")[0])
    p.add_argument("--prompts", type=Path, default=PROMPTS)
    p.add_argument("--methods", default="auto", help="comma-separated; each against off")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--profile", default="appliance", help="the worker's --profile")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="one more argument for the worker, e.g. --worker-arg=--target=FOLDER")
    p.add_argument("--models-from", default=None,
                   help="data folder whose converted models the worker uses (default: the app's)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="the worker's data folder (default: a new temporary one)")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.max_tokens < 1:
        p.error("--rounds and --max-tokens must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    started = time.localtime()
    pairs: list[Pair] = []
    health: dict[str, Any] = {}
    report, stopped = None, None
    try:
        prompts = load_prompts(args.prompts)
        methods = parse_methods(args.methods)
        models = models_dir(args.models_from)
        with contextlib.ExitStack() as stack:
            data = args.data_dir or Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="anve-heldout-")))
            worker = stack.enter_context(fresh_worker(
                ["--profile", args.profile, *args.worker_arg], data, models))
            client = worker.wait(args.ready_timeout)
            health = client.call("GET", "/health")
            try:
                run_pairs(client, prompts, methods, args.rounds, args.max_tokens, pairs)
                report = client.call("GET", "/v1/speculation").get("auto")
            except HeldOutError as exc:
                if not pairs:
                    raise
                stopped = str(exc)  # the finished pairs are still written
                log.error("%s", exc)
    except HeldOutError as exc:
        log.error("%s", exc)
        return 2
    meta = {"date": time.strftime("%Y-%m-%d %H:%M", started), "machine": machine(),
            "cpu_flags": simd_flags(), "profile": args.profile,
            "command": " ".join(["python -m engine.tools.heldout",
                                 *(sys.argv[1:] if argv is None else argv)]),
            "prompts": len(prompts), "rounds": args.rounds, "max_tokens": args.max_tokens,
            "plans": health.get("plans"), "stopped": stopped}
    summary = summarise(pairs, methods)
    text = markdown(summary, pairs, meta)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"heldout-{args.profile}-{time.strftime('%Y%m%d-%H%M', started)}"
    stem.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "summary": summary, "pairs": [asdict(p) for p in pairs],
         "auto": report}, indent=1), encoding="utf-8")
    stem.with_suffix(".md").write_text(text, encoding="utf-8")
    sys.stdout.write(text)
    return 0 if stopped is None else 2


if __name__ == "__main__":
    raise SystemExit(main())
