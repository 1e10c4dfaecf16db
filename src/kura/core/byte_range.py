"""HTTP byte ranges (RFC 9110 §14): which part of a stored artifact a GET asks for.

``choose(range_header, if_range, size_bytes, etag)`` turns a request's ``Range`` and
``If-Range`` into one of three answers, following https://www.rfc-editor.org/rfc/rfc9110#section-14:

* ``FULL``: send the whole representation (200). That is the answer when there is no ``Range``;
  when it names a unit other than ``bytes`` (§14.2: MUST ignore); when it is syntactically
  invalid, including an ``int-range`` whose last-pos is below its first-pos (§14.1.1; §14.2
  lets a server ignore it, and kura does instead of answering 400); when it asks for more than
  one range (§14.2 lets a server ignore a multi-range request; kura never sends
  ``multipart/byteranges``); when ``If-Range`` does not match (§13.1.5: a weak or different
  entity-tag, or an HTTP-date, which never matches because kura sends no ``Last-Modified``); and
  for an empty representation (no byte of it can be selected; ignoring is always allowed).
* a ``ByteRange`` (206): ``bytes=a-b`` (b clamped to the last byte), ``bytes=a-`` (to the end),
  ``bytes=-n`` (the last n bytes, or all of them when n exceeds the size).
* ``UNSATISFIABLE`` (416): one well-formed range whose first-pos is at or past the end, or a
  suffix of length 0 (§14.1.1: satisfiable only if first-pos < size, or suffix-length > 0).

Numbers are decimal digits only (no sign, no spaces); a numeral of more than 18 significant digits is taken
as larger than any size (§14.1.1: recipients must anticipate large numerals). Pure: no IO.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

MAX_DIGITS: Final = 18  # below 2**63; longer numerals exceed any stored size
_SPEC = re.compile(r"([0-9]*)-([0-9]*)")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``first`` to ``last`` inclusive (0-based) of a representation of ``size_bytes``."""

    first: int
    last: int
    size_bytes: int

    @property
    def length_bytes(self) -> int:
        return self.last - self.first + 1

    @property
    def content_range(self) -> str:
        """The ``Content-Range`` of a 206 for this range (RFC 9110 §14.4)."""
        return f"bytes {self.first}-{self.last}/{self.size_bytes}"


Answer = ByteRange | Literal["full", "unsatisfiable"]
FULL: Final = "full"
UNSATISFIABLE: Final = "unsatisfiable"


def unsatisfied_content_range(size_bytes: int) -> str:
    """The ``Content-Range`` of a 416 (RFC 9110 §14.4: ``bytes */complete-length``)."""
    return f"bytes */{size_bytes}"


def strong_etag(sha256: str) -> str:
    """The strong entity-tag kura sends for an artifact: its SHA-256 in quotes. Equal bytes
    give equal tags, which is exactly what a strong validator promises (RFC 9110 §8.8.1)."""
    return f'"{sha256}"'


def choose(range_header: str | None, if_range: str | None, size_bytes: int, etag: str) -> Answer:
    """What to send for a GET with these ``Range`` and ``If-Range`` values (None = absent) of a
    representation of ``size_bytes`` whose entity-tag is ``etag`` (module docstring)."""
    if range_header is None:
        return FULL
    if if_range is not None and if_range.strip() != etag:
        # Strong comparison (§13.1.5): a weak tag never matches, nor does a date (§8.8.2.2
        # would compare it with Last-Modified, which kura does not send).
        return FULL
    unit, eq, spec_set = range_header.partition("=")
    if not eq or not _TOKEN.fullmatch(unit):
        return FULL
    if unit.lower() != "bytes":
        return FULL
    specs = [s.strip(" \t") for s in spec_set.split(",")]
    specs = [s for s in specs if s]  # the #rule allows empty list elements (§5.6.1)
    if len(specs) != 1:
        return FULL
    m = _SPEC.fullmatch(specs[0])
    if m is None:
        return FULL
    first_text, last_text = m.groups()
    if not first_text:
        if not last_text:
            return FULL  # a lone "-"
        suffix = _number(last_text)
        if suffix == 0:
            return UNSATISFIABLE
        if size_bytes == 0:
            return FULL
        return ByteRange(max(0, size_bytes - suffix), size_bytes - 1, size_bytes)
    first = _number(first_text)
    last = _number(last_text) if last_text else None
    if last is not None and last < first:
        return FULL  # an invalid range-spec makes the whole header invalid
    if size_bytes == 0:
        return FULL
    if first >= size_bytes:
        return UNSATISFIABLE
    end = size_bytes - 1 if last is None else min(last, size_bytes - 1)
    return ByteRange(first, end, size_bytes)


def _number(digits: str) -> int:
    digits = digits.lstrip("0") or "0"
    return 10**MAX_DIGITS if len(digits) > MAX_DIGITS else int(digits)
