"""JWT bearer tokens against real kura nodes, in this process (kura.api.jwt_auth, kura.api.auth).

A node with ``KURA_AUTH_JWT_PUBLIC_KEY`` (a PEM file), issuer and audience, plus one plain
read-write token: a ``cache:read`` token reads and is refused a write (403, nothing stored); a
``cache:write`` token writes and cleans; ``cache:write:cas`` stores CAS blobs only and
``cache:clean`` only cleans (issue 29); a token limited to namespace A is refused namespace B
(Kura routes and Turborepo teams alike); expired, wrong-audience, wrong-issuer, wrong-key, ``alg: none`` and
HS256-with-the-public-key tokens are 401; plain tokens keep working next to JWTs. ``/status``
needs a read token once access control is on; ``/up`` and ``/ready`` never do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.inprocess import start_in_process
from tests.integration import jwt_keys
from tests.integration.jwt_keys import AUDIENCE, ISSUER, rsa_key, token
from tests.reapi import action_result

pytestmark = pytest.mark.in_process

PLAIN = "plain-rw-token"
KEY = rsa_key()
GRADLE = "/api/cache/gradle/{key}?tenant_id=acme&namespace_id={ns}"
TURBO = "/v8/artifacts/{key}?slug={team}"


def jwt_settings(public_key: str | Path) -> dict[str, object]:
    return {
        "auth_jwt_public_key": public_key,
        "auth_jwt_issuer": ISSUER,
        "auth_jwt_audience": AUDIENCE,
    }


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    directory = tmp_path_factory.mktemp("jwt")
    key_file = jwt_keys.write_public_key(KEY, directory / "signer.pem")
    env = node_env(directory, read_write_tokens=PLAIN, **jwt_settings(key_file))
    node = start_in_process(directory, env)
    yield node
    assert node.stop() == 0, node.log()[-3000:]


def bearer(value: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {value}"}


def stored(node: NodeProcess) -> tuple[int, int]:
    return node.index_rows(), len(node.blob_files())


def test_a_read_token_reads_and_is_refused_a_write(node: NodeProcess) -> None:
    writer, reader = token(KEY, scope="cache:write"), token(KEY, scope="cache:read")
    path = GRADLE.format(key="r1", ns="app")
    with node.client(headers=bearer(writer)) as c:
        assert c.put(path, content=b"by-jwt").status_code == 201
    before = stored(node)
    with node.client(headers=bearer(reader)) as c:
        assert c.get(path).content == b"by-jwt"
        r = c.put(GRADLE.format(key="r2", ns="app"), content=b"refused")
        assert r.status_code == 403, r.text
        assert "write" in r.json()["message"]
        r = c.put("/v1/cache/77", content=b"refused")  # Nx: 403 is "read-only, skip"
        assert r.status_code == 403
    assert stored(node) == before
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0
    assert node.metric('kura_auth_refusals_total{reason="forbidden"}') >= 2
    assert node.metric("kura_auth_jwks_keys") == 1


def test_each_scope_grants_its_rights(node: NodeProcess) -> None:
    """``cache:write:cas`` stores a CAS blob and nothing else, ``cache:clean`` cleans and reads
    nothing, ``cache:write`` still cleans (issue 29: its meaning before rights); each refusal
    names the right missing and the scopes that grant it, and stores or deletes nothing."""
    blob = b"verified by its digest" * 1000
    cas = f"/cache/cas/{hashlib.sha256(blob).hexdigest()}"
    kept = "/ns/jwt-doomed/cache/kept"
    with node.client(headers=bearer(token(KEY, scope="cache:write:cas"))) as c:
        assert c.put(cas, content=blob).status_code == 200
        assert c.get(cas).content == blob  # cache:write:cas reads too
        before = stored(node)
        for method, path, data, right, scopes in (
            ("PUT", f"/cache/ac/{'a' * 64}", action_result({"o": blob}), "write", "cache:write)"),
            ("PUT", "/cache/plain/by-cas-writer", blob, "write", "cache:write)"),
            ("DELETE", "/ns/jwt-doomed/cache", b"", "clean", "cache:write or cache:clean)"),
        ):
            r = c.request(method, path, content=data)
            assert r.status_code == 403, (path, r.text)
            message = r.json()["message"]
            assert f"lacks the right '{right}' (JWT scope " in message
            assert message.endswith(scopes)
    assert stored(node) == before
    assert node.staging_files() == []
    for scope in ("cache:clean", "cache:write"):
        with node.client(headers=bearer(token(KEY))) as c:
            assert c.put(kept, content=b"kept").status_code in (200, 201)
        with node.client(headers=bearer(token(KEY, scope=scope))) as c:
            if scope == "cache:clean":
                r = c.get(kept)
                assert r.status_code == 403
                assert "lacks the right 'read'" in r.text
                assert c.put(kept, content=b"again").status_code == 403
            assert c.delete("/ns/jwt-doomed/cache").status_code == 204, scope
            assert c.get(kept).status_code in (403, 404)
        with node.client(headers=bearer(token(KEY))) as c:
            assert c.get(kept).status_code == 404, scope  # cleaned


def test_a_namespace_token_is_refused_another_namespace(node: NodeProcess) -> None:
    only_a = token(KEY, scope="cache:write", namespaces=["team-a"])
    with node.client(headers=bearer(token(KEY))) as c:  # unlimited: seeds namespace B
        assert c.put(GRADLE.format(key="n1", ns="team-b"), content=b"b").status_code == 201
        assert c.put(TURBO.format(key="abc1", team="team-b"), content=b"b").status_code == 202
    before = stored(node)
    with node.client(headers=bearer(only_a)) as c:
        assert c.put(GRADLE.format(key="n1", ns="team-a"), content=b"a").status_code == 201
        assert c.get(GRADLE.format(key="n1", ns="team-a")).content == b"a"
        assert c.put(TURBO.format(key="abc1", team="team-a"), content=b"a").status_code == 202
        after_a = stored(node)
        for method, path in (
            ("GET", GRADLE.format(key="n1", ns="team-b")),
            ("PUT", GRADLE.format(key="n2", ns="team-b")),
            ("GET", TURBO.format(key="abc1", team="team-b")),
            ("PUT", TURBO.format(key="abc2", team="team-b")),
            ("GET", "/api/cache/gradle/n1?tenant_id=acme"),  # tenant scope is not team-a
            ("GET", "/v1/cache/1"),  # Nx's fixed namespace "nx"
            ("DELETE", "/api/cache/clean?tenant_id=acme&namespace_id=team-b"),
        ):
            r = c.request(method, path, content=b"x" if method == "PUT" else b"")
            assert r.status_code == 403, (method, path, r.text)
            assert "team-b" in r.text or "namespace" in r.text
        assert c.get("/v8/artifacts/status?slug=team-a").status_code == 200
    assert after_a[0] == before[0] + 2
    assert stored(node) == after_a
    with node.client(headers=bearer(token(KEY))) as c:
        assert c.get(GRADLE.format(key="n1", ns="team-b")).content == b"b"  # not cleaned


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("expired", lambda: token(KEY, ttl=-3600)),
        ("wrong audience", lambda: token(KEY, aud="someone-else")),
        ("wrong issuer", lambda: token(KEY, iss="https://evil.test")),
        ("no expiry", lambda: token(KEY, exp=None)),
        ("wrong key", lambda: token(rsa_key())),
        ("wrong key type", lambda: token(ec.generate_private_key(ec.SECP256R1()), alg="ES256")),
        ("alg none", jwt_keys.unsigned_token),
        ("HS256 keyed with the public key", lambda: jwt_keys.hs256_with_public_key(KEY)),
        ("tampered claims", lambda: _tampered(token(KEY, scope="cache:read"))),
        ("not a token", lambda: "eyJhbGciOiJSUzI1NiJ9.e30.c2ln"),
    ],
)
def test_a_token_not_to_be_believed_is_401(
    node: NodeProcess, name: str, make: Callable[[], str]
) -> None:
    before = stored(node)
    value = make()
    with node.client(headers=bearer(value)) as c:
        r = c.get(GRADLE.format(key="r1", ns="app"))
        assert r.status_code == 401, (name, r.text)
        assert r.json()["message"].startswith("invalid token"), (name, r.text)
        r = c.put(GRADLE.format(key="forged", ns="app"), content=b"forged")
        assert r.status_code == 401, (name, r.text)
        assert c.get("/status").status_code == 401
    assert stored(node) == before
    assert node.metric('kura_auth_refusals_total{reason="invalid"}') >= 3


def _tampered(value: str) -> str:
    """The same signature over claims that now grant a write."""
    header, _payload, signature = value.split(".")
    forged = jwt_keys._b64(
        jwt_keys.json.dumps(jwt_keys.claims(scope="cache:read cache:write")).encode()
    )
    return f"{header}.{forged}.{signature}"


def test_a_valid_token_without_a_cache_scope_is_403(node: NodeProcess) -> None:
    with node.client(headers=bearer(token(KEY, scope="openid profile"))) as c:
        r = c.get(GRADLE.format(key="r1", ns="app"))
        assert r.status_code == 403
        assert "cache:read" in r.json()["message"]


def test_plain_tokens_work_next_to_jwts(node: NodeProcess) -> None:
    with node.client(headers=bearer(PLAIN)) as c:
        assert c.put("/cache/plain/next-to-jwt", content=b"p").status_code == 201
        assert c.get("/cache/plain/next-to-jwt").content == b"p"
    with node.client(headers=bearer("not-listed")) as c:
        assert c.get("/cache/plain/next-to-jwt").status_code == 401


def test_status_needs_a_read_token_and_probes_stay_open(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.get("/status")
        assert r.status_code == 401
        assert node.internal_url not in r.text
        assert c.get("/up").status_code == 200
        assert c.get("/ready").status_code == 200
        assert c.get("/metrics").status_code == 200  # KURA_METRICS_REQUIRE_TOKEN is off
    for credential in (PLAIN, token(KEY, scope="cache:read", namespaces=["x"])):
        with node.client(headers=bearer(credential)) as c:
            r = c.get("/status")
            assert r.status_code == 200, r.text
            assert "ready" in r.json()


@pytest.mark.parametrize("kind", ["ed25519", "p256"])
def test_eddsa_and_es256_keys_verify_their_own_tokens_only(
    start_node: Callable[..., NodeProcess], tmp_path: Path, kind: str
) -> None:
    if kind == "ed25519":
        key: jwt_keys.PrivateKey = ed25519.Ed25519PrivateKey.generate()
        alg = "EdDSA"
    else:
        key, alg = ec.generate_private_key(ec.SECP256R1()), "ES256"
    pem = jwt_keys.public_pem(key)  # given as PEM text this time, not a path
    node = start_node(**jwt_settings(pem))
    with node.client(headers=bearer(token(key, alg=alg))) as c:
        assert c.put("/cache/plain/k", content=b"v").status_code == 201
    with node.client(headers=bearer(token(KEY))) as c:  # RS256 from another signer
        assert c.get("/cache/plain/k").status_code == 401


def test_metrics_can_require_a_token(start_node: Callable[..., NodeProcess]) -> None:
    node = start_node(read_only_tokens="scraper", metrics_require_token="true")
    assert oneshot.get(node.url + "/metrics", timeout=10).status_code == 401
    r = oneshot.get(node.url + "/metrics", headers=bearer("scraper"), timeout=10)
    assert r.status_code == 200
    assert "kura_http_requests_total" in r.text
    assert oneshot.get(node.url + "/ready", timeout=10).status_code == 200
    assert oneshot.get(node.url + "/up", timeout=10).status_code == 200


def test_jwt_settings_without_issuer_or_audience_refuse_to_start(tmp_path: Path) -> None:
    env = node_env(tmp_path, auth_jwt_public_key=jwt_keys.public_pem(KEY))
    with pytest.raises(RuntimeError, match="KURA_AUTH_JWT_ISSUER and KURA_AUTH_JWT_AUDIENCE"):
        spawn_node(tmp_path, env)


@pytest.mark.clients
@pytest.mark.parametrize(
    ("name", "namespaces"),
    [("nx", None), ("turbo", ["team1"])],  # turbo.sh sends --team team1 (?slug=team1)
)
def test_real_nx_and_turborepo_get_a_remote_hit_with_a_jwt(
    node: NodeProcess, name: str, namespaces: list[str] | None
) -> None:
    from tests.integration.test_clients import BY_NAME, lookups, run_client

    client = BY_NAME[name]
    hits_before = lookups(node, client.protocol, "hit")
    run = run_client(client, node, token=token(KEY, ttl=3600, namespaces=namespaces))
    context = f"{run.describe()}\n--- node log ---\n{node.log()[-3000:]}"
    assert run.returncode == 0, context
    assert run.hit, context
    assert lookups(node, client.protocol, "hit") >= hits_before + client.min_hits, context
    assert "Traceback" not in node.log(), context


class JwksServer:
    """The issuer's JWKS endpoint: a real HTTP server (stdlib) in this process, whose key set
    the test changes, or which it stops, to rotate keys or fail fetches."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.keys: list[dict[str, object]] = []
        self.fetches = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.fetches += 1
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def publish(self, key: jwt_keys.PrivateKey, kid: str, alg: str = "RS256") -> None:
        import jwt

        jwk = json_loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))  # type: ignore[arg-type]
        self.keys.append({**jwk, "kid": kid, "alg": alg, "use": "sig"})

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def json_loads(text: str) -> dict[str, object]:
    import json

    doc = json.loads(text)
    assert isinstance(doc, dict)
    return doc


def test_jwks_keys_verify_by_kid_and_a_rotation_is_picked_up(
    start_node: Callable[..., NodeProcess],
) -> None:
    from tests.e2e.mesh import wait_for

    jwks = JwksServer()
    first, second = rsa_key(), rsa_key()
    jwks.publish(first, "k1")
    try:
        node = start_node(
            auth_jwt_jwks_url=jwks.url,
            auth_jwt_issuer=ISSUER,
            auth_jwt_audience=AUDIENCE,
            auth_jwt_jwks_refresh_seconds=1,
        )
        by_first = token(first, headers={"kid": "k1"})
        by_second = token(second, headers={"kid": "k2"})
        with node.client(headers=bearer(by_first)) as c:
            assert c.put("/cache/plain/jwks", content=b"v").status_code == 201  # fetched at start
        with node.client(headers=bearer(by_second)) as c:
            r = c.get("/cache/plain/jwks")
            assert r.status_code == 401
            assert "kid" in r.json()["message"]
        with node.client(headers=bearer(token(second, headers={"kid": "k1"}))) as c:
            assert c.get("/cache/plain/jwks").status_code == 401  # k1's kid, another key

        jwks.publish(second, "k2")  # the signer rotates: both keys published
        assert wait_for(
            lambda: (
                oneshot.get(node.url + "/cache/plain/jwks", headers=bearer(by_second)).status_code
                == 200
            ),
            20,
        ), node.log()[-2000:]

        jwks.stop()  # the issuer is down: the last good set stays
        assert wait_for(lambda: "cannot fetch the JWKS" in node.log(), 20), node.log()[-2000:]
        for value in (by_first, by_second):
            assert (
                oneshot.get(node.url + "/cache/plain/jwks", headers=bearer(value)).status_code
                == 200
            )
    finally:
        if jwks.thread.is_alive():
            jwks.stop()


@pytest.mark.parametrize(
    ("grant", "path", "status"),
    [
        ({"scope": "cache:read"}, "/cache/plain/big", 403),
        (
            {"scope": "cache:write", "namespaces": ["team-a"]},
            TURBO.format(key="big", team="b"),
            403,
        ),
        ({"ttl": -3600}, "/cache/plain/big", 401),
    ],
)
def test_a_refused_jwt_upload_is_answered_before_its_body_is_sent(
    node: NodeProcess, grant: dict[str, object], path: str, status: int
) -> None:
    from tests.integration import rawhttp

    headers = {
        "Content-Length": str(256 * 1024 * 1024),
        "Expect": "100-continue",
        **bearer(token(KEY, **grant)),  # type: ignore[arg-type]
    }
    with rawhttp.connect(node.url, timeout=10) as sock:
        rawhttp.send_head(sock, "PUT", path, headers)
        answer, _headers, _body = rawhttp.read_response(sock)
    assert answer == status
    assert node.metric("kura_tmp_reserved_bytes") == 0
    assert node.staging_files() == []


@pytest.mark.parametrize(
    "value", ["-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n", "private"]
)
def test_an_unusable_public_key_refuses_to_start_naming_the_setting(
    tmp_path: Path, value: str
) -> None:
    if value == "private":  # a private key where the public one belongs
        from cryptography.hazmat.primitives import serialization

        path = tmp_path / "private.pem"
        path.write_bytes(
            KEY.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        value = str(path)
    env = node_env(tmp_path, **jwt_settings(value))
    with pytest.raises(RuntimeError, match="KURA_AUTH_JWT_PUBLIC_KEY: not a usable public key"):
        spawn_node(tmp_path, env)


@pytest.mark.clients
def test_real_turborepo_with_a_token_for_another_team_gets_no_hit_and_stores_nothing(
    node: NodeProcess,
) -> None:
    from tests.integration.test_clients import BY_NAME, requests_with_status, run_client

    before = stored(node)
    refused = requests_with_status(node, "turbo", 403)
    run = run_client(BY_NAME["turbo"], node, token=token(KEY, namespaces=["someone-else"]))
    context = f"{run.describe()}\n--- node log ---\n{node.log()[-3000:]}"
    assert run.returncode == 1, context  # the script ran both builds: no hit (2 = setup error)
    assert not run.hit, context
    assert stored(node) == before, context
    assert requests_with_status(node, "turbo", 403) > refused, context
    assert "Traceback" not in node.log(), context


def test_a_namespace_token_reaches_its_namespace_on_the_path_routes_only(
    node: NodeProcess,
) -> None:
    """The Bazel/HTTP-cache and WebDAV routes take their namespace from ``/ns/<namespace>``."""
    only_a = token(KEY, scope="cache:write", namespaces=["team-a"])
    with node.client(headers=bearer(token(KEY))) as c:  # unlimited: seeds namespace B and ""
        assert c.put("/ns/team-b/cache/ab/b1", content=b"b").status_code == 201
        assert c.put("/cache/ab/b1", content=b"tenant").status_code in (200, 201)
    with node.client(headers=bearer(only_a)) as c:
        assert c.put("/ns/team-a/cache/ab/a1", content=b"a").status_code == 201
        assert c.get("/ns/team-a/cache/ab/a1").content == b"a"
        assert c.put("/ns/team-a/dav/x/a1", content=b"a").status_code == 201
        before = stored(node)
        for method, path in (
            ("GET", "/ns/team-b/cache/ab/b1"),
            ("PUT", "/ns/team-b/cache/ab/b2"),
            ("GET", "/cache/ab/b1"),  # namespace "" is not team-a
            ("PUT", "/ns/team-b/dav/x/b2"),
            ("DELETE", "/ns/team-b/cache"),
            ("DELETE", "/cache"),
        ):
            r = c.request(method, path, content=b"x" if method == "PUT" else b"")
            assert r.status_code == 403, (method, path, r.text)
        assert stored(node) == before
        assert c.delete("/ns/team-a/cache").status_code == 204  # its own namespace: cleaned
        assert c.get("/ns/team-a/cache/ab/a1").status_code == 404
        assert c.get("/ns/team-a/dav/x/a1").status_code == 404
    with node.client(headers=bearer(token(KEY))) as c:
        assert c.get("/ns/team-b/cache/ab/b1").content == b"b"
        assert c.get("/cache/ab/b1").content == b"tenant"


def test_a_namespace_token_cannot_add_parts_to_or_complete_another_namespaces_upload(
    node: NodeProcess,
) -> None:
    """The upload's own namespace is checked, not the one the part's query names."""
    module = "/api/cache/module/{step}?tenant_id=acme&namespace_id={ns}&hash=h1&name=M"
    only_a, only_b = (
        token(KEY, scope="cache:write", namespaces=[team]) for team in ("team-a", "team-b")
    )
    with node.client(headers=bearer(only_a)) as a:
        upload_id = a.post(module.format(step="start", ns="team-a")).json()["upload_id"]
        part = f"/api/cache/module/part?upload_id={upload_id}&part_number="
        assert (
            a.post(part + "1&tenant_id=acme&namespace_id=team-a", content=b"a").status_code == 204
        )
    before = (stored(node), node.metric("kura_tmp_reserved_bytes"))
    with node.client(headers=bearer(only_b)) as b:
        for query in ("&tenant_id=acme&namespace_id=team-b", ""):
            r = b.post(part + "2" + query, content=b"by-b")
            assert r.status_code == 403, r.text
            assert "team-a" in r.json()["message"]
            r = b.post(
                f"/api/cache/module/complete?upload_id={upload_id}{query}", json={"parts": [1]}
            )
            assert r.status_code == 403, r.text
    assert (stored(node), node.metric("kura_tmp_reserved_bytes")) == before
    with node.client(headers=bearer(only_a)) as a:
        # The upload is untouched: its owner completes it with its one part.
        done = a.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1]})
        assert done.status_code == 204, done.text
        assert a.get(module.format(step="x", ns="team-a")).content == b"a"
