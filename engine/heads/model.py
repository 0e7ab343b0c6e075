"""The EAGLE head: ``fc([feature; embedding]) -> one Llama decoder layer -> feature``.

EAGLE-3 (Li et al. 2025): a head whose config names ``feature_layers`` reads wider target
features, the residual streams after those (low and middle) layers beside the final
normed state (the high one), ``[.., (len(feature_layers) + 1) H]``, and fuses them into
the ``[.., H]`` its first draft step reads; its later draft steps read its own
predictions, as EAGLE-1's do. The fusion is the final normed state plus a rank-``r``
linear map of the low and middle ones (``fuse_up(fuse_down(.))``, no biases): where
EAGLE-3 learns one ``3H -> H`` map, this one costs ``3 r H`` weights instead of ``3 H²``
(2.4 MB in float16 at ``r = 256`` for Qwen's ``H = 1536``, against 14 MB: what keeps the
head file within 40 MB) and starts, with ``fuse_up`` zero, as the EAGLE-1 head it is made
from. :meth:`EagleHead.fused` is that map (for an EAGLE-1 head, the final normed part as it
is), so the rest of the head is the same for both; :func:`with_fusion` makes an EAGLE-3
head from an EAGLE-1 one that starts out computing exactly what it did.

Contract: given the target's final normed hidden states ``f_i`` ``[B, T, H]`` and the
target's input embeddings of the tokens that follow them ``e(x_{i+1})`` ``[B, T, H]``,
:meth:`EagleHead.forward` predicts ``f_{i+1}`` ``[B, T, H]``; the target's own frozen
output embeddings (its ``lm_head``) turn that into logits. This module is what training
runs (transformers' ``LlamaModel``, a ``DynamicCache`` when one is passed, gradients);
drafting runs the same layer through the engine's own forward
(:class:`engine.cpu.forward.Stack`). The decoder layer is transformers' ``LlamaModel``
with one layer (rotary positions, causal mask, cache handling and a final RMSNorm come
with it); its own token embedding table has a single unused row.
"""

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel


@dataclass(frozen=True)
class HeadConfig:
    """Shape of a head; ``hidden_size`` must equal the target's."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    max_positions: int
    feature_layers: tuple[int, ...] = ()  # EAGLE-3: target layers fused with the final state
    fuse_rank: int = 256  # rank of the fusion of those layers' features (with feature_layers)

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_layers", tuple(int(t) for t in self.feature_layers))

    @property
    def feature_size(self) -> int:
        """Width of the target features the head reads: ``(len(feature_layers) + 1) H``."""
        return self.hidden_size * (len(self.feature_layers) + 1)

    @classmethod
    def for_target(cls, config: Any, intermediate_size: int | None = None,
                   feature_layers: tuple[int, ...] = (), fuse_rank: int = 256
                   ) -> "HeadConfig":
        """A head shaped like one of the target's layers (optionally a smaller MLP)."""
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        return cls(
            hidden_size=int(config.hidden_size), num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            intermediate_size=int(intermediate_size or config.intermediate_size),
            rope_theta=float(theta), rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            max_positions=int(getattr(config, "max_position_embeddings", 2048)),
            feature_layers=feature_layers, fuse_rank=fuse_rank,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=1, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_positions, rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            pad_token_id=None, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        )


class EagleHead(nn.Module):
    """Predicts the target's next feature from its current feature and the next token."""

    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.decoder = LlamaModel(config.llama_config())
        size, low = config.hidden_size, config.feature_size - config.hidden_size
        self.fuse_down = nn.Linear(low, config.fuse_rank, bias=False) if low else None
        self.fuse_up = nn.Linear(config.fuse_rank, size, bias=False) if low else None

    @property
    def fuses(self) -> bool:
        """Whether the head fuses lower layers' features (EAGLE-3)."""
        return self.fuse_down is not None

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features ``[.., F]`` as the first draft step's input ``[.., H]``:
        the final normed part plus the low-rank map of the rest."""
        size = self.config.hidden_size
        final = features[..., -size:]
        if self.fuse_down is None or self.fuse_up is None:
            return final
        return final + self.fuse_up(self.fuse_down(features[..., :-size]))

    def forward(
        self, features: torch.Tensor, embeds: torch.Tensor, cache: DynamicCache | None = None,
        positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``features``, ``embeds`` ``[B, T, H]`` -> predicted next features ``[B, T, H]``;
        ``features`` are the target's (through :meth:`fused`) or the head's own predictions.

        ``positions`` ``[B, T]`` and an additive ``mask`` ``[B, 1, T, T]`` replace the
        default consecutive positions and causal mask (training-time unrolling)."""
        x = self.fc(torch.cat([features, embeds], dim=-1))  # [B, T, H]
        out = self.decoder(inputs_embeds=x, cache=cache, use_cache=cache is not None,
                           position_ids=positions, attention_mask=mask)
        return out.last_hidden_state  # [B, T, H]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def feature_layers_for(layers: int) -> tuple[int, ...]:
    """The low and middle layers an EAGLE-3 head fuses for a target of ``layers`` layers
    (after its second layer and at its middle; the final normed state is the high one)."""
    if layers < 4:
        raise ValueError(f"a target of {layers} layers is too shallow for fused features")
    return (1 if layers > 4 else 0, layers // 2 - 1)


def with_fusion(base: EagleHead, feature_layers: tuple[int, ...]) -> EagleHead:
    """An EAGLE-3 head made from ``base`` (its weights copied) whose fusion at first passes
    the final normed part through unchanged: it drafts exactly as ``base`` does."""
    if base.fuses:
        raise ValueError("the head already fuses features")
    if not feature_layers:
        raise ValueError("fusing needs at least one lower layer")
    head = EagleHead(replace(base.config, feature_layers=feature_layers))
    head.load_state_dict(base.state_dict(), strict=False)
    assert head.fuse_up is not None
    with torch.no_grad():
        head.fuse_up.weight.zero_()  # the low-rank part adds nothing yet
    return head.to(next(base.parameters()).dtype)


def draft_step_layout(n: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions ``[R]`` and additive mask ``[1, 1, R, K]`` of draft step ``step`` (>= 2)
    over a context of ``n`` rows, for training a head on its own later draft steps.

    The head's cache holds the ``n`` context rows (row ``i`` at position ``i``) and then the
    rows of steps ``2..step-1``. Step ``s`` has ``R = n - s + 1`` rows: row ``j`` is the draft
    after context row ``j``, at position ``j + s - 1``; at draft time it attends to context
    rows ``0..j``, to its own chain's earlier draft rows and to itself, and so it does here.
    """
    rows = n - step + 1
    allowed = [torch.ones(rows, n, dtype=torch.bool).tril()]  # context rows 0..j
    for s in range(2, step + 1):  # row j of each draft step so far, this one included
        allowed.append(torch.eye(rows, n - s + 1, dtype=torch.bool))
    keep = torch.cat(allowed, dim=1)  # [R, K]
    mask = torch.zeros(keep.shape).masked_fill(~keep, float("-inf"))
    return torch.arange(step - 1, n), mask[None, None]


def draft_steps(head: EagleHead, features: torch.Tensor, embeds: torch.Tensor, steps: int
                ) -> Iterator[torch.Tensor]:
    """The head's predicted features at draft steps ``1..steps`` after every context row,
    as drafting gives them, in one forward per step (training and evaluation).

    ``features`` ``[B, n, F]`` are the context rows' target features, ``embeds`` ``[B, n, H]``
    the embeddings of the tokens that follow them (step ``s`` of the chain after row ``j``
    reads ``embeds[:, j + s - 1]``). Step ``s`` yields ``[B, n - s + 1, H]``: row ``j``
    predicts ``f_{j+s}``. Uses a plain ``DynamicCache``, so gradients flow through it.
    """
    n = features.shape[1]
    cache = DynamicCache(config=head.decoder.config) if steps > 1 else None
    pred = head(head.fused(features), embeds, cache=cache)  # [B, n, H]
    yield pred
    for step in range(2, min(steps, n) + 1):
        rows = n - step + 1
        positions, mask = draft_step_layout(n, step)
        pred = head(pred[:, :rows], embeds[:, step - 1 : step - 1 + rows], cache=cache,
                    positions=positions.expand(len(features), -1), mask=mask)
        yield pred
