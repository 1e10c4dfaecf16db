"""Versions across releases (issue 31, docs/upgrading.md): which wire versions a node speaks
and how a refusal names both sides. Pure values; ``kura.mesh.wire`` puts them on the wire
(``Kura-Wire-Version``, ``Kura-Version``) and ``kura.api.internal`` checks them.

Wire version 1 is kura 0.1.0's wire, which carries no version at all: a request or a status
answer without one is wire 1. Version 2 is the same wire plus the two version headers.
"""

from __future__ import annotations

from kura import __version__
from kura.core.errors import KuraError

# The wire version this kura speaks (2: the wire of 1 plus the two version headers) and the
# oldest it still accepts (1: kura 0.1.0, which sends no version).
WIRE_VERSION = 2
MIN_WIRE_VERSION = 1
# ``Kura-Refusal`` of a request whose wire version this node does not speak. The status is a
# 5xx on purpose: every sender keeps the message queued and retries it with its backoff (a
# 4xx makes kura 0.1.0's shipper drop the copy for good, ``mesh.shipper.refusal_reason``), so
# a peer refused during a rollout catches up once the versions meet again.
UNSPOKEN_WIRE_VERSION = "wire_version"
WIRE_REFUSAL_STATUS = 503
# The wire version recorded for a peer whose ``Kura-Wire-Version`` (or status field) does not
# parse: a later release that changed the header's format. Outside every range and below every
# version that parses (0 parses: older than ``MIN_WIRE_VERSION``), so it is refused and reported
# as unspoken, never dropped as a bad request nor taken for a peer that is down.
UNPARSEABLE_WIRE_VERSION = -1
KURA_VERSION_MAX_CHARS = 64


def wire_version_of(value: str | None) -> int:
    """The wire version a ``Kura-Wire-Version`` value names: 1 when absent (kura 0.1.0 sends
    none). ValueError unless 1 to 9 ASCII digits."""
    if value is None:
        return 1
    text = value.strip()
    if not (text.isascii() and text.isdigit() and 0 < len(text) < 10):
        raise ValueError(f"Kura-Wire-Version {value[:40]!r} is not a version number")
    return int(text)


def kura_version_of(value: object) -> str | None:
    """A peer's kura version as reported (header or status field), or None when absent or not
    a short run of visible ASCII (never echoed unchecked into logs and ``/status``)."""
    if not isinstance(value, str) or not 0 < len(value) <= KURA_VERSION_MAX_CHARS:
        return None
    return value if value.isascii() and value.isprintable() and " " not in value else None


def speaks(wire_version: int) -> bool:
    """Whether this node speaks ``wire_version`` (``MIN_WIRE_VERSION``..``WIRE_VERSION``)."""
    return MIN_WIRE_VERSION <= wire_version <= WIRE_VERSION


def describe(wire_version: int | None, kura_version: str | None) -> str:
    """``kura 0.2.0 (wire 2)``; a wire-1 peer without a version is ``kura 0.1.0``, the one
    release that sends none; a wire below ``MIN_WIRE_VERSION`` (``0``, which parses) is said to
    be older than this node speaks, one that did not parse (``UNPARSEABLE_WIRE_VERSION``) so."""
    if wire_version is None:
        return "an unknown kura"
    if wire_version == UNPARSEABLE_WIRE_VERSION:
        return f"kura {kura_version or 'of unknown version'} (unparseable wire version)"
    older = ", older than this node speaks" if wire_version < MIN_WIRE_VERSION else ""
    if kura_version is None:
        return (
            f"kura {'0.1.0' if wire_version == 1 else 'of unknown version'} "
            f"(wire {wire_version}{older})"
        )
    return f"kura {kura_version} (wire {wire_version}{older})"


def unspoken_message(wire_version: int, kura_version: str | None) -> str:
    """Why a node refuses (or will not talk to) a peer of ``wire_version``: both versions and
    what to do."""
    newer = wire_version > WIRE_VERSION or wire_version == UNPARSEABLE_WIRE_VERSION
    return (
        f"{describe(wire_version, kura_version)} and this node, kura {__version__} (wire "
        f"{WIRE_VERSION}, speaks wire {MIN_WIRE_VERSION}-{WIRE_VERSION}), cannot talk: "
        + (
            f"finish the rollout to kura {kura_version or 'of that wire version'} or roll it back"
            if newer
            else "upgrade that node; this kura no longer speaks its wire version"
        )
        + " (docs/upgrading.md)"
    )


class DataDirTooNew(KuraError):
    """The data directory was written by a newer kura in a format this kura cannot read (a
    metadata schema or blob layout past its own). Raised before anything in it is written;
    ``message`` names both versions and what to do (``too_new_message``)."""


class DataDirDamaged(KuraError):
    """The data directory records a version no kura writes (a metadata schema of 0 or below,
    one that is not a number while no newer kura is recorded as its writer, a ``layout`` file
    that is empty, not text or not a file): damaged, or not a kura data directory. Raised
    before anything in it is written; ``message`` says what is wrong and what to do."""


def shown(text: str) -> str:
    """``text`` as a refusal may print it: as it is when a short run of visible ASCII without
    quotes, else its first 40 characters as an ASCII literal (``ascii``), so that an escape
    sequence or a newline read from a data directory never reaches a terminal raw."""
    if kura_version_of(text) is not None and "'" not in text and '"' not in text:
        return text
    return ascii(text[:40])


def is_newer(kura_version: str | None) -> bool:
    """Whether ``kura_version`` (as an index records it) names a release after this one: its
    leading dotted numbers compared with ``__version__``'s (``0.3.0`` > ``0.2.0``; ``0.2.0rc1``
    reads as ``0.2.0``). False for None or a value that does not start with a number."""
    return _release(kura_version or "") > _release(__version__)


def _release(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in version.split("."):
        digits = ""
        for char in part:
            if not (char.isascii() and char.isdigit()):
                break
            digits += char
        if not digits or len(digits) > 9:
            break
        parts.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(parts)


def damaged_message(what: str, readable: str, written_by: str | None) -> str:
    """The refusal of a data directory whose ``what`` (``metadata schema '-1'``, ``layout file
    ... is empty``) no kura writes; ``readable`` is this kura's range, ``written_by`` the kura
    the index records as its last writer (None: none recorded)."""
    writer = f", last written by kura {shown(written_by)}" if written_by else ""
    return (
        f"this data directory's {what}, which no kura writes (kura {__version__} reads "
        f"{readable}{writer}): it is damaged or not a kura data directory; move it aside and "
        "let the node bootstrap from its peers, or restore it from a backup (docs/upgrading.md)"
    )


def too_new_message(part: str, found: str, readable: str, written_by: str | None) -> str:
    """The refusal of a data directory whose ``part`` (``metadata schema``, ``blob layout``) is
    ``found``, past the ``readable`` range of this kura, written (as its index records) by kura
    ``written_by`` (None: not recorded, a kura that predates the record or a newer one;
    printed escaped, ``shown``)."""
    written_by = shown(written_by) if written_by else None
    writer = f"kura {written_by}" if written_by else "a newer kura"
    run = (
        f"run kura {written_by} or later" if written_by else f"run a kura that reads {part} {found}"
    )
    return (
        f"this data directory was written by {writer} ({part} {found}); kura {__version__} "
        f"reads {part}s {readable}: {run}, or move the data directory aside and let the node "
        "bootstrap from its peers (docs/upgrading.md)"
    )
