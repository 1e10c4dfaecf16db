"""Strict integers from query strings and headers.

Python's ``int()`` accepts more than a decimal number: surrounding whitespace, a sign, ``_``
separators (``"1_0"`` is 10) and every Unicode digit (``"١٠"`` is 10). A query parameter or a
``Content-Length`` is ``1*DIGIT`` of ASCII (RFC 9110 §8.6 for Content-Length; our own routes use
the same rule), so anything else is refused with 400 instead of being read as some other number.
"""

from __future__ import annotations

import re

from aiohttp import web

from kura.core.errors import InvalidRequest

_DECIMAL = re.compile(r"[0-9]{1,19}")


def parse_decimal(raw: str) -> int | None:
    """``raw`` as a non-negative int if it is 1 to 19 ASCII digits, else None."""
    return int(raw) if _DECIMAL.fullmatch(raw) else None


def query_int(request: web.Request, name: str, *, default: int | None, low: int, high: int) -> int:
    """Query parameter ``name`` as an int in ``[low, high]``; ``default`` when it is absent.

    Raises InvalidRequest (400) when it is absent without a default, is not ASCII decimal
    digits, or is out of range; the message names the parameter and the range.
    """
    raw = request.query.get(name)
    if raw is None:
        if default is None:
            raise InvalidRequest(f"{name} is required (an integer from {low} to {high})")
        return default
    value = parse_decimal(raw)
    if value is None:
        raise InvalidRequest(f"{name} must be a decimal integer, not {raw[:40]!r}")
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be between {low} and {high}")
    return value
