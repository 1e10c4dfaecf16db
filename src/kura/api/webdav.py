"""The WebDAV subset sccache needs, under ``KURA_WEBDAV_PREFIX`` (default ``/dav``).

sccache 0.16 (opendal) on start-up GETs ``.sccache_check``, PROPFINDs the root, MKCOLs it and
PUTs the check file; on a miss it PROPFINDs each parent, MKCOLs the missing ones and PUTs the
object (clients.md). If PROPFIND or MKCOL answered 405 every write would fail, so:

* collections are virtual: ``MKCOL`` always answers 201, and ``PROPFIND`` on the root or on a
  path ending in ``/`` answers 207 with a collection;
* every PROPFIND answer carries ``getlastmodified`` (a virtual collection's is the current time):
  opendal's parser requires it and fails the whole write ("deserialize xml") without it;
* ``PROPFIND`` on a stored key answers 207 with its length, otherwise 404;
* ``PUT`` answers 201 for a new key and 204 for a replaced one (RFC 4918 §9.7.1).

Entries live in namespace ``""``, or under ``/ns/{namespace}{prefix}`` in that namespace
(``kura.api.scope``); a ``DELETE`` of the root collection cleans it (``kura.api.namespace``).
"""

from __future__ import annotations

from email.utils import formatdate
from xml.sax.saxutils import escape

from aiohttp import web

from kura.api.auth import Access
from kura.api.blob import serve, store
from kura.api.http import ctx, endpoint, read_ref, read_small_body, reader_of, write_ref
from kura.core.errors import NotFound
from kura.core.keys import PATH_KEY, validate
from kura.storage.artifact import ArtifactRef

PROTOCOL = "webdav"
PROPFIND_BODY_LIMIT_BYTES = 64 * 1024


def _key(request: web.Request) -> str:
    return validate(request.match_info["key"], PATH_KEY, "WebDAV path")


def _ref(request: web.Request) -> ArtifactRef:
    return read_ref(request, "dav", _key(request))


def _multistatus(href: str, props: str) -> web.Response:
    body = (
        '<?xml version="1.0" encoding="utf-8"?>\n<D:multistatus xmlns:D="DAV:"><D:response>'
        f"<D:href>{escape(href)}</D:href><D:propstat><D:prop>{props}</D:prop>"
        "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response></D:multistatus>"
    )
    return web.Response(status=207, text=body, content_type="application/xml", charset="utf-8")


def _collection(href: str) -> web.Response:
    modified = formatdate(usegmt=True)
    return _multistatus(
        href,
        "<D:resourcetype><D:collection/></D:resourcetype>"
        f"<D:getlastmodified>{modified}</D:getlastmodified>",
    )


@endpoint(PROTOCOL, Access.READ)
async def get(request: web.Request) -> web.StreamResponse:
    return await serve(request, _ref(request), PROTOCOL)


@endpoint(PROTOCOL, Access.WRITE, body_limit=lambda s: s.max_artifact_bytes)
async def put(request: web.Request) -> web.StreamResponse:
    result = await store(
        request,
        write_ref(request, "dav", _key(request)),
        PROTOCOL,
        limit_bytes=ctx(request).settings.max_artifact_bytes,
    )
    return web.Response(status=201 if result.created else 204)


@endpoint(PROTOCOL, Access.WRITE)
async def mkcol(request: web.Request) -> web.StreamResponse:
    key = request.match_info.get("key", "").rstrip("/")
    if key:
        validate(key, PATH_KEY, "WebDAV path")
    return web.Response(status=201)


@endpoint(PROTOCOL, Access.READ)
async def propfind(request: web.Request) -> web.StreamResponse:
    await read_small_body(request, PROPFIND_BODY_LIMIT_BYTES, PROTOCOL)
    key = request.match_info.get("key", "")
    if key == "" or key.endswith("/"):
        if key:
            validate(key.rstrip("/"), PATH_KEY, "WebDAV path")
        return _collection(request.path)
    service = reader_of(request)  # an artifact id: the first namespace only
    manifest = await service.read_manifest(service.artifact_id(_ref(request)))
    if manifest is None:
        raise NotFound("Not found")
    modified = formatdate(manifest.created_at_ms / 1000, usegmt=True)
    return _multistatus(
        request.path,
        f"<D:resourcetype/><D:getcontentlength>{manifest.size}</D:getcontentlength>"
        f"<D:getlastmodified>{modified}</D:getlastmodified>",
    )


@endpoint(PROTOCOL, None)
async def options(request: web.Request) -> web.StreamResponse:
    return web.Response(
        status=200, headers={"DAV": "1", "Allow": "OPTIONS, GET, HEAD, PUT, PROPFIND, MKCOL"}
    )


def routes(prefix: str) -> list[web.RouteDef]:
    return [
        web.route("PROPFIND", prefix, propfind),
        web.route("PROPFIND", prefix + "/", propfind),
        web.route("MKCOL", prefix, mkcol),
        web.route("MKCOL", prefix + "/", mkcol),
        web.route("OPTIONS", prefix + "/{key:.*}", options),
        web.route("PROPFIND", prefix + "/{key:.+}", propfind),
        web.route("MKCOL", prefix + "/{key:.+}", mkcol),
        web.get(prefix + "/{key:.+}", get, allow_head=True),
        web.put(prefix + "/{key:.+}", put),
    ]
