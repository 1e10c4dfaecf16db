"""A body in a coding kura does not take is refused before it is read, with a clear status,
on every listener of a node of one process or of two (a primary and a worker): a
``Content-Encoding`` other than ``identity`` is 415 with ``Accept-Encoding: identity``, a
transfer coding besides ``chunked`` is 501 (``kura.api.body_codings``). A tester's finding:
aiohttp inflated gzip bodies by itself, so a complete body was a 400 "body ended after 10 of 30
declared bytes", a bogus one a 500, through a worker a 500 or a 503 "retry", and ``gzip,
chunked`` was stored still gzipped."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import socket
from collections.abc import Callable

import pytest

from kit.unix_socket import socket_address
from tests.conftest import NodeProcess
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

PLAIN = b"plain text"
GZIPPED = gzip.compress(PLAIN)
CAS = hashlib.sha256(PLAIN).hexdigest()

# Every public route that takes a body, one of each protocol (the middleware is route-blind;
# these are the routes the tester reached).
PUBLIC_WRITES = [
    ("PUT", "/cache/ab/gz1"),
    ("PUT", f"/cache/cas/{CAS}"),
    ("PUT", "/v1/cache/ab12"),
    ("PUT", "/api/cache/gradle/ab12"),
    ("PUT", "/dav/ab/gz1"),
    ("POST", f"/api/cache/cas/{CAS}"),
    ("PUT", "/api/metro/cache/ab12"),
    ("PUT", "/v8/artifacts/ab12?teamId=t"),
    ("POST", "/_admin/purge?namespace=&writer=anonymous"),
]
INTERNAL_WRITES = [
    ("PUT", "/_internal/replicate/artifact"),
    ("POST", "/_internal/bootstrap/bodies"),
]
ADMIN_WRITES = [("POST", "/_admin/purge?namespace=&writer=anonymous")]

# (headers, body as sent, status, what the message names)
REFUSED = [
    ({"Content-Encoding": "gzip", "Content-Length": str(len(GZIPPED))}, GZIPPED, 415, "gzip"),
    ({"Content-Encoding": "gzip", "Content-Length": "9"}, b"not gzip!", 415, "gzip"),
    (
        {"Content-Encoding": "identity, br", "Transfer-Encoding": "chunked"},
        rawhttp.chunk(b"not brotli") + rawhttp.LAST_CHUNK,
        415,
        "identity, br",
    ),
    (  # refused instead of its 100 Continue: the body is never sent (and the connection is
        # closed once its body came or aiohttp's lingering time passed, as at kura.api.expect's
        # other refusals; not waited for here)
        {"Content-Encoding": "gzip", "Content-Length": "30", "Expect": "100-continue"},
        b"",
        415,
        "gzip",
    ),
    (
        {"Transfer-Encoding": "gzip, chunked"},
        rawhttp.chunk(GZIPPED) + rawhttp.LAST_CHUNK,
        501,
        "gzip, chunked",
    ),
    # chunked not the final coding: aiohttp's parser answers 400 itself, as RFC 9112 §6.3 says
    # (the body's length cannot be told), before any kura code runs
    ({"Transfer-Encoding": "gzip"}, GZIPPED, 400, "Transfer-Encoding"),
]
ROUNDS = 12  # new connections each: the kernel spreads them over both processes (all 12 on
# one process: 1 in 2,048 per case)


def _exchange(
    sock: socket.socket, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes, bool]:
    """Send one request on ``sock`` and read its answer: status, lower-cased headers, body, and
    whether the server then closed the connection. Closes ``sock``."""
    with sock:
        rawhttp.send_head(sock, method, path, headers)
        sock.sendall(body)
        status, got_headers, text = rawhttp.read_response(sock)
        if status < 400 or not body:
            return status, got_headers, text, False  # nothing to wait for
        sock.settimeout(5)  # the answer is all here: the server closes at once or not at all
        try:
            closed = sock.recv(1) == b""
        except ConnectionResetError:
            closed = True
        except TimeoutError:
            closed = False
    return status, got_headers, text, closed


def _admin_socket(node: NodeProcess) -> socket.socket:
    address, fd = socket_address(node.data_dir, "admin.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(address)
    finally:
        if fd is not None:
            os.close(fd)
    return sock


@pytest.mark.parametrize("workers", [1, 2])
def test_a_body_in_a_coding_kura_does_not_take_is_refused_before_it_is_read(
    start_node: Callable[..., NodeProcess], workers: int
) -> None:
    """Every case on every listener (public, internal, admin socket; the public one over new
    connections, so both processes get each case), then the codings kura takes stored and read
    back exactly; nothing is stored by a refused request, nothing is left in the tmp dir, and
    nothing is logged as an unhandled exception."""
    node = start_node(workers=workers)
    listeners: list[tuple[Callable[[], socket.socket], list[tuple[str, str]], int]] = [
        (lambda: rawhttp.connect(node.url), PUBLIC_WRITES, ROUNDS if workers > 1 else 1),
        (lambda: rawhttp.connect(node.internal_url), INTERNAL_WRITES, 1),
        (lambda: _admin_socket(node), ADMIN_WRITES, 1),
    ]
    for connect, writes, rounds in listeners:
        for method, path in writes:
            for headers, body, status, named in REFUSED:
                if "Expect" in headers and path.startswith("/_admin/"):
                    continue  # aiohttp's own expect handler: 100, then the same refusal
                for _ in range(rounds):
                    got, got_headers, text, closed = _exchange(
                        connect(), method, path, headers, body
                    )
                    where = (method, path, headers)
                    assert got == status, (where, got, text)
                    message = text.decode() if got == 400 else json.loads(text)["message"]
                    assert named in message, (where, message)
                    if status == 415:
                        assert got_headers.get("accept-encoding") == "identity", where
                        assert "Content-Encoding" in message
                        assert "identity" in message
                    elif status == 501:
                        assert "Transfer-Encoding" in message
                        assert "chunked" in message
                    if body:
                        assert closed, (where, "the connection stayed open on an unread body")
    assert node.index_rows() == 0  # nothing stored, by any route
    assert node.staging_files() == []
    # The codings kura takes still go through, on both processes: identity, and chunked.
    accepted = [
        ({"Content-Encoding": "identity", "Content-Length": str(len(PLAIN))}, PLAIN),
        ({"Transfer-Encoding": "chunked"}, rawhttp.chunk(PLAIN) + rawhttp.LAST_CHUNK),
        (
            {"Content-Encoding": "identity", "Transfer-Encoding": "chunked"},
            rawhttp.chunk(PLAIN) + rawhttp.LAST_CHUNK,
        ),
    ]
    for i, (headers, body) in enumerate(accepted):
        for r in range(ROUNDS):
            got, _h, text, _closed = _exchange(
                rawhttp.connect(node.url), "PUT", f"/cache/ok-{i}-{r}", headers, body
            )
            assert got in (200, 201), (headers, got, text)
    with node.client() as c:
        for i in range(len(accepted)):
            for r in range(ROUNDS):
                got = c.get(f"/cache/ok-{i}-{r}")
                assert (got.status_code, got.content) == (200, PLAIN)
    assert node.staging_files() == []
    said = node.log()
    assert "Traceback" not in said, said[-3000:]
    assert "Unhandled exception" not in said, said[-3000:]
