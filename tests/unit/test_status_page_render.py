"""``kura.api.status_page.render``: every value from ``/status`` is escaped, and the page shows
the budget-stop share and recent errors when present (the browser test covers the live page)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kura.api.status_page import render

EVIL = '<script>alert("x")</script>'


def status(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "node_url": "http://127.0.0.1:1",
        "public_url": "http://127.0.0.1:2",
        "tenant_id": "default",
        "region": "r0",
        "ready": False,
        "reasons": ["bootstrap in progress: 0 of 1 peers"],
        "warnings": [],
        "bootstrap": {"peers_done": 0, "peers_total": 1, "bytes_done": 0, "bytes_total": 10},
        "generation": 1,
        "peers": [],
        "artifacts": 0,
        "disk_used_bytes": 0,
        "outbox_messages": 0,
        "tmp_reserved_bytes": 0,
        "tmp_capacity_bytes": 100,
        "version": "0.1.0",
        "disk_limit_bytes": 100,
        "lookups": {},
        "recent_errors": [],
    }
    base.update(overrides)
    return base


def test_every_value_is_escaped() -> None:
    page = render(
        status(
            node_url=EVIL,
            reasons=[EVIL],
            warnings=[EVIL],
            peers=[
                {
                    "node_url": EVIL,
                    "known": True,
                    "healthy": False,
                    "region": EVIL,
                    "outbox_messages": 3,
                    "outbox_oldest_age_seconds": 1.5,
                    "replication_failures_in_a_row": 2,
                    "last_error": EVIL,
                }
            ],
            lookups={EVIL: {"hit": 1, "miss": 1}},
            recent_errors=[{"at": EVIL, "level": "ERROR", "logger": EVIL, "message": EVIL}],
        ),
        datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert "<script" not in page
    assert page.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 9
    assert "50.0%" in page  # the hit ratio
    assert "<script" not in page.lower()


def test_budget_stop_share_and_recent_errors_are_shown() -> None:
    page = render(
        status(
            ready=True,
            reasons=[],
            bootstrap={
                "peers_done": 1,
                "peers_total": 1,
                "bytes_done": 10,
                "bytes_total": 10,
                "budget_stopped": True,
                "budget_limit_bytes": 1024,
                "held_percent": 40,
                "held_artifacts": 4,
                "peer_data_artifacts": 10,
                "held_bytes": 400,
                "peer_data_bytes": 1000,
            },
            recent_errors=[
                {
                    "at": "2026-01-01T00:00:00.000+00:00",
                    "level": "WARNING",
                    "logger": "kura",
                    "message": "peer down",
                }
            ],
        )
    )
    assert 'data-ready="true"' in page
    assert "holding 40% of the peers&#x27; data (4 of 10 artifacts" in page
    assert "peer down" in page
    assert 'http-equiv="refresh" content="5"' in page
