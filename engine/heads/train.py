"""Self-distillation training of an EAGLE head: ``python -m engine.heads.train``.

Contract: ``--target NAME --out FILE`` loads the target as the engine runs it (same
acceleration, so the head learns the features it will see), runs it over chat
conversations (default: ``assets/heads/corpus.jsonl``) in windows of ``--seq-len``
tokens, and records per position its final normed hidden state and its top-``k``
next-token distribution (``extract``). The head is then trained with
``smooth_l1(f̂, f) + ce_weight · CE(p_target, softmax(lm_head(f̂)))`` as in the EAGLE
paper, where the cross-entropy runs over a reduced vocabulary: the ``--ce-vocab`` ids
carrying most of the target's probability mass in the corpus (the full-vocabulary
product through ``lm_head`` is what makes CPU training slow; see
``assets/heads/README.md`` for the measured trade-off). The reduced ``lm_head`` rows are
obtained by calling the output-embeddings module on unit vectors, never by reading its
weight. Progress goes to stderr; a checkpoint (``FILE.ckpt``) is written every
``--checkpoint-every`` steps and picked up again by a rerun with the same arguments.
Target features are cached in ``FILE.features.pt`` for the same corpus and settings.
At the end the held-out acceptance (top-1 agreement of the head's first draft token
with the target's greedy token, full ``lm_head``, on the last ``--held-out`` share of
the windows) is measured and stored in the file. ``--init HEAD`` fine-tunes an existing
head (its held-out acceptance on the same windows is stored too); ``--history DB`` (the
app's history file) or ``--conversations FILE`` (the same chats as JSON lines, as the
worker receives them) train on the office's own conversations instead (see
:mod:`engine.heads.office`); ``--answers FILE`` trains on the target's own answers with
the features recorded while it answered (:mod:`engine.heads.answers`, no target pass
here). ``--unroll N`` also trains the head on its own draft steps ``2..N``, and the
held-out figures include the drafts accepted per 4-token greedy chain.
"""

import argparse
import logging
import math
import random
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.heads import answers, history
from engine.heads import corpus as corpus_mod
from engine.heads.files import HeadInfo, load_head, save_head
from engine.heads.model import (
    EagleHead,
    HeadConfig,
    draft_steps,
    feature_layers_for,
    with_fusion,
)
from engine.spec.runner import ModelRunner

log = logging.getLogger(__name__)


@dataclass
class Features:
    """What the target produced over the training windows (``N`` windows of ``L``)."""

    ids: torch.Tensor  # [N, L] token ids
    hidden: torch.Tensor  # [N, L, F] final normed hidden states (float16), after the
    # residual streams of the fused layers for an EAGLE-3 head (F = (layers + 1) H)
    top_ids: torch.Tensor  # [N, L, K] the target's most likely next tokens
    top_probs: torch.Tensor  # [N, L, K] their probabilities (float16)
    # [N, L] whether position t's loss counts (its next token is an answer's); None: all do
    mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def subset(self, rows: slice | torch.Tensor) -> "Features":
        return Features(self.ids[rows], self.hidden[rows], self.top_ids[rows],
                        self.top_probs[rows], None if self.mask is None else self.mask[rows])


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """One chat-templated conversation as token ids."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def answer_flags(tokenizer: Any, messages: list[dict[str, str]], ids: list[int]) -> list[bool]:
    """Which of ``ids`` (``chat_ids(messages)``) belong to an assistant's message: from the
    end of the prompt that asks for it (the template's generation prompt) to the end of the
    message as the template writes it. A template whose prompt does not begin the rendered
    conversation marks nothing of that message."""
    flags = [False] * len(ids)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant" or k == 0:
            continue
        asked = answers.prompt_ids(tokenizer, messages[:k])
        upto = chat_ids(tokenizer, messages[: k + 1])
        start, end = len(asked), len(upto)
        if upto[:start] == asked and ids[:end] == upto:
            flags[start:end] = [True] * (end - start)
    return flags


def answer_windows(tokenizer: Any, conversations: Iterable[list[dict[str, str]]],
                   seq_len: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Chat-templated conversations, one after another, cut into ``[seq_len]`` windows as
    they come (a partial tail dropped), each with its mask ``[seq_len]``: whether a
    position's next token is an answer's (:func:`answer_flags`), the rows a drafter drafts
    from."""
    stream: list[int] = []
    flags: list[bool] = []
    for messages in conversations:
        ids = chat_ids(tokenizer, messages)
        stream += ids
        flags += answer_flags(tokenizer, messages, ids)
        while len(stream) >= seq_len:
            # the next token after a conversation's last is the next one's first: no answer's
            after = flags[1 : seq_len + 1] + [False] * (seq_len + 1 - len(flags))
            yield (torch.tensor(stream[:seq_len], dtype=torch.long),
                   torch.tensor(after[:seq_len], dtype=torch.bool))
            del stream[:seq_len], flags[:seq_len]


def window_stream(tokenizer: Any, conversations: Iterable[list[dict[str, str]]],
                  seq_len: int) -> Iterator[torch.Tensor]:
    """:func:`answer_windows` without the masks."""
    return (ids for ids, _ in answer_windows(tokenizer, conversations, seq_len))


def windows(tokenizer: Any, conversations: list[list[dict[str, str]]], seq_len: int,
            max_tokens: int) -> torch.Tensor:
    """Chat-templated conversations packed into ``[N, seq_len]`` windows, at most
    ``max_tokens`` tokens in all."""
    found = list(islice(window_stream(tokenizer, conversations, seq_len),
                        max_tokens // seq_len))
    return torch.stack(found) if found else torch.empty(0, seq_len, dtype=torch.long)


@torch.no_grad()
def extract(model: Any, ids: torch.Tensor, top_k: int, progress: bool = True,
            taps: tuple[int, ...] = ()) -> Features:
    """Run the target over each window (the engine's forward, teacher forcing: the very
    features drafting sees, with the residual streams of layers ``taps``); keep features
    and top-k next-token probabilities."""
    hidden, top_ids, top_probs = [], [], []
    started = time.perf_counter()
    runner = ModelRunner(model)
    runner.keep_hidden(True, taps)
    for i, window in enumerate(ids):
        runner.reset()
        probs = runner.forward(window.tolist(), rows=len(window)).float().softmax(-1)  # [L, V]
        values, indices = probs.topk(top_k, dim=-1)  # [L, K]
        assert runner.hidden is not None
        hidden.append(runner.hidden.to(torch.float16))  # [L, H]
        top_ids.append(indices.to(torch.int32))
        top_probs.append(values.to(torch.float16))
        if progress and (i % 8 == 7 or i + 1 == len(ids)):
            done = (i + 1) * ids.shape[1]
            rate = done / (time.perf_counter() - started)
            sys.stderr.write(f"\rtarget features: {done}/{ids.numel()} tokens, {rate:.0f} tok/s")
    if progress:
        sys.stderr.write("\n")
    return Features(ids, torch.stack(hidden), torch.stack(top_ids), torch.stack(top_probs))


@torch.no_grad()
def reduced_lm_head(lm_head: Any, hidden_size: int, vocab: torch.Tensor,
                    chunk: int = 64) -> torch.Tensor:
    """``lm_head`` restricted to ``vocab`` as a matrix ``[H, S]`` (plus bias row-free).

    Calls the module on unit vectors (minus its output at zero, i.e. any bias).
    """
    zero = lm_head(torch.zeros(1, hidden_size))[0, vocab].float()  # [S]
    rows = []
    for start in range(0, hidden_size, chunk):
        eye = torch.eye(hidden_size)[start : start + chunk]  # [c, H]
        rows.append(lm_head(eye)[:, vocab].float() - zero)  # [c, S]
    return torch.cat(rows)  # [H, S]


def choose_vocab(data: Features, size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` ids with most target probability mass over the corpus (sorted)."""
    mass = torch.zeros(vocab_size)
    mass.index_add_(0, data.top_ids.reshape(-1).long(), data.top_probs.reshape(-1).float())
    size = min(size, int((mass > 0).sum()))
    return mass.topk(size).indices.sort().values


def soft_targets(top_ids: torch.Tensor, top_probs: torch.Tensor,
                 lookup: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Target distributions on the reduced vocabulary: indices and weights ``[..., K]``."""
    index = lookup[top_ids.long()]  # [..., K], -1 outside the reduced vocabulary
    weight = top_probs.float() * (index >= 0)
    weight = weight / weight.sum(-1, keepdim=True).clamp_min(1e-6)
    return index.clamp_min(0), weight


def batch_losses(head: EagleHead, embed: Any, w_s: torch.Tensor, lookup: torch.Tensor,
                 batch: Features, noise: float, steps: int = 1, later_weight: float = 0.5
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Feature regression and cross-entropy of one batch (both scalar tensors).

    With ``steps`` > 1 the head is also trained on its own draft steps ``2..steps``: each
    feeds the previous step's predicted features (as drafting does) and attends to the
    context and its own chain only (:func:`~engine.heads.model.draft_steps`); those
    steps' losses count ``later_weight`` each against the first step's 1.
    """
    f = batch.hidden.float()  # [B, L, F]
    inputs = f[:, :-1]
    f = f[..., -head.config.hidden_size :]  # [B, L, H] the final normed part: the targets
    if noise:
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * noise
    with torch.no_grad():
        embeds = embed(batch.ids[:, 1:]).float()  # [B, L-1, H]
    losses = [(1.0 if step == 1 else later_weight,
               *_step_losses(pred, f[:, step:], w_s, lookup, batch, step))
              for step, pred in enumerate(draft_steps(head, inputs, embeds, steps), 1)]
    total = sum(w for w, _, _ in losses)
    reg = sum(w * r for w, r, _ in losses) / total
    ce = sum(w * c for w, _, c in losses) / total
    return reg, ce  # type: ignore[return-value]


def _step_losses(pred: torch.Tensor, target: torch.Tensor, w_s: torch.Tensor,
                 lookup: torch.Tensor, batch: Features, offset: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Losses of predicted features ``[B, R, H]`` against ``f_{j+offset}`` and the target's
    next-token distributions there, averaged over the rows ``batch.mask`` counts."""
    reg = F.smooth_l1_loss(pred, target, reduction="none").mean(-1)  # [B, R]
    logp = (pred @ w_s).log_softmax(-1)  # [B, R, S]
    index, weight = soft_targets(batch.top_ids[:, offset:], batch.top_probs[:, offset:], lookup)
    ce = -(weight * logp.gather(-1, index)).sum(-1)  # [B, R]
    if batch.mask is None:
        return reg.mean(), ce.mean()
    counts = batch.mask[:, offset:].float()  # [B, R]
    rows = counts.sum().clamp_min(1.0)
    return (reg * counts).sum() / rows, (ce * counts).sum() / rows


def learning_rate(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 5 % of the steps, then cosine decay to a tenth of ``peak``."""
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = (step - warm) / max(1, total - warm)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


@dataclass
class TrainSetup:
    """Everything :func:`train` needs besides the data."""

    head: EagleHead
    embed: Any
    w_s: torch.Tensor  # [H, S] reduced lm_head
    lookup: torch.Tensor  # [V] index into the reduced vocabulary, -1 outside
    steps: int
    batch: int
    lr: float
    noise: float
    ce_weight: float
    checkpoint: Path
    checkpoint_every: int
    unroll: int = 1  # draft steps trained (1: the first step only, as EAGLE-1)
    later_weight: float = 0.5  # loss weight of each later step
    reg_weight: float = 1.0  # weight of the feature regression (EAGLE-3 drops it: 0)


def optimiser(setup: TrainSetup) -> torch.optim.Optimizer:
    return torch.optim.AdamW(setup.head.parameters(), lr=setup.lr, weight_decay=0.0)


def resume(setup: TrainSetup, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The checkpoint's state loaded into the head and ``opt`` (empty when there is none)."""
    if not setup.checkpoint.is_file():
        return {}
    state = torch.load(setup.checkpoint, weights_only=True)
    setup.head.load_state_dict(state["head"])
    opt.load_state_dict(state["opt"])
    log.info("resumed from %s at step %d", setup.checkpoint, int(state["step"]))
    return dict(state)


def train_step(setup: TrainSetup, opt: torch.optim.Optimizer, batch: Features, step: int
               ) -> tuple[float, float, float]:
    """One optimiser step of ``setup.head`` on ``batch``: (loss, regression, CE)."""
    for group in opt.param_groups:
        group["lr"] = learning_rate(step, setup.steps, setup.lr)
    reg, ce = batch_losses(setup.head, setup.embed, setup.w_s, setup.lookup, batch,
                           setup.noise, setup.unroll, setup.later_weight)
    loss = setup.reg_weight * reg + setup.ce_weight * ce
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(setup.head.parameters(), 1.0)
    opt.step()
    return float(loss.detach()), float(reg.detach()), float(ce.detach())


def train(setup: TrainSetup, data: Features, seed: int = 0) -> list[float]:
    """Train ``setup.head`` in place, resuming from the checkpoint; return the step losses."""
    setup.head.train()
    opt = optimiser(setup)
    state = resume(setup, opt)
    step, losses = int(state.get("step", 0)), list(state.get("losses", []))
    gen = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(len(data), generator=gen) for _ in range(setup.steps)]
    started, first = time.perf_counter(), step
    while step < setup.steps:
        pos = (step * setup.batch) % len(data)
        rows = orders[step * setup.batch // len(data)][pos : pos + setup.batch]
        loss, reg, ce = train_step(setup, opt, data.subset(rows), step)
        step += 1
        losses.append(loss)
        if step % 5 == 0 or step == setup.steps:
            report(step, setup.steps, reg, ce, started, first)
        if step % setup.checkpoint_every == 0 or step == setup.steps:
            save_checkpoint(setup.checkpoint, setup.head, opt, step, losses)
    sys.stderr.write("\n")
    return losses


def report(step: int, total: int, reg: float, ce: float, started: float, first: int,
           extra: str = "") -> None:
    elapsed = time.perf_counter() - started
    eta = elapsed / max(1, step - first) * (total - step)
    sys.stderr.write(f"\rstep {step}/{total}  reg {reg:.4f}  ce {ce:.3f}  {extra}"
                     f"{elapsed:.0f}s elapsed, ~{eta:.0f}s left ")


def save_checkpoint(path: Path, head: EagleHead, opt: Any, step: int,
                    losses: list[float], **more: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                "losses": losses, **more}, tmp)
    tmp.replace(path)


TOP_WIDTHS = (2, 4)  # first-token widths HeldOut.within reports


@dataclass(frozen=True)
class HeldOut:
    """What a head accepts on held-out windows, as counts (so that several add up)."""

    hits: int  # positions whose first draft token is the target's greedy one
    positions: int  # positions whose first draft token was checked
    accepted: int  # drafts accepted from greedy chains (see :func:`held_out`)
    chains: int  # chains counted
    # per TOP_WIDTHS width w: positions whose greedy token is among the head's w likeliest
    hits_within: tuple[int, ...] = (0,) * len(TOP_WIDTHS)

    @property
    def acceptance(self) -> float:
        """Share of positions whose first draft token is the target's greedy one."""
        return self.hits / max(1, self.positions)

    def within(self, width: int) -> float:
        """Share of positions whose greedy token is among the head's ``width`` likeliest
        first tokens (a ``TOP_WIDTHS`` width): what a draft tree branching that wide at
        its first position would find."""
        return self.hits_within[TOP_WIDTHS.index(width)] / max(1, self.positions)

    @property
    def chain(self) -> float:
        """Drafts accepted per ``steps``-token greedy chain."""
        return self.accepted / max(1, self.chains)

    def __add__(self, other: "HeldOut") -> "HeldOut":
        return HeldOut(self.hits + other.hits, self.positions + other.positions,
                       self.accepted + other.accepted, self.chains + other.chains,
                       tuple(a + b for a, b in zip(self.hits_within, other.hits_within,
                                                   strict=True)))


@torch.inference_mode()
def held_out(head: EagleHead, embed: Any, lm_head: Any, data: Features, steps: int = 4,
             first: int = 0) -> HeldOut:
    """Both held-out measures in one pass over ``data``, counted from context row ``first``
    on (the rows before it are context only: a prompt, where nothing is drafted).

    ``acceptance``: at every position, whether the head's first draft token (full
    ``lm_head``, teacher-forced) equals the target's greedy token (``within``: whether it is
    among the head's 2 or 4 likeliest first tokens, :data:`TOP_WIDTHS`). ``chain``: the mean
    number of drafts accepted from ``steps``-token greedy chains, over the positions where
    the text follows the target's greedy choice (its own answers). The chain after context
    row ``j`` (the head fed ``f_j`` and the next token) drafts the tokens after position
    ``j + 1``; it counts while each step's token is the target's greedy token there and the
    text goes on with it. Teacher-forcing the later steps' tokens changes nothing: they
    count only while the drafts equal the text.
    """
    head.eval()
    hits = total = accepted = counted = 0
    within = [0] * len(TOP_WIDTHS)
    for i in range(len(data)):
        ids, top = data.ids[i], data.top_ids[i, :, 0].long()  # [L], [L]
        greedy = top[:-1] == ids[1:]  # position t's greedy token is the text's next
        n = len(ids) - 1
        chains = max(0, n - steps)  # chains after rows j < n - steps can be checked to the end
        embeds = embed(ids[None, 1:]).float()  # [1, n, H]
        start = min(first, chains)  # the first chain counted
        j = torch.arange(start, chains)  # [C] the rows whose chains count
        run, alive = torch.zeros(len(j), dtype=torch.long), greedy[j].clone()
        preds = draft_steps(head, data.hidden[i : i + 1, :-1].float(), embeds,
                            steps if chains else 1)
        for step, pred in enumerate(preds, 1):
            lo, rows = (min(first, n), n) if step == 1 else (start, chains)
            logits = lm_head(pred[0, lo:rows])  # [rows - lo, V]
            guess = logits.argmax(-1)  # [rows - lo] drafts at step
            if step == 1:
                hits += int((guess == top[1 + lo :]).sum())
                total += n - lo
                likeliest = logits.topk(max(TOP_WIDTHS), -1).indices  # [rows - lo, w]
                found = likeliest == top[1 + lo :, None]  # [rows - lo, w]
                for w, width in enumerate(TOP_WIDTHS):
                    within[w] += int(found[:, :width].any(-1).sum())
            alive &= (guess[: len(j)] == top[j + step]) & greedy[j + step]
            run += alive
        counted += int(greedy[j].sum())
        accepted += int(run.sum())
    return HeldOut(hits, total, accepted, counted, tuple(within))


def load_features(model: Any, tokenizer: Any, args: argparse.Namespace,
                  conversations: list[list[dict[str, str]]], cache: Path,
                  taps: tuple[int, ...] = ()) -> Features:
    """Target features for the corpus (with the residual streams of layers ``taps``),
    cached next to the output for resumed runs.

    The cache is reused only if it was made from the same corpus and settings.
    """
    source = args.history or args.conversations or args.corpus
    key = [str(source), args.tokens, args.seq_len, args.top_k, args.accel, list(taps)]
    if cache.is_file():
        saved = torch.load(cache, weights_only=True)
        if saved.pop("key", None) == key:
            log.info("reusing target features from %s", cache)
            return Features(**saved)
    ids = windows(tokenizer, conversations, args.seq_len, args.tokens)
    if len(ids) < 2:
        held = sum(len(chat_ids(tokenizer, m)) for m in conversations)
        raise SystemExit(f"the conversations hold {held} tokens, too few for two windows of "
                         f"{args.seq_len}; chat more first (or lower --seq-len)")
    data = extract(model, ids, args.top_k, taps=taps)
    torch.save({**vars(data), "key": key}, cache)
    return data


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.heads.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="model name or local model folder")
    p.add_argument("--out", required=True, type=Path, help="head file to write (.safetensors)")
    p.add_argument("--corpus", type=Path, default=corpus_mod.DEFAULT)
    office = p.add_mutually_exclusive_group()
    office.add_argument("--history", type=Path, default=None,
                        help="train on the app's SQLite history instead of --corpus")
    office.add_argument("--conversations", type=Path, default=None,
                        help="train on these chats (JSON lines of {\"messages\": [...]})")
    office.add_argument("--answers", type=Path, nargs="+", default=None,
                        help="train on the target's own answers (python -m engine.heads.answers;"
                             " one or more files)")
    p.add_argument("--init", type=Path, default=None, help="head file to fine-tune")
    p.add_argument("--tokens", type=int, default=60000, help="corpus tokens to use")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--held-out", type=float, default=0.1, help="share of windows held out")
    p.add_argument("--top-k", type=int, default=32, help="target probabilities kept per token")
    p.add_argument("--ce-vocab", type=int, default=8192, help="reduced vocabulary for the CE")
    p.add_argument("--intermediate", type=int, default=None, help="head MLP size")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--noise", type=float, default=0.05, help="uniform feature noise amplitude")
    p.add_argument("--ce-weight", type=float, default=0.1)
    p.add_argument("--unroll", type=int, default=1,
                   help="draft steps trained per position (2+: also on its own predictions)")
    p.add_argument("--later-weight", type=float, default=0.5, help="loss weight of steps 2+")
    p.add_argument("--reg-weight", type=float, default=1.0,
                   help="weight of the feature regression loss (EAGLE-3 trains on CE alone: 0)")
    p.add_argument("--fuse", action="store_true",
                   help="an EAGLE-3 head: fuse low and middle layers' features with the final "
                        "one (with --init, made from that head, drafting as it did at first)")
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--accel", default="auto", help="target acceleration (as the engine runs)")
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    if args.unroll < 1:
        p.error("--unroll must be at least 1 (1 trains the first draft step only)")
    if args.fuse and args.answers:
        p.error("--answers records hold only the final features: a --fuse head needs "
                "--corpus, --conversations or --history (teacher-forced)")
    return args


def load_target(name: str, data_dir: str | None, accel: str) -> Any:
    from engine.models import cache
    from engine.models.loading import load_prepared

    return load_prepared(cache.prepare(name, data_dir), "float32", accel)


def split(data: Features, held_out: float) -> tuple[Features, Features]:
    """The last ``held_out`` share of the windows (at least one) is held out."""
    n_held = max(1, round(len(data) * held_out))
    return data.subset(slice(0, len(data) - n_held)), data.subset(slice(len(data) - n_held, None))


def initial_head(args: argparse.Namespace, loaded: Any) -> tuple[EagleHead, EagleHead | None]:
    """A new head, or a copy of ``--init`` to fine-tune (then also returned unchanged);
    with ``--fuse`` an EAGLE-3 one (from an EAGLE-1 ``--init``: :func:`with_fusion`)."""
    config = loaded.model.config
    layers = feature_layers_for(int(config.num_hidden_layers)) if args.fuse else ()
    if args.init is None:
        return EagleHead(HeadConfig.for_target(config, args.intermediate, layers)), None
    base, _ = load_head(args.init, loaded.name, loaded.sha256, loaded.model)
    if args.fuse and not base.fuses:
        return with_fusion(base, layers), base
    head = EagleHead(base.config)
    head.load_state_dict(base.state_dict())
    return head, base


def read_conversations(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    if args.history:
        found = history.conversations(args.history)
    else:
        found = corpus_mod.load(args.conversations or args.corpus)
    random.Random(0).shuffle(found)
    return found


def answer_features(paths: list[Path], seq_len: int) -> Features:
    """The target's recorded answers (:mod:`engine.heads.answers`) in windows; the records
    of several files spread evenly through each other (each file's in its own order), so
    the held-out tail holds some of every file."""
    spread: list[tuple[float, int, answers.Record]] = []  # (place in its file, file, record)
    for f, path in enumerate(paths):
        records = answers.load_records(path)
        spread += [((i + 0.5) / len(records), f, r) for i, r in enumerate(records)]
    records = [r for _, _, r in sorted(spread, key=lambda item: item[:2])]
    held = sum(len(r.ids) for r in records)
    if held < 2 * seq_len:
        names = ", ".join(str(p) for p in paths)
        raise SystemExit(f"{names} hold {held} tokens of answers, too few for two windows of "
                         f"{seq_len}; answer more prompts first (or lower --seq-len)")
    return Features(**answers.pack(records, seq_len))


def corpus_name(args: argparse.Namespace) -> str:
    if args.answers:
        return f"target answers ({', '.join(p.name for p in args.answers)})"
    return "office history" if args.history or args.conversations else str(args.corpus.name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.manual_seed(0)
    started = time.perf_counter()
    loaded = load_target(args.target, args.data_dir, args.accel)
    embed, lm_head = loaded.model.get_input_embeddings(), loaded.model.get_output_embeddings()
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    head, base = initial_head(args, loaded)
    if args.answers:
        data = answer_features(args.answers, args.seq_len)
    else:
        data = load_features(loaded.model, loaded.tokenizer, args, read_conversations(args),
                             out.with_name(out.name + ".features.pt"),
                             head.config.feature_layers)
    train_data, held = split(data, args.held_out)
    vocab = choose_vocab(train_data, args.ce_vocab, embed.num_embeddings)
    lookup = torch.full((embed.num_embeddings,), -1, dtype=torch.long)
    lookup[vocab] = torch.arange(len(vocab))
    setup = TrainSetup(head, embed, reduced_lm_head(lm_head, head.config.hidden_size, vocab),
                       lookup, args.steps, args.batch, args.lr, args.noise, args.ce_weight,
                       out.with_name(out.name + ".ckpt"), args.checkpoint_every, args.unroll,
                       args.later_weight, args.reg_weight)
    losses = train(setup, train_data)
    measured = held_out(head, embed, lm_head, held)
    acceptance = measured.acceptance
    extra = {"held_out_tokens": int(held.ids.numel()), "steps": args.steps,
             "ce_vocab": len(vocab), "top_k": args.top_k, "first_loss": losses[0],
             "final_loss": losses[-1], "seconds": round(time.perf_counter() - started),
             "unroll": args.unroll, "corpus": corpus_name(args),
             "held_out_chain_accepted": round(measured.chain, 3)}
    if base is not None:
        before = held_out(base, embed, lm_head, held)
        extra["init_held_out_acceptance"] = before.acceptance
        extra["init_held_out_chain_accepted"] = round(before.chain, 3)
    info = HeadInfo(loaded.name, loaded.sha256, int(embed.num_embeddings), head.config,
                    int(train_data.ids.numel()), round(acceptance, 4), extra)
    save_head(head, info, out)
    log.info("held-out acceptance %.3f (first draft token), %.2f of 4-token chains accepted;"
             " wrote %s (%.1f MB)", acceptance, extra["held_out_chain_accepted"], out,
             out.stat().st_size / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
