"""EAGLE-style draft heads: a small decoder layer that drafts from the target's features.

* :mod:`engine.heads.model`: the head module and its configuration.
* :mod:`engine.heads.files`: safetensors head files with metadata, checked on load.
* :mod:`engine.heads.corpus`: the training corpus shipped in ``assets/heads/``.
* :mod:`engine.heads.train`: self-distillation training (``python -m engine.heads.train``).
* :mod:`engine.heads.history`: the app's chat history, read-only, as training conversations.
* :mod:`engine.heads.office`: fine-tune on that history, install only if better
  (``python -m engine.heads.office``).

The drafter that uses a head lives in :mod:`engine.spec.drafters.eagle`.
"""
