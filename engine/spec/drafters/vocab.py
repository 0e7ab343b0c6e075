"""A drafter's output layer over the frequent part of the vocabulary (FR-Spec, VocabTrim).

Contract: :func:`short_head` wraps a model's output layer (its ``lm_head``) so that it
computes the logits of a kept set of token ids only and returns full-vocabulary logits
``[..., V]`` with ``-inf`` everywhere else. The kept set is either

* ``ids``: the ``size`` most frequent ids of a ranked list measured on the target's own
  outputs (:class:`Ranking`, shipped as ``assets/heads/*.vocab.safetensors`` and built by
  ``python -m engine.heads.vocab``), plus a few named ids (end of turn, end of text); their
  rows are gathered (copied) into one layer of the same kind; or
* today's rule when no ranking fits the tokenizer: ids ``0 .. size - 1`` plus the named
  ids. BPE vocabularies number tokens in merge order, so low ids are mostly the frequent
  ones; those rows are sliced without copying.

The output layer is the largest single product of a drafting step (Qwen2.5 1.5B: 151,936
x 1,536 weights), so computing fewer rows makes drafts cheaper. A drafter using it never
proposes another id; its distribution ``q`` is the softmax over the kept ids and zero
elsewhere, which is the distribution its drafts are really drawn from, so acceptance stays
lossless (greedy drafts are the argmax over the kept ids; a target token outside the set is
simply never drafted and is reached through the rejection's residual). Rows of
``nn.Linear`` and of our row-major quantized layers are selected; any other layer, or a
vocabulary no larger than the kept set, is returned unchanged.

:func:`frequent_ids` reads the ranking for a tokenizer; a missing, damaged or mismatched
file is logged and gives ``None`` (the caller keeps the low-id rule), never an error.
"""

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.cpu import as_int4, select_rows
from engine.paths import ASSETS

log = logging.getLogger(__name__)

DRAFT_VOCAB = 65536  # kept ids under the low-id rule (no ranking for the tokenizer)
RANKED_VOCAB = 32768  # kept ids from a ranking (docs/vocab.md: coverage and step costs)
ASSETS = ASSETS / "heads"
SUFFIX = ".vocab.safetensors"
FORMAT = "anve-draft-vocab-1"


class ShortHead(nn.Module):
    """Logits of the kept ids; ``-inf`` for the rest.

    ``frequent`` computes either ids ``0 .. size - 1`` (``frequent_ids`` empty) or the ids
    in ``frequent_ids``; ``extra`` computes ``extra_ids``."""

    extra_ids: torch.Tensor  # [E] ids computed by ``extra``
    frequent_ids: torch.Tensor  # [N] ids computed by ``frequent``, or [0] for 0 .. size - 1

    def __init__(self, frequent: Any, extra: nn.Module | None, extra_ids: torch.Tensor,
                 vocab_size: int, frequent_ids: torch.Tensor | None = None) -> None:
        super().__init__()
        self.frequent, self.extra = frequent, extra
        self.size = int(frequent.out_features)
        self.register_buffer("extra_ids", extra_ids)
        self.register_buffer("frequent_ids", torch.zeros(0, dtype=torch.long)
                             if frequent_ids is None else frequent_ids)
        self.vocab_size = vocab_size
        frequent = self.frequent_ids if len(self.frequent_ids) else torch.arange(self.size)
        self._ids = torch.cat([frequent, self.extra_ids])  # kept_logits' columns, in order

    @property
    def kept(self) -> torch.Tensor:
        """The ids whose logits are computed, sorted ``[N + E]``."""
        return self._ids.unique()

    @property
    def columns(self) -> torch.Tensor:
        """The ids of :meth:`kept_logits`' columns, in their order ``[N + E]``."""
        return self._ids

    def kept_logits(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept ids' logits ``[..., N + E]`` and those ids ``[N + E]`` (ascending, as
        :func:`short_head` builds them): what :meth:`forward` returns without spreading it
        over the vocabulary (a greedy draft needs no ``-inf`` rest, and spreading it and
        a softmax over the whole vocabulary were a share of a head's draft step worth
        saving: docs/measurements.md)."""
        logits = self.frequent(x)  # [..., N]
        if self.extra is not None:  # ids past the low ones: above them, in order
            logits = torch.cat([logits, self.extra(x)], dim=-1)  # [..., N + E]
        return logits, self._ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.full((*x.shape[:-1], self.vocab_size), -torch.inf, dtype=x.dtype)  # [..., V]
        if len(self.frequent_ids):
            out[..., self.frequent_ids] = self.frequent(x)
        else:
            out[..., : self.size] = self.frequent(x)
        if self.extra is not None:
            out[..., self.extra_ids] = self.extra(x)
        return out


def short_head(lm_head: Any, extra_ids: Iterable[int], size: int = DRAFT_VOCAB,
               int4: bool = False, ids: Sequence[int] | torch.Tensor | None = None) -> Any:
    """``lm_head`` restricted to ids below ``size`` plus ``extra_ids`` or, given ``ids``
    (a ranking's kept ids, any order), to ``ids`` plus ``extra_ids``, all their rows gathered
    into one layer (see the module); with ``int4`` the gathered or frequent rows are
    re-rounded by :func:`as_int4`. Ids outside the vocabulary are ignored."""
    vocab = int(lm_head.out_features)
    named = {int(i) for i in extra_ids if 0 <= int(i) < vocab}
    if ids is not None:
        wanted = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
        wanted = wanted[(wanted >= 0) & (wanted < vocab)]
        kept = torch.cat([wanted, torch.tensor(sorted(named), dtype=torch.long)]).unique()
        if len(kept) >= vocab:
            return as_int4(lm_head) if int4 else lm_head
        gathered = select_rows(lm_head, kept)
        if gathered is None:
            return lm_head
        return ShortHead(as_int4(gathered) if int4 else gathered, None,
                         torch.zeros(0, dtype=torch.long), vocab, frequent_ids=kept)
    if vocab <= size:
        return as_int4(lm_head) if int4 else lm_head
    frequent = select_rows(lm_head, slice(0, size))
    if frequent is None:
        return lm_head
    if int4:
        frequent = as_int4(frequent)
    extra_tensor = torch.tensor(sorted(i for i in named if i >= size), dtype=torch.long)
    extra = select_rows(lm_head, extra_tensor) if len(extra_tensor) else None
    return ShortHead(frequent, extra, extra_tensor, vocab)


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's string-to-id mapping (added tokens included): two
    tokenizers with the same hash give every token the same id."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    text = json.dumps(vocab, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Ranking:
    """Token ids of one tokenizer, most frequent first, with where the counts came from."""

    ids: torch.Tensor  # [M] int64, distinct, most frequent first
    tokenizer_sha256: str
    info: dict[str, Any] = field(default_factory=dict)  # sources, licences, counts, coverage

    def top(self, size: int) -> torch.Tensor:
        """The ``size`` most frequent ids, sorted ``[min(size, M)]``."""
        return self.ids[:size].sort().values


class BadRankingError(ValueError):
    """A vocabulary file that cannot be read or is not one of ours."""


def save_ranking(path: Path, ranking: Ranking) -> None:
    """Write ``ranking`` as safetensors (``ids`` int32, metadata as JSON strings)."""
    from safetensors.torch import save_file

    meta = {"format": FORMAT, "tokenizer_sha256": ranking.tokenizer_sha256,
            "info": json.dumps(ranking.info, ensure_ascii=False, sort_keys=True)}
    save_file({"ids": ranking.ids.to(torch.int32).contiguous()}, str(path), metadata=meta)


def load_ranking(path: Path) -> Ranking:
    """Read a file written by :func:`save_ranking`; :class:`BadRankingError` if it is not one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            ids = f.get_tensor("ids")
    except (OSError, SafetensorError, KeyError, ValueError, RuntimeError) as exc:
        raise BadRankingError(f"{path} is not a readable draft vocabulary: {exc}") from exc
    if meta.get("format") != FORMAT or "tokenizer_sha256" not in meta:
        raise BadRankingError(f"{path} is not a draft vocabulary of format {FORMAT}")
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64) or not len(ids):
        raise BadRankingError(f"{path}: ids must be a non-empty 1-d integer tensor")
    ids = ids.long()
    if int(ids.min()) < 0 or len(ids.unique()) != len(ids):
        raise BadRankingError(f"{path}: ids must be distinct and not negative")
    try:
        info = json.loads(meta.get("info", "{}"))
    except json.JSONDecodeError as exc:
        raise BadRankingError(f"{path}: unreadable metadata: {exc}") from exc
    return Ranking(ids, meta["tokenizer_sha256"], info if isinstance(info, dict) else {})


@lru_cache(maxsize=16)
def _read(path: str, mtime_ns: int, size: int) -> Ranking | str:
    """The ranking in ``path`` or why it was not read (cached per file version)."""
    del mtime_ns, size  # part of the cache key only
    try:
        return load_ranking(Path(path))
    except BadRankingError as exc:
        return str(exc)


def find_ranking(tokenizer: Any, folder: Path | None = None) -> tuple[Path, Ranking] | None:
    """The ranking in ``folder`` (:data:`ASSETS`) made for ``tokenizer``, or None (logged:
    none fits, or a file is damaged)."""
    try:
        digest = tokenizer_hash(tokenizer)
    except (AttributeError, TypeError) as exc:
        log.info("draft vocabulary: cannot hash the tokenizer (%s)", exc)
        return None
    for path in sorted((folder or ASSETS).glob(f"*{SUFFIX}")):
        stat = path.stat()
        ranking = _read(str(path), stat.st_mtime_ns, stat.st_size)
        if isinstance(ranking, str):
            log.warning("draft vocabulary: skipping %s", ranking)
        elif ranking.tokenizer_sha256 == digest:
            return path, ranking
    return None


def frequent_ids(tokenizer: Any, vocab_size: int, size: int = RANKED_VOCAB,
                 folder: Path | None = None) -> torch.Tensor | None:
    """The ``size`` most frequent ids (sorted) of the ranking made for ``tokenizer``, or
    None when there is none or it does not fit a ``vocab_size``-row output layer; every
    None is logged, and the caller falls back to the low-id rule (:data:`DRAFT_VOCAB`)."""
    found = find_ranking(tokenizer, folder)
    if found is None:
        log.info("draft vocabulary: no ranked list for this tokenizer in %s; drafting over "
                 "ids below the size (%d by default)", folder or ASSETS, DRAFT_VOCAB)
        return None
    path, ranking = found
    if int(ranking.ids.max()) >= vocab_size:
        log.warning("draft vocabulary: %s names ids beyond the model's %d rows; drafting over "
                    "ids below the size (%d by default)", path, vocab_size, DRAFT_VOCAB)
        return None
    top = ranking.top(size)
    log.info("draft vocabulary: %d most frequent ids of %s", len(top), path.name)
    return top


def draft_head(lm_head: Any, extra_ids: Iterable[int], tokenizer: Any | None,
               size: int | None = None, int4: bool = False, folder: Path | None = None) -> Any:
    """A drafter's output layer: the ranking's ``size`` (:data:`RANKED_VOCAB`) most frequent
    ids plus ``extra_ids`` when a ranking fits ``tokenizer``, else ids below
    :data:`DRAFT_VOCAB` plus ``extra_ids`` (:func:`short_head`, full-vocabulary logits)."""
    vocab = int(lm_head.out_features)
    ids = None if tokenizer is None else frequent_ids(tokenizer, vocab, size or RANKED_VOCAB,
                                                      folder)
    if ids is None:
        return short_head(lm_head, extra_ids, DRAFT_VOCAB if size is None else size, int4)
    return short_head(lm_head, extra_ids, int4=int4, ids=ids)


def kept_logits(head: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``head``'s logits of ``x`` over the ids it computes and those ids
    (:meth:`ShortHead.kept_logits`), or the whole vocabulary's and ``None`` for a head
    that computes all of it."""
    if isinstance(head, ShortHead):
        return head.kept_logits(x)
    return head(x), None
