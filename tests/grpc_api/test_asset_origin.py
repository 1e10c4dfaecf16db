"""The Remote Asset ``FetchBlob``'s downloads from an origin served on loopback
(``kura.grpc.origin``), over a real gRPC channel: what is downloaded and recorded, the qualifiers
a download honours, one deadline per call, the node's cap on downloads at once, and the bad
inputs (a lying ``checksum.sri``, a disallowed origin, a private address not allowed
explicitly, a body past the size limit), each with its status and message and nothing stored
(no blob, no record, no staged file, no reserved byte)."""

from __future__ import annotations

import gzip
import http.server
import logging
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.rpc import code_pb2

from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2 as ra
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import digest, start_grpc_node
from tests.grpc_api.test_asset import ARCHIVE, fetch, q, sri
from tests.grpc_api.test_bad_input import assert_nothing_stored, code_of

pytestmark = pytest.mark.in_process


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
                if self.path.startswith("/slow"):  # 1 MiB announced, 1 KiB sent every 0.1 s
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


def test_a_download_slower_than_the_minimum_upload_rate_is_cut_and_leaves_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """An origin declaring 1 MiB and sending ~10 KiB/s held its tmp reservation until the
    call's deadline (a read token could so exhaust the budget): it is held to
    ``KURA_MIN_UPLOAD_BYTES_PER_SECOND``, the rule every upload is, and cut past the grace."""
    node, client = start_grpc_node(
        start_node,
        asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}",
        min_upload_bytes_per_second="65536",
        upload_grace_seconds="1",
    )
    timeout = Duration()
    timeout.FromSeconds(20)
    started = time.monotonic()
    got = fetch(client, origin.url("/slow"), timeout=timeout)
    assert got.status.code == code_pb2.UNAVAILABLE, got.status
    assert "too slow" in got.status.message
    assert time.monotonic() - started < 10  # cut past the 1 s grace, not at the 20 s deadline
    assert_nothing_stored(node)
    assert node.metric('kura_http_aborted_uploads_total{reason="slow"}') == 1
    client.close()


def test_a_uri_with_credentials_is_refused_and_never_sent_to_the_origin(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """``user:pw@`` in a URI went to the origin as Basic auth and was stored in the record's
    body as written; now the fetch is INVALID_ARGUMENT, the origin is not asked, and a
    redirect to such a URI is not followed."""
    origin.files["/pkg.tar.gz"] = ARCHIVE
    origin.redirects["/to-creds"] = f"http://u:pw@127.0.0.1:{origin.port}/pkg.tar.gz"
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    with pytest.raises(grpc.RpcError) as info:
        fetch(client, f"http://user:s3cret@127.0.0.1:{origin.port}/pkg.tar.gz")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries credentials" in (info.value.details() or "")
    assert "s3cret" not in (info.value.details() or "")
    assert origin.gets == 0
    got = fetch(client, origin.url("/to-creds"))
    assert got.status.code == code_pb2.UNAVAILABLE, got.status
    assert "credentials" in got.status.message
    assert "pw" not in got.status.message
    assert origin.gets == 1
    assert_nothing_stored(node)
    client.close()


def test_a_loopback_entry_without_a_port_is_warned_of_at_start_up(
    start_node: Callable[..., NodeProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """``localhost,[::1]`` was accepted silently, yet can never reach loopback."""
    with caplog.at_level(logging.WARNING, logger="kura.grpc.origin"):
        _node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts="localhost,[::1]")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("'localhost' has no port" in m and "localhost:PORT" in m for m in warned), warned
    assert any("'[::1]' has no port" in m and "[::1]:PORT" in m for m in warned), warned
    client.close()


def test_a_fetch_whose_record_cannot_be_kept_downloads_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """Qualifiers too long for a record are refused before the origin is asked, not after its
    bytes were stored with no record to find them by."""
    origin.files["/pkg.tar.gz"] = ARCHIVE
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    long = q(bazel_canonical_id="x" * 300_000)
    assert code_of(lambda: fetch(client, origin.url("/pkg.tar.gz"), qualifiers=long)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert origin.gets == 0
    assert_nothing_stored(node)
    client.close()


@pytest.mark.parametrize(
    "name", ["resource_type", "vcs.commit", "http_header:Authorization", "bazel.auth_headers"]
)
def test_a_miss_naming_a_qualifier_a_download_cannot_honour_downloads_nothing(
    start_node: Callable[..., NodeProcess], origin: Origin, name: str
) -> None:
    """remote_asset.proto: a server "MUST ensure Fetch'd content matches all the specified
    qualifiers"; a download honours checksum.sri only (and keys on bazel.canonical_id), so
    any other qualifier on a miss is INVALID_ARGUMENT naming it, and the origin is not asked."""
    origin.files["/pkg.tar.gz"] = ARCHIVE
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    qualifiers = [
        ra.Qualifier(name=name, value="Bearer s3cret"),
        ra.Qualifier(name="checksum.sri", value=sri(ARCHIVE)),
    ]
    with pytest.raises(grpc.RpcError) as info:
        fetch(client, origin.url("/pkg.tar.gz"), qualifiers=qualifiers)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f'"{name}" not supported' in (info.value.details() or "")
    assert "s3cret" not in (info.value.details() or "")
    assert origin.gets == 0
    assert_nothing_stored(node)
    # The qualifiers a download honours are downloaded with, and recorded under.
    honoured = [*qualifiers[1:], ra.Qualifier(name="bazel.canonical_id", value="pkg-1.0")]
    got = fetch(client, origin.url("/pkg.tar.gz"), qualifiers=honoured)
    assert got.blob_digest == digest(ARCHIVE), got.status
    client.close()


def test_a_call_has_one_deadline_for_all_its_uris(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """Three slow URIs and a 1.5 s ``timeout``: the first takes the whole deadline and the
    others are not tried (each URI had its own ``timeout`` before: 3 × 1.5 s)."""
    node, client = start_grpc_node(start_node, asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}")
    timeout = Duration()
    timeout.FromMilliseconds(1500)
    slow = [origin.url(f"/slow?{i}") for i in range(3)]
    got = fetch(client, *slow, timeout=timeout)
    assert got.status.code == code_pb2.DEADLINE_EXCEEDED, got.status
    assert (got.uri, origin.gets) == (slow[0], 1)
    assert_nothing_stored(node)
    client.close()


def test_downloads_past_the_nodes_cap_are_resource_exhausted(
    start_node: Callable[..., NodeProcess], origin: Origin
) -> None:
    """``KURA_ASSET_FETCH_MAX_DOWNLOADS=1``: while one call downloads, another waits for a slot
    within its deadline, then gets RESOURCE_EXHAUSTED without asking the origin."""
    origin.files["/pkg.tar.gz"] = ARCHIVE
    node, client = start_grpc_node(
        start_node,
        asset_fetch_allowed_hosts=f"127.0.0.1:{origin.port}",
        asset_fetch_max_downloads="1",
    )
    long, short = Duration(), Duration()
    long.FromSeconds(4)
    short.FromMilliseconds(1000)
    first: list[ra.FetchBlobResponse] = []
    holder = threading.Thread(
        target=lambda: first.append(fetch(client, origin.url("/slow"), timeout=long))
    )
    holder.start()
    assert wait_for(lambda: origin.gets == 1, 10)
    with pytest.raises(grpc.RpcError) as info:
        fetch(client, origin.url("/pkg.tar.gz"), timeout=short)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "KURA_ASSET_FETCH_MAX_DOWNLOADS" in (info.value.details() or "")
    assert origin.gets == 1
    holder.join()
    assert first[0].status.code == code_pb2.DEADLINE_EXCEEDED
    assert_nothing_stored(node)
    client.close()


@pytest.mark.parametrize(
    "case",
    [
        "lying checksum.sri",
        "loopback named without a port",
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
        "loopback named without a port": (
            "localhost,127.0.0.1",
            origin.url("/pkg.tar.gz", host="localhost"),
            [],
            code_pb2.PERMISSION_DENIED,
            "names with its port",
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
