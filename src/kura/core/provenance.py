"""Who writes (issue 29 item 4): the writer identity of a credential, recorded in the manifest
of each write it makes (``Manifest.writer``) and named by refusals in the log and by
``kura admin``.

The identity is decided once per request, where its credential is checked
(``kura.api.auth.TokenAuth``), from these rules:

* a static token with a name (the credentials file's ``name=``, a token file line's
  ``name=``): ``token:NAME``;
* a static token without one (``KURA_READ_WRITE_TOKENS`` and the other lists, an unnamed file
  line): ``token:#`` and the first ``FINGERPRINT_HEX_CHARS`` hex digits of the token's
  SHA-256, a fingerprint an operator can compute from the token they hold
  (``printf %s TOKEN | sha256sum``) and that tells tokens apart without revealing one;
* a JWT: ``jwt:`` and its ``sub`` claim, visible ASCII with ``%``, ``#`` and every other
  byte percent-encoded (so no subject reads as a fingerprint, and two subjects never share an
  identity); one longer than ``MAX_WRITER_CHARS`` characters in all is cut and ends with
  ``~`` and the fingerprint of the whole subject (two subjects that differ only past the cut,
  such as two long branch names, stay apart); a JWT without a usable ``sub`` (absent,
  empty): ``jwt:#`` and the token's fingerprint (a ``sub`` that is not a string is refused
  by the JWT check itself, 401: RFC 7519 section 4.1.2 makes it a string);
* no access control configured: ``anonymous``.

Every identity is at most ``MAX_WRITER_CHARS`` visible ASCII characters, the shape a manifest
accepts (``kura.core.manifest``). No token is ever part of one, only its fingerprint.
"""

from __future__ import annotations

import hashlib
from urllib.parse import quote

from kura.core.manifest import MAX_WRITER_CHARS

ANONYMOUS = "anonymous"
FINGERPRINT_HEX_CHARS = 12
# What a JWT subject keeps as it is: visible ASCII but '%', the escape character itself, and
# '#', which marks a fingerprint.
_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "%#")


def fingerprint(token: str) -> str:
    """The first ``FINGERPRINT_HEX_CHARS`` lowercase hex digits of SHA-256(token as UTF-8)."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
    return digest[:FINGERPRINT_HEX_CHARS]


def of_token(name: str | None, token: str) -> str:
    """A static token's identity: ``token:NAME``, or ``token:#<fingerprint>`` without a name.
    ``name`` is a credentials-file name (``[A-Za-z0-9._-]+``, ``kura.api.token_file``)."""
    if name:
        return f"token:{name}"[:MAX_WRITER_CHARS]
    return f"token:#{fingerprint(token)}"


def of_jwt(subject: object, token: str) -> str:
    """A JWT's identity from its ``sub`` claim (any JSON value: only a non-empty string is
    used), else from the token's fingerprint."""
    if isinstance(subject, str) and subject:
        encoded = f"jwt:{quote(subject, safe=_SAFE, encoding='utf-8', errors='surrogateescape')}"
        if len(encoded) <= MAX_WRITER_CHARS:
            return encoded
        tail = f"~{fingerprint(subject)}"
        return encoded[: MAX_WRITER_CHARS - len(tail)] + tail
    return f"jwt:#{fingerprint(token)}"
