"""EAGLE-style draft heads: a small decoder layer that drafts from the target's features.

* :mod:`engine.heads.model`: the head module and its configuration (EAGLE-1, or EAGLE-3
  fusing lower layers' features).
* :mod:`engine.heads.files`: safetensors head files with metadata, checked on load.
* :mod:`engine.heads.corpus`: the training corpus shipped in ``assets/heads/``.
* :mod:`engine.heads.train`: self-distillation training (``python -m engine.heads.train``).
* :mod:`engine.heads.stream`: teacher-forced training that streams its data instead of
  storing it (``python -m engine.heads.stream``).
* :mod:`engine.heads.answers`: the target's own answers (or, ``--text-only``, another
  model's) to a fixed prompt list.
* :mod:`engine.heads.history`: the app's chat history, read-only, as training conversations.
* :mod:`engine.heads.office`: fine-tune on that history, install only if better
  (``python -m engine.heads.office``).

The drafter that uses a head lives in :mod:`engine.spec.drafters.eagle`.
"""
