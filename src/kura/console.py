"""Terminal views of a node: ``kura status`` renders ``GET /status`` for a human.

Pure formatting of the JSON a node serves; no network here (``cli`` fetches it).
"""

from __future__ import annotations

from typing import Any

BAR_WIDTH = 30


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


def render_status(status: dict[str, Any]) -> str:
    """The mesh as one node sees it, as lines of text."""
    lines = [
        f"node     {status['node_url']}  (public {status['public_url']}, "
        f"tenant {status['tenant_id']}, region {status['region']})",
        "ready    " + ("yes" if status["ready"] else "NO: " + "; ".join(status["reasons"])),
        f"store    {status['artifacts']} artifacts, {human_bytes(status['disk_used_bytes'])}; "
        f"tmp {human_bytes(status['tmp_reserved_bytes'])} of "
        f"{human_bytes(status['tmp_capacity_bytes'])} reserved; "
        f"outbox {status['outbox_messages']} messages",
    ]
    bootstrap = status.get("bootstrap")
    if bootstrap:
        lines.append(
            "bootstrap "
            + progress_bar(bootstrap.get("bytes_done", 0), bootstrap.get("bytes_total", 0))
            + f" {bootstrap.get('peers_done', 0)} of {bootstrap.get('peers_total', 0)} peers"
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
    header = f"  {'peer':<32} {'state':<10} {'outbox':>7} {'oldest':>8}  last error"
    lines.append(header)
    for p in status["peers"]:
        state = "healthy" if p["healthy"] else ("down" if p["known"] else "unprobed")
        lines.append(
            f"  {p['node_url']:<32} {state:<10} {p['outbox_messages']:>7} "
            f"{p['outbox_oldest_age_seconds']:>7.1f}s  {p['last_error'][:60]}"
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
