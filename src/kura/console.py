"""Terminal views of a node: ``kura status`` renders ``GET /status`` for a human, ``kura admin``
the operator routes' answers (``kura.api.admin``) as tables. The table is ours (``table``, a
dozen lines): the one table library in the environment, rich, is there only as
import-linter's dependency, and a runtime dependency for aligned columns would not earn it.

Pure formatting of the JSON a node serves; no network here (``cli`` fetches it).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

BAR_WIDTH = 30
LINE_WIDTH = 100  # long reasons and errors wrap at this width, continued under an indent


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def progress_bar(done: float, total: float, width: int = BAR_WIDTH) -> str:
    """``[#########.....]  41%`` for done/total (a full bar when total is 0)."""
    fraction = 1.0 if total <= 0 else max(0.0, min(1.0, done / total))
    filled = round(fraction * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {fraction * 100:3.0f}%"


def bootstrap_line(bootstrap: dict[str, Any]) -> str:
    """The bootstrap bar and the numbers it is drawn from.

    The bar is the smaller of the peer fraction (peers done of peers) and the byte fraction, so
    it is never full while a peer is still to do: before a peer's inventory is read its bytes
    are not yet in ``bytes_total``, and "0 B of 0 B" alone would draw 100 %.
    """
    peers_done, peers_total = bootstrap.get("peers_done", 0), bootstrap.get("peers_total", 0)
    bytes_done, bytes_total = bootstrap.get("bytes_done", 0), bootstrap.get("bytes_total", 0)
    return (
        f"bootstrap {progress_bar(bootstrap_fraction(bootstrap), 1.0)} "
        f"{peers_done} of {peers_total} peers, "
        f"{human_bytes(bytes_done)} of {human_bytes(bytes_total)}"
    )


def bootstrap_fraction(bootstrap: dict[str, Any]) -> float:
    """How far bootstrap is, 0..1: the smaller of the peer and the byte fraction
    (``bootstrap_line`` says why); the status page draws the same number."""
    return min(
        _fraction(bootstrap.get("peers_done", 0), bootstrap.get("peers_total", 0)),
        _fraction(bootstrap.get("bytes_done", 0), bootstrap.get("bytes_total", 0)),
    )


def _fraction(done: float, total: float) -> float:
    return 1.0 if total <= 0 else max(0.0, min(1.0, done / total))


def wrapped(first: str, text: str, indent: int) -> list[str]:
    """``first + text`` wrapped at ``LINE_WIDTH``, continuation lines indented by ``indent``."""
    return textwrap.wrap(
        first + text,
        width=LINE_WIDTH,
        subsequent_indent=" " * indent,
        break_long_words=True,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def render_status(status: dict[str, Any]) -> str:
    """The mesh as one node sees it, as lines of text."""
    lines = [
        f"node     {status['node_url']}  (public {status['public_url']}, "
        f"tenant {status['tenant_id']}, region {status['region']})",
        f"version  kura {status.get('version', '?')}, wire {status.get('wire_version') or 1}",
        *wrapped(
            "ready    ", "yes" if status["ready"] else "NO: " + "; ".join(status["reasons"]), 9
        ),
        # Problems that do not block readiness but need an operator (as /ready's warnings).
        *(line for w in status.get("warnings", ()) for line in wrapped("warning  ", w, 9)),
        f"store    {status['artifacts']} artifacts, {human_bytes(status['disk_used_bytes'])}; "
        f"tmp {human_bytes(status['tmp_reserved_bytes'])} of "
        f"{human_bytes(status['tmp_capacity_bytes'])} reserved; "
        f"outbox {status['outbox_messages']} messages",
    ]
    startup = status.get("startup") or {}
    if startup.get("phase") == "checking":
        lines.append(
            f"start-up checking the index (PRAGMA quick_check), {startup['phase_seconds']} s"
        )
    elif startup.get("phase") == "reconciling":
        done, expected = startup["rows_done"], startup["rows_expected"]
        lines.append(
            f"start-up reconciling files with the index {progress_bar(done, expected)} "
            f"{done:,} of ~{expected:,} rows, {startup['phase_seconds']} s; writes wait"
        )
    store = status.get("object_store")
    if store:
        lines.append(
            f"object store {store['store']}: {store['upload_queue_messages']} uploads queued"
            + (
                f", the oldest {store['oldest_upload_age_seconds']:g} s old"
                if store["upload_queue_messages"]
                else ""
            )
            + ("; UNREACHABLE: misses skip it" if store.get("unreachable") else "")
            + ("; uploads STALLED with the disk full" if store.get("uploads_stalled") else "")
        )
    bootstrap = status.get("bootstrap")
    if bootstrap:
        lines.append(bootstrap_line(bootstrap))
        if bootstrap.get("budget_stopped"):
            lines.append(
                f"  stopped at the disk budget ({human_bytes(bootstrap['budget_limit_bytes'])}): "
                f"holding {bootstrap['held_percent']}% of the peers' data "
                f"({bootstrap['held_artifacts']} of {bootstrap['peer_data_artifacts']} artifacts, "
                f"{human_bytes(bootstrap['held_bytes'])} of "
                f"{human_bytes(bootstrap['peer_data_bytes'])})"
            )
    ae = status.get("anti_entropy")
    if ae:
        last = ae.get("last_round", {})
        lines.append(
            "anti-entropy "
            + (
                f"{ae.get('rounds', 0)} rounds; last: {last.get('requests', 0)} requests, "
                f"{human_bytes(last.get('bytes', 0))}, {ae.get('last_round_seconds', 0)}s, "
                f"{last.get('ranges_mismatched', 0)} ranges mismatched, "
                f"{last.get('repaired', 0)} repaired"
                if ae.get("enabled")
                else "off"
            )
        )
    lines.append(f"peers    {len(status['peers'])} (membership generation {status['generation']})")
    header = f"  {'peer':<32} {'state':<10} {'version':<12} {'outbox':>7} {'oldest':>8}  last error"
    lines.append(header)
    passes = {b["peer"]: b for b in (bootstrap or {}).get("peers", [])}
    for p in status["peers"]:
        state = "healthy" if p["healthy"] else ("down" if p["known"] else "unprobed")
        row = (
            f"  {p['node_url']:<32} {state:<10} {peer_version(p):<12} {p['outbox_messages']:>7} "
            f"{p['outbox_oldest_age_seconds']:>7.1f}s  "
        )
        lines.extend(wrapped(row, p["last_error"], len(row)))
        own = passes.get(p["node_url"], {})
        if own.get("mode"):
            cursor = own.get("cursor")
            lines.append(
                f"    pulled {own['mode']}, change-feed cursor "
                + ("none" if cursor is None else str(cursor))
            )
        if p.get("needs_catch_up"):
            forgotten = p.get("forgotten_at")
            lines.append(
                "    needs catch-up ("
                + (
                    f"queue of {p.get('outbox_dropped_messages', 0)} dropped at {forgotten}"
                    if forgotten
                    else "queue reached its cap"
                )
                + ("; catching up now" if p.get("catching_up") else "")
                + ")"
            )
    return "\n".join(lines)


def peer_version(peer: dict[str, Any]) -> str:
    """A peer's versions as last seen, ``0.2.0 w2``; ``? w1`` for kura 0.1.0, which reports
    no kura version; ``-`` until seen (or from a node that predates the fields)."""
    wire = peer.get("wire_version")
    if wire is None:
        return "-"
    return f"{peer.get('kura_version') or '?'} w{wire}"


# --- kura admin (kura.api.admin's answers): a table for people; --json prints the answer.


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: int = 0) -> str:
    """``rows`` under ``headers`` in columns two spaces apart, each as wide as its widest cell;
    the last ``numeric`` columns right-aligned. The last column is not padded (no trailing
    spaces)."""
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    first_numeric = len(headers) - numeric
    lines = []
    for row in (headers, *rows):
        cells = [
            str(c).rjust(w) if i >= first_numeric else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def human_seconds(seconds: float | None) -> str:
    """``90s``, ``15m``, ``3h``, ``2d`` (the largest whole unit); ``-`` for None."""
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _shown(namespace: str) -> str:
    return namespace if namespace else '""'


def render_namespaces(doc: dict[str, Any]) -> str:
    """``GET /_admin/namespaces`` as a table."""
    rows = []
    for n in doc["namespaces"]:
        rule = n["rule"]
        quota = rule["quota_bytes"]
        rows.append(
            (
                _shown(n["namespace"]),
                rule["pattern"],
                human_seconds(rule["max_age_seconds"]),
                "-" if quota is None else human_bytes(quota),
                human_seconds(rule["min_age_seconds"] or None),
                human_seconds(n["shed_age_youngest_seconds"]),
                human_seconds(n["shed_age_median_seconds"]),
                str(n["artifacts"]),
                human_bytes(n["used_bytes"]),
            )
        )
    headers = (
        "NAMESPACE",
        "RULE",
        "MAX AGE",
        "QUOTA",
        "MIN AGE",
        "SHED YOUNGEST",
        "SHED MEDIAN",
        "ENTRIES",
        "BYTES",
    )
    return table(headers, rows, numeric=2) + f"\nmeasured at {doc['measured_at']}"


def render_writers(doc: dict[str, Any]) -> str:
    """``GET /_admin/writers`` as a table."""
    rows = [
        (
            w["writer"] or "(unrecorded)",
            ",".join(w["vias"]),
            w["last_version_at"],
            str(w["entries"]),
            human_bytes(w["bytes"]),
        )
        for w in doc["writers"]
    ]
    headers = ("WRITER", "VIA", "LAST WRITE", "ENTRIES", "BYTES")
    return f"namespace {_shown(doc['namespace'])}\n" + table(headers, rows, numeric=2)


def render_entries(doc: dict[str, Any]) -> str:
    """``GET /_admin/entries`` as a table."""
    rows = [
        (e["producer"], e["key"], e["version_at"], human_bytes(e["size_bytes"]))
        for e in doc["entries"]
    ]
    headers = ("PRODUCER", "KEY", "WRITTEN", "SIZE")
    title = f"namespace {_shown(doc['namespace'])}, writer {doc['writer']}"
    return title + "\n" + table(headers, rows, numeric=1)


def render_purge(doc: dict[str, Any]) -> str:
    """``POST /_admin/purge``'s answer as one sentence."""
    entries = doc["entries"]
    return (
        f"purged writer {_shown(doc['writer'])} from namespace {_shown(doc['namespace'])} at "
        f"version {doc['version_ms']}: {entries} {'entry' if entries == 1 else 'entries'} "
        f"({human_bytes(doc['bytes'])}) deleted here; the purge is queued for this node's "
        "peers and its bucket, if it has them, which apply it as it reaches them"
    )
