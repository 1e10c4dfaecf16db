"""The internal wire format between peers.

An artifact body travels as raw bytes with its manifest in the ``Kura-Manifest`` header
(compact ASCII JSON, ``kura.core.manifest.Manifest.to_json``), so the receiver can verify size
and SHA-256 and apply the sender's version. The sender's tenant travels in ``Kura-Tenant``; a
receiver refuses a different tenant. ``Kura-Outcome`` tells the sender what the receiver did.

Versions (issue 31, docs/upgrading.md): every internal request and every internal answer carries
the sender's wire version (``Kura-Wire-Version``, an integer) and kura version
(``Kura-Version``, ``kura.__version__``). A request without the header comes from kura 0.1.0,
the release before the header existed: wire version 1, which this kura still speaks both ways
(0.1.0 ignores headers it does not know). A receiver refuses a wire version outside
``MIN_WIRE_VERSION``..``WIRE_VERSION`` with ``WIRE_REFUSAL_STATUS`` and ``Kura-Refusal:
wire_version``, naming both versions (the rules: ``kura.core.versions``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType

from kura import __version__
from kura.core.manifest import Manifest
from kura.core.versions import WIRE_VERSION

MANIFEST_HEADER = "Kura-Manifest"
TENANT_HEADER = "Kura-Tenant"
# The requesting node's internal URL on a change-feed request (``GET /_internal/changes``).
NODE_HEADER = "Kura-Node"
OUTCOME_HEADER = "Kura-Outcome"
# On a refused copy: why, when the status alone does not tell the sender what to do.
REFUSAL_HEADER = "Kura-Refusal"
FUTURE_VERSION = "future_version"
# On a body fetch made for a client waiting on a miss (read-through): the serving peer does
# not slow it for its own public load (``kura.mesh.peer_pace``), a client is waiting on it.
READ_THROUGH_HEADER = "Kura-Read-Through"
WIRE_VERSION_HEADER = "Kura-Wire-Version"
KURA_VERSION_HEADER = "Kura-Version"
PAGE_LIMIT_DEFAULT = 256
PAGE_LIMIT_MAX = 1000


# The two headers every internal request and answer of this node carries (built once: they
# never change while the process runs).
VERSION_HEADERS: Mapping[str, str] = MappingProxyType(
    {WIRE_VERSION_HEADER: str(WIRE_VERSION), KURA_VERSION_HEADER: __version__}
)


def version_headers() -> dict[str, str]:
    """``VERSION_HEADERS``, as a dict of its own."""
    return dict(VERSION_HEADERS)


def encode_manifest(manifest: Manifest) -> str:
    return json.dumps(manifest.to_json(), separators=(",", ":"), ensure_ascii=True)


def decode_manifest(text: str) -> Manifest:
    """Raises ValueError on anything that is not a valid manifest."""
    try:
        return Manifest.from_text(text)
    except ValueError as exc:
        raise ValueError(f"invalid manifest header: {exc}") from exc


def peer_label(url: str) -> str:
    """``host:port`` of a peer URL: the metric label for a peer (a small, configured set)."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]


# Many small bodies in one response (``POST /_internal/bootstrap/bodies``): per requested id, a
# line of compact JSON, then, for a manifest, exactly ``size`` raw bytes. A line that is not a
# manifest says why the body is absent: ``{"artifact_id": …, "missing": true}`` (unknown,
# evicted or damaged) or ``{"artifact_id": …, "large": true}`` (fetch it on its own).
BATCH_MAX_IDS = 256
BATCH_MAX_BODY_BYTES = 64 * 1024


def encode_frame(manifest: Manifest, data: bytes) -> bytes:
    return encode_manifest(manifest).encode() + b"\n" + data


def encode_absent(artifact_id: str, why: str) -> bytes:
    return json.dumps({"artifact_id": artifact_id, why: True}).encode() + b"\n"


def decode_frames(payload: bytes) -> list[tuple[str, Manifest | None, bytes | None, str]]:
    """``(artifact_id, manifest, body, state)`` per frame, state ``ok``, ``missing`` or
    ``large``. Raises ValueError on a malformed or truncated payload."""
    out: list[tuple[str, Manifest | None, bytes | None, str]] = []
    pos = 0
    while pos < len(payload):
        end = payload.find(b"\n", pos)
        if end < 0:
            raise ValueError("truncated frame header")
        try:
            head = json.loads(payload[pos:end])
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"invalid frame header: {exc}") from exc
        pos = end + 1
        if not isinstance(head, dict) or not isinstance(head.get("artifact_id"), str):
            raise ValueError("frame header is not an object with an artifact_id")
        for state in ("missing", "large"):
            if head.get(state) is True:
                out.append((head["artifact_id"], None, None, state))
                break
        else:
            manifest = Manifest.from_json(head)
            body = payload[pos : pos + manifest.size]
            if len(body) != manifest.size:
                raise ValueError(f"frame of {manifest.artifact_id} is truncated")
            pos += manifest.size
            out.append((manifest.artifact_id, manifest, body, "ok"))
    return out


# ``GET /_internal/bootstrap/manifests?order=newest``: pages by (version_ms descending,
# artifact_id) with the compound cursor ``"<version_ms>:<artifact_id>"``. A peer that predates
# the ordering ignores ``order`` and answers without an ``order`` field, in artifact_id order.
ORDER_NEWEST = "newest"


def encode_version_cursor(version_ms: int, artifact_id: str) -> str:
    return f"{version_ms}:{artifact_id}"


MAX_VERSION_MS = 2**63 - 1  # an SQLite INTEGER; a larger one raised OverflowError (a 500)


def decode_version_cursor(text: str) -> tuple[int, str]:
    """``(version_ms, artifact_id)`` of a newest-first cursor: ASCII digits up to
    ``MAX_VERSION_MS``, a colon, a non-empty id. ValueError when malformed."""
    version, sep, artifact_id = text.partition(":")
    ok = sep and version.isascii() and version.isdigit() and len(version) <= 19 and artifact_id
    if not ok or int(version) > MAX_VERSION_MS:
        raise ValueError(f"cursor {text[:80]!r} is not <version_ms>:<artifact_id>")
    return int(version), artifact_id
