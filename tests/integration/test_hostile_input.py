"""Regressions from a hostile-user pass over a fresh clone: each case once answered 500, held a
resource forever, or let a careless configuration start. Every case is a class of input, tested
on every route it reaches."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kura.api.malformed import LOG_LINES
from tests import oneshot
from tests.conftest import NodeProcess, node_env, serve_refused, spawn_node
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024

JSON_ROUTES = [
    ("PUT", "/api/cache/keyvalue?tenant_id=t"),
    ("POST", "/api/cache/module/complete?upload_id=x"),
    ("POST", "/v8/artifacts/events?teamId=t"),
    ("POST", "/v8/artifacts?teamId=t"),
]


@pytest.mark.parametrize(("method", "path"), JSON_ROUTES)
@pytest.mark.parametrize(
    "body",
    [
        b"[" * 100_000 + b"]" * 100_000,  # exhausts the parser's recursion
        b'{"hashes": [' + b"9" * 5000 + b"]}",  # past Python's integer digit limit
        b"\xff\xfe not utf-8",
    ],
    ids=["deep-nesting", "huge-integer", "not-utf8"],
)
def test_hostile_json_is_a_400_never_a_500(
    node: NodeProcess, method: str, path: str, body: bytes
) -> None:
    with node.client() as c:
        r = c.request(method, path, content=body)
    assert r.status_code in (400, 404), (r.status_code, r.text)  # 404: unknown upload id
    assert "Traceback" not in node.log()


def test_a_turbo_duration_must_be_an_integer_and_never_breaks_the_batch_query(
    node: NodeProcess,
) -> None:
    with node.client() as c:
        for bad in ("abc", "1.5", "-3", "9" * 40):
            r = c.put(
                "/v8/artifacts/p1?teamId=t", content=b"x", headers={"x-artifact-duration": bad}
            )
            assert r.status_code == 400, (bad, r.text)
        assert (
            c.put(
                "/v8/artifacts/p1?teamId=t", content=b"x", headers={"x-artifact-duration": "1500"}
            ).status_code
            == 202
        )
        r = c.post("/v8/artifacts?teamId=t", json={"hashes": ["p1", "missing"]})
        assert r.status_code == 200
        assert r.json()["p1"]["taskDurationMs"] == 1500


def test_non_utf8_credentials_are_a_401_not_a_500(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(read_write_tokens="rwtok")
    for route in ("/v1/cache/1", "/cache/x", "/v8/artifacts/status?slug=t"):
        sock = rawhttp.connect(node.url)
        with sock:
            sock.sendall(
                b"GET " + route.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer \xff\xfe\r\n\r\n"
            )
            status, _h, _b = rawhttp.read_response(sock)
        assert status == 401, route


def test_reads_racing_writes_of_one_key_never_miss(node: NodeProcess) -> None:
    """A reader that sees the new file before the new row must look again, not answer 404
    (and must never drop the entry as corrupt)."""
    bodies = [os.urandom(1 * MiB), os.urandom(3 * MiB)]
    with node.client() as c:
        assert c.put("/cache/race/1", content=bodies[0]).status_code == 201
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        with node.client() as c:
            i = 0
            while not stop.is_set():
                c.put("/cache/race/1", content=bodies[i % 2])
                i += 1

    w = threading.Thread(target=writer)
    w.start()
    misses = reads = 0
    deadline = time.monotonic() + 6
    with node.client() as c:
        while time.monotonic() < deadline:
            r = c.get("/cache/race/1")
            reads += 1
            if r.status_code != 200:
                misses += 1
            elif r.content not in bodies:
                errors.append("torn body")
    stop.set()
    w.join()
    assert reads > 20
    assert misses == 0, f"{misses} of {reads} reads missed"
    assert errors == []
    assert 'kura_storage_corrupt_artifacts_total{detected_by="read"}' in node.metrics()
    assert node.metric_sum("kura_storage_corrupt_artifacts_total") == 0
    assert "quarantined artifact" not in node.log()


def test_a_stalled_upload_is_aborted_and_frees_its_reservation(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(body_idle_timeout_seconds=2)
    sock = rawhttp.connect(node.url, timeout=30)
    with sock:
        rawhttp.send_head(sock, "PUT", "/cache/stall", {"Content-Length": str(64 * MiB)})
        sock.sendall(b"s" * 1024)
        assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") > 0)
        status, _h, body = rawhttp.read_response(sock)  # the server gives up on us
    assert status == 400
    assert b"no body bytes arrived" in body
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert node.staging_files() == []


def test_a_second_node_on_the_same_tmp_dir_refuses_to_start(
    node: NodeProcess, tmp_path: Path
) -> None:
    env = dict(node.env, KURA_DATA_DIR=str(tmp_path / "other-data"))  # same tmp dir
    with pytest.raises(RuntimeError, match=r"tmp directory .* is in use"):
        spawn_node(tmp_path / "second", env)


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"KURA_READ_WRITE_TOKENS": " , "}, "no token"),
        ({"KURA_TMP_DIR": "SAME"}, "must not be the same directory"),
        ({"KURA_TMP_DIR": "INSIDE"}, "must not be the same directory"),
    ],
)
def test_careless_configurations_are_refused(
    tmp_path: Path, settings: dict[str, str], needle: str
) -> None:
    env = node_env(tmp_path)
    for key, value in settings.items():
        if value == "SAME":
            value = env["KURA_DATA_DIR"]
        elif value == "INSIDE":
            value = str(Path(env["KURA_DATA_DIR"]) / "tmp")
        env[key] = value
    assert needle in serve_refused(env)


def test_malformed_requests_get_a_400_and_no_traceback_in_the_log(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Each malformed request 8 times over its own connection, so both processes of the node
    (the kernel spreads connections) get some: the chance that one got none is 2**-23. The
    worker once lost the quieting filter with an import it dropped."""
    node = start_node(workers=2)
    for raw in 8 * (
        b"GET /v1/cache/\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PUT /cache/x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Transfer-Encoding: chunked\r\n\r\nabc",
    ):
        sock = rawhttp.connect(node.url)
        with sock:
            sock.sendall(raw)
            status, _h, _b = rawhttp.read_response(sock)
        assert status == 400
    assert oneshot.get(node.url + "/up").status_code == 200
    assert "Traceback" not in node.log()
    # The quiet policy's budget of lines per process (kura.api.malformed), the rest left out.
    assert 1 <= node.log().count("rejected a malformed HTTP request") <= 2 * LOG_LINES


def test_a_malformed_request_never_puts_a_token_in_the_log(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The wiring of ``kura.api.malformed.without_credentials`` into the log filter, on a real
    node (one process: its budget is five lines a minute, one per shape here). Every shape of
    aiohttp's messages, on both of its parsers, is in ``tests/unit/test_malformed_log.py``."""
    node = start_node()
    secret = "writerwriterwrit0002"
    for raw in (
        f"GET /up HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer {secret}\r\n\r\n".encode(),
        f"GET /up HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer\r\n {secret}\r\n\r\n".encode(),
        f"GET /up HTTP/1.1\r\nHost: x\r\nX-Auth-Token: {secret}\x01\r\n\r\n".encode(),
        f"GET /up?token={secret}\x01 HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
        f"GET /up HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}{'a' * 9000}\r\n\r\n".encode(),
    ):
        sock = rawhttp.connect(node.url)
        with sock:
            sock.sendall(raw)
            status, _h, _b = rawhttp.read_response(sock)
        assert status in (400, 431), status
    said = node.log()
    assert said.count("rejected a malformed HTTP request") == 5, said[-3000:]
    assert secret not in said, [line for line in said.splitlines() if secret in line]


def test_a_write_from_a_web_page_is_refused_and_changes_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A browser attaches the status page's Basic credentials to requests other sites' pages
    make (a form's POST needs no CORS preflight), and a page whose name is rebound to the node
    is even same-origin: every request that is not GET, HEAD or OPTIONS and carries ``Origin``
    (whatever it names) or a cross-site ``Sec-Fetch-Site`` is refused with 403 and stores
    nothing, on both processes and on the internal listener; the same requests without those
    headers (as build tools and peers send them) go through, and reads are not affected."""
    node = start_node(workers=2)
    here = node.url  # http://127.0.0.1:PORT: a rebound name would look the same
    from_pages = [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": here, "Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ]
    for round_ in range(4):  # new connections: the kernel spreads them over both processes
        for i, headers in enumerate(from_pages):
            with node.client() as c:
                r = c.put(f"/cache/csrf-{round_}-{i}", content=b"poison", headers=headers)
                assert r.status_code == 403, (headers, r.status_code, r.text)
                assert "from a web page" in r.text
                r = c.post("/_admin/purge?namespace=&writer=anonymous", headers=headers)
                assert r.status_code == 403, (headers, r.status_code, r.text)
                r = c.delete("/cache", headers=headers)
                assert r.status_code == 403, (headers, r.status_code, r.text)
                assert c.get(f"/cache/csrf-{round_}-{i}").status_code == 404  # nothing stored
            r = oneshot.request(
                "DELETE",
                node.internal_url + "/_internal/replicate/namespace?namespace_id=main&version_ms=1",
                headers=headers,
            )
            assert r.status_code == 403, (headers, r.status_code, r.text)
    with node.client() as c:
        assert c.put("/cache/kept", content=b"ok").status_code in (200, 201)  # a build tool
        got = c.get("/cache/kept", headers={"Origin": "http://evil.example"})
        assert (got.status_code, got.content) == (200, b"ok")  # a read is not a write
