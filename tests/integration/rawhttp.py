"""Raw HTTP/1.1 over a socket, for requests a well-behaved client library refuses to send:
bodies shorter than their Content-Length, disconnects mid-body, chunked streams."""

from __future__ import annotations

import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from kit import wait as kit_wait


def connect(base_url: str, timeout: float = 10.0) -> socket.socket:
    u = urlsplit(base_url)
    assert u.hostname is not None
    assert u.port is not None
    return socket.create_connection((u.hostname, u.port), timeout=timeout)


def send_head(sock: socket.socket, method: str, path: str, headers: dict[str, str]) -> None:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Read one response (status, lower-cased headers, body by Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {data!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:length]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05
) -> bool:
    """``kit.wait.wait_until`` with these tests' default timeout (10 s)."""
    return kit_wait.wait_until(predicate, timeout, interval=interval)
