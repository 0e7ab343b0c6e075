"""Run the real worker (``python -m engine.worker``) as a subprocess in tests.

:func:`start_worker` starts it on an ephemeral port (``--port 0``), reads the
``listening`` line it prints, and always stops it (SIGTERM, then SIGKILL).
:class:`Http` is a tiny stdlib client for raw requests and hand-read streams.
:class:`Hold` holds the worker's answers (``ANVE_TEST_HOLD``, :mod:`engine.worker.hold`),
so that a test acts on a running answer however fast the machine generates.
:func:`link_light_cache` gives a fresh data directory the light model's converted cache,
so a worker started on it loads instead of converting again (conversion has its own
tests in ``test_convert`` and ``test_models``).
"""

import contextlib
import http.client
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import paths
from engine.models import registry
from engine.worker.hold import HOLD_ENV
from engine.worker.process import Child, child_worker
from tests.conftest import LIGHT

REPO = Path(__file__).resolve().parents[1]


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """A hard link of ``src`` at ``dst``, or a copy where linking fails (another file
    system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def link_light_cache(models: Path) -> None:
    """Link (or copy, across file systems) the developer's converted light model into
    ``models``, a data directory's models folder; converts it there first if missing."""
    spec = registry.get_spec(LIGHT)
    folder = paths.models_dir() / "cache" / f"{LIGHT}-{spec.sha256[:16]}"
    if not (folder / "manifest.json").is_file():
        from engine.models import cache

        folder = cache.prepare(LIGHT).folder  # converts once into the developer's data dir
    shutil.copytree(folder, models / "cache" / folder.name, copy_function=link_or_copy)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


class Http:
    """Plain HTTP to the worker, one connection per request (stdlib only)."""

    def __init__(self, port: int, headers: dict[str, str] | None = None) -> None:
        self.port, self.headers = port, headers or {}

    def open(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[http.client.HTTPConnection,
                                                              http.client.HTTPResponse]:
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request(method, path, data, {**self.headers, **(headers or {})})
        return conn, conn.getresponse()

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None,
                headers: dict[str, str] | None = None) -> Reply:
        conn, resp = self.open(method, path, body, raw, headers)
        try:
            return Reply(resp.status, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)


class Hold:
    """The file a worker started with ``ANVE_TEST_HOLD`` set to :attr:`path` waits at.

    ``with hold.after(n):`` lets every answer send ``n`` chunks of text and then wait,
    until :meth:`allow` lets more through, :meth:`release` lets all through, or the block
    ends (a release). Answers that a test does not hold run freely.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def env(self) -> dict[str, str]:
        return {HOLD_ENV: str(self.path)}

    def allow(self, chunks: int) -> None:
        spare = self.path.with_name(self.path.name + ".new")
        spare.write_text(str(chunks))
        spare.replace(self.path)  # the worker never reads a half-written number

    def release(self) -> None:
        self.path.unlink(missing_ok=True)

    @contextlib.contextmanager
    def after(self, chunks: int) -> Iterator["Hold"]:
        self.allow(chunks)
        try:
            yield self
        finally:
            self.release()


class WorkerProcess:
    """A started worker: its address, its logs, and waiting for it."""

    def __init__(self, child: Child) -> None:
        self.child, self.proc = child, child.proc
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        return self.child.tail(lines)

    def wait_listening(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.child.listening_port()
            if port is not None:
                self.port = port
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self.log_tail()}")
            time.sleep(0.05)
        raise AssertionError(f"worker did not listen in {timeout} s:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0, headers: dict[str, str] | None = None) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = Http(self.port, headers).get("/health").json()
            if health["status"] == "ready":
                return health
            assert health["status"] == "loading", health
            time.sleep(0.05)
        raise AssertionError(f"worker not ready in {timeout} s:\n{self.log_tail()}")


@contextlib.contextmanager
def start_worker(args: list[str], log_dir: Path,
                 hold: Hold | None = None) -> Iterator[WorkerProcess]:
    """Start ``python -m engine.worker --port 0 ARGS`` (held at ``hold``) and stop it
    afterwards. ``ARGS`` must name a ``--data-dir`` (a test's own, see
    :func:`link_light_cache`): the developer's would receive the test's calibration and
    history, and its calibration would steer the test's worker."""
    assert "--data-dir" in args, "a test's worker needs a --data-dir of its own"
    with child_worker(args, log_dir, env=hold.env if hold else None, cwd=REPO) as child:
        worker = WorkerProcess(child)
        worker.wait_listening()
        yield worker
