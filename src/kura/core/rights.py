"""What a credential may do: the rights, what each one implies, and their spelling.

A credential (a plain token, a line of the credentials file, a JWT) grants a set of rights;
each route and RPC needs exactly one (``docs/security.md`` lists the mapping):

* ``read``: every look-up, and what a look-up may store that needs no trust in the caller:
  SplitBlob's chunks (content-addressed, cut by the server from a blob already stored) and a
  FetchBlob download whose request names its ``checksum.sri`` (verified content); a FetchBlob
  download that would record an unverified URI -> digest needs ``write`` (``grpc.asset``);
* ``write:cas``: content-verified blobs only, whose key is the SHA-256 of the bytes and which
  kura checks before it stores them (Bazel CAS over HTTP and gRPC, REAPI chunks). Such a key
  cannot lie, so a writer holding only this right can add blobs but never an entry that points
  at them (issue 29: the "CREEP" cache-poisoning class, CVE-2025-36852);
* ``write``: every entry (action cache, Nx, Turborepo, Gradle, ccache, ...); implies
  ``write:cas``;
* ``clean``: deleting a namespace's content.

No right implies ``read``: a write-only credential (a CI uploader) reads nothing.
"""

from __future__ import annotations

import enum
import re

# A right is echoed in a message only when it could not be (part of) a token.
_SHOWN_RIGHT = re.compile(r"[a-z:]{1,16}")


class Access(enum.Enum):
    """One right; the value is its spelling in the credentials file and in messages."""

    READ = "read"
    WRITE_CAS = "write:cas"
    WRITE = "write"
    CLEAN = "clean"


Rights = frozenset[Access]

READ_ONLY: Rights = frozenset({Access.READ})
# A read-write token (KURA_READ_WRITE_TOKENS and its file): what it could do before rights
# were finer than read and write, cleaning included.
READ_WRITE: Rights = frozenset(Access)


def implied(rights: frozenset[Access]) -> Rights:
    """``rights`` with what they imply: ``write`` adds ``write:cas``."""
    return rights | {Access.WRITE_CAS} if Access.WRITE in rights else rights


def parse_rights(text: str) -> Rights:
    """The rights named in ``text``, comma-separated (``read,write:cas``), with what they imply.
    ``ValueError`` naming an unknown right, or for an empty list or an empty item."""
    names = [n.strip() for n in text.split(",")]
    if not any(names):
        raise ValueError("no rights given (known: " + known_rights() + ")")
    rights = set()
    for name in names:
        try:
            rights.add(Access(name))
        except ValueError:
            shown = f"unknown right {name!r}" if _SHOWN_RIGHT.fullmatch(name) else "unknown right"
            raise ValueError(f"{shown} (known: {known_rights()})") from None
    return implied(frozenset(rights))


def known_rights() -> str:
    return ", ".join(a.value for a in Access)
