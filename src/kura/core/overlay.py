"""Overlay namespaces (issue 29 item 2): the namespaces a credential reads, in order, and the
one it writes; and what one request reads and writes (``NamespaceView``), decided once, where
the right is checked (``kura.api.auth.TokenAuth.view``, for every HTTP route and RPC).

A pull-request job's credential reads ``pr-123`` then ``main`` and writes ``pr-123``: its
builds get hits from main's entries and never write into main, whatever route or key they use
(the "CREEP" cache-poisoning class, CVE-2025-36852; ``docs/security.md``).

What a request reads and writes (``view_of``). ``Asked`` is what the request names: the
protocol's own default (``""`` for Bazel HTTP, ccache, Gradle, sccache, WebDAV and Kura's
routes without ``namespace_id``; ``nx``/``metro`` for Nx and Metro; REAPI's empty instance
name; Turborepo without a team: none) or a namespace it names itself (``/ns/X/...``,
``namespace_id=X``, Turborepo's ``teamId``/``slug`` X, REAPI instance name X).

* A credential without an overlay: the request reads and writes the namespace it names, or
  its default, exactly as before overlays existed.
* With an overlay, a request that names none, or names the overlay's write namespace: reads
  try each of the overlay's namespaces in order (a miss falls through, a hit anywhere is a
  hit: ``kura.storage.overlay``), writes and cleans go to the write namespace.
* Naming another namespace the overlay reads: reads of it alone; a write or clean is
  ``Forbidden`` (403 / PERMISSION_DENIED) before any byte is read, so nothing is stored.
* Naming a namespace the overlay does not read: ``Forbidden`` for everything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from kura.core.errors import Forbidden
from kura.core.keys import NAMESPACE, validate
from kura.core.rights import Access

# The rights that put something into (or take it out of) a namespace.
WRITING = frozenset({Access.WRITE_CAS, Access.WRITE, Access.CLEAN})


@dataclass(frozen=True)
class Overlay:
    """A credential's namespaces: ``reads`` in the order they are tried (not empty, no
    repeats) and ``write``, one of them (None: the credential writes no namespace)."""

    reads: tuple[str, ...]
    write: str | None

    def describe(self) -> str:
        """``reads pr-123, main and writes pr-123`` (a refusal's message)."""
        writes = f"writes {self.write!r}" if self.write is not None else "writes no namespace"
        return f"reads {', '.join(map(repr, self.reads))} and {writes}"


def overlay_from(reads: list[str] | None, write: str | None) -> Overlay | None:
    """The overlay of a credential's ``read`` list and ``write`` namespace (None when both are
    absent: no overlay). Without ``reads`` it reads ``[write]``; otherwise ``write`` must be
    one of ``reads``. ``ValueError`` saying why for an empty list, a repeated namespace, one
    outside the namespace alphabet (``kura.core.keys.NAMESPACE``) or a ``write`` not read,
    never echoing a value (a token pasted into the wrong field must not reach a log)."""
    if reads is None and write is None:
        return None
    if reads is None:
        assert write is not None
        reads = [write]
    if not reads:
        raise ValueError("the read namespaces are an empty list")
    if any(not n for n in [*reads, *([write] if write is not None else [])]):
        raise ValueError(
            'an overlay names no empty namespace ("", the default one, cannot be in an overlay)'
        )
    for name in [*reads, *([write] if write is not None else [])]:
        if NAMESPACE.pattern.fullmatch(name) is None:
            raise ValueError(f"a namespace is {NAMESPACE.description}")
    if len(set(reads)) != len(reads):
        raise ValueError("a namespace is listed twice")
    if write is not None and write not in reads:
        raise ValueError("the write namespace must be one of the read namespaces")
    return Overlay(tuple(reads), write)


class Asked(NamedTuple):  # a tuple: built on every request, at a fraction of a dataclass's cost
    """What a request names: ``named`` (None: nothing, the protocol's default applies),
    ``default`` (None: the route touches no namespace unless it names one) and ``label``, the
    field a malformed ``named`` is reported as (``namespace_id``, ``team``, ...)."""

    named: str | None
    default: str | None
    label: str = "namespace"

    @property
    def namespace(self) -> str | None:
        """The namespace a credential without an overlay uses (None: none)."""
        return self.named if self.named is not None else self.default


class NamespaceView(NamedTuple):  # a tuple, as ``Asked``
    """The namespaces one request reads (``reads``, in order, not empty) and writes
    (``write``; None: it may not write, cleans included), and who writes (``writer``, its
    credential's identity, ``kura.core.provenance``; "" where none was decided)."""

    reads: tuple[str, ...]
    write: str | None
    writer: str = ""

    @property
    def home(self) -> str:
        """The namespace a read names; the reader tries the rest of ``reads`` after it."""
        return self.reads[0]

    @property
    def writable(self) -> str:
        """``write``, or ``Forbidden`` when this request may not write."""
        if self.write is None:
            raise Forbidden(
                "this request would store content, and its credential writes nothing here: "
                "it names a namespace the credential only reads, or the credential writes none"
            )
        return self.write


def view_of(
    overlay: Overlay | None, asked: Asked, access: Access, writer: str = ""
) -> NamespaceView | None:
    """What a request that asks ``asked`` with the right ``access`` reads and writes (module
    rules), its credential's identity ``writer`` carried along; None when it touches no
    namespace (no overlay, nothing named, no default).
    ``Forbidden`` naming the credential's namespaces (never its token) for a write to a
    namespace it may only read, or anything in one it does not read; ``InvalidRequest`` for a
    named namespace outside the alphabet (a credential without an overlay)."""
    if overlay is None:
        ns = asked.namespace
        if ns is None:
            return None
        if asked.named is not None:
            validate(ns, NAMESPACE, asked.label)
        return NamespaceView((ns,), ns, writer)
    named = asked.named
    if named is None or named == overlay.write:
        if access in WRITING and overlay.write is None:
            raise Forbidden(f"this credential writes no namespace: it {overlay.describe()}")
        return NamespaceView(overlay.reads, overlay.write, writer)
    if named not in overlay.reads:
        raise Forbidden(
            f"this credential is not valid for namespace {named[:80]!r}: it {overlay.describe()}"
        )
    if access in WRITING:
        raise Forbidden(
            f"this credential writes only its write namespace, not {named!r}: it "
            f"{overlay.describe()}"
        )
    return NamespaceView((named,), None, writer)
