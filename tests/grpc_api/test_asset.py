"""The Remote Asset API (``build.bazel.remote.asset.v1``) over a real gRPC channel, from a
client written from the published stubs: pushes and fetches by URI and qualifiers, downloads
from an origin served on loopback, and the bad inputs (a lying ``checksum.sri``, a disallowed
origin, a private address not allowed explicitly, a body past the size limit), each with its
status and message and nothing stored (no blob, no record, no staged file, no reserved byte)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import http.server
import os
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2

from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2 as ra
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura_harness.launch.process import free_port
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import manifests, wait_for
from tests.grpc_api.client import Reapi, digest, start_grpc_node
from tests.grpc_api.test_bad_input import assert_nothing_stored, code_of

pytestmark = pytest.mark.in_process

URI = "https://mirror.example/pkg-1.0.tar.gz"
ARCHIVE = os.urandom(200_000)  # staged in the tmp dir, not an inline row


def sri(data: bytes, algorithm: str = "sha256") -> str:
    raw = hashlib.new(algorithm, data).digest()
    return f"{algorithm}-{base64.b64encode(raw).decode()}"


def q(**pairs: str) -> list[ra.Qualifier]:
    return [ra.Qualifier(name=k.replace("_", "."), value=v) for k, v in pairs.items()]


class Origin:
    """An HTTP origin on 127.0.0.1 serving ``files`` (path → bytes) and ``redirects`` (path →
    Location), gzip-encoding the ``gzipped`` paths for a client that accepts it (as a web
    server compresses text); counts its GETs."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.redirects: dict[str, str] = {}
        self.gzipped: set[str] = set()
        self.gets = 0
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                origin.gets += 1
                if self.path in origin.redirects:
                    self.send_response(302)
                    self.send_header("Location", origin.redirects[self.path])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.path == "/slow":  # 1 MiB announced, 1 KiB sent every 0.1 s
                    self.send_response(200)
                    self.send_header("Content-Length", str(1024 * 1024))
                    self.end_headers()
                    try:
                        for _ in range(1024):
                            self.wfile.write(bytes(1024))
                            self.wfile.flush()
                            time.sleep(0.1)
                    except OSError:
                        pass
                    return
                body = origin.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                accepted = self.headers.get("Accept-Encoding", "")
                if body is not None and self.path in origin.gzipped and "gzip" in accepted:
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *_args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origin() -> Iterator[Origin]:
    served = Origin()
    yield served
    served.stop()


@pytest.fixture
def grpc_node(start_node: Callable[..., NodeProcess]) -> Iterator[tuple[NodeProcess, Reapi]]:
    node, client = start_grpc_node(start_node)
    yield node, client
    client.close()


def fetch(client: Reapi, *uris: str, **kwargs: object) -> ra.FetchBlobResponse:
    return client.fetch.FetchBlob(  # type: ignore[no-any-return]
        ra.FetchBlobRequest(uris=list(uris), **kwargs), metadata=client.metadata
    )


def push(client: Reapi, data: bytes, *uris: str, **kwargs: object) -> None:
    client.push.PushBlob(
        ra.PushBlobRequest(uris=list(uris), blob_digest=digest(data), **kwargs),
        metadata=client.metadata,
    )


def test_a_pushed_blob_is_fetched_by_its_uri_and_qualifiers(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    node, client = grpc_node
    client.batch_update([ARCHIVE])
    push(client, ARCHIVE, URI, qualifiers=q(resource_type="application/x-tar", vcs_commit="abc"))
    # Qualifiers in any order, and a checksum.sri (not part of the key) checked on the bytes.
    for checksum in (sri(ARCHIVE), sri(ARCHIVE, "sha384"), sri(ARCHIVE, "sha512")):
        got = fetch(
            client,
            "https://other.example/x",
            URI,
            qualifiers=[
                *q(vcs_commit="abc", resource_type="application/x-tar"),
                ra.Qualifier(name="checksum.sri", value=checksum),
            ],
        )
        assert got.status.code == code_pb2.OK, got.status.message
        assert (got.uri, got.blob_digest) == (URI, digest(ARCHIVE))
    # Another qualifier value, a missing qualifier, a lying checksum: misses, answered inline.
    for qualifiers in (
        q(resource_type="application/x-tar", vcs_commit="def"),
        q(resource_type="application/x-tar"),
        [
            *q(resource_type="application/x-tar", vcs_commit="abc"),
            ra.Qualifier(name="checksum.sri", value=sri(b"other bytes", "sha384")),
        ],
    ):
        miss = fetch(client, URI, qualifiers=qualifiers)
        assert miss.status.code == code_pb2.NOT_FOUND
        assert "no record" in miss.status.message
    # Content stored before now is refused to a client that accepts only newer content.
    future = Timestamp()
    future.FromSeconds(2**33)
    newer = fetch(
        client,
        URI,
        qualifiers=q(resource_type="application/x-tar", vcs_commit="abc"),
        oldest_content_accepted=future,
    )
    assert newer.status.code == code_pb2.NOT_FOUND
    assert node.metric('kura_grpc_requests_total{code="OK",method="PushBlob"}') == 1


def test_a_pushed_directory_is_fetched_until_its_push_expires(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    _node, client = grpc_node
    leaf = b"file contents"
    root = reapi.Directory(
        files=[reapi.FileNode(name="a.txt", digest=digest(leaf))]
    ).SerializeToString()
    client.batch_update([leaf, root])
    past = Timestamp()
    past.FromSeconds(1)
    for uri, expire in (("urn:fdc:kura.test:2026:dir", None), ("urn:fdc:kura.test:2026:old", past)):
        client.push.PushDirectory(
            ra.PushDirectoryRequest(
                uris=[uri],
                root_directory_digest=digest(root),
                references_blobs=[digest(leaf)],
                expire_at=expire,
            )
        )
    got = client.fetch.FetchDirectory(ra.FetchDirectoryRequest(uris=["urn:fdc:kura.test:2026:dir"]))
    assert got.status.code == code_pb2.OK
    assert got.root_directory_digest == digest(root)
    # A directory record is not a blob's, and an expired push is a miss.
    as_blob = fetch(client, "urn:fdc:kura.test:2026:dir")
    expired = client.fetch.FetchDirectory(
        ra.FetchDirectoryRequest(uris=["urn:fdc:kura.test:2026:old"])
    )
    assert (as_blob.status.code, expired.status.code) == (code_pb2.NOT_FOUND, code_pb2.NOT_FOUND)


def test_empty_requests_and_pushes_of_absent_or_mislabelled_content_are_invalid(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """BuildStream probes a server with empty Fetch and Push requests and expects
    INVALID_ARGUMENT; a push must name content in the CAS, matching its checksum.sri."""
    node, client = grpc_node
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: client.fetch.FetchBlob(ra.FetchBlobRequest())) == invalid
    assert code_of(lambda: client.push.PushBlob(ra.PushBlobRequest())) == invalid
    assert code_of(lambda: push(client, ARCHIVE, URI)) == invalid  # not uploaded
    twice = [ra.Qualifier(name="a", value="1"), ra.Qualifier(name="a", value="2")]
    assert code_of(lambda: fetch(client, URI, qualifiers=twice)) == invalid
    bad_sri = [ra.Qualifier(name="checksum.sri", value="sha256-short")]
    assert code_of(lambda: fetch(client, URI, qualifiers=bad_sri)) == invalid
    client.batch_update([ARCHIVE])
    lying = [ra.Qualifier(name="checksum.sri", value=sri(b"other bytes", "sha512"))]
    with pytest.raises(grpc.RpcError) as info:
        push(client, ARCHIVE, URI, qualifiers=lying)
    assert info.value.code() == invalid
    assert "does not match" in (info.value.details() or "")
    assert node.index_rows() == 1  # the uploaded blob, and no record
    assert fetch(client, URI).status.code == code_pb2.NOT_FOUND


def test_a_push_with_one_record_too_large_records_none_of_its_uris(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """A push is all or nothing: the short URI's record fits, the long one's does not, and
    neither is recorded."""
    _node, client = grpc_node
    client.batch_update([ARCHIVE])
    short, long = URI, URI + "?" + "x" * 8000
    qualifiers = q(vcs_commit="c" * (256 * 1024 - 4000))
    refused = code_of(lambda: push(client, ARCHIVE, short, long, qualifiers=qualifiers))
    assert refused == grpc.StatusCode.INVALID_ARGUMENT
    assert fetch(client, short, qualifiers=qualifiers).status.code == code_pb2.NOT_FOUND


def test_a_namespace_clean_removes_its_records(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    """Records live in the instance name's namespace: ``DELETE /ns/team-1/cache`` drops that
    namespace's record (and blob), and leaves the default namespace's."""
    node, client = grpc_node
    for instance in ("", "team-1"):
        client.batch_update([ARCHIVE], instance=instance)
        client.push.PushBlob(
            ra.PushBlobRequest(instance_name=instance, uris=[URI], blob_digest=digest(ARCHIVE))
        )
    with node.client() as http:
        assert http.delete("/ns/team-1/cache").status_code == 204
    cleaned = client.fetch.FetchBlob(ra.FetchBlobRequest(instance_name="team-1", uris=[URI]))
    assert cleaned.status.code == code_pb2.NOT_FOUND
    assert fetch(client, URI).blob_digest == digest(ARCHIVE)


def test_a_joining_node_bootstraps_the_records(start_node: Callable[..., NodeProcess]) -> None:
    """A node started later with the first as its only peer (which does not know it, so ships
    it nothing) holds the record once it is ready, and answers the fetch from it."""
    a, a_client = start_grpc_node(start_node, "a")
    a_client.batch_update([ARCHIVE])
    push(a_client, ARCHIVE, URI)
    a_client.close()
    b, b_client = start_grpc_node(start_node, "b", peers=a.internal_url, discovery_settle_ms=0)
    assert wait_for(lambda: oneshot.get(b.url + "/ready").status_code == 200, 30)
    assert sorted(m["key"] for m in manifests(b).values()) == sorted(
        m["key"] for m in manifests(a).values()
    )
    assert fetch(b_client, URI).blob_digest == digest(ARCHIVE)
    b_client.close()


def test_a_read_only_token_fetches_but_cannot_push(start_node: Callable[..., NodeProcess]) -> None:
    _node, client = start_grpc_node(start_node, read_write_tokens="rw", read_only_tokens="ro")
    client.token = "rw"
    client.batch_update([ARCHIVE])
    push(client, ARCHIVE, URI)
    client.token = "ro"
    assert code_of(lambda: push(client, ARCHIVE, URI)) == grpc.StatusCode.PERMISSION_DENIED
    assert fetch(client, URI).blob_digest == digest(ARCHIVE)
    client.close()


def test_fetch_downloads_from_an_allowed_origin_and_answers_once_it_is_gone(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    origin.files["/pkg.tar.gz"] = ARCHIVE
    origin.redirects["/latest.tar.gz"] = "/pkg.tar.gz"
    origin.files["/by-name.bin"] = b"fetched by a host name"
    node, client = start_grpc_node(
        start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port},localhost:{origin.port}"
    )
    # A host name named exactly may resolve to loopback; the connection goes to what was checked.
    by_name = fetch(client, origin.url("/by-name.bin", host="localhost"))
    assert by_name.blob_digest == digest(b"fetched by a host name"), by_name.status
    checksum = [ra.Qualifier(name="checksum.sri", value=sri(ARCHIVE, "sha384"))]
    got = fetch(client, origin.url("/latest.tar.gz"), qualifiers=checksum)
    assert got.status.code == code_pb2.OK, got.status.message
    assert got.blob_digest == digest(ARCHIVE)
    assert origin.gets == 3  # by name, then the redirect and the file
    origin.stop()
    again = fetch(client, origin.url("/latest.tar.gz"), qualifiers=checksum)
    assert again.blob_digest == digest(ARCHIVE)
    batch = client.cas.BatchReadBlobs(reapi.BatchReadBlobsRequest(digests=[digest(ARCHIVE)]))
    assert batch.responses[0].data == ARCHIVE
    assert node.metric('kura_asset_origin_downloads_total{result="stored"}') == 2
    assert node.metric('kura_cache_lookups_total{protocol="grpc",result="hit"}') >= 1
    client.close()


def test_a_download_stores_the_origins_bytes_not_a_content_encoding_of_them(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """A web server compresses text for a client that accepts gzip; the blob asked for is the
    file itself, so the download must not ask for an encoding it does not undo."""
    text = b"def rules():\n    pass\n" * 1000
    origin.files["/defs.bzl"] = text
    origin.gzipped.add("/defs.bzl")
    _node, client = start_grpc_node(
        start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}"
    )
    got = fetch(client, origin.url("/defs.bzl"))
    assert got.status.code == code_pb2.OK, got.status.message
    assert got.blob_digest == digest(text)
    checked = fetch(
        client,
        origin.url("/defs.bzl"),
        qualifiers=[ra.Qualifier(name="checksum.sri", value=sri(text))],
    )
    assert checked.status.code == code_pb2.OK, checked.status.message
    client.close()


def test_a_download_past_its_timeout_is_deadline_exceeded_and_leaves_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """The request's ``timeout`` cancels a download mid-body (1 MiB reserved, a few KiB
    staged): the reservation and the staged file go with it."""
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    timeout = Duration()
    timeout.FromMilliseconds(1500)
    got = fetch(client, origin.url("/slow"), timeout=timeout)
    assert got.status.code == code_pb2.DEADLINE_EXCEEDED, got.status
    assert "longer than 1.5 s" in got.status.message
    assert_nothing_stored(node)
    assert node.metric('kura_asset_origin_downloads_total{result="failed"}') == 1
    client.close()


def test_a_fetch_whose_record_cannot_be_kept_downloads_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """Qualifiers too long for a record are refused before the origin is asked, not after its
    bytes were stored with no record to find them by."""
    origin.files["/pkg.tar.gz"] = ARCHIVE
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    long = q(vcs_commit="x" * 300_000)
    assert code_of(lambda: fetch(client, origin.url("/pkg.tar.gz"), qualifiers=long)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert origin.gets == 0
    assert_nothing_stored(node)
    client.close()


@pytest.mark.parametrize(
    "case",
    [
        "lying checksum.sri",
        "disallowed origin",
        "loopback by wildcard",
        "localhost by wildcard",
        "redirect to a loopback name",
        "larger than the limit",
        "not at the origin",
        "origin down",
    ],
)
def test_a_bad_download_gets_its_status_and_stores_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin, case: str
) -> None:
    origin.files["/pkg.tar.gz"] = ARCHIVE
    origin.redirects["/moved"] = origin.url("/pkg.tar.gz", host="localhost")
    explicit = f"127.0.0.1:{origin.port}"
    closed = free_port()  # nothing listens there
    allowed, uri, qualifiers, code, words = {
        "lying checksum.sri": (
            explicit,
            origin.url("/pkg.tar.gz"),
            [ra.Qualifier(name="checksum.sri", value=sri(b"other bytes"))],
            code_pb2.ABORTED,
            "do not match checksum.sri",
        ),
        "disallowed origin": (
            "mirror.example",
            origin.url("/pkg.tar.gz"),
            [],
            code_pb2.PERMISSION_DENIED,
            "is not allowed",
        ),
        "loopback by wildcard": (
            "*",
            origin.url("/pkg.tar.gz"),
            [],
            code_pb2.PERMISSION_DENIED,
            "not a global address",
        ),
        "localhost by wildcard": (
            "*",
            origin.url("/pkg.tar.gz", host="localhost"),
            [],
            code_pb2.PERMISSION_DENIED,
            "not a global address",
        ),
        "redirect to a loopback name": (
            f"{explicit},*",
            origin.url("/moved"),
            [],
            code_pb2.PERMISSION_DENIED,
            "not a global address",
        ),
        "larger than the limit": (
            explicit,
            origin.url("/pkg.tar.gz"),
            [],
            code_pb2.RESOURCE_EXHAUSTED,
            "limit",
        ),
        "not at the origin": (
            explicit,
            origin.url("/gone.tar.gz"),
            [],
            code_pb2.NOT_FOUND,
            "answered 404",
        ),
        "origin down": (
            f"127.0.0.1:{closed}",
            f"http://127.0.0.1:{closed}/pkg.tar.gz",
            [],
            code_pb2.UNAVAILABLE,
            "could not be reached",
        ),
    }[case]
    settings: dict[str, object] = {"asset_fetch_allowed_hosts": allowed}
    if case == "larger than the limit":
        settings["max_artifact_bytes"] = str(len(ARCHIVE) - 1)
    node, client = start_grpc_node(start_node, **settings)
    got = fetch(client, uri, qualifiers=qualifiers)
    assert got.status.code == code, got.status
    assert words in got.status.message
    assert got.uri == uri
    assert_nothing_stored(node)
    if code == code_pb2.PERMISSION_DENIED:
        assert origin.gets == (1 if case == "redirect to a loopback name" else 0)
        assert node.metric('kura_asset_origin_downloads_total{result="refused"}') == 1
    client.close()
