"""Shared fixtures: real kura node processes on 127.0.0.1 with OS-chosen ports.

``start_node(**settings)`` starts ``kura serve`` as a subprocess with its own data and tmp
dirs under the test's tmp_path and returns a ``NodeProcess`` with helpers to look at what the
node left on disk (blob files, index rows, staging files) and at its metrics. Every node a test
starts is stopped when the test ends; a node that exited with an error fails the test. In a
module marked ``in_process`` the same call starts the node in this process instead
(``tests.inprocess``, tens of milliseconds against a process's ~0.8 s) unless it needs one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import re
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from kit.wait import wait_until
from kura.settings_rules import parse_workers
from kura_harness.launch.node import KURA_LISTEN, kura_env, spawn_kura
from kura_harness.launch.process import stop
from tests import oneshot

ROOT = Path(__file__).resolve().parent.parent
LISTEN_LINE = KURA_LISTEN
START_TIMEOUT_SECONDS = 30.0
TEST_WORKERS = 1  # processes per test node (node_env); worker tests ask for 2

# The suite starts hundreds of Python processes (nodes, CLIs, kured agents, scripts). Where
# PYTHONDONTWRITEBYTECODE is set (some shells and sandboxes set it) each one compiled kura from
# source again (about 0.25 s of CPU a node start) and pytest rewrote every test module again in
# every xdist worker (about 7 s of CPU each): the run and the processes it starts (they inherit
# this environment) write and reuse bytecode caches (__pycache__, ignored by git).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@dataclass
class NodeProcess:
    """A running ``kura serve`` subprocess and the directories it owns."""

    url: str
    data_dir: Path
    tmp_dir: Path
    proc: subprocess.Popen[str]
    log_path: Path
    env: dict[str, str] = field(repr=False)
    reader: threading.Thread | None = field(default=None, repr=False)
    internal_url: str = ""
    # What the helpers below send: a context trusting an https:// node's CA, a /metrics token.
    verify: ssl.SSLContext | bool = oneshot.TLS
    metrics_headers: dict[str, str] = field(default_factory=dict)
    # Signals the test sent on purpose (``kill``, ``stop``): ``stop_nodes`` accepts death by one
    # of them, besides exit 0. SIGTERM and SIGINT are never among them: a node handles both.
    sent: set[int] = field(default_factory=set, repr=False)

    def client(self, **kwargs: object) -> httpx.Client:
        kwargs.setdefault("verify", self.verify)
        return httpx.Client(base_url=self.url, timeout=30.0, **kwargs)  # type: ignore[arg-type]

    def metrics(self) -> dict[str, float]:
        """Every sample on /metrics as ``{"name{labels}": value}`` (labels as printed). Raises
        ``httpx.HTTPStatusError`` when the scrape is refused (at the connection cap, say)."""
        resp = oneshot.get(
            self.url + "/metrics", timeout=10, verify=self.verify, headers=self.metrics_headers
        )
        return parse_samples(resp.raise_for_status().text)

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def metric_sum(self, name: str) -> float:
        """The sum of ``name`` over all its label values (0 if absent)."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))

    def index_rows(self) -> int:
        """Rows in the metadata index (read-only connection; WAL allows it while running)."""
        db = self.data_dir / "index.sqlite3"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return int(conn.execute("SELECT COUNT(*) FROM artifacts").fetchone()[0])
        finally:
            conn.close()

    def namespace_rows(self, producer: str | None = None) -> dict[str, int]:
        """Index rows per namespace (of ``producer`` only, if given); namespaces without any
        are absent."""
        db = self.data_dir / "index.sqlite3"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        where, args = ("WHERE producer = ?", (producer,)) if producer else ("", ())
        try:
            rows = conn.execute(
                f"SELECT namespace_id, COUNT(*) FROM artifacts {where} GROUP BY namespace_id", args
            )
            return {str(ns): int(n) for ns, n in rows}
        finally:
            conn.close()

    def keys(self, producer: str, namespace: str) -> list[str]:
        """The keys ``producer`` stored in ``namespace``, sorted."""
        db = self.data_dir / "index.sqlite3"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT key FROM artifacts WHERE producer = ? AND namespace_id = ? ORDER BY key",
                (producer, namespace),
            )
            return [str(key) for (key,) in rows]
        finally:
            conn.close()

    def artifact_ids(self) -> set[str]:
        """Every artifact id in the metadata index (read-only connection, as ``index_rows``)."""
        db = self.data_dir / "index.sqlite3"
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            return {str(aid) for (aid,) in conn.execute("SELECT artifact_id FROM artifacts")}
        finally:
            conn.close()

    def blob_files(self) -> list[Path]:
        return sorted(p for p in (self.data_dir / "blobs").rglob("*") if p.is_file())

    def staging_files(self) -> list[Path]:
        """Files in the tmp dir, except the node's ownership lock (an empty file)."""
        return sorted(
            p for p in self.tmp_dir.rglob("*") if p.is_file() and p.name != ".kura.tmp.lock"
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` now and return (a crash the test causes on purpose: ``stop_nodes``
        then accepts death by it)."""
        self._expect(sig)
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Send ``sig``, wait up to ``timeout`` s (then SIGKILL, which ``stop_nodes`` does
        not accept unless the test sent it); the exit code."""
        self._expect(sig)
        rc = stop(self.proc, sig, timeout)
        if self.reader is not None:
            self.reader.join(5)
        assert rc is not None
        return rc

    def _expect(self, sig: int) -> None:
        if sig not in (signal.SIGTERM, signal.SIGINT):
            self.sent.add(sig)

    def exited_cleanly(self, rc: int) -> bool:
        """Exit 0, or death by a signal the test sent on purpose (``kill``, ``stop``), or by
        SIGKILL when its ``KURA_FAILPOINTS`` kill it (kit.failpoint)."""
        expected = {-s for s in self.sent}
        if "kill" in self.env.get("KURA_FAILPOINTS", ""):
            expected.add(-signal.SIGKILL)
        return rc == 0 or rc in expected


def node_env(tmp: Path, **settings: object) -> dict[str, str]:
    """The environment of a test node with its dirs under ``tmp`` (``kura_harness.launch.node``).

    Every node runs ``TEST_WORKERS`` (1) process, whatever the machine's CPU count (kura's
    own default is ``auto``), unless the test sets ``workers`` itself. ``KURA_TEST_WORKERS=N``
    in the test run's environment starts them with N instead (``2``: a primary and a worker)."""
    workers = os.environ.get("KURA_TEST_WORKERS") or str(TEST_WORKERS)
    if "workers" not in settings:
        settings = {**settings, "workers": workers}
    return kura_env(tmp / "data", tmp / "tmp", settings)


def faketime_prefix(offset: str) -> tuple[str, ...]:
    """A command prefix that runs a node with its wall clock shifted by ``offset`` (``"+60s"``,
    ``"-30s"``) through Debian's libfaketime (package ``faketime``, see scripts/install-deps).

    The library is preloaded through ``env`` rather than the ``faketime`` wrapper, which forks
    the program and does not forward SIGTERM (the test's stop would kill the wrapper and orphan
    the node). The monotonic clock is left alone: faked, Python's timed waits
    (``threading.Event.wait``, which executors use) compute deadlines the kernel never reaches
    and hang; ``time.sleep`` then fails with EINVAL (libfaketime 0.9.10), which a node never
    calls. Raises FileNotFoundError when libfaketime is not installed (the test fails).
    """
    libs = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not libs:
        raise FileNotFoundError("libfaketime not found: apt-get install faketime")
    return (
        "env",
        f"LD_PRELOAD={libs[0]}",
        f"FAKETIME={offset}",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
    )


def spawn_node(directory: Path, env: dict[str, str], prefix: Sequence[str] = ()) -> NodeProcess:
    """Start ``kura serve`` and wait for its listening line. Raises if it exits first.

    ``prefix`` is a command the node runs under, e.g. ``faketime_prefix("+60s")``."""
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"node-{len(list(directory.glob('node-*.log')))}.log"
    started = spawn_kura(
        env, log_path, cwd=directory, prefix=prefix, timeout=START_TIMEOUT_SECONDS, log_mode="w"
    )
    try:
        _wait_for_workers(
            Path(env["KURA_DATA_DIR"]), parse_workers(env.get("KURA_WORKERS", "auto"))
        )
    except BaseException:  # nobody else holds the process yet: do not leak it past the test
        stop(started.proc, signal.SIGTERM, 10)
        raise
    return NodeProcess(
        started.url,
        Path(env["KURA_DATA_DIR"]),
        Path(env["KURA_TMP_DIR"]),
        started.proc,
        log_path,
        env,
        started.reader,
        started.internal_url,
    )


def serve_refused(
    env: dict[str, str], *flags: str, cwd: Path | None = None, exit_code: int = 2
) -> str:
    """Run ``kura serve *flags`` in ``env`` (e.g. ``node_env(tmp, **bad_settings)``), which must
    refuse to start: exit ``exit_code`` (``kura.cli``: 2 a configuration error, 1 a refusal at
    start-up such as a port in use or a data dir another node owns) within 60 s, no traceback
    and no listening line. Returns its stderr, for the test to find the message it expects."""
    done = subprocess.run(
        [sys.executable, "-m", "kura.cli", "serve", *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert "kura listening" not in done.stdout, done.stdout
    return done.stderr


def _wait_for_workers(data_dir: Path, workers: int) -> None:
    """With ``KURA_WORKERS > 1`` the workers start after the primary announces itself: wait
    until each answers on its control socket (it listens on the public port by then), so a
    test's requests are spread from the first one. Data dirs whose path is too long for a
    unix socket keep them elsewhere (kura.workers.supervisor); nothing to wait on then."""
    directory = data_dir.resolve()
    if workers <= 1 or len(str(directory)) > 87:
        return
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    for n in range(1, workers):
        path = str(directory / f".kura.worker-{n}.sock")
        left = deadline - time.monotonic()
        if not wait_until(functools.partial(_answers, path), left):
            raise AssertionError(f"worker {n} of {data_dir} did not start")


def _answers(path: str) -> bool:
    """Whether an HTTP server answers 200 on the unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(path)
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            return sock.recv(64).split(b" ")[1:2] == [b"200"]
        except OSError:
            return False


@pytest.fixture
def start_node(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., NodeProcess]]:
    """Factory: ``start_node(name="a", prefix=(), process=None, **settings)`` starts a node with
    KURA_<SETTING> values, optionally under a command ``prefix`` (see ``spawn_node``).

    In a test marked ``in_process`` the node is a ``kura.app.Node`` in this process
    (``tests.inprocess``) unless it needs a process: ``process=True``, a ``prefix``,
    ``workers`` other than 1 or ``failpoints``. Elsewhere every node is a ``kura serve``
    process."""
    nodes: list[NodeProcess] = []
    in_process = wants_in_process(request)

    def start(
        name: str = "node",
        prefix: Sequence[str] = (),
        process: bool | None = None,
        **settings: object,
    ) -> NodeProcess:
        directory = tmp_path / name
        if process is None:
            process = (
                not in_process
                or bool(prefix)
                or str(settings.get("workers", 1)) != "1"
                or "failpoints" in settings
            )
        if process:
            node = spawn_node(directory, node_env(directory, **settings), prefix)
        else:
            from tests.inprocess import start_in_process

            node = start_in_process(directory, node_env(directory, **{"workers": 1, **settings}))
        nodes.append(node)
        return node

    yield start
    stop_nodes(nodes)


def parse_samples(text: str) -> dict[str, float]:
    """A Prometheus text exposition as ``{"name{labels}": value}`` (labels as printed)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def stop_nodes(nodes: Sequence[NodeProcess]) -> list[int]:
    """Stop every node with SIGTERM, then fail naming each one that did not exit cleanly
    (``NodeProcess.exited_cleanly``: 0, or death by a signal the test sent on purpose), with
    the end of its log. A node handles SIGTERM, so death by it is a failure. The exit codes."""
    crashed, rcs = [], []
    for node in nodes:
        rc = node.stop()
        rcs.append(rc)
        if not node.exited_cleanly(rc):
            crashed.append(f"{node.url} exited {rc}:\n{node.log()[-3000:]}")
    assert not crashed, "\n".join(crashed)
    return rcs


@pytest.fixture
def node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    return start_node()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "in_process: start_node and node give in-process nodes (tests.inprocess) unless a "
        "test asks for a process",
    )
    config.addinivalue_line(
        "markers", "process: in an in_process module, this test's nodes are processes"
    )
    config.addinivalue_line(
        "markers", "own_seaweedfs: the module kills or stops its SeaweedFS: not the shared one"
    )


MODULE_SECONDS = ROOT / "tests" / "module_seconds.txt"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Heaviest modules first (``tests/module_seconds.txt``), each module's tests in their order.

    ``--dist loadfile`` hands whole modules to the workers in collection order (pyproject gives
    ``--no-loadscope-reorder``: xdist's own order, most tests first, puts the long modules of one
    or two tests last, where one of them leaves the other core idle). Modules not listed follow
    in collection order; every worker sorts the same collection the same way."""
    seconds: dict[str, float] = {}
    for line in MODULE_SECONDS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            value, path = line.split()
            seconds[path] = float(value)
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], 0.0))


def wants_in_process(request: pytest.FixtureRequest) -> bool:
    """Whether the test's nodes run in this process: marked ``in_process``, not ``process``."""
    node = request.node
    return bool(node.get_closest_marker("in_process")) and not node.get_closest_marker("process")


@pytest.fixture(autouse=True)
def no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves asyncio tasks running in its loop (in-process nodes
    check their own loop when they stop, ``tests.inprocess``)."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("_tasks_left_behind")


@pytest_asyncio.fixture
async def _tasks_left_behind() -> AsyncIterator[None]:
    """Torn down after the test's other fixtures (``no_leaked_tasks`` asks for it first):
    whatever task is still running then was left behind. They are cancelled, then reported."""
    yield
    leaked = asyncio.all_tasks() - {asyncio.current_task()}
    for task in leaked:
        task.cancel()
    if leaked:
        await asyncio.wait(leaked, timeout=10)
    assert not leaked, f"the test left {len(leaked)} asyncio tasks running: {leaked}"


def processes_naming(path: Path) -> dict[int, str]:
    """Live processes (zombies excluded) whose command line names ``path`` or a file under it,
    or whose working directory is inside it: ``{pid: command line}``. (A process that names
    neither, such as the orphaned child of a killed agent that ``exec``-ed into a plain command,
    is not found.)"""
    found: dict[int, str] = {}
    prefix = str(path)
    named = re.compile(re.escape(prefix) + r"(/|\s|$)")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if argv and (named.search(argv) or cwd == prefix or cwd.startswith(prefix + "/")):
            found[int(entry.name)] = argv.strip()
    return found


@pytest.fixture(autouse=True)
def no_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a process behind: after its other fixtures are torn down (its
    nodes stopped), no live process may still run in, or name, the test's ``tmp_path``. Found
    ones are killed (SIGKILL), then reported. A process a test kills on purpose may take a
    moment to go: up to 2 s are allowed."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp_path: Path = request.getfixturevalue("tmp_path")
    yield
    left: dict[int, str] = {}

    def none_left() -> bool:  # one scan of /proc a look: the last one's finds are reported
        left.clear()
        left.update(processes_naming(tmp_path))
        return not left

    wait_until(none_left, 2.0, interval=0.05)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"the test left {len(left)} processes running: {left}"
