"""The speculative decoding core: the chat engine, the loop, acceptance and drafters.

Contract: this package knows only token ids, distributions and the model interface of
:mod:`engine.cpu` (a forward pass over a KV cache it owns). It reaches the CPU back end
through ``engine.cpu``'s top level only, never one of its modules (an import-linter
contract), and it never imports the worker, the tools or the app.

* ``session``: :class:`ChatEngine`, one answer at a time over a loaded pair of models;
* ``decoding``: the speculative loop as a generator of events;
* ``acceptance``: the lossless acceptance rule (``p``, ``q``, residual ``max(0, p - q)``);
* ``sampling``: seeded temperature / top-k / top-p sampling;
* ``policy``: the adaptive draft length and the switch-off;
* ``calibration``: this machine's measured costs and the ``auto`` method's prediction;
* ``runner``: the target's KV cache kept in step with a conversation;
* ``detokenize``: token ids to streamed text;
* ``drafters/``: every drafting method, on one base class.
"""
