"""The CPU back end: weight formats, native kernels, the layers and the forward pass on them.

Contract: this package's top level is the model interface of the decoding core (the loop,
acceptance, policy, drafters, the session and the runner). The core imports the names
below from ``engine.cpu`` and never a submodule (checked by import-linter), so it knows
no kernel, instruction set, weight format or C source:

* :class:`Forward`, :class:`Stack`, :class:`KVCache`, :class:`ForwardPlan`,
  :func:`forward_for`, :class:`UnsupportedModelError`, :data:`TREE_ROWS`: the one forward
  pass (:mod:`engine.cpu.forward`);
* :func:`select_rows`, :func:`as_int4`: a drafter's short output layer
  (:mod:`engine.cpu.layers`);
* :func:`int8_layers`: a drafting head on int8 kernels (:mod:`engine.cpu.quantize`).
"""

from engine.cpu.forward import (
    TREE_ROWS,
    Forward,
    ForwardPlan,
    Head,
    KVCache,
    Stack,
    UnsupportedModelError,
    forward_for,
)
from engine.cpu.layers import as_int4, select_rows
from engine.cpu.quantize import int8_layers

__all__ = ["TREE_ROWS", "Forward", "ForwardPlan", "Head", "KVCache", "Stack",
           "UnsupportedModelError", "as_int4", "forward_for", "int8_layers", "select_rows"]
