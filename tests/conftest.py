"""Shared fixtures: headless Qt, tiny random models, and the light real model."""

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path

import pytest

from tests.kernel_variants import variant  # noqa: F401 (each kernel variant in turn)
from tests.tiny import save_tiny

LIGHT = "smollm2-135m-instruct"


@pytest.fixture(autouse=True)
def qt_thread_collection(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """In the app's tests, Python's collector runs on the Qt thread, as in the app
    (:mod:`app.collector`): a cycle holding a widget of an earlier test, collected on the
    history store's thread, would crash a later test."""
    if not request.module.__name__.rsplit(".", 1)[-1].startswith("test_app_"):
        yield
        return
    from app.collector import QtThreadCollector

    request.getfixturevalue("qapp")
    collector = QtThreadCollector()
    collector.start()
    yield
    collector.stop()


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Llama with a real BPE tokenizer and chat template."""
    return save_tiny(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def light_engine():  # type: ignore[no-untyped-def]
    """ChatEngine on smollm2-135m-instruct (converted once into the data dir)."""
    from engine.errors import ModelNotInstalledError
    from engine.spec.session import ChatEngine

    try:
        return ChatEngine.load(LIGHT)
    except ModelNotInstalledError as exc:
        pytest.fail(f"the light model is required by the test suite: {exc}")
