"""``kured doctor``'s ``etcd`` and ``gate`` checks against a real etcd and real HTTP servers:
both are fail-closed in the agent, so a dead one must be a FAIL, not silence."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.kured.doctor_host import in_process, release

__all__ = ["release"]


def dead_url() -> str:
    """An http URL of a loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def findings(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    return [(f["level"], f["message"]) for f in report["findings"] if f["check"] == check]


@pytest.fixture
def gate() -> Iterator[dict[str, Any]]:
    """A real HTTP server whose answer the test sets: ``{"status": int, "url": str}``."""
    state: dict[str, Any] = {"status": 200}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"reasons": ["bootstrapping from 2 peers"]}).encode()
            self.send_response(state["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/ready"
    yield state
    server.shutdown()
    server.server_close()


def test_etcd_answering_is_ok_and_names_the_lock_state(
    etcd: str, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    _code, report = in_process(capsys, release, etcd=etcd)
    assert findings(report, "etcd") == [("OK", "every etcd endpoint answers; /kured/lock is free.")]


def test_one_dead_member_warns_and_none_answering_fails(
    etcd: str, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    dead = dead_url()
    _code, report = in_process(capsys, release, etcd=f"{etcd},{dead}")
    [(level, message)] = findings(report, "etcd")
    assert level == "WARN"
    assert message.startswith(f"1 of 2 etcd endpoints answer; down: {dead} ("), message
    code, report = in_process(capsys, release, etcd=dead)
    [(level, message)] = findings(report, "etcd")
    assert level == "FAIL"
    assert message.startswith(f"no --etcd-endpoints answers: {dead} ("), message
    assert message.endswith("the agent cannot take the lock, so no node reboots.")
    assert code == 1


def test_a_gate_open_closed_and_unreachable(
    etcd: str, gate: dict[str, Any], capsys: pytest.CaptureFixture[str], release: str
) -> None:
    url = gate["url"]
    code, report = in_process(capsys, release, "--gate-url", url, etcd=etcd)
    assert findings(report, "gate") == [("OK", f"gate {url} answered 200: open.")]
    gate["status"] = 503
    code, report = in_process(capsys, release, "--gate-url", url, etcd=etcd)
    closed_now = f"gate {url} answered 503: bootstrapping from 2 peers: closed now"
    assert findings(report, "gate") == [("WARN", closed_now + ", so a reboot would wait.")]
    dead = dead_url() + "/ready"
    code, report = in_process(
        capsys, release, "--gate-url", url, "--gate-url", dead, "--gate-timeout", "2s", etcd=etcd
    )
    [closed, (level, message)] = findings(report, "gate")
    assert closed[0] == "WARN"
    assert level == "FAIL"
    assert message.startswith(f"gate {dead} "), message
    assert message.endswith("the agent treats that as closed and never reboots.")
    assert code == 1
