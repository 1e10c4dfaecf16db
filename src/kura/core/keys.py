"""Keys, namespaces and artifact identity.

An artifact is identified by ``artifact_id = hex(sha256(producer 0x00 tenant 0x00 namespace 0x00
key))``, the rule of the Rust Kura server (docs/reference/kura-behaviour.md §1.2), so the same
(producer, namespace, key) names the same artifact on every node of a tenant's mesh. The tenant is
the node's configured tenant, never a query parameter.

Every key a client sends is checked against its protocol's alphabet before anything touches
storage, so a key can never name a path outside the store (no ``..``, no separators beyond the
ones a layout allows, no NUL or control characters).
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass

from kura.core.errors import InvalidRequest

MAX_KEY_CHARS = 512

# Every producer (protocol family) that names artifacts. Peers refuse any other.
PRODUCERS = frozenset({"nx", "metro", "turbo", "xcode", "gradle", "module", "bazel", "http", "dav"})

# One segment of a path-like key: letters, digits and . _ - ~ ; never "." or "..".
_SEGMENT = r"(?!\.\.?(?:/|$))[A-Za-z0-9._~-]{1,255}"


@dataclass(frozen=True)
class Alphabet:
    """A named key syntax. ``pattern`` must match the whole key."""

    name: str
    pattern: re.Pattern[str]
    description: str


SAFE_NAME = Alphabet(
    "name",
    re.compile(_SEGMENT),
    "1-255 characters of letters, digits, '.', '_', '-', '~', and not '.' or '..'",
)
HEX_SHA256 = Alphabet("sha256", re.compile(r"[0-9a-f]{64}"), "64 lowercase hex digits (SHA-256)")
ALNUM_HASH = Alphabet(
    "hash", re.compile(r"[A-Za-z0-9_-]{1,128}"), "1-128 letters, digits, '_' or '-'"
)
PATH_KEY = Alphabet(
    "path",
    re.compile(rf"{_SEGMENT}(/{_SEGMENT}){{0,7}}"),
    "1-8 '/'-separated segments of letters, digits, '.', '_', '-', '~' (none '.' or '..')",
)
NAMESPACE = Alphabet(
    "namespace",
    re.compile(r"([A-Za-z0-9_~-][A-Za-z0-9._~-]{0,127})?"),
    "0-128 characters of letters, digits, '.', '_', '-', '~', not starting with '.'",
)


def validate(value: str, alphabet: Alphabet, what: str) -> str:
    """Return ``value`` if it matches ``alphabet`` entirely, else raise ``InvalidRequest``.

    ``what`` names the field in the error message (for example ``"Nx hash"``).
    """
    if len(value) > MAX_KEY_CHARS or alphabet.pattern.fullmatch(value) is None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise InvalidRequest(f"invalid {what} {shown!r}: expected {alphabet.description}")
    return value


# A GET names its artifact twice (the read-through wrapper, then the store), and a build asks
# for the same keys again and again: the last ARTIFACT_IDS_CACHED identities are remembered.
# A hit costs a tuple hash of four strings whose own hashes are cached (0.08 us) against a
# SHA-256 (1.0 us, on this project's 2-core machine); at most a few MiB of keys held.
ARTIFACT_IDS_CACHED = 4096


@functools.lru_cache(maxsize=ARTIFACT_IDS_CACHED)
def artifact_id(producer: str, tenant_id: str, namespace_id: str, key: str) -> str:
    """The 64-hex-digit identity of an artifact (Kura's rule; see module docstring)."""
    h = hashlib.sha256()
    for part in (producer, tenant_id, namespace_id):
        h.update(part.encode())
        h.update(b"\x00")
    h.update(key.encode())
    return h.hexdigest()
