"""``kura admin rollout-gate``: wait until a restarted node is ready and the mesh has caught up
with it, so that a rollout may move the next node (issue 31; docs/upgrading.md; the StatefulSet
rollout, deploy/kura/rollout.sh, runs it between pods).

A look at the mesh (``look``) reads the node's ``/ready`` and ``/status`` and the ``/status`` of
every other node given (their public URLs; the node's own URL among them is recognised by its
``node_url`` and skipped). The node has caught up (``behind`` returns no reason) when:

* its ``/ready`` answers 200: discovery done and settled, every peer bootstrapped, writes taken;
* every peer it lists is healthy in its eyes, and it holds at most ``max_queued`` outbox
  messages for each and no catch-up mark (a queue that overflowed: the peer must pull);
* every peer it lists was looked at (``--mesh-url``; one given but down or unreachable is said
  to be so), knows it, sees it healthy, and holds at
  most ``max_queued`` messages and no catch-up mark for it: what was written while it was
  away has reached it;
* every ``--mesh-url`` node is listed by it, and none holds messages or a mark for it;
* no ``/status`` looked at warns that its node cannot talk to a peer, nor lists a peer whose
  ``wire_version`` is outside that node's range (``min_wire_version``..``wire_version``): with
  no writes flowing, a peer of an unspoken wire still looks healthy and holds no queue.

The queue fields read are in the ``/status`` of kura 0.1.0 as well (``peers[].outbox_messages``,
``needs_catch_up``, ``healthy``); the version fields (``warnings``' "cannot talk",
``wire_version``, ``min_wire_version``) are read only when present, so the gate also judges a
mesh that is half previous release.
``max_queued`` (default 0) allows for the messages a live write load keeps in flight.

The gate looks every ``INTERVAL_SECONDS`` until the node has caught up or ``wait_seconds``
passed, printing each new set of reasons. Exit codes (``run``): 0 caught up; 3 a token was
refused (401, 403); 5 not caught up in time, with the last reasons.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kit.fetch import FetchError, Hints, fetch_json

INTERVAL_SECONDS = 1.0
CAUGHT_UP, REFUSED, NOT_CAUGHT_UP = 0, 3, 5
HINTS = Hints("a kura node", "--url or --mesh-url", "--token or KURA_TOKEN")


@dataclass
class Look:
    """One look at the mesh: the node's readiness and status, and each other node's status by
    its public URL (None: it could not be read, ``errors`` says why)."""

    ready: bool = False
    status: dict[str, Any] | None = None
    others: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    refused: bool = False  # a 401 or 403: no waiting fixes a wrong token


Fetch = Callable[[str], Any]


def look(url: str, mesh_urls: Sequence[str], fetch: Fetch) -> Look:
    """Read ``url``'s ``/ready`` and ``/status`` and every ``mesh_urls`` node's ``/status``
    with ``fetch`` (a URL -> decoded JSON, raising ``FetchError``)."""
    seen = Look()
    try:
        fetch(url + "/ready")
        seen.ready = True
    except FetchError as exc:
        if exc.status != 503:  # 503: not ready, the reasons are in /status
            seen.errors.append(exc.message)
    for target in (url, *mesh_urls):
        try:
            doc = fetch(target + "/status")
        except FetchError as exc:
            seen.errors.append(exc.message)
            seen.refused |= exc.status in (401, 403)
            doc = None
        if target == url:
            seen.status = doc if isinstance(doc, dict) else None
        else:
            seen.others[target] = doc if isinstance(doc, dict) else None
    return seen


def behind(seen: Look, max_queued: int = 0) -> list[str]:
    """Why the mesh has not caught up with the node (the module docstring's rules); empty when
    it has. Pure: reads ``seen`` only."""
    reasons = list(seen.errors)
    node = seen.status
    if node is None:
        return reasons or ["the node's /status could not be read"]
    me = str(node.get("node_url", ""))
    if not seen.ready:
        reasons.append("not ready: " + ("; ".join(node.get("reasons") or []) or "/ready is 503"))
    statuses = {str(doc.get("node_url")): doc for doc in seen.others.values() if doc}
    listed = set()
    for row in node.get("peers", []):
        peer = str(row.get("node_url"))
        listed.add(peer)
        reasons.extend(_row_behind(f"{peer} (as this node sees it)", row, max_queued))
        doc = statuses.get(peer)
        if doc is None:
            reasons.append(_not_checked(peer, seen))
            continue
        theirs = next((r for r in doc.get("peers", []) if r.get("node_url") == me), None)
        if theirs is None:
            reasons.append(f"{peer} does not list this node ({me}) yet")
            continue
        reasons.extend(_row_behind(f"{peer}'s view of this node", theirs, max_queued))
    # A --mesh-url node the node does not list (its discovery gave up on it, or membership has
    # not admitted it yet) may still hold messages or a mark for it.
    for peer, doc in statuses.items():
        if peer == me or peer in listed:
            continue
        reasons.append(f"{peer} is in the mesh but this node does not list it")
        theirs = next((r for r in doc.get("peers", []) if r.get("node_url") == me), None)
        if theirs is not None:
            reasons.extend(_row_behind(f"{peer}'s view of this node", theirs, max_queued))
    for doc in (node, *statuses.values()):
        reasons.extend(_cannot_talk(doc))
    return reasons


def _not_checked(peer: str, seen: Look) -> str:
    """Why ``peer``'s queue for the node was not read: it was given (``--mesh-url``, under the
    URL the node lists it by) and its ``/status`` could not be read (down or unreachable; the
    fetch error is among the reasons too), some ``--mesh-url`` node could not be read (it may be
    that one, under another URL), or it was not given."""
    head = f"{peer}'s queue for this node not checked"
    if peer in seen.others:
        return f"{head}: {peer} is down or unreachable (its /status could not be read)"
    unread = [url for url, doc in seen.others.items() if doc is None]
    if unread:
        return (
            f"{head}: --mesh-url {', '.join(unread)} is down or unreachable (its /status could "
            "not be read); if that is not this peer, pass its public URL with --mesh-url"
        )
    return f"{head}: pass that node's public URL with --mesh-url"


def _cannot_talk(doc: dict[str, Any]) -> list[str]:
    """Why the node of ``doc`` (a ``/status``) cannot talk to a peer: a warning saying so, or a
    peer row whose ``wire_version`` is outside the node's range (``min_wire_version`` to
    ``wire_version``). Without writes a peer of an unspoken wire still looks healthy and holds
    no queue, so only these say it. Fields read only when present (kura 0.1.0 has none; a
    ``/status`` without ``min_wire_version`` speaks from wire 1)."""
    where = str(doc.get("node_url"))
    out = [f"{where}: {w}" for w in doc.get("warnings") or [] if "cannot talk" in str(w)]
    high = doc.get("wire_version")
    if not isinstance(high, int):
        return out
    low = doc.get("min_wire_version", 1)
    for row in doc.get("peers") or []:
        wire = row.get("wire_version")
        if isinstance(wire, int) and isinstance(low, int) and not low <= wire <= high:
            out.append(
                f"{where}: peer {row.get('node_url')} runs wire {wire}, outside {low}-{high}"
            )
    return out


def _row_behind(where: str, row: dict[str, Any], max_queued: int) -> list[str]:
    out = []
    if not row.get("healthy"):
        out.append(f"{where}: not healthy")
    queued = int(row.get("outbox_messages") or 0)
    if queued > max_queued:
        out.append(f"{where}: {queued} outbox messages queued (at most {max_queued})")
    if row.get("needs_catch_up"):
        out.append(f"{where}: needs catch-up ({row.get('catch_up_reason') or 'queue dropped'})")
    return out


def run(
    url: str,
    mesh_urls: Sequence[str],
    token: str | None,
    *,
    wait_seconds: float,
    max_queued: int = 0,
    request_timeout_seconds: float = 10.0,
    out: TextIO = sys.stdout,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Look until the mesh has caught up with ``url`` (exit 0) or ``wait_seconds`` passed (5);
    3 when a token is refused. Prints each new set of reasons and the verdict to ``out``."""
    url = url.rstrip("/")
    mesh = [u.rstrip("/") for u in mesh_urls if u.rstrip("/") != url]
    deadline = clock() + wait_seconds

    def fetch(target: str) -> Any:
        left = max(0.5, min(request_timeout_seconds, deadline - clock()))
        return fetch_json(target, HINTS, token, left)

    shown: list[str] = []
    while True:
        seen = look(url, mesh, fetch)
        reasons = behind(seen, max_queued)
        if not reasons:
            peers = len((seen.status or {}).get("peers", []))
            print(f"caught up: {url} is ready and in step with its {peers} peers", file=out)
            return CAUGHT_UP
        if seen.refused:
            print("refused: " + "; ".join(reasons), file=out)
            return REFUSED
        if reasons != shown:
            print("waiting: " + "; ".join(reasons), file=out, flush=True)
            shown = reasons
        if clock() >= deadline:
            print(
                f"not caught up after {wait_seconds:g} s: " + "; ".join(reasons),
                file=out,
            )
            return NOT_CAUGHT_UP
        sleep(min(INTERVAL_SECONDS, max(0.0, deadline - clock())))
