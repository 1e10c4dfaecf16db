"""What granian's RSGI interface does for kura's needs, asked of a running granian (issue 30,
item 1): one JSON object of observations, for ``docs/benchmarks.md``.

Starts ``granian --interface rsgi --workers 1 --http1-header-read-timeout 2000`` on
``bench/servers/probe_rsgi.py`` and, with raw sockets on 127.0.0.1:

* ``expect_reject`` / ``expect_accept``: a PUT with ``Expect: 100-continue`` that the app
  answers 401 without reading the body, and one whose body it reads: the bytes the client gets
  before sending any body (is ``100 Continue`` sent before the app's checks, after, or never).
* ``request_backpressure``: a 64 MiB PUT the app reads at 50 ms per chunk; how many bytes the
  client could send in 3 s, and the worker's RSS growth (bounded = the server stops reading).
* ``response_backpressure``: a 256 MiB ``response_stream`` (1 MiB ``send_bytes`` each) to a
  client that reads nothing for 3 s; how long the app's sending loop took and the worker's RSS
  growth (the loop ending at once with +256 MiB = no back-pressure on ``send_bytes``).
* ``file_syscalls``: the system calls (``strace -c``) of the worker while it serves a 64 MiB
  ``response_file``: ``sendfile`` (zero-copy) or ``read``/``write`` (copied through memory).
* ``short_response``: a 200 promising 1 MiB whose app raises after 512 KiB: what the client
  gets (the bytes, then a reset or a clean end of the connection).
* ``idle_keepalive``: after one answered request, whether an idle keep-alive connection is
  closed within 6 s (granian offers no HTTP/1 idle timeout option; the header-read timeout is
  2 s here).
* ``slowloris``: a request head sent one byte per 0.5 s: when the server closes it.

Usage: python -m bench.granian_probe [--json-out FILE]   (about 30 s; needs strace for the file
check, skipped without it)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import bench.cachebench as cb
from bench.peers import Proc, machine_info, stop_all, wait_http
from kura_harness.launch.process import free_port, http_get

SERVERS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "servers")
MiB = cb.MiB


def connect(port: int, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def recv_for(sock: socket.socket, seconds: float) -> bytes:
    """What arrives within ``seconds`` (until the peer closes or the time is up)."""
    sock.settimeout(0.1)
    got = b""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        if not data:
            break
        got += data
    return got


def head(port: int, path: str, length: int, expect: bool) -> bytes:
    lines = [f"PUT {path} HTTP/1.1", "Host: probe", f"Content-Length: {length}"]
    return ("\r\n".join(lines + (["Expect: 100-continue"] if expect else [])) + "\r\n\r\n").encode()


def expect_case(port: int, path: str) -> dict:
    """The status lines the client gets before it sends any body, and after it sent it (only
    when a ``100 Continue`` invited it to)."""
    with connect(port) as s:
        s.sendall(head(port, path, MiB, expect=True))
        before_body = recv_for(s, 2.0)
        after_body = b""
        if b"100 Continue" in before_body:
            s.sendall(b"x" * MiB)
            after_body = recv_for(s, 2.0)

    def statuses(data: bytes) -> list[str]:
        return [x for x in data.decode(errors="replace").split("\r\n") if x.startswith("HTTP/")]

    return {"before_body": statuses(before_body), "after_body": statuses(after_body)}


def stats(port: int) -> dict:
    """The worker's /stats (its pid, RSS now, the last flood's figures)."""
    status, body = http_get(f"http://127.0.0.1:{port}/stats", timeout=10)
    if status != 200:
        raise RuntimeError(f"/stats answered {status}")
    return dict(json.loads(body))


def request_backpressure(port: int) -> dict:
    size = 64 * MiB
    rss0 = stats(port)["rss_kib"]
    s = connect(port)
    s.sendall(head(port, "/slow-read", size, expect=False))
    s.setblocking(False)
    sent, chunk = 0, b"x" * 65536
    end = time.monotonic() + 3.0
    while time.monotonic() < end and sent < size:
        try:
            sent += s.send(chunk[: size - sent])
        except BlockingIOError:
            time.sleep(0.01)
    rss1 = stats(port)["rss_kib"]
    s.close()
    return {
        "body_bytes": size,
        "client_sent_in_3s": sent,
        "worker_rss_growth_kib": rss1 - rss0,
        "app_reads_at": "one chunk per 50 ms",
    }


def response_backpressure(port: int) -> dict:
    mib = 256
    s = connect(port, timeout=60)
    s.sendall(f"GET /flood/{mib} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
    time.sleep(3.0)  # the client reads nothing meanwhile
    flood = stats(port)
    got = 0
    s.settimeout(30)
    while got < mib * MiB:  # drain it, then the answer is complete
        data = s.recv(1 << 20)
        if not data:
            break
        got += len(data)
    s.close()
    return {
        "response_bytes": mib * MiB,
        "client_read_during_3s": 0,
        "app_send_loop_seconds": round(flood["seconds"], 3) if "seconds" in flood else None,
        "worker_rss_growth_kib": flood.get("rss_kib_after", 0) - flood.get("rss_kib_before", 0),
        "client_received_after": got,
    }


def file_syscalls(port: int, size: int) -> dict:
    strace = shutil.which("strace")
    if not strace:
        return {"skipped": "strace not on PATH"}
    calls = "sendfile,read,pread64,write,writev,sendmsg,sendto,copy_file_range,splice"
    cmd = [strace, "-f", "-c", "-e", f"trace={calls}", "-p", str(stats(port)["pid"])]
    tracer = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    status, body = http_get(f"http://127.0.0.1:{port}/file", timeout=60)
    time.sleep(0.5)
    tracer.send_signal(signal.SIGINT)
    _, err = tracer.communicate(timeout=30)
    counts = {}
    for line in err.splitlines():
        parts = line.split()
        if parts and parts[-1] in calls.split(",") and len(parts) >= 5:
            counts[parts[-1]] = int(parts[3])
    return {"status": status, "bytes": len(body), "file_bytes": size, "calls": counts}


def short_response(port: int) -> dict:
    with connect(port) as s:
        s.sendall(b"GET /short HTTP/1.1\r\nHost: probe\r\n\r\n")
        s.settimeout(5.0)
        got, end = b"", "timeout (connection left open)"
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    end = "clean end (FIN)"
                    break
                got += data
        except ConnectionResetError:
            end = "reset (RST)"
        except TimeoutError:
            pass
    head, _, body = got.partition(b"\r\n\r\n")
    return {
        "status": head.split(b"\r\n")[0].decode(errors="replace"),
        "body_bytes": len(body),
        "promised": 1 << 20,
        "connection": end,
    }


def idle_keepalive(port: int) -> dict:
    with connect(port) as s:
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: probe\r\n\r\n")
        recv_for(s, 0.5)
        t0 = time.monotonic()
        s.settimeout(6.0)
        try:
            closed = s.recv(1) == b""
        except TimeoutError:
            closed = False
        return {"closed": closed, "after_s": round(time.monotonic() - t0, 2) if closed else None}


def slowloris(port: int) -> dict:
    request = b"GET /stats HTTP/1.1\r\nHost: probe\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n"
    with connect(port) as s:
        t0 = time.monotonic()
        s.settimeout(0.5)
        for i in range(len(request)):
            try:
                s.send(request[i : i + 1])
            except OSError:
                return {"closed_after_s": round(time.monotonic() - t0, 2), "bytes_sent": i}
            try:
                data = s.recv(4096)
                if data == b"":
                    return {"closed_after_s": round(time.monotonic() - t0, 2), "bytes_sent": i}
                return {"answered": data.split(b"\r\n")[0].decode(), "bytes_sent": i}
            except TimeoutError:
                continue
    return {"closed": False, "bytes_sent": len(request)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json-out")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="kura-granian-probe-")
    run: dict[str, Any] = {"machine": machine_info(), "load_start": cb.loadavg()}
    try:
        import granian

        run["granian"] = granian.__version__
        file_path = os.path.join(work, "blob")
        with open(file_path, "wb") as f:
            f.write(os.urandom(64 * MiB))
        port = free_port()
        cmd = [sys.executable, "-m", "granian", "--interface", "rsgi", "--port", str(port)]
        cmd += ["--workers", "1", "--http", "1", "--no-ws", "--log-level", "warning"]
        cmd += ["--http1-header-read-timeout", "2000", "--working-dir", SERVERS_DIR]
        proc = Proc(
            "granian-probe",
            [*cmd, "probe_rsgi:app"],
            env=dict(os.environ, PROBE_FILE=file_path),
            logfile=os.path.join(work, "granian.log"),
        )
        wait_http(f"http://127.0.0.1:{port}/stats", {}, proc)
        shown = [os.path.relpath(c) if c == SERVERS_DIR else c for c in cmd[3:]]
        run["command"] = " ".join(["granian", *shown, "probe_rsgi:app"])
        run["expect_reject"] = expect_case(port, "/reject")
        run["expect_accept"] = expect_case(port, "/accept")
        run["request_backpressure"] = request_backpressure(port)
        run["response_backpressure"] = response_backpressure(port)
        run["file_syscalls"] = file_syscalls(port, 64 * MiB)
        run["short_response"] = short_response(port)
        run["idle_keepalive"] = idle_keepalive(port)
        run["slowloris"] = slowloris(port)
        run["load_end"] = cb.loadavg()
    finally:
        stop_all()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(run, indent=1)
    print(text)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
