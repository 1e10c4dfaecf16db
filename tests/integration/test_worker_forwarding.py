"""Requests a worker forwards to the primary (kura.workers.forward), on connections the worker
itself accepted: which process accepted a TCP connection is read from /proc (the server-side
socket's inode among the process's descriptors), so nothing rests on ``SO_REUSEPORT`` luck.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from kura.api.connections import ConnectionGuard, unix_listening_socket
from kura.cli import build_parser
from kura.settings import load_settings
from kura.workers.forward import Forwarder
from tests.conftest import NodeProcess, node_env
from tests.descriptors import squeeze
from tests.integration import rawhttp
from tests.integration.test_workers import start_with_workers, worker_pids

MiB = 1024 * 1024
# SIGTERM to exit, past KURA_SHUTDOWN_TIMEOUT_SECONDS: the processes' own exit (0.3 to 0.9 s
# measured on 2 loaded cores; up to 1.6 s at a load average of 20).
STOP_SLACK_SECONDS = 2.0


def _server_inode(port: int, client_port: int) -> int | None:
    """The inode of the server side of the connection from ``client_port`` (proc(5) net/tcp)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) == port and (
                int(remote.rsplit(":", 1)[1], 16) == client_port
            ):
                return int(fields[9])
    return None


def _holds(pid: int, inode: int) -> bool:
    target = f"socket:[{inode}]"
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:
            continue
    return False


def worker_connection(node: NodeProcess) -> socket.socket:
    """A connection to the public port that the worker (not the primary) accepted."""
    (worker,) = worker_pids(node)
    return _accepted_by(node, worker)


def _accepted_by(node: NodeProcess, pid: int) -> socket.socket:
    """A connection to the public port that process ``pid`` of ``node`` accepted."""
    port = int(node.url.rsplit(":", 1)[1])
    others = [p for p in [node.proc.pid, *worker_pids(node)] if p != pid]
    for _ in range(200):
        s = rawhttp.connect(node.url, timeout=30)
        client_port = s.getsockname()[1]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            inode = _server_inode(port, client_port)
            if inode:
                if _holds(pid, inode):
                    return s
                if any(_holds(other, inode) for other in others):
                    break
            time.sleep(0.01)
        s.close()
    raise AssertionError(f"process {pid} accepted none of 200 connections")


def primary_connection(node: NodeProcess) -> socket.socket:
    """A connection to the public port that the primary (not the worker) accepted."""
    return _accepted_by(node, node.proc.pid)


def closed(s: socket.socket) -> bool:
    """Whether the peer closed (EOF or reset) within the socket's timeout, nothing more sent."""
    try:
        return s.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_a_trickling_upload_through_the_worker_is_answered_and_closed_at_the_grace(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_with_workers(
        start_node,
        "g",
        workers=2,
        min_upload_bytes_per_second=16 * 1024,
        upload_grace_seconds=2,
        body_idle_timeout_seconds=60,
    )
    with worker_connection(node) as s:
        started = time.monotonic()
        rawhttp.send_head(s, "PUT", "/cache/trickle", {"Content-Length": str(MiB)})
        s.sendall(b"x")
        s.settimeout(1.0)
        data = b""
        while b"upload too slow" not in data and time.monotonic() - started < 20:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                s.sendall(b"x")  # a byte a second
                continue
            assert chunk, data
            data += chunk
        after = time.monotonic() - started
        assert data.startswith(b"HTTP/1.1 400"), data
        assert b"upload too slow" in data
        assert 1.5 <= after < 10, after
        # Closed at once, as the primary closes its own: not after a 10 s lingering read.
        s.settimeout(3)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(b"x")
        assert closed(s)
    assert node.metric('kura_http_aborted_uploads_total{reason="slow"}') == 1
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)


def test_the_primary_keeps_reading_a_forwarded_trickle_it_answered(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The relay's side of the trickle above, made deterministic. On a forwarded connection
    (the primary's unix socket, spoken to as a worker does), the primary answers the trickle
    400 and then keeps reading until the worker closes: it does not close under a body the
    worker is still relaying. Had it closed, the worker's next write would fail (EPIPE), and a
    worker whose loop wrote before it read lost the 400 and answered 503 (seen in a full run)."""
    node = start_with_workers(
        start_node,
        "k",
        workers=2,
        min_upload_bytes_per_second=16 * 1024,
        upload_grace_seconds=1,
        body_idle_timeout_seconds=60,
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(node.data_dir.resolve() / ".kura.primary.sock"))
        s.settimeout(10)
        rawhttp.send_head(s, "PUT", "/cache/relayed-trickle", {"Content-Length": str(MiB)})
        s.sendall(b"x")
        status, headers, body = rawhttp.read_response(s)
        assert status == 400, body
        assert b"upload too slow" in body
        assert headers.get("connection") == "close"
        # Still reading: bytes sent after the answer are taken, and nothing ends the connection.
        s.settimeout(0.5)
        for _ in range(4):
            s.sendall(b"x" * 4096)  # BrokenPipeError if the primary had closed
            with contextlib.suppress(TimeoutError):
                assert s.recv(1) != b"", "the primary closed the forwarded connection"
                raise AssertionError("the primary sent more after its answer")
    assert node.metric('kura_http_aborted_uploads_total{reason="slow"}') == 1
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)


def test_forwarded_requests_end_cleanly_when_the_primary_is_killed(
    start_node: Callable[..., NodeProcess],
) -> None:
    """In flight when the primary dies: a body waiting for its ``100 Continue``, a body half
    sent, and a stream of small uploads on kept-alive connections (a pooled connection to the
    primary found closed as its body goes out). Each client gets a whole answer or a cut
    connection; the worker logs no traceback (no task exception left unretrieved)."""
    node = start_with_workers(start_node, "p", workers=2)
    (worker,) = worker_pids(node)
    waiting = worker_connection(node)
    rawhttp.send_head(
        waiting, "PUT", "/cache/waiting", {"Content-Length": str(MiB), "Expect": "100-continue"}
    )
    half = worker_connection(node)
    rawhttp.send_head(half, "PUT", "/cache/half", {"Content-Length": str(MiB)})
    half.sendall(os.urandom(MiB // 2))

    stop = threading.Event()
    outcomes: list[str] = []

    def hammer(s: socket.socket, n: int) -> None:
        """Small uploads, one after another on one kept-alive connection to the worker."""
        i = 0
        with s:
            while not stop.is_set():
                i += 1
                body = os.urandom(2000)
                try:
                    rawhttp.send_head(s, "PUT", f"/cache/h{n}-{i}", {"Content-Length": "2000"})
                    s.sendall(body)
                    status = rawhttp.read_response(s)[0]
                except OSError:  # ConnectionError, or the timeout of a connection cut
                    outcomes.append("cut")
                    return
                outcomes.append(str(status))
                if status != 201:
                    return

    hammered = [worker_connection(node) for _ in range(4)]
    writers = [threading.Thread(target=hammer, args=(s, n)) for n, s in enumerate(hammered)]
    for t in writers:
        t.start()
    time.sleep(1.0)
    node.kill()
    assert node.proc.wait(timeout=15) == -signal.SIGKILL
    assert rawhttp.wait_until(lambda: not Path(f"/proc/{worker}").exists(), 30)
    stop.set()
    for t in writers:
        t.join(30)
        assert not t.is_alive()

    for s in (waiting, half):
        s.settimeout(10)
        try:
            data = s.recv(65536)
            while data.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
                data = data[len(b"HTTP/1.1 100 Continue\r\n\r\n") :] or s.recv(65536)
        except ConnectionResetError:
            data = b""
        assert data == b"" or data.startswith(b"HTTP/1.1 503"), data
        s.close()
    assert "201" in outcomes  # the stream was under way when the primary died
    assert set(outcomes) <= {"201", "503", "cut"}, set(outcomes)
    log = node.log()
    assert "Traceback" not in log, log[-3000:]
    assert "never retrieved" not in log, log[-3000:]


def test_sigterm_to_exit_is_one_shutdown_timeout_for_the_whole_process_group(
    start_node: Callable[..., NodeProcess],
) -> None:
    """One deadline for the whole stop: an upload held open on the worker (relayed, so the
    primary runs a handler for it too) and one on the primary, each outliving the timeout.
    SIGTERM to the primary's exit, its worker's included, is at most the timeout plus
    ``STOP_SLACK_SECONDS`` (2.3 to 3.6 s here for 2), and the worker exits by itself. On main
    the worker drained for the timeout, then aiohttp's cleanup waited for the relayed upload
    for as long again, and the primary waited for the worker (up to the timeout + 5 s, then
    killed it) before its own drain of the full timeout: 65 s for 30 s, 8.1 s for 2. An upload
    acknowledged before the SIGTERM is still stored."""
    timeout = 2
    node = start_with_workers(
        start_node, "g", workers=2, shutdown_timeout_seconds=timeout, upload_grace_seconds=120
    )
    with node.client() as c:
        assert c.put("/cache/acked", content=b"acknowledged").status_code in (200, 201)
    held = [worker_connection(node), primary_connection(node)]
    try:
        for i, s in enumerate(held):
            rawhttp.send_head(s, "PUT", f"/cache/held{i}", {"Content-Length": str(MiB)})
            s.sendall(b"x")
        assert rawhttp.wait_until(lambda: len(node.staging_files()) == 2)
        started = time.monotonic()
        node.proc.send_signal(signal.SIGTERM)
        assert node.proc.wait(30) == 0, node.log()[-3000:]
        took = time.monotonic() - started
    finally:
        for s in held:
            s.close()
    assert took <= timeout + STOP_SLACK_SECONDS, took
    assert "did not stop; killing it" not in node.log()  # the worker exited by itself
    assert node.index_rows() == 1
    assert node.staging_files() == []


def test_a_worker_short_of_descriptors_answers_ready_503_itself(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A worker forwards ``/ready`` to the primary, which cannot see the worker's descriptors:
    on main a worker that could open none (its soft limit lowered under it) relayed the
    primary's 200 over the connection it had kept to it, while its share of the port could
    serve nothing. Now it answers 503 with the reason, and 200 again once the shortage passes."""
    node = start_with_workers(start_node, "g", workers=2)
    (worker,) = worker_pids(node)
    limit = resource.prlimit(worker, resource.RLIMIT_NOFILE)
    with worker_connection(node) as s:
        rawhttp.send_head(s, "GET", "/ready", {})
        assert rawhttp.read_response(s)[0] == 200  # forwarded: a kept-alive forward connection
        answers: list[tuple[int, bytes]] = []

        def ready(status: int) -> bool:
            rawhttp.send_head(s, "GET", "/ready", {})
            got, _headers, body = rawhttp.read_response(s)
            answers.append((got, body))
            return got == status

        try:
            squeeze(worker, limit[1])
            short = ready(503)
        finally:
            resource.prlimit(worker, resource.RLIMIT_NOFILE, limit)
        assert short, answers[-1]
        assert b"short of descriptors" in answers[-1][1], answers[-1]
        assert rawhttp.wait_until(lambda: ready(200), 10)


async def test_a_forward_the_primary_refuses_at_its_cap_is_relayed_as_its_cap_refusal(
    tmp_path: Path,
) -> None:
    """A worker's ``Forwarder`` against the primary's guarded unix listener
    (``unix_listening_socket``) at its cap (1, held by a connection it counts), in this
    process. The primary refuses a forward as it accepts it (``GuardedSocket.accept``: 503,
    then close), and here it does so in the one slot that made it race on main: after the
    worker's connection looked for something to read and before it wrote its head. The head's
    write fails (EPIPE) and the 503 is never read; the client must still get the cap's answer,
    as from the primary itself. On main it got 503 "the node's primary process is
    unavailable" (a real node: 1 to 4 in 60 refusals, test_connection_cap)."""
    settings = load_settings(build_parser().parse_args(["serve"]), node_env(tmp_path))
    loop = asyncio.get_running_loop()
    guard = ConnectionGuard(1)
    held, peer = socket.socketpair()
    guard.track(held)  # the cap's one connection, busy (no handler waits for its head)
    listener = unix_listening_socket(guard, str(tmp_path / "primary.sock"))
    listener.listen(8)
    listener.setblocking(False)
    refused = asyncio.Event()

    def accept() -> None:  # asyncio's accept loop does this on readiness; here one turn later
        with contextlib.suppress(BlockingIOError):  # refused: nothing to return
            listener.accept()
        refused.set()

    def ready() -> None:
        loop.remove_reader(listener.fileno())
        loop.call_soon(accept)

    forward = Forwarder(str(tmp_path / "primary.sock"), os.getppid(), settings)
    await forward.start()

    async def relay(request: web.Request) -> web.StreamResponse:
        return await forward(request)

    worker_app = web.Application()
    worker_app.router.add_route("*", "/{tail:.*}", relay)
    worker = web.AppRunner(worker_app, handle_signals=False)
    await worker.setup()
    await web.TCPSite(worker, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{worker.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession(url) as http:
            for _ in range(3):
                refused.clear()
                loop.add_reader(listener.fileno(), ready)
                async with http.post("/v8/artifacts/events", data=b"{}") as r:
                    assert refused.is_set()
                    assert guard.refused_total >= 1
                    assert (r.status, r.headers.get("Retry-After")) == (503, "1")
                    assert await r.text() == "connection limit reached; retry later\n"
    finally:
        await worker.cleanup()
        await forward.close()
        listener.close()
        held.close()
        peer.close()
