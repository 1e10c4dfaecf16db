"""Access control over real HTTP (kura.api.auth; README "Access control"; clients.md).

No tokens configured: open. With tokens: no credentials or an unknown token → 401 (Nx's route
answers ``text/plain``, the only 401 Nx reads as "Unauthorized"); a read-only token that writes
→ 403 and nothing is stored; reads with either kind of token → 200. Tokens work as Bearer or as
the password of HTTP Basic auth (Gradle, sccache). Probes never need a token.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator

import pytest

from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.integration import rawhttp
from tests.reapi import action_result

pytestmark = pytest.mark.in_process

RW, RO = "rw-token-1", "ro-token-1"
SCOPE = "tenant_id=acme&namespace_id=app"
DIGEST = hashlib.sha256(b"payload").hexdigest()
# An ActionResult whose one output is the CAS blob below (``/cache/ac`` bodies must parse).
AC_BODY = action_result({"out": b"payload"})

# (method, path, body) for a write on every protocol; the body is valid for its route.
WRITES = [
    ("DELETE", f"/api/cache/clean?{SCOPE}", b""),  # first: it would delete what follows
    ("PUT", "/v1/cache/1001", b"payload"),
    ("PUT", "/api/metro/cache/m1", b"payload"),
    ("PUT", "/v8/artifacts/t1?slug=team", b"payload"),
    ("POST", f"/api/cache/cas/c1?{SCOPE}", b"payload"),
    ("PUT", f"/api/cache/keyvalue?{SCOPE}", b'{"cas_id": "k1", "entries": [{"value": "v"}]}'),
    ("PUT", f"/api/cache/gradle/g1?{SCOPE}", b"payload"),
    ("POST", f"/api/cache/module/start?{SCOPE}&hash=h&name=n", b""),
    ("PUT", f"/cache/ac/{DIGEST}", AC_BODY),
    ("PUT", f"/cache/cas/{DIGEST}", b"payload"),
    ("PUT", "/cache/plain/key", b"payload"),
    ("PUT", "/dav/a/b/obj", b"payload"),
    ("MKCOL", "/dav/a", b""),
]
# Reads of what WRITES stored (with a read-write token).
READS = [
    "/v1/cache/1001",
    "/api/metro/cache/m1",
    "/v8/artifacts/t1?slug=team",
    f"/api/cache/cas/c1?{SCOPE}",
    f"/api/cache/keyvalue/k1?{SCOPE}",
    f"/api/cache/gradle/g1?{SCOPE}",
    f"/cache/ac/{DIGEST}",
    f"/cache/cas/{DIGEST}",
    "/cache/plain/key",
    "/dav/a/b/obj",
]
STORING_WRITES = [w for w in WRITES if w[0] in ("PUT", "POST") and "module/start" not in w[1]]


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


TOKENS = {"read_write_tokens": f"{RW},rw-token-2", "read_only_tokens": RO}


@pytest.fixture
def guarded(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    return start_node(**TOKENS)


@pytest.fixture(scope="module")
def shared_guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One guarded node for the many refusal cases: a refused request changes nothing, and each
    test compares against the state it found."""
    directory = tmp_path_factory.mktemp("guarded")
    node = spawn_node(directory, node_env(directory, **TOKENS))
    yield node
    assert node.stop() == 0, node.log()[-3000:]


def _stored(node: NodeProcess) -> tuple[int, int]:
    return node.index_rows(), len(node.blob_files())


def test_without_tokens_the_node_is_open(node: NodeProcess) -> None:
    with node.client() as c:
        for method, path, body in WRITES:
            r = c.request(method, path, content=body)
            assert r.status_code < 300, (method, path, r.status_code, r.text)
        for path in READS:
            assert c.get(path).status_code == 200, path


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_a_write_without_credentials_is_401_and_stores_nothing(
    shared_guarded: NodeProcess, method: str, path: str, body: bytes
) -> None:
    before = _stored(shared_guarded)
    with shared_guarded.client() as c:
        r = c.request(method, path, content=body)
    assert r.status_code == 401, r.text
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert _stored(shared_guarded) == before
    assert shared_guarded.staging_files() == []


@pytest.mark.parametrize("path", READS)
def test_a_read_without_credentials_is_401(shared_guarded: NodeProcess, path: str) -> None:
    with shared_guarded.client() as c:
        assert c.get(path).status_code == 401


def test_nx_gets_its_401_in_plain_text(shared_guarded: NodeProcess) -> None:
    with shared_guarded.client() as c:
        for r in (c.get("/v1/cache/1"), c.put("/v1/cache/1", content=b"x")):
            assert r.status_code == 401
            assert r.headers["Content-Type"].split(";")[0] == "text/plain"
            assert "credentials" in r.text
        r = c.get("/cache/plain/key")  # everyone else gets JSON
        assert r.status_code == 401
        assert "credentials" in r.json()["message"]


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong-token",
        "Bearer " + RW + "x",
        "Bearer",
        "Token " + RW,
        basic("kura", "wrong"),
        basic(RW, ""),  # the token as user name is not the password
        "Basic !!!not-base64",
        RW,
    ],
)
def test_unknown_or_malformed_credentials_are_401(
    shared_guarded: NodeProcess, authorization: str
) -> None:
    before = _stored(shared_guarded)
    with shared_guarded.client() as c:
        r = c.put("/cache/plain/key", content=b"x", headers={"Authorization": authorization})
        assert r.status_code == 401
        r = c.get("/v1/cache/1", headers={"Authorization": authorization})
        assert r.status_code == 401
        assert r.headers["Content-Type"].split(";")[0] == "text/plain"
    assert _stored(shared_guarded) == before


@pytest.mark.parametrize(("method", "path", "body"), WRITES)
def test_a_read_only_token_that_writes_gets_403_and_stores_nothing(
    shared_guarded: NodeProcess, method: str, path: str, body: bytes
) -> None:
    before = _stored(shared_guarded)
    with shared_guarded.client(headers={"Authorization": f"Bearer {RO}"}) as c:
        r = c.request(method, path, content=body)
    assert r.status_code == 403, r.text
    assert "read-only" in r.text
    assert _stored(shared_guarded) == before
    assert shared_guarded.staging_files() == []
    assert shared_guarded.metric("kura_tmp_reserved_bytes") == 0


def test_a_read_only_token_cannot_clean_a_namespace(guarded: NodeProcess) -> None:
    with guarded.client(headers={"Authorization": f"Bearer {RW}"}) as c:
        assert c.put(f"/api/cache/gradle/g1?{SCOPE}", content=b"keep").status_code == 201
    with guarded.client(headers={"Authorization": f"Bearer {RO}"}) as c:
        assert c.delete(f"/api/cache/clean?{SCOPE}").status_code == 403
        assert c.get(f"/api/cache/gradle/g1?{SCOPE}").content == b"keep"


def test_read_write_tokens_write_and_both_kinds_read(guarded: NodeProcess) -> None:
    with guarded.client(headers={"Authorization": f"Bearer {RW}"}) as c:
        for method, path, body in WRITES:
            r = c.request(method, path, content=body)
            assert r.status_code < 300, (method, path, r.status_code, r.text)
    for token in (RW, "rw-token-2", RO):
        with guarded.client(headers={"Authorization": f"Bearer {token}"}) as c:
            for path in READS:
                assert c.get(path).status_code == 200, (token, path)
            assert c.get("/cache/plain/absent").status_code == 404  # a miss, not 401/403
    assert guarded.index_rows() == len(STORING_WRITES)


def test_a_large_write_without_credentials_is_refused_before_its_body_is_read(
    shared_guarded: NodeProcess,
) -> None:
    sock = rawhttp.connect(shared_guarded.url, timeout=5)
    with sock:
        rawhttp.send_head(sock, "PUT", "/cache/big", {"Content-Length": str(512 * 1024 * 1024)})
        status, _h, _b = rawhttp.read_response(sock)
    assert status == 401
    assert shared_guarded.metric("kura_tmp_reserved_bytes") == 0


def test_basic_auth_with_the_token_as_password_works_for_any_user(guarded: NodeProcess) -> None:
    with guarded.client(headers={"Authorization": basic("gradle", RW)}) as c:
        assert c.put("/cache/0123abcd", content=b"gradle").status_code == 201
        assert c.get("/cache/0123abcd").content == b"gradle"
    with guarded.client(auth=("sccache", RW)) as c:  # httpx's own Basic encoding
        assert c.put("/dav/x/y", content=b"dav").status_code == 201
    with guarded.client(auth=("anyone", RO)) as c:
        assert c.get("/dav/x/y").content == b"dav"
        assert c.put("/dav/x/z", content=b"no").status_code == 403


def test_probes_and_metrics_need_no_token(shared_guarded: NodeProcess) -> None:
    for path in ("/up", "/ready", "/metrics"):
        assert oneshot.get(shared_guarded.url + path, timeout=10).status_code == 200, path
    with shared_guarded.client() as c:
        assert c.options("/dav/x").status_code == 200


def test_turbo_status_needs_a_token_like_every_artifact_route(shared_guarded: NodeProcess) -> None:
    # turbo only warns on a 401 and builds locally (clients.md); the status call is where it
    # learns the token is wrong.
    with shared_guarded.client() as c:
        assert c.get("/v8/artifacts/status?slug=team").status_code == 401
        ok = c.get("/v8/artifacts/status?slug=team", headers={"Authorization": f"Bearer {RO}"})
        assert (ok.status_code, ok.json()) == (200, {"status": "enabled"})
