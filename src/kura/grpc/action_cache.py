"""REAPI ``ActionCache``: ``GetActionResult`` and ``UpdateActionResult``.

The same entries as the Bazel HTTP cache's ``/ac/`` (``ArtifactRef("bazel", namespace,
"ac/<hex>")``) under the same rules (``kura.api.action_cache``): a stored result is a hit only
while every output it references (output files, stdout, stderr, every file of every output
directory's ``Tree``) is in the CAS, otherwise NOT_FOUND, counted as a miss in
``kura_cache_lookups_total{protocol="grpc"}`` (``kura.api.action_lookup``, shared with HTTP).
An update must be a valid ``ActionResult`` of at most 4 MiB (INVALID_ARGUMENT otherwise, nothing
stored); the stored bytes are its serialization, which the HTTP route serves as is.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from kura.api.action_cache import MAX_ACTION_RESULT_BYTES, parse_action_result
from kura.api.action_lookup import ac_ref, find_action_result, tree_bounds
from kura.api.auth import Access
from kura.core.errors import PayloadTooLarge
from kura.grpc.common import GrpcContext, check_digest, rpc
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from kura.storage.ports import one_piece

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class ActionCache(reapi_grpc.ActionCacheServicer):
    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc

    @rpc("GetActionResult")
    async def GetActionResult(
        self, request: reapi.GetActionResultRequest, context: Ctx
    ) -> reapi.ActionResult:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        ref = ac_ref(view.home, check_digest(request.action_digest))
        _manifest, _data, result = await self.gc.looked_up(
            find_action_result(self.gc.reader_for(view), ref, tree_bounds(self.gc.settings))
        )
        return result

    @rpc("UpdateActionResult")
    async def UpdateActionResult(
        self, request: reapi.UpdateActionResultRequest, context: Ctx
    ) -> reapi.ActionResult:
        view = self.gc.authorize(context, Access.WRITE, request.instance_name)
        ref = ac_ref(view.writable, check_digest(request.action_digest), view.writer)
        data = request.action_result.SerializeToString()
        limit = min(MAX_ACTION_RESULT_BYTES, self.gc.settings.max_artifact_bytes)
        if len(data) > limit:
            raise PayloadTooLarge(f"the ActionResult is larger than {limit} bytes", limit)
        parse_action_result(data)
        await self.gc.writer.put_stream(
            ref,
            one_piece(data),
            declared_length=len(data),
            limit_bytes=limit,
            content_type="application/octet-stream",
        )
        return request.action_result
