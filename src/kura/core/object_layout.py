"""Where artifacts live in the object-storage tier: the URL and the object layout (no IO).

``KURA_OBJECT_STORE_URL=s3://bucket/prefix``; every object key below is relative to the prefix:

    <tenant_id>/ns-<namespace_id>/<artifact_id>          the artifact (``object_key``)
    <tenant_id>/touch/ns-<namespace_id>/<artifact_id>    its zero-byte touch marker

so a namespace's objects (what a clean deletes) are exactly one prefix. Namespace ids may be
empty (the Bazel, ccache, Gradle and WebDAV routes use ``""``), hence the ``ns-`` marker: the
segment is never empty and never ``.``/``..`` (a namespace never starts with ``.``).
A touch marker (``touch_key``) records that some node used the artifact: its last-modified
time is a use that the object's own does not show (bucket expiry, ``core.bucket_expiry``).
Markers sit outside the namespace prefixes, so a clean's listing never sees them.
"""

from __future__ import annotations

from urllib.parse import urlsplit

# The outbox target of uploads to the tier (never a peer URL: those are http(s)://...). The
# shipper, catch-up and the per-peer cap leave it alone; eviction skips artifacts it holds.
OUTBOX_TARGET = "object-store"


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``. Raises ValueError for
    another scheme, no bucket, a query or fragment, or empty/``.``/``..`` prefix segments."""
    parts = urlsplit(url.strip())
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError("must be an s3://bucket/prefix URL")
    if parts.query or parts.fragment:
        raise ValueError("must not have a query or fragment")
    prefix = parts.path.strip("/")
    if prefix and any(seg in ("", ".", "..") for seg in prefix.split("/")):
        raise ValueError("the prefix must not contain empty, '.' or '..' segments")
    return parts.netloc, prefix


def namespace_prefix(tenant_id: str, namespace_id: str) -> str:
    """The key prefix holding every object of one namespace (ends with ``/``)."""
    return f"{tenant_id}/ns-{namespace_id}/"


def namespace_of(tenant_id: str, key: str) -> str:
    """The namespace of an object key (``object_key``'s ``namespace_id``)."""
    return key[len(tenant_id) + len("/ns-") :].split("/", 1)[0]


def object_key(tenant_id: str, namespace_id: str, artifact_id: str) -> str:
    """The key of one artifact's object."""
    return namespace_prefix(tenant_id, namespace_id) + artifact_id


TOUCH_SEGMENT = "touch"


def touch_key(tenant_id: str, namespace_id: str, artifact_id: str) -> str:
    """The key of one artifact's touch marker (zero bytes; only its last-modified matters)."""
    return f"{tenant_id}/{TOUCH_SEGMENT}/" + object_key("", namespace_id, artifact_id)[1:]


def marker_object_key(tenant_id: str, key: str) -> str | None:
    """For a listed ``key`` under ``<tenant_id>/``: the object key a touch marker stands for,
    or None when ``key`` is not a marker."""
    head = f"{tenant_id}/{TOUCH_SEGMENT}/ns-"
    if not key.startswith(head):
        return None
    return f"{tenant_id}/" + key[len(head) - 3 :]


def is_object_key(tenant_id: str, key: str) -> bool:
    """Whether a listed ``key`` under ``<tenant_id>/`` is an artifact's object."""
    return key.startswith(f"{tenant_id}/ns-") and "/" in key[len(tenant_id) + 1 :]
