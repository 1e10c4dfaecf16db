"""Credentials read from a file and re-read when it changes (rotation without a restart).

Two formats, one parser (``parse_credentials``); in both, blank lines and lines starting with
``#`` are ignored (a comment is a whole line) and surrounding whitespace is stripped:

* a token file (``KURA_READ_WRITE_TOKENS_FILE``, ``KURA_READ_ONLY_TOKENS_FILE``): one token a
  line, every one with the file's rights, optionally followed by ``name=`` (as below), so that
  its writes and refusals are told by name (issue 29 item 4: ``tok... name=ci-main``);
* the credentials file (``KURA_TOKENS_FILE``): one credential a line, the token (at least
  ``MIN_TOKEN_CHARS``; a first field shaped ``key=`` is "the token is missing", as a template
  whose token variable was empty writes) then whitespace-separated ``key=value`` fields:

  - ``rights=`` (required): comma-separated rights, ``read``, ``write:cas``, ``write``,
    ``clean`` (``kura.core.rights``; ``write`` implies ``write:cas``);
  - ``name=`` (optional): a label of ``[A-Za-z0-9._-]`` naming the credential (never the
    token) in its refusals in the log (``kura.api.auth``) and as the writer of what it writes
    (``token:NAME``, ``kura.core.provenance``); two tokens sharing one get a warning, and their
    writes are one writer's;
  - ``read=`` and ``write=`` (optional, issue 29 item 2): an overlay (``kura.core.overlay``),
    the comma-separated namespaces read in order and the one written, which must be one of
    them (``read=pr-123,main write=pr-123``); ``write=`` alone reads that namespace only,
    ``read=`` alone writes none. Each is a namespace (``kura.core.keys.NAMESPACE``).

  For example ``3f9c0e1b7a... name=pr-builds rights=read,write:cas``, or a pull request's
  ``5d2a... name=pr-123 rights=read,write read=pr-123,main write=pr-123``. Any other key, a field
  that is not ``key=value``, a key given twice or a token listed again with other rights or
  another name is a ``ValueError`` naming the line (and the key or right when it is short
  lowercase text, else the field number), never the token.

``reload_if_changed()`` (called every ``STAT_INTERVAL_SECONDS`` by ``TokenAuth.run``, never on
a request) re-reads the file when its (inode, size, mtime) changed, so a rotation written in
place or renamed over the old file takes effect within about a second, new rights included. A
re-read that fails (the file missing or unreadable, a line the parser refuses, text that may be
half a file: ``TokenFile._read_whole``, or a set the caller refuses) keeps the last good set,
logs a warning once per failure and is tried again on the next call; an empty file is a
valid, empty set. Replace a file by rename.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from kura.core import provenance
from kura.core.overlay import Overlay, overlay_from
from kura.core.rights import Rights, parse_rights

log = logging.getLogger(__name__)

STAT_INTERVAL_SECONDS = 1.0
_Signature = tuple[int, int, int]
_NAME = re.compile(r"[A-Za-z0-9._-]+")
# A first field shaped like a field: the token is missing (a template's empty variable).
_FIELD_SHAPED = re.compile(r"[a-z_]+=")
# A key is echoed in a message only when it could not be (part of) a token: a base64 token
# put in a field would otherwise leak almost whole, as the "key" before its '=='.
_SHOWN_KEY = re.compile(r"[a-z_]{1,16}")
MIN_TOKEN_CHARS = 16  # a credentials-file token: a guessable short one is refused


@dataclass(frozen=True)
class Credential:
    """One token and what it grants. ``rights`` include what they imply; ``name`` is None when
    the line gave none (and for bare tokens)."""

    token: str = field(repr=False)  # never in a log line or a traceback's locals
    rights: Rights
    name: str | None = None
    line: int = field(default=0, compare=False)  # its line in the file (0: not from a file)
    overlay: Overlay | None = None  # read= and write= (kura.core.overlay); None: none

    @cached_property
    def writer(self) -> str:
        """Its writer identity (``kura.core.provenance.of_token``), computed once: it is asked
        on every request."""
        return provenance.of_token(self.name, self.token)


def _name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError("a name is letters, digits and . _ - only")
    return value


def _namespaces(value: str) -> list[str]:
    return [n.strip() for n in value.split(",")]


# The fields of a credentials-file line: key -> parse(value) -> the value kept. A key added
# here is a field of ``Credential`` too.
_FIELDS: dict[str, Callable[[str], object]] = {
    "rights": parse_rights,
    "name": _name,
    "read": _namespaces,
    "write": str,
}
_REQUIRED = ("rights",)


def parse_credentials(text: str, rights: Rights | None = None) -> tuple[Credential, ...]:
    """The credentials in a file's text, in file order, each token once. With ``rights`` (a
    token file) every line is one bare token with those rights; without, every line is a
    credentials-file line (module docstring). ``ValueError`` naming the line number (and the
    key) for a line that is neither; never the token or a field's value."""
    found: dict[str, tuple[int, Credential]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        token, *fields = line.split()
        if rights is not None:
            credential = Credential(token, rights, _bare_name(number, fields), number)
        else:
            credential = _credential(number, token, fields)
        if token in found:
            first, earlier = found[token]
            if earlier != credential:
                raise ValueError(
                    f"line {number}: the token of line {first} again, with other rights, name or "
                    "namespaces"
                )
            continue
        found[token] = (number, credential)
    return tuple(c for _n, c in found.values())


def _bare_name(number: int, fields: list[str]) -> str | None:
    """A token file line's optional ``name=`` (its only field), else ``ValueError``."""
    if not fields:
        return None
    if len(fields) == 1 and fields[0].startswith("name="):
        try:
            return _name(fields[0].removeprefix("name="))
        except ValueError as exc:
            raise ValueError(f"line {number}: key 'name': {exc}") from None
    if fields[0].startswith("name="):  # never echoed: a field may be part of a token
        raise ValueError(
            f"line {number}: field {len(fields) + 1} follows name=: a token file line is a "
            "token and an optional name=NAME, a name being one word"
        )
    raise ValueError(
        f"line {number}: a token must not contain whitespace (a token file line is a token "
        "and an optional name=)"
    )


def _credential(number: int, token: str, fields: list[str]) -> Credential:
    if _FIELD_SHAPED.match(token):
        raise ValueError(f"line {number}: the token is missing")
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(f"line {number}: the token is shorter than {MIN_TOKEN_CHARS} characters")
    values: dict[str, object] = {}
    for position, text in enumerate(fields, 2):
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise ValueError(f"line {number}: field {position} is not key=value")
        if key not in _FIELDS:
            known = ", ".join(_FIELDS)
            shown = _SHOWN_KEY.fullmatch(key)
            what = f"unknown key {key!r}" if shown else f"field {position}: unknown key"
            raise ValueError(f"line {number}: {what} (known: {known})")
        if key in values:
            raise ValueError(f"line {number}: key {key!r} given twice")
        try:
            values[key] = _FIELDS[key](value)
        except ValueError as exc:
            raise ValueError(f"line {number}: key {key!r}: {exc}") from None
    for key in _REQUIRED:
        if key not in values:
            raise ValueError(f"line {number}: key {key!r} is required")
    rights, name = values["rights"], values.get("name")
    reads, write = values.get("read"), values.get("write")
    assert isinstance(rights, frozenset)
    assert name is None or isinstance(name, str)
    assert reads is None or isinstance(reads, list)
    assert write is None or isinstance(write, str)
    try:
        overlay = overlay_from(reads, write)
    except ValueError as exc:
        raise ValueError(f"line {number}: keys 'read' and 'write': {exc}") from None
    return Credential(token, rights, name, number, overlay)


def warn_shared_names(path: Path, credentials: tuple[Credential, ...]) -> None:
    """Log a warning for each ``name=`` two tokens share: refusals are logged by name, and a
    shared one no longer tells the credentials apart."""
    first: dict[str, int] = {}
    for c in credentials:
        if c.name is None:
            continue
        if c.name in first:
            log.warning(
                "%s line %d: name %r is also the name of line %d's token",
                path,
                c.line,
                c.name,
                first[c.name],
            )
        else:
            first[c.name] = c.line


class TokenFile:
    """The current credentials of one file: a token file when ``rights`` is given (each bare
    token gets them), else a credentials file. The first read happens in the constructor and
    raises ``OSError``/``ValueError``: a node must not start with a file it cannot read."""

    def __init__(self, path: Path, rights: Rights | None = None) -> None:
        self.path = path
        self._rights = rights
        self._signature = self._stat()
        self._credentials = parse_credentials(path.read_text(), rights)
        warn_shared_names(path, self._credentials)
        self._failed: str | None = None  # the last failure logged
        self.reloads_total = 0

    def credentials(self) -> tuple[Credential, ...]:
        """The last good set (no I/O)."""
        return self._credentials

    @property
    def failing(self) -> bool:
        """True while the file has changed but cannot be read (the last good set is kept)."""
        return self._failed is not None

    def _stat(self) -> _Signature:
        st = os.stat(self.path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read_whole(self) -> str:
        """The file's text, refused (``ValueError``) when it may be half-written: a non-empty
        text without its final newline, or a file whose (inode, size, mtime) changed while
        it was read. A torn read of ``rights=read,write:cas`` can be ``rights=read,write``,
        wider than either version, so a rewrite must be whole (replace the file by rename)."""
        before = self._stat()
        text = self.path.read_text()
        if text and not text.endswith("\n"):
            raise ValueError("the text does not end in a newline (a write in progress?)")
        if self._stat() != before:
            raise ValueError("the file changed while it was read")
        return text

    def reload_if_changed(
        self, check: Callable[[TokenFile, tuple[Credential, ...]], None] | None = None
    ) -> bool:
        """Re-read the file if its (inode, size, mtime) changed; True when a new set was
        taken. ``check(self, credentials)`` may refuse the new set with a ``ValueError``
        (``TokenAuth``: a token listed in another source too). Never raises: a failed re-read
        (unreadable, refused by the parser or by ``check``, or possibly torn,
        ``_read_whole``) is logged and tried again on the next call."""
        try:
            signature = self._stat()
            if signature == self._signature:
                return False
            credentials = parse_credentials(self._read_whole(), self._rights)
            if check is not None:
                check(self, credentials)
        except (OSError, ValueError) as exc:
            if self._failed != str(exc):
                self._failed = str(exc)
                log.warning(
                    "cannot re-read token file %s, keeping %d tokens: %s",
                    self.path,
                    len(self._credentials),
                    exc,
                )
            return False
        self._signature, self._credentials, self._failed = signature, credentials, None
        self.reloads_total += 1
        warn_shared_names(self.path, credentials)
        log.info("token file %s re-read: %d tokens", self.path, len(credentials))
        return True
