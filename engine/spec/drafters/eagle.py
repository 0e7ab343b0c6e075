"""Drafting with an EAGLE head (Li et al. 2024) on the target's own features.

The head reads the target's final normed hidden state ``f_i`` (kept by the runner
during verification: no extra target forward; an EAGLE-3 head also reads the residual
streams of the layers it names, ``feature_layers``, which the runner then keeps beside it,
and fuses them: :meth:`engine.heads.model.EagleHead.fused`) and the embedding of the token that
followed it, predicts the next feature, and the target's own ``lm_head`` module turns
that into logits. The head keeps its own KV cache with one entry per context position
whose target feature is known (a :class:`~engine.spec.runner.PrefixCache`, as the
target's); each ``propose`` crops it to the prefix still shared with the context,
feeds the new positions, then drafts up to ``k`` tokens by feeding its own predicted
features, and finally crops those draft entries away again (they are
replaced by the target's real features after verification). Greedy drafts are the
argmax (``probs=None``); sampled drafts return the distributions ``q`` they came from,
processed like the target's, so acceptance stays lossless. Drafting stops early after
a token the head gave less than ``min_confidence``. With ``branches`` the chain gets up
to that many alternative tokens as leaves beside it (:mod:`engine.spec.drafters.tree`), for
runners that verify trees.

Drafting cost: the head's linear layers run as per-channel int8 on our kernels where
they run (:func:`quantize_head`), its decoder layer then as one native call per draft
step (:class:`engine.cpu.forward.Stack`, native where it can), and the target's
``lm_head`` is read only for the frequent part of the vocabulary plus the end tokens
(:mod:`engine.spec.drafters.vocab`), those re-rounded to 4 bits; none of it can change an
answer, only how many drafts are accepted.
"""

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from engine.cpu import Stack, int8_layers
from engine.errors import EngineError
from engine.heads.files import SHIPPED, find_head, load_head
from engine.heads.model import EagleHead
from engine.models.loading import LoadedModel
from engine.spec.drafters import EMPTY_DRAFT, Draft, Drafter
from engine.spec.drafters.tree import Level, branch, choose
from engine.spec.drafters.vocab import draft_head, kept_logits
from engine.spec.runner import PrefixCache
from engine.spec.sampling import SamplingParams

log = logging.getLogger(__name__)


class EagleDrafter(Drafter):
    """Proposes tokens with a trained head over the target's features."""

    name = "eagle"
    wants_hidden = True
    reads_prompt = True

    def __init__(self, head: EagleHead, target: Any, min_confidence: float = 0.3,
                 draft_vocab: int | None = None, keep_ids: Sequence[int] = (),
                 branches: int = 0, min_branch: float = 0.1, int4_vocab: bool = True,
                 tokenizer: Any | None = None) -> None:
        self.head = head.eval()
        self.dtype = next(head.parameters()).dtype
        self.stack = Stack(head.decoder, self.dtype)  # the engine's forward of its layer
        # called as a module, never read: the frequent ids (the tokenizer's ranking, else
        # low ids) and keep_ids (end tokens)
        self.lm_head = draft_head(target.get_output_embeddings(), keep_ids, tokenizer,
                                  draft_vocab, int4_vocab)
        self.embed = target.get_input_embeddings()
        self.feature_layers = head.config.feature_layers  # what the runner keeps
        self.info: dict[str, Any] = {"kind": head_kind(head)}  # what the worker reports
        self.min_confidence = min_confidence
        self.branches, self.min_branch = branches, min_branch  # tree drafting (tree.py)
        self.features: torch.Tensor | None = None  # [len(context) - 1, F] from the target
        # entry i: feature i with the token after it, so the ids run one ahead of the entries
        self.kv = PrefixCache(self.stack.new_cache(), lag=1)

    def observe_hidden(self, features: torch.Tensor | None) -> None:
        """The target's features of ``context[:-1]`` (``[len(context) - 1, F]``); features
        of another width (kept for another head) are not used."""
        width = self.head.config.feature_size
        self.features = features if features is not None and features.shape[-1] == width \
            else None


    def reset(self) -> None:
        self.kv = PrefixCache(self.stack.new_cache(), lag=1)

    def _step(self, features: torch.Tensor, ids: Sequence[int], target: bool = True
              ) -> torch.Tensor:
        """Feed entries ``(features, ids [T])``: the target's ``[T, F]`` (fused here) or,
        with ``target=False``, the head's own ``[T, H]``; return the last predicted feature
        ``[1, H]``."""
        embeds = self.embed(torch.tensor(list(ids), dtype=torch.long))  # [T, H]
        f, e = features.to(self.dtype), embeds.to(self.dtype)
        if target:
            f = self.head.fused(f)  # [T, H]
        out = self.stack(self.head.fc(torch.cat([f, e], dim=-1)), self.kv.cache)  # [T, H]
        return out[-1:].to(features.dtype)  # [1, H]

    def _kept(self, context: Sequence[int]) -> int:
        """Entries of the head's cache that hold for ``context``, all but its last known
        position's at most (the next step feeds that one)."""
        return min(self.kv.reusable(context), len(context) - 2)

    def unread(self, context: Sequence[int]) -> int:
        """Entries the head would feed before its first draft after ``context``."""
        real = len(context) - 1
        return 0 if real < 1 else real - self._kept(context)

    @torch.inference_mode()
    def prefill(self, context: Sequence[int]) -> None:
        """Feed the head all known positions but the last (the first ``propose`` feeds it)."""
        real = len(context) - 1
        features = self.features
        if real < 2 or features is None or features.shape[0] < real:
            return
        keep = self._kept(context)
        self.kv.truncate(keep)
        if keep < real - 1:
            self._step(features[keep : real - 1], context[keep + 1 : real])
        self.kv.ids = list(context[:real])

    @torch.inference_mode()
    def propose(
        self, context: Sequence[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        real = len(context) - 1  # entries whose target feature is known
        features = self.features
        if k <= 0 or real < 1 or features is None or features.shape[0] < real:
            return EMPTY_DRAFT
        keep = self._kept(context)
        self.kv.truncate(keep)
        feature = self._step(features[keep:real], context[keep + 1 : real + 1])  # [1, H]
        self.kv.ids = list(context)
        draft = self._draft(feature, k, params, generator, len(context))
        self.kv.truncate(real)  # the draft steps' entries go
        return replace(draft, catch_up=real - keep)

    def _draft(
        self, feature: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator,
        position: int,
    ) -> Draft:
        """Up to ``k`` tokens for context positions ``position, position + 1, ...``."""
        levels: list[Level] = []
        for i in range(k):
            if params.greedy:  # the kept ids' logits only, never spread over the vocabulary
                logits, ids = kept_logits(self.lm_head, feature)  # [1, N], [N] (or [1, V], None)
            else:
                logits, ids = self.lm_head(feature), None  # [1, V]
            levels.append(choose(logits[0], params, generator, self.branches and 1,
                                 position + i, ids))
            if levels[-1].confidence < self.min_confidence or i + 1 == k:
                break
            feature = self._step(feature, [levels[-1].token], target=False)  # [1, H]
        return branch(levels, self.branches, self.min_branch)


def head_kind(head: EagleHead) -> str:
    """``"EAGLE-3"`` for a head fusing several target layers, else ``"EAGLE-1"``."""
    return "EAGLE-3" if head.config.feature_layers else "EAGLE-1"


def quantize_head(head: EagleHead) -> EagleHead:
    """Run the head's linear layers as per-channel int8 on our kernels (in place)."""
    int8_layers(head)
    return head


def eagle_for(
    target: LoadedModel, head_file: Path | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> EagleDrafter | None:
    """The EAGLE drafter for ``target`` from ``head_file`` or its installed head, if any
    (the office's own in ``data_dir`` first, then the shipped one).

    A head that is missing gives ``None``; one that is damaged or made for another
    target is logged and skipped (the engine still runs, without ``eagle``).
    """
    path = head_file or find_head(target.name, data_dir)
    if path is None:
        return None
    try:
        head, info = load_head(path, target.name, target.sha256, target.model)
    except EngineError as exc:
        if head_file is not None:
            raise
        log.warning("not offering eagle: %s", exc)
        return None
    log.info("eagle head %s (%s, held-out acceptance %s)", path, head_kind(head),
             info.held_out_acceptance)
    drafter = EagleDrafter(quantize_head(head), target.model, keep_ids=sorted(target.eos_ids),
                           tokenizer=target.tokenizer)
    drafter.info.update(
        file=path.name, shipped=path.parent.resolve() == SHIPPED.resolve(),
        feature_layers=list(info.config.feature_layers), training_tokens=info.corpus_tokens,
        teacher_forced=bool(info.extra.get("teacher_forced")),
        held_out_acceptance=info.held_out_acceptance,
        held_out_chain_accepted=info.extra.get("held_out_chain_accepted"))
    return drafter
