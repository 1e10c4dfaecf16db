"""``If-None-Match`` on artifact GETs and HEADs (RFC 9110 §13.1.2).

A client that already holds the bytes sends the artifact's entity-tag back; when it still
matches, the answer is ``304 Not Modified`` with no body. The comparison is weak (§8.8.3.2: a
``W/`` prefix on either side is ignored), ``*`` matches any stored artifact, and the field is a
comma-separated list of tags (§5.6.1 allows empty elements). §13.2.2 evaluates it before
``Range``/``If-Range``, so a matching tag gets 304 even with a ``Range``.
"""

from __future__ import annotations

import re

# An entity-tag, optionally weak: W/"<etagc*>" (§8.8.3), one list element at a time.
_TAG = re.compile(r'\s*(?:W/)?("[\x21\x23-\x7e\x80-\xff]*")\s*')


def none_match(if_none_match: list[str], etag: str) -> bool:
    """True when the ``If-None-Match`` values (every field line, possibly none) name ``etag``
    or ``*``, so a GET or HEAD is answered 304. A malformed list never matches (the request is
    then served as if the field were absent, which §13.1.2 leaves to the server)."""
    tags: set[str] = set()
    for line in if_none_match:
        if line.strip() == "*":
            return True
        for element in line.split(","):
            if not element.strip():
                continue
            m = _TAG.fullmatch(element)
            if m is None:
                return False
            tags.add(m.group(1))
    return etag.removeprefix("W/") in tags
