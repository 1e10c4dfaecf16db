"""The rights matrix against one real node, in this process (issue 29 item 1, kura.core.rights).

Every HTTP write and clean route and every write RPC, plus one read per protocol, each asked by
a credential of each kind: read-only (``KURA_READ_ONLY_TOKENS``), ``write:cas`` only,
``write`` only (no read, no clean), ``clean`` only (the last three from ``KURA_TOKENS_FILE``)
and read-write (``KURA_READ_WRITE_TOKENS``: read, write, clean). A credential holding the
route's right gets its ordinary answer; one without it gets 403 / PERMISSION_DENIED naming the
right, counted once in ``kura_auth_refusals_total{reason="forbidden"}``, and the node holds
nothing new: no index row, no blob file, no staged file, no tmp reservation, and the
namespace a refused clean named still holds its entry; an allowed write adds an index row.
And the core of ``write:cas``: bytes that do not match their digest, by every CAS upload path,
are refused and store nothing.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import zstandard

from kura.app import Node
from kura.core.rights import Access
from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2 as ra
from kura.protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as reapi
from kura.protos.google.bytestream import bytestream_pb2 as bs
from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess, node_env
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import Reapi, blob_name, digest, new_upload, write_requests
from tests.grpc_api.test_asset_origin import Origin
from tests.inprocess import InProcessNode, start_in_process
from tests.integration import jwt_keys
from tests.reapi import action_result

pytestmark = pytest.mark.in_process

R, WC, W, C = Access.READ, Access.WRITE_CAS, Access.WRITE, Access.CLEAN
# Each kind of credential: its token and the rights issue 29 gives it.
CREDENTIALS = {
    "read-only": ("tok-ro", {R}),
    "write:cas": ("tok-cas-abcdefghijk", {WC}),  # KURA_TOKENS_FILE: 16 characters at least
    "write": ("tok-w-abcdefghijklm", {W, WC}),  # write implies write:cas
    "clean": ("tok-clean-abcdefghi", {C}),
    "read-write": ("tok-rw", {R, WC, W, C}),
}
# An overlay credential with every right (kura.core.overlay): it writes "ovl" and reads it,
# then the namespaces the routes below store in ("team", "app") and clean ("doomed").
OVERLAY_TOKEN = "tok-overlay-abcdefgh"
WRITES, FOREIGN = "ovl", "other"
# The refusal-log test's named token.
LOGGED_TOKEN = "tok-logged-abcdefghij"
JWT_KEY = jwt_keys.rsa_key()
TOKENS_FILE = "".join(
    f"{token} {fields}\n"
    for token, fields in (
        (CREDENTIALS["write:cas"][0], "name=cas rights=write:cas"),
        (CREDENTIALS["write"][0], "name=w rights=write"),
        (CREDENTIALS["clean"][0], "rights=clean"),
        (OVERLAY_TOKEN, f"name=pr rights=read,write,clean read={WRITES},team,app,doomed write=ovl"),
    )
)
# A read-write token file line with a name (issue 29 item 4: a token file may name its tokens).
FILE_TOKEN = "tok-file-abcdefghij"
SEED = "seed"  # the key suffix of what the fixture stores for the reads


def key(kind: str) -> str:
    """The key suffix of what ``kind``'s credential writes (letters only: every alphabet)."""
    return CREDENTIALS[kind][0].replace("-", "")


SCOPE = "tenant_id=acme&namespace_id=app"
DOOMED = "/ns/doomed/cache/kept"  # an entry of the namespace the clean routes name


def body(k: str) -> bytes:
    """Over KURA_INLINE_MAX_BYTES: an upload that got through would leave a blob file."""
    return f"payload-{k}-".encode() + b"x" * 20_000


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Route:
    """One HTTP route: ``path`` and ``body`` are formatted per credential (``fields``)."""

    method: str
    path: str
    right: Access
    # "blob": ``body(k)``; "ac": an ActionResult; "kv": key-value JSON; "parts": a module
    # completion's JSON; "": none
    body: str = "blob"
    ok: tuple[int, ...] = (200, 201, 202, 204)
    grows: bool = True  # an allowed write adds an index row (a read, a clean: not checked)

    def request(self, k: str, upload: str) -> tuple[str, str, bytes]:
        data = {
            "blob": body(k),
            "ac": action_result({"out": body(SEED)}),
            "kv": f'{{"cas_id": "kv{k}", "entries": [{{"value": "v"}}]}}'.encode(),
            "parts": b'{"parts": [1]}',
            "hashes": f'{{"hashes": ["{sha(SEED.encode())}"]}}'.encode(),
            "events": b"[]",
            "": b"",
        }[self.body]
        keys = [SEED, *map(key, CREDENTIALS)]
        part = str(1 + keys.index(k)) if k in keys else "1"
        fields = {
            **{"k": k, "sha": sha(data), "kh": sha(k.encode()), "scope": SCOPE, "part": part},
            "seedsha": sha(body(SEED)),
        }
        return self.method, self.path.format(upload=upload, **fields), data


HTTP = {
    "bazel cas": Route("PUT", "/cache/cas/{sha}", WC),
    "bazel cas, namespaced": Route("PUT", "/ns/team/cache/cas/{sha}", WC),
    "bazel ac": Route("PUT", "/cache/ac/{kh}", W, "ac"),
    "bazel ac, namespaced": Route("PUT", "/ns/team/cache/ac/{kh}", W, "ac"),
    "ccache": Route("PUT", "/cache/ccache/{k}", W),
    "ccache, namespaced": Route("PUT", "/ns/team/cache/ccache/{k}", W),
    "nx": Route("PUT", "/v1/cache/{kh}", W),
    "metro": Route("PUT", "/api/metro/cache/m{k}", W),
    "turbo": Route("PUT", "/v8/artifacts/{kh}?slug=team", W),
    "xcode cas": Route("POST", "/api/cache/cas/c{k}?{scope}", W),
    "keyvalue": Route("PUT", "/api/cache/keyvalue?{scope}", W, "kv"),
    "gradle": Route("PUT", "/api/cache/gradle/g{k}?{scope}", W),
    "module start": Route(
        "POST", "/api/cache/module/start?{scope}&hash=h{k}&name=n", W, "", grows=False
    ),
    "module part": Route(
        "POST", "/api/cache/module/part?upload_id={upload}&part_number={part}", W, grows=False
    ),
    "module complete": Route(
        "POST", "/api/cache/module/complete?upload_id=no-such-upload", W, "parts", (404,), False
    ),
    "webdav put": Route("PUT", "/dav/a/o{k}", W),
    "webdav put, namespaced": Route("PUT", "/ns/team/dav/a/o{k}", W),
    "webdav mkcol": Route("MKCOL", "/dav/a/", W, "", grows=False),
    "clean": Route("DELETE", "/api/cache/clean?tenant_id=acme&namespace_id=doomed", C, ""),
    "clean cache root": Route("DELETE", "/ns/doomed/cache", C, ""),
    "clean dav root": Route("DELETE", "/ns/doomed/dav/", C, ""),
    # one read per protocol, of what the fixture stored with k = SEED
    "bazel cas read": Route("GET", "/cache/cas/{sha}", R, ok=(200,)),
    "bazel cas head": Route("HEAD", "/cache/cas/{seedsha}", R, "", (200,)),
    "bazel ac read": Route("GET", "/cache/ac/{kh}", R, ok=(200,)),
    "ccache read": Route("GET", "/cache/ccache/{k}", R, ok=(200,)),
    "nx read": Route("GET", "/v1/cache/{kh}", R, ok=(200,)),
    "metro read": Route("GET", "/api/metro/cache/m{k}", R, ok=(200,)),
    "turbo read": Route("GET", "/v8/artifacts/{kh}?slug=team", R, ok=(200,)),
    "turbo query": Route("POST", "/v8/artifacts?slug=team", R, "hashes", (200,)),  # stores nothing
    "turbo events": Route("POST", "/v8/artifacts/events?slug=team", R, "events", (200,)),
    "xcode cas read": Route("GET", "/api/cache/cas/c{k}?{scope}", R, ok=(200,)),
    "keyvalue read": Route("GET", "/api/cache/keyvalue/kv{k}?{scope}", R, ok=(200,)),
    "gradle read": Route("GET", "/api/cache/gradle/g{k}?{scope}", R, ok=(200,)),
    "module read": Route("HEAD", "/api/cache/module/x?{scope}&hash=h{k}&name=n", R, "", (404,)),
    "webdav read": Route("GET", "/dav/a/o{k}", R, ok=(200,)),
}
READS = {name for name, route in HTTP.items() if route.right is R}


# --- gRPC: each call takes the credential's client and its key suffix.


def _write(c: Reapi, k: str, instance: str = "") -> object:
    data = f"bytestream-{k}".encode() * 2000
    return c.write(blob_name(data, instance, upload=new_upload()), data)


def _query_write_status(c: Reapi, k: str, instance: str = "") -> object:
    name = blob_name(f"never-{k}".encode(), instance, upload=new_upload())
    return c.bytestream.QueryWriteStatus(
        bs.QueryWriteStatusRequest(resource_name=name), metadata=c.metadata
    )


def _batch_update(c: Reapi, k: str, instance: str = "") -> object:
    response = c.batch_update([f"batch-{k}".encode() * 2000], instance)
    assert [r.status.code for r in response.responses] == [0]
    return response


def chunks(k: str) -> list[bytes]:
    return [f"chunk-a-{k}".encode() * 500, f"chunk-b-{k}".encode() * 500]


def _splice(c: Reapi, k: str, instance: str = "") -> object:
    parts = chunks(k)
    return c.splice(digest(b"".join(parts)), [digest(p) for p in parts], instance)


def _update_action_result(c: Reapi, k: str, instance: str = "") -> object:
    return c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(
            instance_name=instance,
            action_digest=digest(f"action-{k}".encode()),
            action_result=reapi.ActionResult(exit_code=1),
        ),
        metadata=c.metadata,
    )


def asset(k: str) -> bytes:
    return f"asset-{k}".encode()


def directory_blob(k: str) -> bytes:
    node = reapi.FileNode(name=f"f{k}", digest=digest(asset(k)))
    return reapi.Directory(files=[node]).SerializeToString()


def _push_blob(c: Reapi, k: str, instance: str = "") -> object:
    request = ra.PushBlobRequest(
        instance_name=instance, uris=[f"https://x.test/{k}"], blob_digest=digest(asset(k))
    )
    return c.push.PushBlob(request, metadata=c.metadata)


def _push_directory(c: Reapi, k: str, instance: str = "") -> object:
    request = ra.PushDirectoryRequest(
        instance_name=instance,
        uris=[f"https://x.test/d{k}"],
        root_directory_digest=digest(directory_blob(k)),
    )
    return c.push.PushDirectory(request, metadata=c.metadata)


def _get_capabilities(c: Reapi, _k: str, instance: str = "") -> object:
    request = reapi.GetCapabilitiesRequest(instance_name=instance)
    return c.capabilities.GetCapabilities(request, metadata=c.metadata)


def _find_missing(c: Reapi, k: str, instance: str = "") -> object:
    assert c.find_missing([asset(k)], instance) == []
    return None


def _read(c: Reapi, k: str, instance: str = "") -> object:
    assert c.read(blob_name(asset(k), instance)) == asset(k)
    return None


def _get_action_result(c: Reapi, k: str, instance: str = "") -> object:
    request = reapi.GetActionResultRequest(
        instance_name=instance, action_digest=digest(f"action-{k}".encode())
    )
    return c.ac.GetActionResult(request, metadata=c.metadata)


def _split(c: Reapi, k: str, instance: str = "") -> object:
    # SplitBlob: chunks cut by the server, content-addressed
    assert c.split(digest(asset(k)), instance)
    return None


def _batch_read(c: Reapi, k: str, instance: str = "") -> object:
    request = reapi.BatchReadBlobsRequest(instance_name=instance, digests=[digest(asset(k))])
    response = c.cas.BatchReadBlobs(request, metadata=c.metadata)
    assert [r.data for r in response.responses] == [asset(k)]
    return response


def _get_tree(c: Reapi, k: str, instance: str = "") -> object:
    request = reapi.GetTreeRequest(instance_name=instance, root_digest=digest(directory_blob(k)))
    pages = list(c.cas.GetTree(request, metadata=c.metadata))
    assert [len(p.directories) for p in pages] == [1]
    return pages


def _fetch_directory(c: Reapi, k: str, instance: str = "") -> object:
    request = ra.FetchDirectoryRequest(instance_name=instance, uris=[f"https://x.test/d{k}"])
    response = c.fetch.FetchDirectory(request, metadata=c.metadata)
    assert response.root_directory_digest == digest(directory_blob(k))
    return response


# The matrix fixture's loopback origin that FetchBlob downloads from (one, while it runs).
ORIGINS: list[Origin] = []


def _download(c: Reapi, k: str, instance: str = "", *, verified: bool) -> object:
    """A FetchBlob miss that downloads from ``ORIGIN`` and records the URI; ``verified``: the
    request names the blob's ``checksum.sri``."""
    path = f"/{'sri' if verified else 'plain'}-{k}"
    (origin,) = ORIGINS
    origin.files[path] = asset(k) * 3
    sri = "sha256-" + base64.b64encode(hashlib.sha256(asset(k) * 3).digest()).decode()
    qualifiers = [ra.Qualifier(name="checksum.sri", value=sri)] if verified else []
    request = ra.FetchBlobRequest(
        instance_name=instance, uris=[origin.url(path)], qualifiers=qualifiers
    )
    response = c.fetch.FetchBlob(request, metadata=c.metadata)
    assert response.blob_digest == digest(asset(k) * 3), response.status
    return response


def _fetch_blob(c: Reapi, k: str, instance: str = "") -> object:
    request = ra.FetchBlobRequest(instance_name=instance, uris=[f"https://x.test/{k}"])
    response = c.fetch.FetchBlob(request, metadata=c.metadata)
    assert response.blob_digest == digest(asset(k))
    return response


# Each RPC's call and the rights it needs, in the order it checks them.
RPCS: dict[str, tuple[Callable[..., object], Access | tuple[Access, ...]]] = {
    "ByteStream.Write": (_write, WC),
    "ByteStream.QueryWriteStatus": (_query_write_status, WC),
    "BatchUpdateBlobs": (_batch_update, WC),
    "SpliceBlob": (_splice, WC),
    "UpdateActionResult": (_update_action_result, W),
    "PushBlob": (_push_blob, W),
    "PushDirectory": (_push_directory, W),
    "GetCapabilities": (_get_capabilities, R),
    "FindMissingBlobs": (_find_missing, R),
    "ByteStream.Read": (_read, R),
    "GetActionResult": (_get_action_result, R),
    "FetchBlob": (_fetch_blob, R),
    "SplitBlob": (_split, R),
    "BatchReadBlobs": (_batch_read, R),
    "GetTree": (_get_tree, R),
    "FetchDirectory": (_fetch_directory, R),
    # a download recording an unverified URI -> digest is a write; a verified one a read
    "FetchBlob download": (lambda c, k, i="": _download(c, k, i, verified=False), (R, W)),
    "FetchBlob download, checksum.sri": (lambda c, k, i="": _download(c, k, i, verified=True), R),
}
RPC_READS = {name for name, (_call, right) in RPCS.items() if right is R}
# The writes whose allowed call adds no index row.
RPC_NO_GROWTH = {"ByteStream.QueryWriteStatus"}
# An allowed call's answer when it is not OK (no upload of that name is in progress).
RPC_OK = {"ByteStream.QueryWriteStatus": grpc.StatusCode.NOT_FOUND}


@dataclass
class Matrix:
    node: NodeProcess
    clients: dict[str, Reapi]
    upload: str  # a module upload the part route adds to


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    directory = tmp_path_factory.mktemp("rights")
    tokens_file = directory / "credentials"
    tokens_file.write_text(TOKENS_FILE)
    rw_file = directory / "rw-tokens"
    rw_file.write_text(f"{FILE_TOKEN} name=ci-main\n")
    port = free_port()
    origin = Origin()
    ORIGINS.append(origin)
    env = node_env(
        directory,
        read_write_tokens="tok-rw",
        read_only_tokens="tok-ro",
        tokens_file=tokens_file,
        read_write_tokens_file=rw_file,
        grpc_port=port,
        asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}",
        auth_jwt_public_key=jwt_keys.write_public_key(JWT_KEY, directory / "signer.pem"),
        auth_jwt_issuer=jwt_keys.ISSUER,
        auth_jwt_audience=jwt_keys.AUDIENCE,
    )
    node = start_in_process(directory, env)
    clients = {kind: Reapi(f"127.0.0.1:{port}", token) for kind, (token, _r) in CREDENTIALS.items()}
    clients["overlay"] = Reapi(f"127.0.0.1:{port}", OVERLAY_TOKEN)
    rw = clients["read-write"]
    with node.client(headers=bearer("tok-rw")) as c:
        for name in HTTP.keys() - READS:  # what the reads read
            method, path, data = HTTP[name].request(SEED, "")
            if method in ("PUT", "POST") and "module" not in name:
                assert c.request(method, path, content=data).status_code < 300, name
        upload = c.post(f"/api/cache/module/start?{SCOPE}&hash=up&name=n").json()["upload_id"]
    for k in [SEED, *map(key, CREDENTIALS)]:  # what the RPCs need: blobs to splice and to push
        rw.batch_update([*chunks(k), asset(k), directory_blob(k)])
    for instance in ("", "team"):  # "team": what the overlay credential reads through
        rw.batch_update([*chunks(SEED), asset(SEED), directory_blob(SEED)], instance)
        _update_action_result(rw, SEED, instance)
        _push_blob(rw, SEED, instance)
        _push_directory(rw, SEED, instance)
    yield Matrix(node, clients, upload)
    for client in clients.values():
        client.close()
    ORIGINS.clear()
    origin.stop()
    assert node.stop() == 0, node.log()[-3000:]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Held:
    """What the node holds, and the refusals it counted (one /metrics scrape)."""

    rows: int
    blob_files: int
    staged: list[Path]
    reserved_bytes: float
    forbidden: float

    @classmethod
    def by(cls, node: NodeProcess) -> Held:
        metrics = node.metrics()
        return cls(
            node.index_rows(),
            len(node.blob_files()),
            node.staging_files(),
            metrics.get("kura_tmp_reserved_bytes", 0.0),
            metrics.get('kura_auth_refusals_total{reason="forbidden"}', 0.0),
        )

    def after_one_refusal(self) -> Held:
        return dataclasses.replace(self, forbidden=self.forbidden + 1)


def keep_doomed(m: Matrix) -> None:
    """The clean routes' namespace holds an entry before each refused clean."""
    with m.node.client(headers=bearer("tok-rw")) as c:
        assert c.put(DOOMED, content=b"kept").status_code in (200, 201)


def doomed_entry_kept(m: Matrix) -> bool:
    with m.node.client(headers=bearer("tok-rw")) as c:
        return c.get(DOOMED).content == b"kept"


@pytest.mark.parametrize("kind", CREDENTIALS)
@pytest.mark.parametrize("route", HTTP)
def test_each_http_route_needs_its_right_and_a_refusal_stores_nothing(
    matrix: Matrix, route: str, kind: str
) -> None:
    token, rights = CREDENTIALS[kind]
    spec = HTTP[route]
    method, path, data = spec.request(SEED if route in READS else key(kind), matrix.upload)
    refused = spec.right not in rights
    if refused and spec.right is C:
        keep_doomed(matrix)
    grows = not refused and spec.grows and spec.right in (W, WC)
    before = Held.by(matrix.node) if refused or grows else None
    with matrix.node.client(headers=bearer(token)) as c:
        r = c.request(method, path, content=data)
    if not refused:
        assert r.status_code in spec.ok, (r.status_code, r.text)
        assert before is None or matrix.node.index_rows() > before.rows, "nothing stored"
        return
    assert before is not None
    assert r.status_code == 403, r.text
    if method != "HEAD":
        assert f"lacks the right '{spec.right.value}'" in r.text, r.text
    assert Held.by(matrix.node) == before.after_one_refusal()
    assert spec.right is not C or doomed_entry_kept(matrix)


@pytest.mark.parametrize("kind", CREDENTIALS)
@pytest.mark.parametrize("rpc", RPCS)
def test_each_rpc_needs_its_right_and_a_refusal_stores_nothing(
    matrix: Matrix, rpc: str, kind: str
) -> None:
    _token, rights = CREDENTIALS[kind]
    call, needs = RPCS[rpc]
    needs = needs if isinstance(needs, tuple) else (needs,)
    lacking = [right for right in needs if right not in rights]
    client = matrix.clients[kind]
    k = SEED if rpc in RPC_READS else key(kind)
    grows = not lacking and rpc not in RPC_READS | RPC_NO_GROWTH
    before = Held.by(matrix.node) if lacking or grows else None
    try:
        call(client, k)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    if not lacking:
        assert code is RPC_OK.get(rpc, grpc.StatusCode.OK), details
        assert before is None or matrix.node.index_rows() > before.rows, "nothing stored"
        return
    assert before is not None
    assert code is grpc.StatusCode.PERMISSION_DENIED, details
    assert f"lacks the right '{lacking[0].value}'" in details, details
    assert Held.by(matrix.node) == before.after_one_refusal()


# --- the namespace dimension (issue 29 item 2): the overlay credential, which holds every
# right, on each route and RPC naming its write namespace, a namespace it only reads, one it
# does not read, or none (the protocol's default: its overlay applies).
NAMED = re.compile(r"^/ns/[^/]+|[?&](?:namespace_id|slug)=[^&]*")
# The routes whose namespace is their upload's, not one the request names.
UPLOAD_NAMESPACED = {"module part", "module complete"}


def naming(path: str, ns: str | None) -> str:
    """``path`` naming ``ns`` where it names its namespace; naming none when ``ns`` is None."""

    def swap(m: re.Match[str]) -> str:
        if ns is None:
            return ""
        if m.group().startswith("/ns/"):
            return f"/ns/{ns}"
        return m.group().split("=")[0] + f"={ns}"

    return NAMED.sub(swap, path)


# Where the request points: a namespace the credential writes, one it only reads, a foreign one,
# or none of its own. Each with the key suffix of what its RPCs write.
WHERE = {"write": ("ovlw", WRITES), "read-only": (SEED, ""), "foreign": ("frgn", FOREIGN)}
WHERE_NONE = ("ovln", None)
WRITE_RIGHTS = (W, WC, C)


def names_one(route: Route) -> bool:
    """Whether ``route`` names a namespace (its path, ``namespace_id`` or team)."""
    return NAMED.search(route.request(SEED, "")[1]) is not None


def _namespace_cases() -> list[tuple[str, str]]:
    cases = []
    for name, route in HTTP.items():
        if name not in UPLOAD_NAMESPACED:
            wheres = (*WHERE, "none") if names_one(route) else ("none",)
            cases += [(name, where) for where in wheres]
    return cases


def held_in(m: Matrix, ns: str) -> int:
    return m.node.namespace_rows().get(ns, 0)


@pytest.mark.parametrize(("route", "where"), _namespace_cases())
def test_each_http_route_writes_only_the_overlays_write_namespace(
    matrix: Matrix, route: str, where: str
) -> None:
    """Naming its write namespace, or none: reads fall through the overlay, writes land in
    "ovl". Naming a namespace it only reads: reads of it, every write and clean 403. Naming a
    foreign one: 403 for everything. A refusal stores nothing and keeps what a clean named."""
    spec = HTTP[route]
    ns = None if where == "none" else WHERE[where][1]
    k = "o" + sha(f"{route} {where}".encode())[:12]  # a new key for each write
    method, path, data = spec.request(SEED if spec.right is R else k, matrix.upload)
    if where != "read-only":  # read-only: the route's own namespace, which the overlay reads
        path = naming(path, ns)
    writes = spec.right in WRITE_RIGHTS
    refused = where == "foreign" or (where == "read-only" and writes)
    if spec.right is C:
        keep_doomed(matrix)
    before = Held.by(matrix.node) if refused else None
    stored = held_in(matrix, WRITES)
    with matrix.node.client(headers=bearer(OVERLAY_TOKEN)) as c:
        r = c.request(method, path, content=data)
    if refused:
        assert before is not None
        assert r.status_code == 403, (path, r.text)
        if method != "HEAD":
            wanted = "not valid for namespace" if where == "foreign" else "writes only its write"
            assert wanted in r.text, r.text
        assert Held.by(matrix.node) == before.after_one_refusal()
        assert spec.right is not C or doomed_entry_kept(matrix)
        return
    # Every read falls through "ovl" to the seed in "team" or "app" (the Bazel, ccache and
    # WebDAV routes without /ns/ too: their /ns/team siblings stored the same keys there); Nx
    # and Metro stored theirs only in their own namespaces, which the overlay does not read.
    wanted_status = (404,) if route in ("nx read", "metro read") else spec.ok
    assert r.status_code in wanted_status, (path, r.status_code, r.text)
    if spec.right is C:  # the clean went to the write namespace, and only there
        assert held_in(matrix, WRITES) == 0
        assert held_in(matrix, "team") > 0
        assert doomed_entry_kept(matrix)
    elif writes and spec.grows:
        assert held_in(matrix, WRITES) > stored, f"{path} stored nothing in {WRITES}"


@pytest.mark.parametrize("where", [*WHERE, "none"])
@pytest.mark.parametrize("rpc", RPCS)
def test_each_rpc_writes_only_the_overlays_write_namespace(
    matrix: Matrix, rpc: str, where: str
) -> None:
    """The same rules by instance name: "ovl" or none (the empty name) reads through the
    overlay ("team" holds the seeds) and writes "ovl"; "team" only reads; "other" nothing."""
    call, needs = RPCS[rpc]
    needs = needs if isinstance(needs, tuple) else (needs,)
    k, _ns = WHERE_NONE if where == "none" else WHERE[where]
    instance = {"write": WRITES, "read-only": "team", "foreign": FOREIGN, "none": ""}[where]
    writes = any(right in WRITE_RIGHTS for right in needs)
    reads = rpc in RPC_READS
    if not reads and where in ("write", "none"):  # splices and pushes name stored content
        matrix.clients["read-write"].batch_update([*chunks(k), asset(k), directory_blob(k)], WRITES)
    # A verified download stores the blob it fetched, and SplitBlob the chunks it cuts: where
    # the call writes, with a read right; so neither runs where the call writes nothing.
    stores = writes or rpc in ("FetchBlob download, checksum.sri", "SplitBlob")
    refused = where == "foreign" or (where == "read-only" and stores)
    before = Held.by(matrix.node) if refused else None
    stored = held_in(matrix, WRITES)
    try:
        call(matrix.clients["overlay"], SEED if reads else k, instance)
        code, details = grpc.StatusCode.OK, ""
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
    if refused:
        assert before is not None
        assert code is grpc.StatusCode.PERMISSION_DENIED, details
        counted = before.after_one_refusal() if writes or where == "foreign" else before
        assert Held.by(matrix.node) == counted
        return
    assert code is RPC_OK.get(rpc, grpc.StatusCode.OK), details
    if not reads and rpc not in RPC_NO_GROWTH:
        assert held_in(matrix, WRITES) > stored, f"{rpc} stored nothing in {WRITES}"


# --- write:cas holds only what matches its digest: every CAS upload path, lying bytes.
LIE = b"the bytes sent " * 3000  # over KURA_INLINE_MAX_BYTES: a stored one would leave a file
CLAIMED = b"the bytes claimed " * 3000  # what the digest names


def _http_cas(prefix: str) -> Callable[[Matrix], str]:
    def put(m: Matrix) -> str:
        with m.node.client(headers=bearer(CREDENTIALS["write:cas"][0])) as c:
            r = c.put(f"{prefix}/cache/cas/{sha(CLAIMED)}", content=LIE)
        return str(r.status_code)

    return put


def _rpc_code(call: Callable[[Reapi], object]) -> Callable[[Matrix], str]:
    def run(m: Matrix) -> str:
        try:
            call(m.clients["write:cas"])
        except grpc.RpcError as exc:
            return str(exc.code())
        return "OK"

    return run


def _zstd(c: Reapi) -> object:
    name = blob_name(CLAIMED, upload=new_upload(), compressor="zstd")
    return c.write(name, zstandard.ZstdCompressor().compress(LIE))


def _resumed(c: Reapi) -> object:
    """A resumable upload: its first half true, then resumed (QueryWriteStatus) and finished
    with other bytes."""
    name = blob_name(CLAIMED, upload=new_upload())
    half = len(CLAIMED) // 2
    requests = write_requests(name, CLAIMED[:half], finish=False)
    with contextlib.suppress(grpc.RpcError):  # an unfinished stream: answered either way
        c.bytestream.Write(requests, metadata=c.metadata)
    status = c.bytestream.QueryWriteStatus(
        bs.QueryWriteStatusRequest(resource_name=name), metadata=c.metadata
    )
    assert 0 < status.committed_size <= half, status  # the true half is held, to resume
    return c.write(
        name,
        CLAIMED[: status.committed_size] + LIE[status.committed_size :],
        offset=status.committed_size,
    )


def _batch_lie(c: Reapi) -> object:
    request = reapi.BatchUpdateBlobsRequest(
        requests=[reapi.BatchUpdateBlobsRequest.Request(digest=digest(CLAIMED), data=LIE)]
    )
    response = c.cas.BatchUpdateBlobs(request, metadata=c.metadata)
    return [grpc.StatusCode.INVALID_ARGUMENT.value[0] == r.status.code for r in response.responses]


def _splice_lie(c: Reapi) -> object:
    parts = chunks(SEED)  # stored by the fixture; they do not make up CLAIMED
    return c.splice(digest(CLAIMED), [digest(p) for p in parts])


LIES: dict[str, tuple[Callable[[Matrix], str], str]] = {
    "http cas": (_http_cas(""), "400"),
    "http cas, namespaced": (_http_cas("/ns/team"), "400"),
    "bytestream zstd": (_rpc_code(_zstd), str(grpc.StatusCode.INVALID_ARGUMENT)),
    "bytestream resumed": (_rpc_code(_resumed), str(grpc.StatusCode.INVALID_ARGUMENT)),
    "batch update": (lambda m: str(_batch_lie(m.clients["write:cas"])), "[True]"),
    "splice": (_rpc_code(_splice_lie), str(grpc.StatusCode.INVALID_ARGUMENT)),
}


@pytest.mark.parametrize("path", LIES)
def test_write_cas_stores_no_bytes_that_do_not_match_their_digest(
    matrix: Matrix, path: str
) -> None:
    """The reason ``write:cas`` is safe to give a pull request: whatever path it uploads by,
    a blob's key is the hash of its bytes, checked before anything is stored."""
    upload, refused = LIES[path]
    before = Held.by(matrix.node)
    assert upload(matrix) == refused
    assert wait_for(lambda: Held.by(matrix.node) == before, 15), Held.by(matrix.node)
    assert matrix.clients["read-write"].find_missing([CLAIMED]) == [digest(CLAIMED).hash]


def test_an_entry_unusable_in_an_earlier_namespace_does_not_hide_a_whole_one_later(
    matrix: Matrix,
) -> None:
    """ "ovl" (read first) holds an action result whose output nobody stored, "team" (read
    after it) a whole one for the same action: the overlay credential gets team's, over gRPC
    and over Bazel's HTTP action cache, where the first namespace's answer was a miss."""
    rw, action = matrix.clients["read-write"], digest(b"action-hidden")
    whole, gone = b"the output team stored", b"an output nobody stored"
    rw.batch_update([whole], "team")
    for instance, output in (("team", whole), (WRITES, gone)):
        result = reapi.ActionResult()
        result.output_files.add(path="out", digest=digest(output))
        rw.ac.UpdateActionResult(
            reapi.UpdateActionResultRequest(
                instance_name=instance, action_digest=action, action_result=result
            ),
            metadata=rw.metadata,
        )
    got = matrix.clients["overlay"].ac.GetActionResult(
        reapi.GetActionResultRequest(action_digest=action),
        metadata=matrix.clients["overlay"].metadata,
    )
    assert got.output_files[0].digest == digest(whole)
    with matrix.node.client(headers=bearer(OVERLAY_TOKEN)) as c:
        r = c.get(f"/cache/ac/{action.hash}")
    assert r.status_code == 200, r.text
    assert reapi.ActionResult.FromString(r.content).output_files[0].digest == digest(whole)


def test_splices_and_pushes_find_content_in_the_namespaces_read_and_store_where_written(
    matrix: Matrix,
) -> None:
    """FindMissingBlobs tells the overlay credential that team's blobs are stored, so it does
    not upload them again: SpliceBlob, PushBlob and PushDirectory naming them then succeed,
    and what they store or record lands in "ovl" (they answered NOT_FOUND and
    INVALID_ARGUMENT when they looked in "ovl" alone). Nothing is added to "team"."""
    k, overlay = "fallthrough", matrix.clients["overlay"]
    matrix.clients["read-write"].batch_update([*chunks(k), asset(k), directory_blob(k)], "team")
    assert overlay.find_missing([*chunks(k), asset(k)]) == []
    team = held_in(matrix, "team")
    for call in (_splice, _push_blob, _push_directory):
        stored = held_in(matrix, WRITES)
        call(overlay, k, "")
        assert held_in(matrix, WRITES) > stored, call.__name__
    assert held_in(matrix, "team") == team


# --- every refused write is logged once, by the credential's identity, never its token
# (issue 29 item 4, kura.api.auth.TokenAuth.log_refusal), over HTTP and gRPC alike.


def test_each_refused_write_is_logged_once_by_writer_and_reason_never_the_token(
    tmp_path: Path,
) -> None:
    """A named write:cas token and a namespace-limited write:cas JWT each ask for an entry
    write over HTTP and over gRPC (one reason: one line for both), then write a blob into a
    namespace they may not (another reason: one more line). Asked again, nothing more. A node
    of its own: the refusal lines of a node are rate-limited, and the matrix's other tests
    refuse plenty."""
    credentials = tmp_path / "credentials"
    credentials.write_text(f"{LOGGED_TOKEN} name=logged rights=read,write:cas read=ns write=ns\n")
    port = free_port()
    env = node_env(
        tmp_path,
        tokens_file=credentials,
        grpc_port=port,
        auth_jwt_public_key=jwt_keys.write_public_key(JWT_KEY, tmp_path / "signer.pem"),
        auth_jwt_issuer=jwt_keys.ISSUER,
        auth_jwt_audience=jwt_keys.AUDIENCE,
    )
    node = start_in_process(tmp_path, env)
    jwt = jwt_keys.token(JWT_KEY, scope="cache:write:cas", sub="pr-bot 7", namespaces=["pr-7"])
    try:
        for _round in range(2):
            for token in (LOGGED_TOKEN, jwt):
                client = Reapi(f"127.0.0.1:{port}", token)
                try:
                    with node.client(headers=bearer(token)) as c:
                        r = c.put(f"/cache/ac/{sha(b'logged')}", content=action_result({}))
                    assert r.status_code == 403, r.text
                    with pytest.raises(grpc.RpcError) as refused:
                        _update_action_result(client, "logged")
                    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                    with pytest.raises(grpc.RpcError) as refused:
                        client.batch_update([b"logged elsewhere"], "elsewhere")
                    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
                finally:
                    client.close()
    finally:
        assert node.stop() == 0, node.log()[-3000:]
    log = node.log()
    lines = [line for line in log.splitlines() if " refused: " in line]
    wanted = [
        "writer 'token:logged', asking for 'write': this token lacks the right 'write'",
        "writer 'token:logged', asking for 'write:cas': this credential is not valid for "
        "namespace 'elsewhere'",
        "writer 'jwt:pr-bot%207', asking for 'write': this token lacks the right 'write' "
        "(JWT scope cache:write)",
        "writer 'jwt:pr-bot%207', asking for 'write:cas': this token is not valid for "
        "namespace 'elsewhere'",
    ]
    assert len(lines) == len(wanted), lines
    for line, text in zip(lines, wanted, strict=True):
        assert text in line, (line, text)
        assert " WARNING " in line, line
    assert LOGGED_TOKEN not in log
    assert jwt not in log
    assert jwt.split(".")[2] not in log  # nor the JWT's signature alone


# --- who writes (issue 29 item 4): every write, by every route and RPC, records the writer
# identity of its credential (kura.core.provenance) in its manifest, read back through the
# storage API.


def fingerprint(token: str) -> str:
    return "token:#" + hashlib.sha256(token.encode()).hexdigest()[:12]


WRITER_JWT = "a JWT minted when the test runs"  # an import-time one expires in a long run
# Each kind of credential: its token, rights, and the writer its writes record.
WRITERS: dict[str, tuple[str, set[Access], str]] = {
    "named": (CREDENTIALS["write"][0], {W, WC}, "token:w"),
    "unnamed": ("tok-rw", {R, WC, W, C}, fingerprint("tok-rw")),
    "token file": (FILE_TOKEN, {R, WC, W, C}, "token:ci-main"),
    "jwt": (WRITER_JWT, {R, WC, W, C}, "jwt:ci/main%20bot"),
    "overlay": (OVERLAY_TOKEN, {R, WC, W, C}, "token:pr"),
}


def writer_of_kind(kind: str) -> tuple[str, str]:
    """``kind``'s token, a JWT minted now (valid 10 minutes from here, not from collection),
    and the writer its writes record."""
    token, _rights, recorded = WRITERS[kind]
    if token == WRITER_JWT:
        token = jwt_keys.token(JWT_KEY, scope="cache:read cache:write", sub="ci/main bot")
    return token, recorded


HTTP_WRITES = [n for n, r in HTTP.items() if r.right in (W, WC) and r.grows]


def _written(m: Matrix, write: Callable[[], object]) -> list[str]:
    """The writers recorded in the manifests of what ``write()`` added to the index, each read
    back through the storage API (``ArtifactReader.read_manifest``)."""
    before = m.node.artifact_ids()
    write()
    added = sorted(m.node.artifact_ids() - before)
    assert isinstance(m.node, InProcessNode)

    async def writers(node: Node) -> list[str]:
        manifests = [await node.service.reads.read_manifest(aid) for aid in added]
        return [mf.writer for mf in manifests if mf is not None]

    return m.node.call(writers)


@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.parametrize("route", [*HTTP_WRITES, "module upload"])
def test_each_http_write_records_its_credentials_writer(
    matrix: Matrix, route: str, kind: str
) -> None:
    token, writer = writer_of_kind(kind)
    k = "p" + sha(f"{route} {kind}".encode())[:12]

    def write() -> None:
        with matrix.node.client(headers=bearer(token)) as c:
            if route == "module upload":
                start = f"/api/cache/module/start?{SCOPE}&hash=h{k}&name=n"
                if kind == "overlay":
                    start = naming(start, None)
                upload = c.post(start).json()["upload_id"]
                r = c.post(f"/api/cache/module/part?upload_id={upload}&part_number=1", content=b"x")
                assert r.status_code < 300, r.text
                r = c.post(
                    f"/api/cache/module/complete?upload_id={upload}", content=b'{"parts":[1]}'
                )
            else:
                method, path, data = HTTP[route].request(k, matrix.upload)
                r = c.request(
                    method, naming(path, None) if kind == "overlay" else path, content=data
                )
            assert r.status_code < 300, r.text

    assert _written(matrix, write) == [writer]


def _split_fresh(c: Reapi, k: str, instance: str = "") -> object:
    """SplitBlob of a blob of several chunks that nobody split before (stored by another)."""
    return c.split(digest(big(k)), instance)


def big(k: str) -> bytes:
    return hashlib.shake_256(k.encode()).digest(2 * 1024 * 1024)


def _write_small(c: Reapi, k: str, instance: str = "") -> object:
    """A ByteStream Write of one message carrying a small blob (``kura.grpc.batch.store_whole``)."""
    data = f"small-{k}".encode()
    return c.write(blob_name(data, instance, upload=new_upload()), data)


RPC_WRITES: dict[str, tuple[Callable[..., object], set[Access]]] = {
    "ByteStream.Write": (_write, {WC}),
    "ByteStream.Write, one message": (_write_small, {WC}),
    "BatchUpdateBlobs": (_batch_update, {WC}),
    "SpliceBlob": (_splice, {WC}),
    "SplitBlob": (_split_fresh, {R}),
    "UpdateActionResult": (_update_action_result, {W}),
    "PushBlob": (_push_blob, {W}),
    "PushDirectory": (_push_directory, {W}),
    "FetchBlob download": (RPCS["FetchBlob download"][0], {R, W}),
    "FetchBlob download, checksum.sri": (RPCS["FetchBlob download, checksum.sri"][0], {R}),
}


@pytest.mark.parametrize(
    ("rpc", "kind"),
    [
        (rpc, kind)
        for rpc in RPC_WRITES
        for kind in WRITERS
        if RPC_WRITES[rpc][1] <= WRITERS[kind][1]
    ],
)
def test_each_rpc_write_records_its_credentials_writer(matrix: Matrix, rpc: str, kind: str) -> None:
    """Each with every kind of credential that may make it (refusals: the matrix above)."""
    token, writer = writer_of_kind(kind)
    call, _needs = RPC_WRITES[rpc]
    k = "r" + sha(f"{rpc} {kind}".encode())[:12]
    # What the call names must be stored, by another writer, where the credential reads it.
    where = WRITES if kind == "overlay" else ""
    seeds = matrix.clients["read-write"]
    seeds.batch_update([*chunks(k), asset(k), directory_blob(k)], where)
    seeds.write(blob_name(big(k), where, upload=new_upload()), big(k))
    client = Reapi(matrix.clients["read-write"].target, token)
    try:
        written = _written(matrix, lambda: call(client, k))
    finally:
        client.close()
    assert written, f"{rpc} stored nothing"
    assert set(written) == {writer}, written
