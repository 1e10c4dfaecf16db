"""The internal wire format between peers.

An artifact body travels as raw bytes with its manifest in the ``Kura-Manifest`` header
(compact ASCII JSON, ``kura.core.manifest.Manifest.to_json``), so the receiver can verify size
and SHA-256 and apply the sender's version. The sender's tenant travels in ``Kura-Tenant``; a
receiver refuses a different tenant. ``Kura-Outcome`` tells the sender what the receiver did.
"""

from __future__ import annotations

import json

from kura.core.manifest import Manifest

MANIFEST_HEADER = "Kura-Manifest"
TENANT_HEADER = "Kura-Tenant"
# The requesting node's internal URL on a change-feed request (``GET /_internal/changes``).
NODE_HEADER = "Kura-Node"
OUTCOME_HEADER = "Kura-Outcome"
# On a refused copy: why, when the status alone does not tell the sender what to do.
REFUSAL_HEADER = "Kura-Refusal"
FUTURE_VERSION = "future_version"
PAGE_LIMIT_DEFAULT = 256
PAGE_LIMIT_MAX = 1000


def encode_manifest(manifest: Manifest) -> str:
    return json.dumps(manifest.to_json(), separators=(",", ":"), ensure_ascii=True)


def decode_manifest(text: str) -> Manifest:
    """Raises ValueError on anything that is not a valid manifest."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid manifest header: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError("invalid manifest header: not an object")
    return Manifest.from_json(data)


def peer_label(url: str) -> str:
    """``host:port`` of a peer URL: the metric label for a peer (a small, configured set)."""
    rest = url.split("://", 1)[-1]
    return rest.split("/", 1)[0]
