"""The CPU back end: weight formats, native kernels, the layers and the forward pass on them.

Contract: the decoding core (the loop, acceptance, drafters) reaches a model through
:mod:`engine.runner` and never imports a kernel; everything that knows about
instruction sets, weight formats or the C source lives in this package.
"""
