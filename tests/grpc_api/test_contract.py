"""What a REAPI client finds out from kura and relies on (issue 28): capabilities that follow the
caller's rights and advertise zstd, zstd batch calls, and instance names of several segments,
over a real gRPC channel to an in-process node, with the client written from the stubs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import zstandard

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests import oneshot
from tests.conftest import NodeProcess
from tests.grpc_api.client import Reapi, blob_name, digest, new_upload, start_grpc_node

pytestmark = pytest.mark.in_process

RW, RO = "tok-rw", "tok-ro"
CAS_TOKEN = "tok-cas-0123456789"  # KURA_TOKENS_FILE: 16 characters at least
ZSTD = reapi.Compressor.ZSTD
REQUEST_METADATA = "build.bazel.remote.execution.v2.requestmetadata-bin"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def node_and_clients(
    start_node: Callable[..., NodeProcess],
) -> Iterator[tuple[NodeProcess, Reapi, Reapi]]:
    node, anonymous = start_grpc_node(start_node, read_write_tokens=RW, read_only_tokens=RO)
    anonymous.close()
    rw, ro = Reapi(anonymous.target, RW), Reapi(anonymous.target, RO)
    yield node, rw, ro
    rw.close()
    ro.close()


def caps(client: Reapi, instance: str = "") -> reapi.CacheCapabilities:
    request = reapi.GetCapabilitiesRequest(instance_name=instance)
    answer = client.capabilities.GetCapabilities(request, metadata=client.metadata)
    assert (answer.high_api_version.major, answer.high_api_version.minor) == (2, 3)
    return answer.cache_capabilities  # type: ignore[no-any-return]


def test_capabilities_follow_the_callers_rights_and_advertise_zstd(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    node, rw, ro = node_and_clients
    refusals = node.metric_sum("kura_auth_refusals_total")
    for instance in ("", "org/team-1"):
        assert caps(rw, instance).action_cache_update_capabilities.update_enabled
        # A read-only token is told not to write, so Bazel does not try and fail on every action.
        assert not caps(ro, instance).action_cache_update_capabilities.update_enabled
    for client in (rw, ro):
        found = caps(client)
        assert list(found.supported_compressors) == [ZSTD]
        assert list(found.supported_batch_update_compressors) == [ZSTD]
        assert found.split_blob_support  # a read
    assert caps(rw).splice_blob_support
    assert not caps(ro).splice_blob_support  # a write
    # Describing a caller is not refusing one.
    assert node.metric_sum("kura_auth_refusals_total") == refusals


def test_a_bazel_older_than_6_is_told_it_may_write(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    """Bazel before 6.0 fails the build on ``update_enabled: false`` (bazel#16624): it is told
    true, by the version in its RequestMetadata; 6.0 and later, and other tools, are told the
    truth."""
    _, _, ro = node_and_clients

    def update_enabled(tool: str, version: str) -> bool:
        details = reapi.RequestMetadata(
            tool_details=reapi.ToolDetails(tool_name=tool, tool_version=version)
        )
        metadata = (*ro.metadata, (REQUEST_METADATA, details.SerializeToString()))
        answer = ro.capabilities.GetCapabilities(reapi.GetCapabilitiesRequest(), metadata=metadata)
        return answer.cache_capabilities.action_cache_update_capabilities.update_enabled  # type: ignore[no-any-return]

    assert update_enabled("bazel", "4.2.3")
    assert update_enabled("bazel", "5.4.1")
    assert not update_enabled("bazel", "6.0.0")
    assert not update_enabled("bazel", "8.1.0")
    assert update_enabled("bazel", "")  # Debian's 4.2.3 sends no version
    assert not update_enabled("buck2", "4.0")
    assert not update_enabled("", "")


def test_a_write_cas_credential_is_told_it_may_not_update_the_action_cache_and_uploads_blobs(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """A pull request's Bazel with ``rights=read,write:cas`` (issue 29): told
    ``update_enabled: false`` (but may splice), so Bazel 6+ builds without an action-cache
    upload to fail; its CAS uploads are stored, an action result it sends anyway is refused.
    A Bazel before 6.0 is still told true (bazel#16624)."""
    credentials = tmp_path / "credentials"
    credentials.write_text(f"{CAS_TOKEN} name=pr-123 rights=read,write:cas\n")
    node, anonymous = start_grpc_node(start_node, read_write_tokens=RW, tokens_file=credentials)
    anonymous.close()
    cas, rw = Reapi(anonymous.target, CAS_TOKEN), Reapi(anonymous.target, RW)
    try:
        for instance in ("", "org/team-1"):
            found = caps(cas, instance)
            assert not found.action_cache_update_capabilities.update_enabled
            assert found.splice_blob_support  # a splice stores a verified blob
            assert caps(rw, instance).action_cache_update_capabilities.update_enabled
        old_bazel = reapi.RequestMetadata(
            tool_details=reapi.ToolDetails(tool_name="bazel", tool_version="5.4.1")
        )
        metadata = (*cas.metadata, (REQUEST_METADATA, old_bazel.SerializeToString()))
        answer = cas.capabilities.GetCapabilities(reapi.GetCapabilitiesRequest(), metadata=metadata)
        assert answer.cache_capabilities.action_cache_update_capabilities.update_enabled
        blob = os.urandom(100_000)
        assert cas.write(blob_name(blob, upload=new_upload()), blob).committed_size == len(blob)
        assert [r.status.code for r in cas.batch_update([b"small"]).responses] == [0]
        assert cas.find_missing([blob, b"small"]) == []
        rows = node.index_rows()
        with pytest.raises(grpc.RpcError) as refused:
            cas.ac.UpdateActionResult(
                reapi.UpdateActionResultRequest(
                    action_digest=digest(b"action"), action_result=reapi.ActionResult()
                ),
                metadata=cas.metadata,
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "lacks the right 'write'" in refused.value.details()
        assert node.index_rows() == rows
    finally:
        cas.close()
        rw.close()


def batch_update(client: Reapi, requests: list[reapi.BatchUpdateBlobsRequest.Request]) -> list[int]:
    answer = client.cas.BatchUpdateBlobs(
        reapi.BatchUpdateBlobsRequest(requests=requests), metadata=client.metadata
    )
    return [r.status.code for r in answer.responses]


def test_zstd_batch_update_and_read_round_trip_byte_identical(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    _, rw, _ = node_and_clients
    text = b"".join(b"line %d of a source-like file\n" % i for i in range(20_000))
    blobs = [text, os.urandom(100_000), b"x", b""]
    level3 = zstandard.ZstdCompressor(level=3)
    sent = [level3.compress(b) for b in blobs]
    assert len(sent[0]) * 10 < len(text)  # the compressible one travels small
    requests = [
        reapi.BatchUpdateBlobsRequest.Request(digest=digest(b), data=z, compressor=ZSTD)
        for b, z in zip(blobs, sent, strict=True)
    ]
    assert batch_update(rw, requests) == [0, 0, 0, 0]
    assert rw.find_missing(blobs) == []
    assert rw.read(blob_name(text)) == text  # stored uncompressed: ByteStream identity reads it

    def batch_read(acceptable: list[int]) -> list[reapi.BatchReadBlobsResponse.Response]:
        request = reapi.BatchReadBlobsRequest(
            digests=[digest(b) for b in blobs], acceptable_compressors=acceptable
        )
        return list(rw.cas.BatchReadBlobs(request, metadata=rw.metadata).responses)

    zstd = batch_read([ZSTD])
    assert [r.compressor for r in zstd] == [ZSTD] * 4
    assert [zstandard.ZstdDecompressor().decompress(r.data) for r in zstd] == blobs
    assert len(zstd[0].data) * 10 < len(text)
    plain = batch_read([])
    assert [r.compressor for r in plain] == [reapi.Compressor.IDENTITY] * 4
    assert [r.data for r in plain] == blobs


def test_zstd_batch_bombs_and_unknown_compressors_are_refused_and_store_nothing(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    node, rw, _ = node_and_clients
    rows = node.index_rows()
    zeros = bytes(1024 * 1024)
    bomb = zstandard.ZstdCompressor(level=19).compress(zeros)  # ~100 bytes for 1 MiB
    declared = digest(zeros[:4096])  # says 4 KiB; the frame grows to 1 MiB
    good = os.urandom(2000)
    requests = [
        reapi.BatchUpdateBlobsRequest.Request(digest=declared, data=bomb, compressor=ZSTD),
        reapi.BatchUpdateBlobsRequest.Request(
            digest=digest(good), data=good, compressor=reapi.Compressor.DEFLATE
        ),
        reapi.BatchUpdateBlobsRequest.Request(
            digest=digest(b"corrupt"), data=b"not a zstd frame", compressor=ZSTD
        ),
    ]
    invalid = INVALID.value[0]
    assert batch_update(rw, requests) == [invalid, invalid, invalid]
    # A declared size past the batch limit is refused before anything is decompressed.
    huge = reapi.Digest(hash=declared.hash, size_bytes=64 * 1024 * 1024)
    with pytest.raises(grpc.RpcError) as refused:
        batch_update(
            rw, [reapi.BatchUpdateBlobsRequest.Request(digest=huge, data=bomb, compressor=ZSTD)]
        )
    assert refused.value.code() is INVALID
    assert "declared size" in (refused.value.details() or "")
    assert node.index_rows() == rows
    assert node.staging_files() == []


def test_instance_names_of_several_segments_are_one_namespace_with_http(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    node, rw, _ = node_and_clients
    a, b = os.urandom(3000), os.urandom(5000)
    assert [r.status.code for r in rw.batch_update([a], instance="org/team-1").responses] == [0]
    name = blob_name(b, instance="a/b.c/d_e-1", upload=new_upload())
    assert rw.write(name, b).committed_size == len(b)
    assert rw.read(blob_name(a, instance="org/team-1")) == a
    assert rw.read(blob_name(b, instance="a/b.c/d_e-1")) == b
    # Each instance is its own namespace: not the default one, not another.
    assert rw.find_missing([a]) == [digest(a).hash]
    assert rw.find_missing([a], instance="org") == [digest(a).hash]
    # Over HTTP, the namespace is the segments joined by '~'.
    auth = {"Authorization": f"Bearer {RW}"}
    url = f"{node.url}/ns/org~team-1/cache/cas/{digest(a).hash}"
    assert oneshot.get(url, headers=auth).content == a
    # ... and cleaning it over HTTP empties the gRPC instance.
    assert oneshot.delete(f"{node.url}/ns/org~team-1/cache", headers=auth).status_code == 204
    assert rw.find_missing([a], instance="org/team-1") == [digest(a).hash]


REFUSED = [
    ("org/blobs", "reserved"),
    ("uploads", "reserved"),
    ("compressed-blobs/x", "reserved"),
    ("a//b", "empty segment"),
    ("/a", "empty segment"),
    ("a/", "empty segment"),
    ("a~b", "'/'"),
    ("a/.hidden", "not starting with '.'"),
    ("a/b c", "letters, digits"),
    ("x" * 129, "longer than 128 characters"),
]


def test_ambiguous_or_malformed_instance_names_are_refused_with_the_reason(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    node, rw, _ = node_and_clients
    for instance, why in REFUSED:
        with pytest.raises(grpc.RpcError) as refused:
            rw.batch_update([os.urandom(100)], instance=instance)
        assert refused.value.code() is INVALID, instance
        assert why in (refused.value.details() or ""), (instance, refused.value.details())
        with pytest.raises(grpc.RpcError) as refused:
            rw.write(blob_name(b"y" * 10, instance=instance, upload=new_upload()), b"y" * 10)
        assert refused.value.code() is INVALID, instance
    assert node.index_rows() == 0
    assert node.staging_files() == []


def test_a_digest_function_other_than_sha256_is_refused(
    node_and_clients: tuple[NodeProcess, Reapi, Reapi],
) -> None:
    """REAPI 2.2 added ``digest_function`` to the requests: kura advertises SHA-256 alone, so a
    BLAKE3 request is INVALID_ARGUMENT, not a lookup of its hash as SHA-256."""
    node, rw, _ = node_and_clients
    blob = os.urandom(100)
    blake3 = reapi.DigestFunction.BLAKE3
    calls = [
        lambda: rw.cas.FindMissingBlobs(
            reapi.FindMissingBlobsRequest(blob_digests=[digest(blob)], digest_function=blake3),
            metadata=rw.metadata,
        ),
        lambda: rw.cas.BatchUpdateBlobs(
            reapi.BatchUpdateBlobsRequest(
                requests=[reapi.BatchUpdateBlobsRequest.Request(digest=digest(blob), data=blob)],
                digest_function=blake3,
            ),
            metadata=rw.metadata,
        ),
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() is INVALID
        assert "BLAKE3 is not supported" in (refused.value.details() or "")
    sha256 = reapi.DigestFunction.SHA256
    request = reapi.FindMissingBlobsRequest(blob_digests=[digest(blob)], digest_function=sha256)
    assert len(rw.cas.FindMissingBlobs(request, metadata=rw.metadata).missing_blob_digests) == 1
    assert node.index_rows() == 0
