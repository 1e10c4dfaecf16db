"""Idle and half-open connections cannot lock a node out (issue 10 §7): 1,100 idle connections
under a 1,024-descriptor limit once made ``/up`` time out and wrote 166,623 tracebacks in 30 s.
The node runs under a lowered descriptor limit (``prlimit``), as a small container would."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import NodeProcess, node_env, spawn_node
from tests.integration import rawhttp

MiB = 1024 * 1024


@pytest.fixture
def limited_node(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    """Factory: a node whose descriptor limit is soft 128, hard 256."""
    nodes: list[NodeProcess] = []

    def start(**settings: object) -> NodeProcess:
        directory = tmp_path / f"n{len(nodes)}"
        node = spawn_node(
            directory, node_env(directory, **settings), prefix=["prlimit", "--nofile=128:256"]
        )
        nodes.append(node)
        return node

    yield start
    for node in nodes:
        assert node.stop() == 0, node.log()[-3000:]


def processes(node: NodeProcess) -> int:
    """The node's serving processes: its workers, plus the primary."""
    return int(node.metric("kura_workers") or 0) + 1


def _open(url: str, n: int, partial_every: int) -> list[socket.socket]:
    socks = []
    for i in range(n):
        s = rawhttp.connect(url, timeout=10)
        if i % partial_every == 0:
            s.sendall(b"GET /up HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        socks.append(s)
    return socks


def _timed_up(url: str) -> float:
    started = time.monotonic()
    r = httpx.get(url + "/up", timeout=10)
    assert r.status_code == 200
    return time.monotonic() - started


def test_up_answers_with_hundreds_of_idle_connections_and_the_log_stays_clean(
    limited_node: Callable[..., NodeProcess],
) -> None:
    node = limited_node(header_read_timeout_seconds=4, max_connections=4096)
    # The soft limit was raised to the hard one and the cap clamped below it, with a reserve.
    assert "connection cap 192 (KURA_MAX_CONNECTIONS=4096, descriptor limit 256)" in node.log()
    cap = 192 * processes(node)  # each process has its own cap and limit; /metrics sums them
    socks = _open(node.url, 600, partial_every=2)
    try:
        assert max(_timed_up(node.url) for _ in range(10)) < 5.0
        samples = node.metrics()
        assert samples["kura_http_max_connections"] == cap
        assert samples["kura_http_open_connections"] <= cap
        # Past the cap each newcomer either displaced an idle connection or, when every one
        # was still being set up (not yet waiting for a head), was answered 503.
        made_room = samples["kura_http_connections_closed_at_cap_total"]
        refused = samples["kura_http_connections_refused_at_cap_total"]
        assert made_room > 0
        assert made_room + refused >= 600 - cap, (made_room, refused)
        # The header-read timeout closes whatever is left once it passes.
        assert rawhttp.wait_until(lambda: node.metric("kura_http_open_connections") <= 1, 20)
        assert _timed_up(node.url) < 5.0
    finally:
        for s in socks:
            s.close()
    log = node.log()
    assert "Traceback" not in log
    assert "Too many open files" not in log
    assert len(log) < 20_000, len(log)


def test_a_connection_that_never_finishes_its_head_is_closed_after_the_timeout(
    limited_node: Callable[..., NodeProcess],
) -> None:
    node = limited_node(header_read_timeout_seconds=2)
    with rawhttp.connect(node.url, timeout=10) as s:
        started = time.monotonic()
        s.sendall(b"GET /up HTTP/1.1\r\nHost: x\r\n")
        for _ in range(5):  # a slow trickle of header bytes does not extend it
            time.sleep(0.3)
            s.sendall(b"X-A: b\r\n")
        assert s.recv(1024) == b""
        assert 1.5 < time.monotonic() - started < 6
    # Between keep-alive requests the same timeout applies.
    with rawhttp.connect(node.url, timeout=10) as s:
        rawhttp.send_head(s, "GET", "/up", {})
        assert rawhttp.read_response(s)[0] == 200
        started = time.monotonic()
        assert s.recv(1024) == b""
        assert 1.5 < time.monotonic() - started < 6


def test_at_the_cap_with_every_connection_busy_a_new_one_gets_503(
    limited_node: Callable[..., NodeProcess],
) -> None:
    node = limited_node(max_connections=8, upload_grace_seconds=120)
    n = processes(node)  # 8 each; the kernel picks the process of each new connection
    busy: list[socket.socket] = []
    try:
        refusal = None
        while refusal is None and len(busy) <= 8 * n:
            s = rawhttp.connect(node.url, timeout=30)
            headers = {"Content-Length": str(MiB), "Expect": "100-continue"}
            rawhttp.send_head(s, "PUT", f"/cache/busy{len(busy)}", headers)
            status, headers, body = rawhttp.read_response(s)
            if status == 503:
                refusal = (status, headers.get("retry-after"), body)
                s.close()
                break
            # The 100 proves its head was parsed and its handler runs: it is busy, not idle.
            assert status == 100
            s.sendall(b"b")
            busy.append(s)
        # Refused once the process it reached had 8 busy: after 8 (one process) to 8 * n.
        assert refusal is not None
        assert 8 <= len(busy) <= 8 * n, len(busy)
        assert refusal[:2] == (503, "1")
        assert b"connection limit reached" in refusal[2]
    finally:
        for s in busy:
            s.close()
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert node.metric("kura_http_connections_refused_at_cap_total") >= 1
    assert node.staging_files() == []
    assert "Traceback" not in node.log()


def test_accept_errors_are_logged_as_one_line_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio's own exception handler (a real event loop) reporting EMFILE on every retry."""
    import asyncio
    import errno

    import kura.api.connections  # noqa: F401  (installs the filter, as the node does)

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.INFO, logger="asyncio"):
            for _ in range(1000):
                try:
                    raise OSError(errno.EMFILE, "Too many open files")
                except OSError as exc:
                    loop.call_exception_handler(
                        {"message": "socket.accept() out of system resource", "exception": exc}
                    )
    finally:
        loop.close()
    records = [r for r in caplog.records if r.name == "asyncio"]
    assert len(records) == 1
    assert records[0].exc_info is None
    assert records[0].levelname == "WARNING"
    line = records[0].getMessage()
    assert "\n" not in line
    assert "Too many open files" in line
