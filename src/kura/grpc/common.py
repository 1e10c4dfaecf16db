"""What every gRPC service shares: the context, digests and instance names, tokens, errors.

* Instance names select namespaces (``kura.grpc.resource_names.namespace_of``); the empty one
  names none, so a credential's overlay applies (``kura.core.overlay``): ``authorize`` and
  ``view`` decide what a call reads and writes, once, where its right is checked.
* A digest is SHA-256 (64 lowercase hex digits) with ``size_bytes >= 0`` (INVALID_ARGUMENT
  otherwise); the empty blob is always present (REAPI).
* Tokens: ``authorization: Bearer <token>`` metadata, checked by the HTTP routes'
  ``TokenAuth``; UNAUTHENTICATED for none or an unknown one, PERMISSION_DENIED for a
  credential without the right the call needs, named in the message (``kura.api.auth`` rules,
  mapped by ``STATUS``).
* Errors: ``rpc`` maps kura's exception tree to one gRPC status per class, as
  ``kura.api.errors`` maps it to HTTP, and counts every call in
  ``kura_grpc_requests_total{method,code}``.
* Malformed input follows the listeners' quiet policy (``kura.api.malformed``): a message that
  does not decode as its method's protobuf is INVALID_ARGUMENT with at most a rate-limited INFO
  line (``TolerantDecoding``; grpcio itself answers UNKNOWN and logs an ERROR traceback each).
* A call the client cancelled (or whose connection dropped) is counted with code CANCELLED and
  is not logged, by kura or by grpcio (``_ClientGoneFilter``): it is not a server error.
* A call that fails for want of descriptors or memory (EMFILE, ENFILE, ENOMEM) is UNAVAILABLE,
  as HTTP answers 503, with one WARNING line per interval for all of them (``_shortage``).
* A server-streaming call (Read, GetTree) whose client takes no message for
  ``KURA_BODY_IDLE_TIMEOUT_SECONDS`` is cut (``_SendWatchdog``), counted DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import Counter

from kura.api.action_cache import EMPTY_SHA256
from kura.api.action_lookup import cas_ref
from kura.api.auth import Access, TokenAuth
from kura.api.file_response import DamagedBlob, verified_chunks
from kura.api.malformed import (
    disk_full_error,
    log_malformed,
    log_shortage,
    short_of_resources,
)
from kura.api.metrics import KuraMetrics
from kura.core import errors as e
from kura.core.keys import HEX_SHA256, validate
from kura.core.overlay import Asked, NamespaceView
from kura.grpc.resource_names import namespace_of
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.settings import Settings
from kura.storage.artifact import StoredBody
from kura.storage.fsync import disk_full
from kura.storage.overlay import overlay_reader
from kura.storage.ports import ArtifactReader, ArtifactWriter

log = logging.getLogger(__name__)
T = TypeVar("T")

PROTOCOL = "grpc"  # the protocol label of kura_cache_lookups_total and the byte counters
# Room for the request's own fields around the blob data in a batch call.
BATCH_OVERHEAD_BYTES = 64 * 1024

# The RPCs served: the closed set of the ``method`` label.
METHODS = (
    "GetCapabilities",
    "FindMissingBlobs",
    "BatchUpdateBlobs",
    "BatchReadBlobs",
    "GetTree",
    "SplitBlob",
    "SpliceBlob",
    "GetActionResult",
    "UpdateActionResult",
    "Read",
    "Write",
    "QueryWriteStatus",
    "FetchBlob",
    "FetchDirectory",
    "PushBlob",
    "PushDirectory",
)


class OutOfRange(e.InvalidRequest):
    """A ByteStream ``read_offset`` outside the blob (google/bytestream/bytestream.proto:
    "OUT_OF_RANGE")."""


STATUS: tuple[tuple[type[e.KuraError], grpc.StatusCode], ...] = (
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (e.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (e.Forbidden, grpc.StatusCode.PERMISSION_DENIED),
    (e.NotFound, grpc.StatusCode.NOT_FOUND),
    (e.Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (e.PayloadTooLarge, grpc.StatusCode.INVALID_ARGUMENT),
    (e.UnprocessableEntity, grpc.StatusCode.FAILED_PRECONDITION),
    (e.InsufficientStorage, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (e.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (e.Corruption, grpc.StatusCode.DATA_LOSS),
)


def code_for(exc: e.KuraError) -> grpc.StatusCode:
    for cls, code in STATUS:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


@dataclass
class GrpcContext:
    """What the servicers need, built once by ``kura.grpc.server``."""

    settings: Settings
    reader: ArtifactReader
    writer: ArtifactWriter
    auth: TokenAuth
    metrics: KuraMetrics
    requests: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "kura_grpc_requests_total",
            "REAPI gRPC calls by method and final status code.",
            ["method", "code"],
            registry=self.metrics.registry,
        )
        for method in METHODS:  # the families exist (at 0) before the first call
            self.requests.labels(method, "OK")

    @property
    def max_batch_bytes(self) -> int:
        """``max_batch_total_size_bytes``: blob bytes one batch call may carry."""
        return self.settings.grpc_max_message_bytes - BATCH_OVERHEAD_BYTES

    def view(
        self, context: grpc.aio.ServicerContext[Any, Any], access: Access, ns: str
    ) -> NamespaceView:
        """What the call reads and writes once its token allows ``access`` to the namespace
        ``ns`` it names (``""``: none; ``kura.core.overlay``); ``Unauthenticated`` or
        ``Forbidden`` otherwise."""
        return self._view(context, access, lambda: ns)

    def _view(
        self, context: grpc.aio.ServicerContext[Any, Any], access: Access, ns: Callable[[], str]
    ) -> NamespaceView:
        def asked() -> Asked:
            named = ns()
            return Asked(named or None, "", "instance name")

        view = self.auth.view(_authorization(context), access, asked)
        assert view is not None  # the default namespace "" is a namespace
        return view

    def reader_for(self, view: NamespaceView) -> ArtifactReader:
        """The node's reader, reading through ``view``'s namespaces in order
        (``kura.storage.overlay``): the reader itself for one namespace."""
        return overlay_reader(self.reader, view.reads)

    def writable(self, view: NamespaceView, access: Access, refusal: str | None = None) -> str:
        """``TokenAuth.writable``: the namespace ``view`` writes, for a call whose right
        (``read``) let it through but which stores (SplitBlob's chunks, a verified download);
        a refusal logged like every other."""
        return self.auth.writable(view, access, refusal)

    def allows(self, context: grpc.aio.ServicerContext[Any, Any], access: Access, ns: str) -> bool:
        """Whether the call's token allows ``access`` to ``ns`` (``TokenAuth.allows``)."""
        return self.auth.allows(_authorization(context), access, lambda: ns)

    def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], access: Access, instance_name: str
    ) -> NamespaceView:
        """What the call reads and writes: the namespace ``instance_name`` selects, or the
        token's overlay (``view``); ``InvalidRequest``, ``Unauthenticated`` or ``Forbidden``
        otherwise."""
        return self._view(context, access, lambda: namespace_of(instance_name))

    async def looked_up(self, lookup: Awaitable[T]) -> T:
        """``await lookup``, counted in ``kura_cache_lookups_total{protocol="grpc"}``: a hit, or a
        miss when it raises ``NotFound`` (re-raised)."""
        try:
            found = await lookup
        except e.NotFound:
            self.metrics.count_lookup("grpc", False)
            raise
        self.metrics.count_lookup("grpc", True)
        return found


# The REAPI's per-call client details (remote_execution.proto, RequestMetadata).
REQUEST_METADATA_KEY = "build.bazel.remote.execution.v2.requestmetadata-bin"
# Bazel before 6.0 fails the whole build when --remote_upload_local_results (its default) meets
# update_enabled: false ("the current account is not authorized to write local results");
# 6.0 reads it as "do not upload" (bazelbuild/bazel#16624, #16724).
FIRST_BAZEL_READING_UPDATE_ENABLED = 6


def fails_on_update_disabled(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    """Whether the caller is a Bazel older than 6.0 by its ``RequestMetadata`` (tool_details,
    e.g. ``bazel`` ``4.2.3``): such a client must be told ``update_enabled: true`` even when its
    writes will be refused, or it refuses to build at all. A Bazel that sends no version is
    taken for an old one (Debian's bazel-bootstrap 4.2.3 sends ``bazel`` and an empty version);
    any other tool, or none named, is taken to read the capability."""
    for key, value in context.invocation_metadata() or ():
        if key != REQUEST_METADATA_KEY or not isinstance(value, bytes):
            continue
        try:
            tool = reapi.RequestMetadata.FromString(value).tool_details
        except DecodeError:
            return False
        major = re.match(r"\d+", tool.tool_version)
        return tool.tool_name == "bazel" and (
            major is None or int(major.group()) < FIRST_BAZEL_READING_UPDATE_ENABLED
        )
    return False


async def stored_blob(
    gc: GrpcContext,
    ns: str,
    sha256: str,
    size_bytes: int,
    what: str,
    reader: ArtifactReader | None = None,
) -> AsyncGenerator[bytes, None]:
    """The stored blob ``sha256`` of namespace ``ns`` (read by ``reader``, default the
    node's), opened and read as ``verified_body``. Close it (``aclosing``) to release the file
    early."""
    body = await (reader or gc.reader).read(cas_ref(ns, sha256))
    async for piece in verified_body(gc, body, sha256, size_bytes, what):
        yield piece


async def verified_body(
    gc: GrpcContext,
    body: StoredBody,
    sha256: str,
    size_bytes: int,
    what: str,
    limit_bytes: int | None = None,
) -> AsyncGenerator[bytes, None]:
    """``body`` (closed here) as the blob ``sha256`` in pieces, verified against its stored
    digest as they are read (``verified_chunks``: the last piece only once the whole blob
    hashed right). ``NotFound`` when it is not stored with ``size_bytes``, or damaged (storage
    then quarantines it); ``InvalidRequest`` when it is larger than ``limit_bytes``."""
    try:
        if body.manifest.size != size_bytes:
            raise e.NotFound(
                f"{what} {sha256} is stored with size {body.manifest.size}, not {size_bytes}"
            )
        if limit_bytes is not None and body.manifest.size > limit_bytes:
            raise e.InvalidRequest(
                f"{what} {sha256} is larger than {limit_bytes} bytes: use ByteStream.Read"
            )
        async for piece in verified_chunks(gc.reader, body):
            yield piece
    except DamagedBlob:
        raise e.NotFound(f"{what} {sha256} failed verification; treated as a miss") from None
    finally:
        body.close()


def _authorization(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str):
            return value
    return None


Digest = reapi.Digest  # what the batch calls' work (``kura.grpc.batch``) takes


def check_digest(digest: reapi.Digest) -> str:
    """The digest's hash; ``InvalidRequest`` unless it is SHA-256 with a size >= 0."""
    validate(digest.hash, HEX_SHA256, "digest hash")
    if digest.size_bytes < 0:
        raise e.InvalidRequest(f"digest {digest.hash} has a negative size {digest.size_bytes}")
    return digest.hash


def is_empty(digest: reapi.Digest) -> bool:
    return digest.size_bytes == 0 and digest.hash == EMPTY_SHA256


@dataclass(frozen=True)
class Undecodable:
    """What ``TolerantDecoding`` hands a servicer for a message that did not decode."""

    message: str


class _ClientGoneFilter(logging.Filter):
    """grpcio logs at ERROR, with a traceback, a send that failed because the client went
    away in the middle of a streaming call (``ExecuteBatchError raised in core by servicer
    method``). The call is counted CANCELLED (``streaming_rpc``); the line is dropped unless
    the log is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if type(exc).__name__ != "ExecuteBatchError":  # grpc._cython.cygrpc's, private
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        record.exc_info, record.exc_text = None, None
        return logging.getLogger().isEnabledFor(logging.DEBUG)


logging.getLogger("grpc._cython.cygrpc").addFilter(_ClientGoneFilter())


class TolerantDecoding(grpc.aio.ServerInterceptor):
    """Decode each request message so that a malformed one reaches the servicer as
    ``Undecodable`` (then INVALID_ARGUMENT from ``rpc``/``streaming_rpc``) instead of raising
    inside grpcio, which answers UNKNOWN and logs an ERROR traceback per message. Methods kura
    does not serve stay grpcio's (UNIMPLEMENTED, not logged).

    The methods in ``pre_encoded`` yield their responses already encoded (``bytes``): their
    serializer is replaced by one that sends those as they are (``ByteStream.Read``,
    ``kura.grpc.bytestream.read_response``)."""

    def __init__(self, pre_encoded: frozenset[str] = frozenset()) -> None:
        self.pre_encoded = pre_encoded

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        decode = getattr(handler, "request_deserializer", None)
        if handler is None or decode is None:
            return handler
        # grpcio's handlers are named tuples (grpc._utilities.RpcMethodHandler).
        changes: dict[str, Any] = {"request_deserializer": _tolerant(decode)}
        if handler_call_details.method in self.pre_encoded:
            changes["response_serializer"] = _as_encoded
        replaced: grpc.RpcMethodHandler[Any, Any] = handler._replace(  # type: ignore[attr-defined]
            **changes
        )
        return replaced


def _as_encoded(response: bytes) -> bytes:
    """The serializer of a method whose responses are encoded already: each as it is."""
    return response


def _tolerant(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def tolerant(raw: bytes) -> Any:
        try:
            return decode(raw)
        except DecodeError as exc:
            return Undecodable(str(exc))

    return tolerant


def _refuse_undecodable(request: Any) -> Any:
    """``request``, unless it is ``Undecodable`` (``InvalidRequest``, quietly logged) or names
    a digest function other than SHA-256 (``InvalidRequest``: REAPI 2.2 added
    ``digest_function`` to the requests, and kura advertises SHA-256 alone; 0, unset, means the
    default, SHA-256 here); a stream of requests is checked message by message as the servicer
    reads it."""
    if isinstance(request, Undecodable):
        log_malformed("gRPC", request.message)
        raise e.InvalidRequest(f"the request message is malformed: {request.message}")
    if hasattr(request, "__aiter__"):
        return _checked_stream(request)
    function = getattr(request, "digest_function", 0)
    if function not in (0, reapi.DigestFunction.SHA256):
        name = _FUNCTIONS.get(function, str(function))
        raise e.InvalidRequest(f"digest_function {name} is not supported: only SHA256 is")
    return request


_FUNCTIONS = {int(number): name for name, number in reapi.DigestFunction.Value.items()}


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield _refuse_undecodable(request)


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Unary = Callable[[S, Req, "grpc.aio.ServicerContext[Req, Resp]"], Coroutine[Any, Any, Resp]]
Streaming = Callable[[S, Req, "grpc.aio.ServicerContext[Req, Resp]"], AsyncIterator[Resp]]


def rpc(method: str) -> Callable[[Unary[S, Req, Resp]], Unary[S, Req, Resp]]:
    """Decorate a unary-response servicer method: KuraError → its status, every call counted."""
    assert method in METHODS

    def wrap(fn: Unary[S, Req, Resp]) -> Unary[S, Req, Resp]:
        @functools.wraps(fn)
        async def handler(
            self: S, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
        ) -> Resp:
            gc: GrpcContext = self.gc  # type: ignore[attr-defined]
            try:
                response = await fn(self, _refuse_undecodable(request), context)
            except e.KuraError as exc:
                await _abort(gc, method, context, exc)
            except BaseException as exc:
                if short_of_resources(exc):
                    await _abort(gc, method, context, _shortage(method, exc))
                if disk_full(exc):  # passes: RESOURCE_EXHAUSTED, never INTERNAL
                    await _abort(gc, method, context, disk_full_error("gRPC", method, exc))
                _count_failure(gc, method, exc)
                raise
            gc.requests.labels(method, "OK").inc()
            return response

        return handler

    return wrap


class _SendWatchdog:
    """Cuts a server-streaming call whose client takes no message for ``seconds``
    (``KURA_BODY_IDLE_TIMEOUT_SECONDS``, the uploads' idle timeout): ``with watchdog:`` around
    each ``yield``. grpcio sends a yielded message before it asks for the next one, and a send
    completes only once the transport took it, so a client that stopped reading leaves the
    generator suspended at its ``yield`` with a message or more buffered in the server. The
    watchdog then cancels the call's task: grpcio cancels the call (the client sees CANCELLED),
    the generator and its file are closed, and its buffers are freed once the transport lets go
    of them (what is already queued on the connection goes when it closes). 200 stalled Reads
    once held their calls, files and 1.1 GB for as long as their clients stayed connected, and
    kept 790 MB after they left (``kit.allocator``; issue 26)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._task = asyncio.current_task()
        self._timer: asyncio.TimerHandle | None = None

    def _cut(self) -> None:
        self.fired = True
        if self._task is not None:
            self._task.cancel()

    def __enter__(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.seconds, self._cut)

    def __exit__(self, *exc_info: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


def streaming_rpc(method: str) -> Callable[[Streaming[S, Req, Resp]], Streaming[S, Req, Resp]]:
    """``rpc`` for a server-streaming method (an async generator)."""
    assert method in METHODS

    def wrap(fn: Streaming[S, Req, Resp]) -> Streaming[S, Req, Resp]:
        @functools.wraps(fn)
        async def handler(
            self: S, request: Req, context: grpc.aio.ServicerContext[Req, Resp]
        ) -> AsyncIterator[Resp]:
            gc: GrpcContext = self.gc  # type: ignore[attr-defined]
            responses: AsyncIterator[Resp] | None = None
            watchdog = _SendWatchdog(float(gc.settings.body_idle_timeout_seconds))
            try:
                responses = fn(self, _refuse_undecodable(request), context)
                async for response in responses:
                    with watchdog:
                        yield response
            except e.KuraError as exc:
                await _abort(gc, method, context, exc)
            except BaseException as exc:
                if short_of_resources(exc):
                    await _abort(gc, method, context, _shortage(method, exc))
                if disk_full(exc):  # passes: RESOURCE_EXHAUSTED, never INTERNAL
                    await _abort(gc, method, context, disk_full_error("gRPC", method, exc))
                if watchdog.fired:
                    gc.requests.labels(method, "DEADLINE_EXCEEDED").inc()
                    log.info(
                        "cut a %s stream whose client took no message for %g s",
                        method,
                        watchdog.seconds,
                    )
                else:
                    _count_failure(gc, method, exc)
                raise
            finally:
                if responses is not None:  # now, not whenever the collector gets to it
                    await responses.aclose()  # type: ignore[attr-defined]
            gc.requests.labels(method, "OK").inc()

        return handler

    return wrap


async def _abort(
    gc: GrpcContext, method: str, context: grpc.aio.ServicerContext[Any, Any], exc: e.KuraError
) -> Any:
    code = code_for(exc)
    gc.requests.labels(method, code.name).inc()
    if code is grpc.StatusCode.INTERNAL:
        log.error("%s failed: %s", method, exc.message)
    await context.abort(code, exc.message)


def _shortage(method: str, exc: BaseException) -> e.Unavailable:
    """UNAVAILABLE for a call that failed for want of descriptors or memory, as HTTP answers
    503 (``kura.api.malformed.short_of_resources``): the condition passes, so not INTERNAL,
    and one budgeted line for all such calls, not a traceback each."""
    assert isinstance(exc, OSError)
    log_shortage("gRPC", method, exc)
    return e.Unavailable(f"the node is short of descriptors or memory now ({exc.strerror})")


def _count_failure(gc: GrpcContext, method: str, exc: BaseException) -> None:
    if isinstance(exc, grpc.aio.AbortError):
        return  # counted where it was raised
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        # The client cancelled or went away: grpcio cancels a unary call's task, and closes a
        # streaming call's generator at its ``yield`` (GeneratorExit). Not a server error.
        gc.requests.labels(method, "CANCELLED").inc()
    else:
        gc.requests.labels(method, "INTERNAL").inc()
        log.exception("%s failed", method)
