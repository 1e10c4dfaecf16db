"""Tokens as ``authorization: Bearer`` metadata (the HTTP routes' tokens and rules), and the
message-size limit: advertised in GetCapabilities, enforced by the server."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import Reapi, blob_name, digest, new_upload, start_grpc_node
from tests.integration.test_public_tls import (
    SWAP_TIMEOUT_SECONDS,
    make_ca,
    make_leaf,
    replace,
    served_serial,
)

pytestmark = pytest.mark.in_process

RW, RO = "tok-rw", "tok-ro"


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def test_tokens_map_to_grpc_statuses(start_node: Callable[..., NodeProcess]) -> None:
    node, anonymous = start_grpc_node(start_node, read_write_tokens=RW, read_only_tokens=RO)
    target = anonymous.target
    rw, ro, bad = Reapi(target, RW), Reapi(target, RO), Reapi(target, "nope")
    try:
        blob = os.urandom(1000)
        name = blob_name(blob, upload=new_upload())
        assert code_of(lambda: anonymous.write(name, blob)) is grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: bad.find_missing([blob])) is grpc.StatusCode.UNAUTHENTICATED
        assert code_of(lambda: ro.write(name, blob)) is grpc.StatusCode.PERMISSION_DENIED
        assert code_of(lambda: ro.batch_update([blob])) is grpc.StatusCode.PERMISSION_DENIED
        assert (
            code_of(
                lambda: ro.ac.UpdateActionResult(
                    reapi.UpdateActionResultRequest(
                        action_digest=digest(b"a"), action_result=reapi.ActionResult(exit_code=1)
                    ),
                    metadata=ro.metadata,
                )
            )
            is grpc.StatusCode.PERMISSION_DENIED
        )
        assert node.index_rows() == 0
        assert rw.write(name, blob).committed_size == len(blob)
        assert ro.read(blob_name(blob)) == blob  # a read-only token reads
        assert ro.find_missing([blob]) == []
        refusals = node.metric_sum("kura_auth_refusals_total")
        assert refusals == 5
        assert node.metric('kura_grpc_requests_total{code="PERMISSION_DENIED",method="Write"}') == 1
    finally:
        for c in (anonymous, rw, ro, bad):
            c.close()


def test_message_size_limit_advertised_and_enforced(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, grpc_max_message_bytes="1MiB")
    try:
        caps = c.capabilities.GetCapabilities(reapi.GetCapabilitiesRequest())
        limit = caps.cache_capabilities.max_batch_total_size_bytes
        assert limit == 1024 * 1024 - 64 * 1024
        # Just within the advertised limit: stored.
        fits = [os.urandom(limit // 2), os.urandom(limit // 2)]
        assert [r.status.code for r in c.batch_update(fits).responses] == [0, 0]
        # Over it but under the message limit: refused by kura, nothing stored.
        over = [os.urandom(limit // 2 + 10), os.urandom(limit // 2 + 10)]
        assert code_of(lambda: c.batch_update(over)) is grpc.StatusCode.INVALID_ARGUMENT
        # A message over the limit: refused by grpc itself.
        huge = [os.urandom(1024 * 1024 + 1)]
        assert code_of(lambda: c.batch_update(huge)) is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert node.index_rows() == 2
        assert node.metric("kura_tmp_reserved_bytes") == 0
        # Reading more than the limit in one batch: INVALID_ARGUMENT (REAPI), ByteStream works.
        big = os.urandom(2 * 1024 * 1024)
        c.write(blob_name(big, upload=new_upload()), big)
        assert (
            code_of(
                lambda: c.cas.BatchReadBlobs(reapi.BatchReadBlobsRequest(digests=[digest(big)]))
            )
            is grpc.StatusCode.INVALID_ARGUMENT
        )
        assert c.read(blob_name(big)) == big  # 1 MiB messages fit under the send limit
    finally:
        c.close()


def test_tls_with_a_token(start_node: Callable[..., NodeProcess], tmp_path: Path) -> None:
    """With the public TLS certificate set the gRPC port speaks TLS (grpcs://) and still
    checks tokens; a plaintext client cannot talk to it."""
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = make_ca(pki)
    cert, key = make_leaf(pki, "node", 1)
    node, plain = start_grpc_node(
        start_node, public_tls_cert_path=cert, public_tls_key_path=key, read_write_tokens=RW
    )
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
    channel = grpc.secure_channel(plain.target, credentials)
    try:
        cas = reapi_grpc.ContentAddressableStorageStub(channel)
        request = reapi.BatchUpdateBlobsRequest(
            requests=[reapi.BatchUpdateBlobsRequest.Request(digest=digest(b"tls"), data=b"tls")]
        )
        assert code_of(lambda: cas.BatchUpdateBlobs(request)) is grpc.StatusCode.UNAUTHENTICATED
        response = cas.BatchUpdateBlobs(request, metadata=(("authorization", f"Bearer {RW}"),))
        assert response.responses[0].status.code == 0
        assert node.index_rows() == 1
        plain.token = RW
        assert (
            code_of(lambda: plain.find_missing([b"tls"], timeout=5)) is grpc.StatusCode.UNAVAILABLE
        )
    finally:
        channel.close()
        plain.close()


def test_a_swapped_certificate_is_served_on_the_grpc_port_without_a_restart(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """The gRPC port follows the public certificate files as the HTTPS port does: a new
    handshake gets the new pair, calls over it work, and the process is the same."""
    pki = tmp_path / "pki"
    pki.mkdir()
    ca = make_ca(pki)
    first_cert, first_key = make_leaf(pki, "first", 1001)
    live_cert, live_key = pki / "live.pem", pki / "live.key"
    replace(first_cert, live_cert)
    replace(first_key, live_key)
    node, plain = start_grpc_node(  # two processes: each follows the files (below)
        start_node, public_tls_cert_path=live_cert, public_tls_key_path=live_key, workers=2
    )
    grpc_url = f"https://{plain.target}"
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())

    def stored_over_a_new_channel(data: bytes) -> bool:
        with grpc.secure_channel(plain.target, credentials) as channel:
            cas = reapi_grpc.ContentAddressableStorageStub(channel)
            entry = reapi.BatchUpdateBlobsRequest.Request(digest=digest(data), data=data)
            response = cas.BatchUpdateBlobs(
                reapi.BatchUpdateBlobsRequest(requests=[entry]), timeout=10
            )
            return bool(response.responses[0].status.code == 0)

    try:
        pid = node.proc.pid
        assert served_serial(grpc_url, ca) == 1001
        assert stored_over_a_new_channel(b"before the swap")
        second_cert, second_key = make_leaf(pki, "second", 2002)
        replace(second_key, live_key)
        replace(second_cert, live_cert)
        assert wait_for(lambda: served_serial(grpc_url, ca) == 2002, SWAP_TIMEOUT_SECONDS), (
            node.log()[-2000:]
        )
        # The HTTPS port too: with workers each process follows the files on its own poll.
        assert wait_for(lambda: served_serial(node.url, ca) == 2002, SWAP_TIMEOUT_SECONDS)
        assert stored_over_a_new_channel(b"after the swap")
        assert node.index_rows() == 2
        assert node.proc.pid == pid
        assert node.proc.poll() is None
    finally:
        plain.close()
