"""Bearer tokens read from a file and re-read when it changes (rotation without a restart).

The file holds one token per line; blank lines and lines starting with ``#`` are ignored, and
surrounding whitespace is stripped. ``reload_if_changed()`` (called every
``STAT_INTERVAL_SECONDS`` by ``TokenAuth.run``, never on a request) re-reads the file when its
(inode, size, mtime) changed, so a rotation written in place or renamed over the old file takes
effect within about a second. A re-read that fails (the file missing or unreadable, a token
with whitespace inside) keeps the last good set and logs a warning once per change; an empty
file is a valid, empty set.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

STAT_INTERVAL_SECONDS = 1.0
_Signature = tuple[int, int, int]


def parse_tokens(text: str) -> tuple[str, ...]:
    """The tokens in a token file's text; ``ValueError`` for a line with inner whitespace."""
    tokens = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if any(c.isspace() for c in line):
            raise ValueError(f"line {number}: a token must not contain whitespace")
        tokens.append(line)
    return tuple(tokens)


class TokenFile:
    """The current tokens of one file. The first read happens in the constructor and raises
    ``OSError``/``ValueError``: a node must not start with a token file it cannot read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._signature = self._stat()
        self._tokens = parse_tokens(path.read_text())
        self._failed: str | None = None  # the last failure logged
        self.reloads_total = 0

    def tokens(self) -> tuple[str, ...]:
        """The last good set (no I/O)."""
        return self._tokens

    @property
    def failing(self) -> bool:
        """True while the file has changed but cannot be read (the last good set is kept)."""
        return self._failed is not None

    def _stat(self) -> _Signature:
        st = os.stat(self.path)
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def reload_if_changed(self) -> bool:
        """Re-read the file if its (inode, size, mtime) changed; True when a new set was
        taken. Never raises: a failed re-read is logged and tried again on the next call."""
        try:
            signature = self._stat()
            if signature == self._signature:
                return False
            tokens = parse_tokens(self.path.read_text())
        except (OSError, ValueError) as exc:
            if self._failed != str(exc):
                self._failed = str(exc)
                log.warning(
                    "cannot re-read token file %s, keeping %d tokens: %s",
                    self.path,
                    len(self._tokens),
                    exc,
                )
            return False
        self._signature, self._tokens, self._failed = signature, tokens, None
        self.reloads_total += 1
        log.info("token file %s re-read: %d tokens", self.path, len(tokens))
        return True
