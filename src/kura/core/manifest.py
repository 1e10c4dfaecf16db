"""The manifest: everything known about one stored artifact except its bytes.

Its JSON form is the wire format peers exchange (kura-behaviour.md §1.4 "Manifest JSON"), with
``sha256`` and ``headers`` added: the digest lets every node verify bytes it receives, and
``headers`` carries protocol metadata stored with the body (Turborepo's ``x-artifact-tag``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Manifest:
    """One artifact's metadata. ``inline`` artifacts keep their bytes in the index, not a file."""

    artifact_id: str
    producer: str
    namespace_id: str
    key: str
    content_type: str
    size: int
    sha256: str
    version_ms: int
    created_at_ms: int
    inline: bool = False
    headers: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        """Parse a peer's manifest. Raises ValueError on a missing or mistyped field."""
        try:
            headers = data.get("headers") or {}
            if not isinstance(headers, dict):
                raise ValueError("headers must be an object")
            return cls(
                artifact_id=str(data["artifact_id"]),
                producer=str(data["producer"]),
                namespace_id=str(data["namespace_id"]),
                key=str(data["key"]),
                content_type=str(data["content_type"]),
                size=int(data["size"]),
                sha256=str(data["sha256"]),
                version_ms=int(data["version_ms"]),
                created_at_ms=int(data["created_at_ms"]),
                inline=bool(data.get("inline", False)),
                headers={str(k): str(v) for k, v in headers.items()},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid manifest: {exc}") from exc
