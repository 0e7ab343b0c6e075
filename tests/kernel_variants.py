"""The ``variant`` fixture: a test runs once under each native kernel variant
(:data:`engine.cpu.kernels.VARIANTS`), forced with :func:`engine.cpu.kernels.use` so one pytest
process tests them all; a variant this CPU or compiler lacks is skipped with the reason."""

from collections.abc import Iterator

import pytest

from engine.cpu import kernels


@pytest.fixture(params=list(kernels.BY_NAME))
def variant(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each kernel variant in turn, forced for the test (skipped where it cannot run)."""
    name = str(request.param)
    reason = kernels.why_not(name)
    if reason is not None:
        pytest.skip(reason)
    kernels.use(name)
    try:
        assert kernels.variant() == name
        yield name
    finally:
        kernels.use(None)
