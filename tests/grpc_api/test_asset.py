"""The Remote Asset API (``build.bazel.remote.asset.v1``) over a real gRPC channel, from a
client written from the published stubs: pushes and fetches by URI and qualifiers, records
that replicate, bootstrap and are cleaned, credential qualifiers that are never stored, and
the bad inputs of a push or fetch. Downloads from origin: ``test_asset_origin``."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Callable, Iterator

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import code_pb2

from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2 as ra
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import manifests, wait_for
from tests.grpc_api.client import Reapi, digest, start_grpc_node
from tests.grpc_api.test_bad_input import code_of

pytestmark = pytest.mark.in_process

URI = "https://mirror.example/pkg-1.0.tar.gz"
ARCHIVE = os.urandom(200_000)  # staged in the tmp dir, not an inline row


def sri(data: bytes, algorithm: str = "sha256") -> str:
    raw = hashlib.new(algorithm, data).digest()
    return f"{algorithm}-{base64.b64encode(raw).decode()}"


def q(**pairs: str) -> list[ra.Qualifier]:
    return [ra.Qualifier(name=k.replace("_", "."), value=v) for k, v in pairs.items()]


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


@pytest.mark.parametrize(
    "root", [b"#!/bin/sh\necho not a directory\n", b"\x08\x01"], ids=["text", "unknown field"]
)
def test_a_pushed_root_directory_that_is_not_a_directory_is_invalid(
    grpc_node: tuple[NodeProcess, Reapi], root: bytes
) -> None:
    """PushDirectory recorded any blob as a root directory (a text file, or a message that is
    no Directory), and FetchDirectory then handed it out: it must parse as one."""
    node, client = grpc_node
    client.batch_update([root])
    with pytest.raises(grpc.RpcError) as info:
        client.push.PushDirectory(
            ra.PushDirectoryRequest(
                uris=["urn:fdc:kura.test:2026:x"], root_directory_digest=digest(root)
            )
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a REAPI Directory" in (info.value.details() or "")
    assert node.index_rows() == 1  # the uploaded blob, and no record
    got = client.fetch.FetchDirectory(ra.FetchDirectoryRequest(uris=["urn:fdc:kura.test:2026:x"]))
    assert got.status.code == code_pb2.NOT_FOUND


def test_a_push_with_one_record_too_large_records_none_of_its_uris(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """A push is all or nothing: the short URI's record fits, the long one's does not, and
    neither is recorded."""
    _node, client = grpc_node
    client.batch_update([ARCHIVE])
    short, long = URI, URI + "x" * 8000  # a long path (a query is not kept in the body)
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


def test_a_pushed_records_secret_qualifiers_key_it_but_are_never_stored(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """Credential qualifiers (Bazel 7's ``http_header:*``, ``bazel.auth_headers``) key a
    pushed record, but no byte of their values reaches the disk (and so no peer)."""
    node, client = grpc_node
    client.batch_update([ARCHIVE])
    secret = "Bearer kura-secret-" + os.urandom(8).hex()
    auth = [
        ra.Qualifier(name="http_header:Authorization", value=secret),
        ra.Qualifier(name="bazel.auth_headers", value='{"h": ["' + secret + '"]}'),
        ra.Qualifier(name="http_header_url:0:Authorization", value=secret),
    ]
    push(client, ARCHIVE, URI, qualifiers=auth)
    assert fetch(client, URI, qualifiers=auth).blob_digest == digest(ARCHIVE)
    other = [ra.Qualifier(name=a.name, value=a.value + "x") for a in auth]
    assert fetch(client, URI, qualifiers=other).status.code == code_pb2.NOT_FOUND
    stored = [p for p in node.data_dir.rglob("*") if p.is_file()]
    assert stored
    assert not [p for p in stored if secret.encode() in p.read_bytes()]
    client.close()
