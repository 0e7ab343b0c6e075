"""``anve``: the desktop window. Starts (or attaches to) the worker and shows the chat.

Usage: ``anve`` starts ``python -m engine.worker --port 0 --profile appliance`` in the
background and stops it on close; ``anve --profile light`` suits weak machines;
``anve --worker http://host:port`` attaches to a running worker (an appliance in the
office) or any OpenAI-compatible server (vLLM, llama.cpp's llama-server; the app detects
which and shows what it reports) and leaves it running; without it the app uses the
server chosen in Admin, if any. The data directory is the platform's user data dir or
``ANVE_DATA_DIR``.
"""

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtWidgets import QApplication

from app import display, theme
from app.application import AnveApp
from app.client import normalise_url
from app.launcher import WorkerCommand
from app.paths import data_dir

log = logging.getLogger("app")
PROFILES = ("appliance", "light")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="anve", description="ANVE desktop: chat with the office's local model."
    )
    p.add_argument("--worker", metavar="URL", type=worker_url,
                   help="attach to a running worker or OpenAI-compatible server (vLLM, "
                        "llama.cpp) instead of starting one")
    p.add_argument("--profile", choices=PROFILES, default="appliance",
                   help="models for the worker the app starts (light: for weak machines)")
    p.add_argument("--target", help="the started worker's target model (folder or .gguf)")
    p.add_argument("--draft", help="the started worker's draft model")
    p.add_argument("--token-file", help="file with the worker's access token")
    p.add_argument("--admin-token-file", help="file with the worker's admin token")
    p.add_argument("--theme", choices=("system", "light", "dark"), default="system")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def worker_url(text: str) -> str:
    try:
        return normalise_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def read_token(path: str | None) -> str | None:
    return Path(path).read_text(encoding="utf-8").strip() if path else None


def worker_command(args: argparse.Namespace) -> WorkerCommand:
    extra: list[str] = []
    if args.target:
        extra += ["--target", args.target]
    if args.draft:
        extra += ["--draft", args.draft]
    return WorkerCommand(profile=args.profile, extra=tuple(extra))


async def run(args: argparse.Namespace) -> int:
    qt_app = QApplication.instance()
    assert isinstance(qt_app, QApplication)
    theme.apply(qt_app, args.theme)
    app = AnveApp(
        data_dir(), worker_url=args.worker, command=worker_command(args),
        token=read_token(args.token_file), admin_token=read_token(args.admin_token_file),
    )
    closed = asyncio.Event()
    app.window.closed.connect(closed.set)
    for sig in (signal.SIGINT, signal.SIGTERM):  # Ctrl+C, logout: close like the window
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(sig, closed.set)
    app.start()
    await closed.wait()
    await app.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    multiprocessing.freeze_support()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import qasync

    if QApplication.instance() is None and (missing := display.problem()) is not None:
        log.error("%s", missing)  # Qt would abort with a message about its plugin
        return 1
    qt_app = QApplication.instance() or QApplication(sys.argv[:1])
    assert isinstance(qt_app, QApplication)
    qt_app.setApplicationName("ANVE")
    qt_app.setDesktopFileName("org.anve.Desktop")  # matches the installed menu entry
    qt_app.setQuitOnLastWindowClosed(False)
    return int(qasync.run(run(args)))


if __name__ == "__main__":
    sys.exit(main())
