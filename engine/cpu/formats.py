"""The weight formats a linear layer can have: the one table the back end reads.

Contract: :data:`FORMATS` lists every format, with what the rest of the engine asks of
one. A layer class names its format in a ``FORMAT`` class attribute
(:mod:`engine.cpu.layers`); :func:`format_of` reads it (``dense`` for ``nn.Linear``
and anything unknown). The C kernels take their format ids from this table: the build
passes ``-DANVE_FORM_<NAME>=<id>`` for every native format (:func:`c_defines`), and
``qdot.cpp``'s ``enum Form`` is made of those macros, so the two sides cannot disagree.

Fields: ``c_id`` the id in the C ``Part`` (``None``: the format runs on torch's
kernels); ``row_independent`` whether each output row's bits are the same whatever the
number of rows in the call (what verification needs to compute exactly what decoding
does); ``row_major`` whether every array is ``[N, ...]`` (output rows sliced without a
copy, as a drafter's short output layer does); ``efficient_rows`` how many rows one call
holds at about the cost of one pass over the weights (``None``: no such block).
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    name: str
    description: str
    c_id: int | None = None
    row_independent: bool = False
    row_major: bool = False
    efficient_rows: int | None = None

    @property
    def native(self) -> bool:
        """Whether our kernels compute it."""
        return self.c_id is not None


FORMATS: tuple[Format, ...] = (
    Format("q4", "4-bit GGUF codes, float16 scale and offset per 32 (Q4_0, Q4_1)",
           c_id=0, row_independent=True, row_major=True, efficient_rows=8),
    Format("q8", "int8 per output channel, float32 scale", c_id=1, row_independent=True,
           row_major=True, efficient_rows=8),
    Format("q4k", "Q4_K in its own integer form", c_id=2, row_independent=True,
           row_major=True, efficient_rows=8),
    Format("q6k", "Q6_K in its own integer form", c_id=3, row_independent=True,
           row_major=True, efficient_rows=8),
    Format("q6kp", "Q6_K in its own integer form, codes in 6 bits (q6k's bits)", c_id=4,
           row_independent=True, row_major=True, efficient_rows=8),
    Format("int4", "4-bit codes on torch's int4 kernel (bfloat16 scale and zero)",
           row_independent=True, efficient_rows=4),
    Format("int8", "int8 per output channel on torch's int8 kernel", row_independent=True,
           row_major=True),
    Format("fp32", "float weights, a small-batch product (FastLinear)"),
    Format("dense", "nn.Linear"),
)
BY_NAME = {f.name: f for f in FORMATS}
C_IDS = {f.name: f.c_id for f in FORMATS if f.c_id is not None}


def format_of(layer: Any) -> Format:
    """The format of a linear layer (``dense`` where it names none)."""
    return BY_NAME.get(getattr(layer, "FORMAT", "dense"), BY_NAME["dense"])


def c_defines() -> tuple[str, ...]:
    """Compiler flags giving the C kernels every native format's id."""
    return tuple(f"-DANVE_FORM_{name.upper()}={c_id}" for name, c_id in C_IDS.items())


def efficient_rows(names: Any) -> int | None:
    """Rows one verification holds at about one pass over the weights, for a model whose
    layers have the formats ``names``: the smallest block among them (``None`` where none
    has one)."""
    blocks = [b for n in names if n in BY_NAME and (b := BY_NAME[n].efficient_rows)]
    return min(blocks) if blocks else None
