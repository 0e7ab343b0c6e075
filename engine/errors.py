"""Errors the engine raises for bad input or a broken installation.

Every error carries a message meant for a person: it says what was wrong and what to
do about it. ``code`` is a stable machine-readable name (the worker maps it to HTTP).
"""


class EngineError(Exception):
    """Base class: a clear, user-facing failure that loses no state."""

    code = "engine_error"


class BadRequestError(EngineError, ValueError):
    """The caller's input is malformed (empty messages, bad sampling values...)."""

    code = "invalid_request"


class PromptTooLongError(BadRequestError):
    """The prompt alone does not fit in the model's context window."""

    code = "context_length_exceeded"


class UnknownModelError(EngineError, LookupError):
    """A model name that is neither a known model nor an existing path."""

    code = "model_not_found"


class ModelNotInstalledError(EngineError):
    """A known model whose carrying PyPI packages are missing or the wrong version."""

    code = "model_not_installed"


class IntegrityError(EngineError):
    """A model file whose size or SHA-256 differs from the pinned one (fail closed)."""

    code = "integrity_error"


class IncompatibleModelsError(EngineError):
    """A draft model whose vocabulary differs from the target's."""

    code = "incompatible_models"


class InsufficientMemoryError(EngineError, MemoryError):
    """The machine has too little free memory to load the requested models."""

    code = "insufficient_memory"


class HeadFileError(EngineError):
    """A draft-head file that cannot be read: truncated, corrupt, or not a head at all."""

    code = "invalid_head"
