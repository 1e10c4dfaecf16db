"""``Expect: 100-continue`` is answered only once the request could succeed.

A client that sends ``Expect: 100-continue`` waits for ``100 Continue`` before it sends the body,
so that a request the server will refuse costs no upload (RFC 9110 §10.1.1: a server that
would refuse the request answers the final status instead of 100). aiohttp's default expect
handler writes ``100 Continue`` as soon as the head is parsed, before the handler runs, so an
over-limit upload got ``100`` and then ``413`` after the client had started to send.

``guarded(route_defs)`` gives every route one expect handler that first runs the checks the
route's handler would run before it reads a byte of body, from the ``EndpointSpec`` the
``endpoint`` decorator declared: credentials (401/403), then for an upload route the declared
Content-Length against the route's limit and the disk budget (413/507), free disk space and
room in the tmp budget (503 + Retry-After); before them all, a body in a coding kura does
not take (415, 501: ``kura.api.body_codings``). A failing check is answered with the handler's own
error response (same status table, same body style) and the connection is closed; nothing is
reserved or staged. The handler still makes every check itself when the body arrives: this is
a forecast, not a reservation. A client that closed before its ``100`` is no error
(``kura.api.malformed.client_gone``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11

from kura.api import body_codings, cross_site
from kura.api.errors import error_response
from kura.api.http import EndpointSpec, ctx, declared_length, endpoint_spec
from kura.api.malformed import client_gone, log_client_gone
from kura.core.errors import KuraError

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


Precheck = Callable[[web.Request], web.StreamResponse | None]


def guarded(
    route_defs: Iterable[web.RouteDef], precheck: Precheck | None = None
) -> list[web.RouteDef]:
    """``route_defs`` with ``expect_continue`` as every route's expect handler (same order).

    ``precheck`` runs first and may answer instead (the internal listener's peer credentials,
    which its middleware checks too late for an expectation: aiohttp runs the expect handler
    before any middleware)."""

    async def handler(request: web.Request) -> web.StreamResponse | None:
        if precheck is not None and request.headers.get(hdrs.EXPECT) is not None:
            refused = precheck(request)
            if refused is not None:
                return refused
        return await expect_continue(request)

    return [
        web.RouteDef(d.method, d.path, d.handler, {**d.kwargs, "expect_handler": handler})
        for d in route_defs
    ]


async def expect_continue(request: web.Request) -> web.StreamResponse | None:
    """Answer an ``Expect`` header: the final error response if a pre-body check fails (the
    connection is then closed), else ``100 Continue`` and None (the handler runs). An expectation
    other than ``100-continue`` is 417, as in aiohttp's default handler."""
    if request.version != HttpVersion11:
        return None  # HTTP/1.0 has no 100 Continue (RFC 9110 §10.1.1)
    expect = request.headers.get(hdrs.EXPECT, "")
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    # What the app's outer middleware refuses (http.track_handlers), refused before the 100.
    refused = cross_site.refusal(request) or body_codings.refusal(request)
    if refused is not None:
        return refused
    spec = endpoint_spec(request.match_info.handler)
    if spec is not None:
        started = time.perf_counter()
        try:
            _check(request, spec)
        except KuraError as exc:
            response = error_response(exc, spec.style)
            response.force_close()  # the body was never asked for: do not wait for it
            ctx(request).metrics.observe_request(
                spec.protocol, request.method, response.status, time.perf_counter() - started
            )
            return response
    try:
        await request.writer.write(CONTINUE)
    except Exception as exc:
        if not client_gone(exc):
            raise
        # The client closed before its 100 (a cancelled upload): nothing to answer, nothing
        # staged. This response is never sent (aiohttp drops a write that fails for a reset
        # connection quietly); raising would log a traceback at ERROR (issue 26).
        log_client_gone("HTTP", f"{request.method} {request.path} before its 100 Continue")
        gone = web.Response(status=499)
        gone.force_close()
        return gone
    request.writer.output_size = 0  # the 100 is not part of the response
    return None


def _check(request: web.Request, spec: EndpointSpec) -> None:
    c = ctx(request)
    if spec.access is not None:
        spec.authorize(request)
    if spec.body_limit is None:
        return
    length = declared_length(request)
    # The checks ArtifactWriter.put_stream makes before it stages a byte, in the same order.
    c.writer.check_size(length, spec.body_limit(c.settings))
    if c.writer.stages(length):  # an inline body takes nothing from the tmp budget
        c.writer.budget.check_room(max(1, length or 0))
