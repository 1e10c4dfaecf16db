"""The manifest: everything known about one stored artifact except its bytes.

Its JSON form is the wire format peers exchange (kura-behaviour.md §1.4 "Manifest JSON"), with
``sha256`` and ``headers`` added: the digest lets every node verify bytes it receives, and
``headers`` carries protocol metadata stored with the body (Turborepo's ``x-artifact-tag``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

MAX_STORED_HEADER_VALUE_CHARS = 1024
# An HTTP field name is a token (RFC 9110 §5.1, §5.6.2).
_FIELD_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
# RFC 9110 §5.5: a field value is visible ASCII, space and tab (obs-text is not stored); CR, LF
# and NUL are never allowed, and a value with CR or LF would split the response it is sent in
# (aiohttp refuses to send it and the connection closes without an answer).
_FIELD_VALUE = re.compile(r"[\t\x20-\x7e]*")


def stored_header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` may not be stored with an artifact (and later sent as a response
    header), or None if it may. The one rule for every entry point: a client's upload, a peer's
    replica, a bootstrap or read-through manifest, and the serving path (defence in depth)."""
    if not _FIELD_NAME.fullmatch(name):
        return f"stored header name {name[:64]!r} is not an HTTP token"
    if len(value) > MAX_STORED_HEADER_VALUE_CHARS:
        return f"{name} header is longer than {MAX_STORED_HEADER_VALUE_CHARS} characters"
    if not _FIELD_VALUE.fullmatch(value):
        return f"{name} header contains a control character (CR, LF, NUL or other) or non-ASCII"
    return None


def check_stored_headers(headers: Mapping[str, str]) -> None:
    """Raise ValueError with the first problem of ``stored_header_problem``."""
    for name, value in headers.items():
        problem = stored_header_problem(name, value)
        if problem is not None:
            raise ValueError(problem)


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
    # Who wrote it (issue 29 item 4, ``kura.core.provenance``): the credential of the local write
    # that made this version, carried unchanged by replicas, bootstrap and the bucket tier. ""
    # for versions written before provenance was recorded, or by a peer that does not send it.
    writer: str = ""

    def to_json(self) -> dict[str, Any]:
        """Every field, by name, with ``headers`` copied: what ``dataclasses.asdict`` gives, at
        about 1/20 of its cost (it deep-copies field by field). A bootstrap page serializes
        hundreds of manifests at once on the serving node's event loop."""
        out = {name: getattr(self, name) for name in _FIELDS}
        out["headers"] = dict(self.headers)
        return out

    @classmethod
    def from_text(cls, text: str | bytes) -> Manifest:
        """Parse a manifest from its JSON text (a peer's header, a bucket object's header).
        Raises ValueError on anything that is not a valid manifest: bad JSON, nesting deep
        enough to exhaust the parser, a top level that is not an object, or what ``from_json``
        refuses."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"invalid manifest: {exc}") from exc
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: object) -> Manifest:
        """Parse a peer's manifest. Raises ValueError when ``data`` is not a JSON object, on a
        missing or mistyped field, or a stored header that ``stored_header_problem`` refuses."""
        if not isinstance(data, dict):
            raise ValueError(f"invalid manifest: a {type(data).__name__}, not an object")
        try:
            headers = data.get("headers") or {}
            if not isinstance(headers, dict):
                raise ValueError("headers must be an object")
            parsed = {str(k): str(v) for k, v in headers.items()}
            check_stored_headers(parsed)
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
                headers=parsed,
                writer=writer_of(data.get("writer", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"invalid manifest: {exc}") from exc


_FIELDS = tuple(f.name for f in fields(Manifest))

MAX_WRITER_CHARS = 200
# A writer is shown to operators and matched by ``kura admin``: visible ASCII only, so a peer's
# manifest cannot carry a control character into a log line or a terminal.
_WRITER = re.compile(rf"[\x21-\x7e]{{0,{MAX_WRITER_CHARS}}}")


def writer_of(value: object) -> str:
    """``value`` if it is a valid writer (at most ``MAX_WRITER_CHARS`` visible ASCII
    characters, ``""`` allowed), else ValueError."""
    if not isinstance(value, str) or not _WRITER.fullmatch(value):
        raise ValueError(
            f"writer must be at most {MAX_WRITER_CHARS} visible ASCII characters (no space)"
        )
    return value
