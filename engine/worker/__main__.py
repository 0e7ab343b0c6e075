"""``anve-worker`` / ``python -m engine.worker``: serve the models over HTTP.

Contract: options are checked before anything heavy is imported or bound; a
non-loopback ``--host`` without ``--token-file`` exits with status 2 and a message.
Once listening, the worker prints one JSON line to stdout,
``{"event": "listening", "host": ..., "port": ..., "url": ...}`` (``--port 0`` picks a
free port), and loads the models in the background while ``/health`` reports progress.
SIGINT or SIGTERM shut it down cleanly. ``ANVE_TEST_HOLD`` is for the tests only
(:mod:`engine.worker.hold`).
"""

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.models.registry import PROFILES
from engine.protocol import ACCELERATIONS, METHODS
from engine.worker.auth import ConfigError, check_bind, read_token

if TYPE_CHECKING:
    from engine.models.registry import Progress
    from engine.spec.session import ChatEngine, DraftLength
    from engine.worker.server import Worker

log = logging.getLogger("engine.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the worker needs, checked."""

    host: str
    port: int
    target: str
    draft: str | None
    method: str | None
    num_draft_tokens: "DraftLength | None"
    load_threshold: int
    max_waiting: int
    data_dir: str | None
    user_token: str | None = field(repr=False)
    admin_token: str | None = field(repr=False)
    accel: str = "auto"
    max_batch: int = 4


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="anve-worker", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port; 0 picks a free one")
    p.add_argument("--profile", choices=sorted(PROFILES), default="appliance")
    p.add_argument("--target", help="target model: a name, a folder or a .gguf file")
    p.add_argument("--draft", help="draft model (with --target; default: the profile's)")
    p.add_argument("--method", choices=("auto", *METHODS),
                   help="initial drafting method (default: auto, the one this machine's "
                        "calibration predicts fastest, adaptive)")
    p.add_argument("--num-draft-tokens", help="1..16 or 'adaptive' (default: the engine's)")
    p.add_argument("--load-threshold", type=int, default=2,
                   help="switch speculation off for new requests when more would wait")
    p.add_argument("--max-queue", type=int, default=64, help="waiting requests before 503")
    p.add_argument("--max-batch", type=int, default=4,
                   help="answers decoding together, at most (default 4; fewer where the "
                        "memory is short; 1 answers one at a time)")
    p.add_argument("--data-dir", help="where converted models are kept")
    p.add_argument("--accel", choices=ACCELERATIONS, default="auto",
                   help="linear-layer kernels (default auto: the GGUF's int4 codes)")
    p.add_argument("--token-file", help="file holding the access token (Bearer)")
    p.add_argument("--admin-token-file", help="file holding the admin token")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def make_config(args: argparse.Namespace) -> WorkerConfig:
    """Resolve the profile and read the tokens; :class:`ConfigError` if not allowed."""
    user = read_token(args.token_file, "access token") if args.token_file else None
    admin = read_token(args.admin_token_file, "admin token") if args.admin_token_file else None
    check_bind(args.host, user)
    if user is not None and admin is not None and user == admin:
        raise ConfigError("the admin token must differ from the access token")
    from engine.worker.settings import check_draft_length, check_threshold  # imports torch

    target, draft = PROFILES[args.profile]
    if args.target:  # a draft belongs to its target: only the one named here
        target, draft = args.target, args.draft
    elif args.draft:
        draft = args.draft
    k = args.num_draft_tokens
    try:
        num_draft_tokens = None if k is None else check_draft_length(
            int(k) if k.isdigit() else k, True, "--num-draft-tokens"
        )
        check_threshold(args.load_threshold)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.max_batch < 1:
        raise ConfigError(f"--max-batch must be at least 1, not {args.max_batch}")
    return WorkerConfig(
        args.host, args.port, target, draft, args.method, num_draft_tokens,
        args.load_threshold, args.max_queue, args.data_dir, user, admin, args.accel,
        args.max_batch,
    )


def make_loader(config: WorkerConfig) -> Callable[["Progress"], "ChatEngine"]:
    """The function the engine thread calls to load the models."""

    def load(progress: "Progress") -> "ChatEngine":
        from engine.spec.session import ChatEngine

        return ChatEngine.load(
            config.target, config.draft, data_dir=config.data_dir, progress=progress,
            method=config.method, accel=config.accel,
        )

    return load


def build_worker(config: WorkerConfig) -> "Worker":
    from engine.paths import data_dir
    from engine.worker.auth import Auth
    from engine.worker.hold import held_if_asked
    from engine.worker.learning import HeadLearning
    from engine.worker.metrics import Metrics
    from engine.worker.scheduler import Scheduler
    from engine.worker.server import Worker
    from engine.worker.settings import SpeculationConfig, SpeculationSettings

    settings = SpeculationSettings(SpeculationConfig(
        method=config.method, num_draft_tokens=config.num_draft_tokens,
        load_threshold=config.load_threshold,
    ))
    metrics = Metrics()
    scheduler = Scheduler(held_if_asked(make_loader(config)), settings, metrics,
                          config.max_waiting,
                          str(data_dir(config.data_dir) / "calibration.json"), config.max_batch)
    learning = HeadLearning(config.target, config.data_dir, scheduler.reload_head)
    return Worker(scheduler, settings, metrics, Auth(config.user_token, config.admin_token),
                  learning)


async def serve(config: WorkerConfig) -> int:
    """Listen, announce the address, load the models, and serve until a signal."""
    from aiohttp import web

    from engine.worker.server import create_app

    worker = build_worker(config)
    runner = web.AppRunner(create_app(worker), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, config.host, config.port).start()
    except OSError as exc:
        log.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
        await runner.cleanup()
        return 1
    host, port = runner.addresses[0][:2]
    url = f"http://{config.host}:{port}"
    print(json.dumps({"event": "listening", "host": host, "port": port, "url": url}), flush=True)
    log.info("listening on %s; loading %s", url, " + ".join(filter(None, [config.target,
                                                                         config.draft])))
    worker.scheduler.start()
    await _wait_for_signal()
    log.info("shutting down")
    await runner.cleanup()
    await asyncio.to_thread(worker.scheduler.stop)
    return 0


async def _wait_for_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # Windows: Ctrl+C raises
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    multiprocessing.freeze_support()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = make_config(args)
    except ConfigError as exc:
        parser.exit(2, f"anve-worker: error: {exc}\n")
    try:
        return asyncio.run(serve(config))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
