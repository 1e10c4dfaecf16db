"""A real ``kura.app.Node`` run inside the test process, on real sockets on 127.0.0.1.

``start_in_process(directory, env)`` is ``spawn_node``'s twin: the same ``KURA_*`` environment
(``node_env``), loaded into ``Settings`` as ``kura serve`` loads it (``kura.cli``), and the same
helper surface (``NodeProcess``: url, data_dir, tmp_dir, metrics, index_rows, blob_files,
staging_files, log, client, stop). The node runs in an event loop of its own, on a thread of its
own, so sync tests keep talking to it with httpx and async tests with aiohttp; a start costs
tens of milliseconds instead of a process's ~0.8 s.

What it cannot do, it refuses loudly: more than one process (``KURA_WORKERS > 1``), a stop by
any signal but SIGTERM/SIGINT, a command prefix (faketime), and what a node reads from its
process environment rather than from its settings (``NEEDS_A_PROCESS``: failpoints are read
once at import, the object store's credentials from ``os.environ``). Such tests start a process
(``start_node(process=True)``). ``proc`` is None: a test that reaches for the process fails.

Its log: the records of the node's threads (its loop thread, the loop's default executor), at
the node's ``KURA_LOG_LEVEL``, formatted as ``kit.log`` formats them, written to ``log_path``;
records of threads no node owns by name (storage's pools) go to every in-process node's log.
Stopping it fails like a crashed process: a background task that died, an error from
``Node.stop`` or tasks its loop still holds after the stop make ``stop()`` return 1, which
``stop_nodes`` reports with the end of the log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import signal
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from kit import event_loop
from kura.app import Node
from kura.cli import build_parser, log_start_up
from kura.settings import Settings, environment, load_settings
from tests.conftest import START_TIMEOUT_SECONDS, NodeProcess

THREAD_PREFIX = "kura-node-"
# Variables a node reads from its process environment, not from Settings (kit.failpoint,
# kura.app's ObjectStoreConfig.from_env): honoured only by a process of its own.
NEEDS_A_PROCESS = ("KURA_FAILPOINTS", "KURA_OBJECT_STORE_URL")
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s %(threadName)s %(message)s"
_numbers = itertools.count(1)
T = TypeVar("T")
LEAK_GRACE_SECONDS = 2.0


class _NodeRecords(logging.Filter):
    """A record belongs to the node whose thread logged it, or, from a thread no in-process
    node owns by name (storage's thread pools; not the test's own thread), to every node."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        name = record.threadName or ""
        if name.startswith(THREAD_PREFIX):
            return name.startswith(self.prefix)
        return name != "MainThread"


@dataclass
class InProcessNode(NodeProcess):
    """A ``Node`` serving from a thread of the test process (``proc`` is None)."""

    thread: threading.Thread | None = field(default=None, repr=False)
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    stop_event: asyncio.Event | None = field(default=None, repr=False)
    outcome: concurrent.futures.Future[int] = field(
        default_factory=concurrent.futures.Future, repr=False
    )
    node: Node | None = field(default=None, repr=False)

    def call(self, work: Callable[[Node], Awaitable[T]], timeout: float = 30.0) -> T:
        """``await work(node)`` on the node's own loop (its storage API, say), from the test's
        thread; what it returns or raises."""
        node, loop = self.node, self.loop
        assert node is not None, "the node is not running"
        assert loop is not None

        async def run() -> T:
            return await work(node)

        return asyncio.run_coroutine_threadsafe(run(), loop).result(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Stop it gracefully, as SIGTERM stops ``kura serve``: 0 when clean, 1 when the node
        failed (see the module docstring). Other signals need a process: TypeError."""
        if sig not in (signal.SIGTERM, signal.SIGINT):
            raise TypeError(f"an in-process node cannot take signal {sig}: use a process")
        if self.loop is not None and self.stop_event is not None and not self.outcome.done():
            self.loop.call_soon_threadsafe(self.stop_event.set)
        rc = self.outcome.result(timeout)
        if self.thread is not None:
            self.thread.join(timeout)
        return rc


def start_in_process(
    directory: Path, env: dict[str, str], prepare: Callable[[Node], None] | None = None
) -> InProcessNode:
    """Start a node with the ``KURA_*`` settings of ``env`` (``node_env``) in this process and
    wait until it listens; ``prepare(node)`` runs once it is built, before it starts (on the
    node's thread: a test sets a hook, e.g. ``service.startup.hook``). Raises ``kit.settings.SettingsError`` for invalid settings, the
    start's own error (a data dir in use, a port taken) when it fails, ``TypeError`` for
    settings only a process can have (``KURA_WORKERS`` > 1)."""
    settings = load_settings(build_parser().parse_args(["serve"]), env)
    if settings.workers != 1:
        raise TypeError(f"KURA_WORKERS={settings.workers} needs a process: use a process")
    for name in NEEDS_A_PROCESS:
        if env.get(name):
            raise TypeError(f"{name} is read from the process environment: use a process")
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"node-{len(list(directory.glob('node-*.log')))}.log"
    name = f"{THREAD_PREFIX}{next(_numbers)}"
    handler = logging.FileHandler(log_path, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT, "%Y-%m-%dT%H:%M:%S"))
    handler.setLevel(settings.log_level.upper())
    handler.addFilter(_NodeRecords(name + "-"))  # its loop thread and its executor's
    handle = InProcessNode(
        "",
        Path(settings.data_dir),
        Path(settings.tmp_dir),
        None,
        log_path,
        env,  # type: ignore[arg-type]
    )
    started: concurrent.futures.Future[tuple[str, str]] = concurrent.futures.Future()
    thread = threading.Thread(
        target=_run,
        args=(settings, env, handle, handler, started, prepare),
        name=name + "-",
        daemon=True,
    )
    handle.thread = thread
    thread.start()
    handle.url, handle.internal_url = started.result(START_TIMEOUT_SECONDS)
    return handle


def _run(
    settings: Settings,
    env: dict[str, str],
    handle: InProcessNode,
    handler: logging.Handler,
    started: concurrent.futures.Future[tuple[str, str]],
    prepare: Callable[[Node], None] | None,
) -> None:
    """The node's thread: its own loop (``KURA_EVENT_LOOP``), as ``kura serve`` runs it."""
    _name, factory = event_loop.choose(settings.event_loop)
    root = logging.getLogger()
    root.addHandler(handler)
    _lower_level(root, handler.level)
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            rc = runner.run(_serve(settings, env, handle, started, prepare))
    except BaseException as exc:  # the runner's own shutdown failed: a crash
        logging.getLogger(__name__).error("in-process node failed", exc_info=exc)
        rc = 1
    finally:
        handle.node = None
        root.removeHandler(handler)
        handler.close()
        if not started.done():
            started.set_exception(RuntimeError(f"in-process node did not start: {handle.log()}"))
    handle.outcome.set_result(rc)


def _lower_level(root: logging.Logger, level: int) -> None:
    """Let the node's records reach its handler (``kura serve`` sets the root level to
    KURA_LOG_LEVEL, ``kit.log``); a lower root level only lets pytest capture more."""
    if root.getEffectiveLevel() > level:
        root.setLevel(level)


async def _serve(
    settings: Settings,
    env: dict[str, str],
    handle: InProcessNode,
    started: concurrent.futures.Future[tuple[str, str]],
    prepare: Callable[[Node], None] | None,
) -> int:
    """``Node.serve_forever`` with an event instead of signal handlers (a thread cannot install
    them). The exit code ``kura serve`` would have: 0 clean, 1 failed."""
    loop = asyncio.get_running_loop()
    name = threading.current_thread().name
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(thread_name_prefix=name))
    log_start_up(settings, environment(env))
    node = Node(settings)
    if prepare is not None:
        prepare(node)
    handle.node, handle.loop, handle.stop_event = node, loop, asyncio.Event()
    try:
        await node.start()
    except BaseException as exc:
        await node._abandon_start()
        started.set_exception(exc)
        return 1
    started.set_result((node.public_url, node.node_url))
    assert node._tasks is not None
    waiter = asyncio.create_task(handle.stop_event.wait())
    done, _ = await asyncio.wait({waiter, node._tasks}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    rc = 1 if node._tasks in done else 0  # a background task died: serve_forever raises
    try:
        await node.stop()
    except Exception:
        logging.getLogger(__name__).exception("Node.stop failed")
        rc = 1
    await asyncio.wait({waiter})
    leaked = {t for t in asyncio.all_tasks() - {asyncio.current_task()} if not _lingering(t)}
    if leaked:  # closed connections' handlers end a few loop turns after the cleanup
        _, leaked = await asyncio.wait(leaked, timeout=LEAK_GRACE_SECONDS)
    if leaked:
        logging.getLogger(__name__).error("tasks left running after stop: %s", leaked)
        rc = 1
    return rc


def _lingering(task: asyncio.Task[object]) -> bool:
    """aiohttp's handler of a connection whose request body was not read: it lingers reading
    and dropping it (``lingering_time``, 10 s) and outlives ``runner.cleanup``; the loop's
    shutdown cancels it, in ``kura serve`` as here (``asyncio.Runner``)."""
    return task.get_coro().__qualname__ == "RequestHandler.start"  # type: ignore[union-attr]
