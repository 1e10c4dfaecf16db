"""``kura status`` and ``kured status`` when they cannot read ``/status`` (issue 26, item 11): one
line naming the URL and what to do, exit 1, no traceback. On main they printed urllib's own
``<urlopen error [Errno 111] Connection refused>`` and ``HTTP Error 401: Unauthorized``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process


def run_status(program: str, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``PROGRAM status *args`` (in ``env``, default this process's), which must fail with
    exit 1 and one line on stderr, no traceback and nothing on stdout; returns that line."""
    done = subprocess.run(
        [sys.executable, "-m", f"{program}.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (bound by the OS, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) but never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("program", "server", "url_option"),
    [
        ("kura", "a kura node", "--url or KURA_URL"),
        ("kured", "a kured agent", "--url or KURED_STATUS_URL"),
    ],
)
def test_a_closed_port_names_the_url_and_asks_whether_the_server_runs(
    closed_port: int, program: str, server: str, url_option: str
) -> None:
    url = f"http://127.0.0.1:{closed_port}"
    line = run_status(program, "--url", url)
    assert line == (
        f"{program} status: cannot connect to {url}/status: connection refused: is {server} "
        f"running and listening on 127.0.0.1:{closed_port}? Pass its URL with {url_option}."
    )


@pytest.mark.parametrize("program", ["kura", "kured"])
def test_a_server_that_never_answers_is_a_timeout_naming_the_url(
    silent_port: int, program: str
) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    line = run_status(program, "--url", url, "--timeout", "0.5")
    assert line.startswith(f"{program} status: no answer from {url}/status within 0.5 s: "), line
    assert "--url" in line


def test_a_node_that_requires_a_token_names_the_option_and_variable(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(workers=1, read_write_tokens="tok-rw")
    line = run_status("kura", "--url", node.url, "--token", "")
    assert line == (
        f"kura status: {node.url}/status answered HTTP 401 Unauthorized: a kura node requires a "
        "token; pass one with --token or KURA_TOKEN."
    )
    line = run_status("kura", "--url", node.url, "--token", "not-the-token")
    assert line.startswith(f"kura status: {node.url}/status answered HTTP 401 Unauthorized: "), line
    assert "the token was refused" in line
    assert "not-the-token" not in line


def test_the_grpc_port_is_not_taken_for_the_http_port(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``--url`` pointing at the node's gRPC port: its HTTP/2 answer is no HTTP/1 status line
    (``http.client.BadStatusLine``), which urllib lets through: a traceback before."""
    port = free_port()
    start_node(workers=1, grpc_port=port)
    url = f"http://127.0.0.1:{port}"
    line = run_status("kura", "--url", url)
    assert line == (
        f"kura status: {url}/status did not answer in HTTP/1: is it a kura node's HTTP port? "
        "Pass its URL with --url or KURA_URL."
    )


def test_kured_status_ignores_the_service_links_of_a_service_kured_metrics(
    closed_port: int,
) -> None:
    """The kubelet gives a pod KURED_METRICS_PORT=tcp://IP:PORT for a Service ``kured-metrics``;
    the agent ignores it (kit.service_link), and ``kured status`` read it as --metrics-port's
    default: int('tcp://...') raised before any request (a traceback)."""
    links = {
        "KURED_METRICS_SERVICE_HOST": "10.96.0.21",
        "KURED_METRICS_PORT": "tcp://10.96.0.21:9100",
        "KURED_METRICS_PORT_9100_TCP_PORT": "9100",
    }
    url = f"http://127.0.0.1:{closed_port}"
    line = run_status("kured", "--url", url, env={**os.environ, **links})
    assert line.startswith(f"kured status: cannot connect to {url}/status: "), line


@pytest.mark.parametrize(
    ("program", "url", "problem"),
    [
        ("kura", "notaurl", "add the scheme, as in http://notaurl/status"),
        ("kured", "notaurl", "add the scheme, as in http://notaurl/status"),
        ("kura", "127.0.0.1:4000", "add the scheme, as in http://127.0.0.1:4000/status"),
        ("kura", "localhost:4000", "add the scheme, as in http://localhost:4000/status"),
        ("kura", "http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("kura", "ftp://127.0.0.1", "the scheme must be http:// or https://, not ftp://"),
    ],
)
def test_a_url_that_is_not_one_says_how_to_write_it(program: str, url: str, problem: str) -> None:
    """On main, ``notaurl`` and a port out of range were urllib's ValueError traceback, and
    ``127.0.0.1:4000`` was ``unknown url type: 127.0.0.1`` with no hint (issue 26)."""
    line = run_status(program, "--url", url)
    option = "--url or KURA_URL" if program == "kura" else "--url or KURED_STATUS_URL"
    assert line == (
        f"{program} status: {url}/status is not a usable URL: {problem}. "
        f"Pass the right one with {option}."
    )
