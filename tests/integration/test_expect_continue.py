"""``Expect: 100-continue`` is answered with the final error when the upload would be refused:
never ``100`` first and then the error after the client started sending (issue 10 §7)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable

import pytest

from kura.core.keys import artifact_id
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.test_hostile_clients import recent_errors
from tests.integration import rawhttp

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
RW = {"Authorization": "Bearer rw"}
RO = {"Authorization": "Bearer ro"}
PEER_WRONG = {"Authorization": "Bearer not-the-peer-secret"}


def _expect(
    url: str, method: str, path: str, length: int, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    """Send only a head with ``Expect: 100-continue``; the first response the node gives."""
    sock = rawhttp.connect(url)
    with sock:
        rawhttp.send_head(
            sock,
            method,
            path,
            {"Content-Length": str(length), "Expect": "100-continue", **headers},
        )
        return rawhttp.read_response(sock)


def replica_manifest(key: str, size: int, sha256: str = "0" * 64) -> str:
    """A peer's ``Kura-Manifest`` header for ``/cache/<key>`` of ``size`` bytes, written now."""
    now = int(time.time() * 1000)
    return json.dumps(
        {
            "artifact_id": artifact_id("http", "default", "", key),
            "producer": "http",
            "namespace_id": "",
            "key": key,
            "content_type": "application/octet-stream",
            "size": size,
            "sha256": sha256,
            "version_ms": now,
            "created_at_ms": now,
        },
        separators=(",", ":"),
    )


def _assert_nothing_left(node: NodeProcess) -> None:
    assert node.index_rows() == 0
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_refused_uploads_get_their_final_status_and_never_100(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(read_write_tokens="rw", read_only_tokens="ro", max_artifact_bytes=MiB)
    cases = [
        ("PUT", "/cache/big", 2 * MiB, RW, 413, b"exceeds this route's limit"),
        ("PUT", "/cache/anon", 10, {}, 401, b"missing credentials"),
        ("PUT", "/cache/ro", 10, RO, 403, b"read-only"),
        ("PUT", "/v1/cache/abc123", 2 * MiB, RW, 413, b"limit"),  # Nx, text style
        ("PUT", "/v8/artifacts/abc?teamId=t", 2 * MiB, RW, 413, b'"error"'),  # Vercel style
        ("POST", "/api/cache/module/part?upload_id=u&part_number=1", 11 * MiB, RW, 413, b"limit"),
        ("POST", "/api/cache/module/part?upload_id=u&part_number=1", 10, {}, 401, b"credentials"),
        ("PUT", "/api/cache/gradle/k?tenant_id=t", 10, {}, 401, b"credentials"),
    ]
    for method, path, length, headers, want, needle in cases:
        status, h, body = _expect(node.url, method, path, length, headers)
        assert (status, needle in body) == (want, True), (path, status, body)
        assert h.get("connection") == "close", path
    _assert_nothing_left(node)
    # The refusals are counted like any other request.
    assert (
        node.metric('kura_http_requests_total{method="PUT",protocol="http_cache",status="413"}')
        == 1
    )


def test_disk_and_tmp_budgets_are_checked_before_100(
    start_node: Callable[..., NodeProcess],
) -> None:
    small_disk = start_node("disk", max_disk_bytes=MiB)
    status, _h, body = _expect(small_disk.url, "PUT", "/cache/x", 2 * MiB, {})
    assert status == 507, body
    # A peer's copy larger than the disk budget is refused on the internal listener too.
    status, _h, body = _expect(
        small_disk.internal_url,
        "PUT",
        "/_internal/replicate/artifact",
        2 * MiB,
        {"Kura-Manifest": replica_manifest("r", 2 * MiB)},
    )
    assert status == 413, body
    _assert_nothing_left(small_disk)

    small_tmp = start_node("tmp", tmp_dir_max_bytes=MiB)
    status, _h, body = _expect(small_tmp.url, "PUT", "/cache/x", 2 * MiB, {})
    assert status == 413
    assert b"tmp staging budget" in body
    _assert_nothing_left(small_tmp)


def test_a_full_tmp_budget_answers_503_with_retry_after_before_100(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(tmp_dir_max_bytes=4 * MiB, upload_grace_seconds=60)
    holder = rawhttp.connect(node.url, timeout=30)
    with holder:
        rawhttp.send_head(holder, "PUT", "/cache/holder", {"Content-Length": str(3 * MiB)})
        holder.sendall(b"h" * 1024)
        assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 3 * MiB)
        status, h, body = _expect(node.url, "PUT", "/cache/x", 2 * MiB, {})
        assert status == 503, body
        assert h.get("retry-after") == "1"
        assert b"temporary storage budget exhausted" in body
        assert node.metric("kura_tmp_reserved_bytes") == 3 * MiB  # the check reserved nothing
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert node.staging_files() == []


@pytest.mark.parametrize(
    ("method", "path", "want"),
    [
        ("PUT", "/cache/good", 201),
        ("PUT", "/v8/artifacts/good?teamId=t", 202),
        ("PUT", "/v1/cache/abcdef", 200),
    ],
)
def test_an_acceptable_upload_gets_100_then_its_success(
    start_node: Callable[..., NodeProcess], method: str, path: str, want: int
) -> None:
    node = start_node(read_write_tokens="rw")
    data = b"payload " * 1000
    sock = rawhttp.connect(node.url)
    with sock:
        rawhttp.send_head(
            sock,
            method,
            path,
            {"Content-Length": str(len(data)), "Expect": "100-continue", **RW},
        )
        status, _h, _b = rawhttp.read_response(sock)
        assert status == 100
        sock.sendall(data)
        status, _h, body = rawhttp.read_response(sock)
        assert status == want, body
    with node.client(headers=RW) as c:
        r = c.get(path)
    assert r.status_code == 200
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(data).digest()
    assert node.metric("kura_tmp_reserved_bytes") == 0


LIMIT = 64 * 1024
SCOPE = "tenant_id=acme&namespace_id=app"
HEX = "ab" * 32
UPLOAD_ROUTES = [
    ("PUT", "/cache/k", LIMIT),
    ("PUT", f"/cache/ac/{HEX}", LIMIT),
    ("PUT", f"/cache/cas/{HEX}", LIMIT),
    ("PUT", "/v1/cache/abc", LIMIT),
    ("PUT", "/api/metro/cache/k", LIMIT),
    ("PUT", "/v8/artifacts/abc?teamId=t", LIMIT),
    ("POST", f"/api/cache/cas/obj1?{SCOPE}", LIMIT),
    ("PUT", f"/api/cache/keyvalue?{SCOPE}", LIMIT),
    ("PUT", f"/api/cache/gradle/k?{SCOPE}", LIMIT),
    ("PUT", "/dav/a/b", LIMIT),
    ("POST", "/api/cache/module/part?upload_id={upload_id}&part_number=1", 10 * MiB),
]


def test_every_upload_route_declares_the_limit_its_handler_enforces(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The limit checked before 100 is the one the handler applies: one byte over it is 413
    with and without ``Expect``; exactly at it, the expectation is met with 100."""
    node = start_node(
        max_artifact_bytes=LIMIT,
        max_xcode_bytes=LIMIT,
        max_gradle_bytes=LIMIT,
        max_keyvalue_bytes=LIMIT,
    )
    with node.client() as c:
        r = c.post(f"/api/cache/module/start?{SCOPE}&hash=h&name=M")
        upload_id = r.json()["upload_id"]
    for method, template, limit in UPLOAD_ROUTES:
        path = template.format(upload_id=upload_id)
        assert _expect(node.url, method, path, limit + 1, {})[0] == 413, path
        with rawhttp.connect(node.url) as sock:
            rawhttp.send_head(sock, method, path, {"Content-Length": str(limit + 1)})
            assert rawhttp.read_response(sock)[0] == 413, path
        assert _expect(node.url, method, path, limit, {})[0] == 100, path
    assert node.metric("kura_tmp_reserved_bytes") == 0
    assert node.index_rows() == 0


def test_the_internal_listener_checks_peer_credentials_before_100(
    start_node: Callable[..., NodeProcess],
) -> None:
    # aiohttp runs the expect handler before any middleware, so the peer-token middleware alone
    # would let 100 Continue out to a peer it then refuses.
    node = start_node(internal_tokens="peer-secret")
    manifest = {"Kura-Manifest": replica_manifest("r", 10)}
    for auth, needle in (({}, b"missing peer credentials"), (PEER_WRONG, b"invalid peer token")):
        status, h, body = _expect(
            node.internal_url, "PUT", "/_internal/replicate/artifact", 10, {**manifest, **auth}
        )
        assert (status, needle in body, h.get("connection")) == (401, True, "close"), body
    status, _h, body = _expect(
        node.internal_url,
        "PUT",
        "/_internal/replicate/artifact",
        10,
        {**manifest, "Authorization": "Bearer peer-secret"},
    )
    assert status == 100, body
    # The accepted peer then hung up without its body: once the handler has finished (it counts
    # the request), its staging file is gone with it.
    assert wait_for(
        lambda: any(
            k.startswith("kura_http_requests_total{") and 'protocol="internal"' in k
            for k in node.metrics()
        ),
        10,
    )
    _assert_nothing_left(node)
    assert node.metric('kura_internal_auth_failures_total{reason="missing"}') == 1
    assert node.metric('kura_internal_auth_failures_total{reason="invalid"}') == 1


def test_the_internal_listener_checks_the_wire_version_before_100(
    start_node: Callable[..., NodeProcess],
) -> None:
    """After the peer's credentials, its wire version (kura.api.internal): a wire this node does
    not speak gets the final 503 naming both versions, never ``100`` first."""
    node = start_node(internal_tokens="peer-secret")
    peer = {"Kura-Manifest": replica_manifest("w", 10), "Authorization": "Bearer peer-secret"}
    status, h, body = _expect(
        node.internal_url,
        "PUT",
        "/_internal/replicate/artifact",
        10,
        {**peer, "Kura-Wire-Version": "3", "Kura-Version": "0.3.0"},
    )
    assert (status, h.get("kura-refusal"), h.get("connection")) == (503, "wire_version", "close")
    assert b"kura 0.3.0 (wire 3)" in body
    # Credentials still come first: a wrong token is a 401 whatever the version.
    status, _h, body = _expect(
        node.internal_url,
        "PUT",
        "/_internal/replicate/artifact",
        10,
        {**peer, **PEER_WRONG, "Kura-Wire-Version": "3"},
    )
    assert status == 401, body
    # No version at all is kura 0.1.0's wire: 100.
    assert _expect(node.internal_url, "PUT", "/_internal/replicate/artifact", 10, peer)[0] == 100
    assert node.index_rows() == 0


def test_clients_that_leave_before_sending_the_body_are_not_errors(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A client that sends ``Expect: 100-continue`` and goes away (a cancelled curl upload) is
    no error on any listener: on main, 400 of them logged 400 tracebacks at ERROR (writing the
    ``100`` to a closing transport) that filled ``recent_errors``, and each one a worker relayed
    logged a WARNING blaming the primary ("could not forward ... Can not write request body")."""
    node = start_node(workers=2)
    path = "/cache/cas/" + "ab" * 32
    for i in range(400):
        sock = rawhttp.connect(node.url)
        rawhttp.send_head(
            sock, "PUT", path, {"Content-Length": "9", "Expect": "100-continue", **RW}
        )
        if i % 2:  # a moment later: the upload is then on its way to the primary
            time.sleep(0.005)
        sock.close()
    assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 0)
    assert node.staging_files() == []
    assert node.index_rows() == 0
    assert recent_errors(node) == []
    log = node.log()
    assert "Traceback" not in log
    assert " ERROR " not in log, log[-3000:]
    assert " WARNING " not in log, log[-3000:]
    assert len(log.splitlines()) < 60, log[-3000:]
