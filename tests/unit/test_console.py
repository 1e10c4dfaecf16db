"""``kura status`` rendering: the bootstrap bar matches its numbers, long text wraps, never cut."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kura.console import LINE_WIDTH, render_status


def status(
    bootstrap: dict[str, int] | None = None, error: str = "", reasons: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "node_url": "http://127.0.0.1:4101",
        "public_url": "http://127.0.0.1:4001",
        "tenant_id": "default",
        "region": "dev-2",
        "ready": not reasons,
        "reasons": list(reasons),
        "artifacts": 3,
        "disk_used_bytes": 100,
        "tmp_reserved_bytes": 0,
        "tmp_capacity_bytes": 1 << 30,
        "outbox_messages": 0,
        "bootstrap": bootstrap,
        "generation": 3,
        "peers": [
            {
                "node_url": "http://127.0.0.1:4100",
                "healthy": not error,
                "known": True,
                "outbox_messages": 0,
                "outbox_oldest_age_seconds": 0.0,
                "last_error": error,
            }
        ],
    }


def bar_of(text: str) -> str:
    line = next(x for x in text.splitlines() if x.startswith("bootstrap "))
    return line[line.index("[") : line.index("]") + 1]


def test_no_peer_done_and_no_bytes_known_draws_an_empty_bar() -> None:
    # The case: "0 of 2 peers" next to a full 100 % bar.
    text = render_status(
        status({"peers_done": 0, "peers_total": 2, "bytes_done": 0, "bytes_total": 0})
    )
    assert "0 of 2 peers" in text
    assert "  0%" in text
    assert "#" not in bar_of(text)


def test_the_bar_is_full_only_when_every_peer_and_byte_is_done() -> None:
    half = render_status(
        status({"peers_done": 1, "peers_total": 2, "bytes_done": 50, "bytes_total": 50})
    )
    assert " 50%" in half
    assert bar_of(half).count("#") == 15
    done = render_status(
        status({"peers_done": 2, "peers_total": 2, "bytes_done": 80, "bytes_total": 80})
    )
    assert "100%" in done
    assert "." not in bar_of(done)
    bytes_behind = render_status(
        status({"peers_done": 2, "peers_total": 2, "bytes_done": 1, "bytes_total": 4})
    )
    assert " 25%" in bytes_behind


def test_long_errors_and_reasons_wrap_instead_of_being_cut() -> None:
    error = "ClientConnectorError: " + " ".join(f"word{i}" for i in range(60)) + " END-OF-ERROR"
    reason = "bootstrap in progress: " + " ".join(f"r{i}" for i in range(60)) + " END-OF-REASON"
    text = render_status(status(error=error, reasons=(reason,)))
    assert all(len(line) <= LINE_WIDTH for line in text.splitlines()), text
    flat = " ".join(line.strip() for line in text.splitlines())
    assert error in flat
    assert reason in flat


def test_warnings_are_printed_under_ready_and_wrap() -> None:
    full = (
        "the object-store upload queue is full (5 messages, KURA_OUTBOX_MAX_DEPTH=5): writes "
        "are refused with 503 until the store takes the uploads"
    )
    text = render_status({**status(), "warnings": [full, "disk full at start-up"]})
    lines = text.splitlines()
    ready = lines.index("ready    yes")
    assert lines[ready + 1].startswith("warning  the object-store upload queue is full")
    assert all(len(line) <= LINE_WIDTH for line in lines)
    assert " ".join(x.strip() for x in lines[ready + 1 : ready + 3]).startswith(
        "warning  " + full[:60]
    )
    assert "warning  disk full at start-up" in lines
    assert "warning" not in render_status(status())  # none: no line


def test_the_printed_kura_command_is_the_one_that_is_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kura_harness import devmesh

    script = tmp_path / ".venv" / "bin" / "kura"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [str(script), "dev"])
    monkeypatch.setenv("PATH", "/nonexistent")
    assert devmesh.kura_command() == str(script)  # not a bare `kura` that is not on PATH
    monkeypatch.setattr(sys, "argv", ["/x/kura/cli.py", "dev"])
    assert devmesh.kura_command() == f"{sys.executable} -m kura.cli"


def test_kura_status_inside_a_node_uses_the_nodes_own_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kura.cli import build_parser

    monkeypatch.delenv("KURA_TOKEN", raising=False)
    monkeypatch.setenv("KURA_READ_ONLY_TOKENS", "")
    monkeypatch.setenv("KURA_READ_WRITE_TOKENS", " rw-1 ,rw-2")
    assert build_parser().parse_args(["status"]).token == "rw-1"
    monkeypatch.setenv("KURA_READ_ONLY_TOKENS", "ro-1")
    assert build_parser().parse_args(["status"]).token == "ro-1"
    monkeypatch.setenv("KURA_TOKEN", "mine")
    assert build_parser().parse_args(["status"]).token == "mine"


def test_versions_are_printed_for_the_node_and_each_peer_as_last_seen() -> None:
    doc = status()
    doc.update(version="0.2.0", wire_version=2)
    seen = {**doc["peers"][0], "wire_version": 2, "kura_version": "0.2.0"}
    old = {**seen, "node_url": "http://127.0.0.1:4102", "wire_version": 1, "kura_version": None}
    unseen = {**seen, "node_url": "http://127.0.0.1:4103", "wire_version": None}
    doc["peers"] = [seen, old, unseen]
    lines = render_status(doc).splitlines()
    assert "version  kura 0.2.0, wire 2" in lines
    rows = {line.split()[0]: line.split()[2] for line in lines if line.startswith("  http")}
    assert rows == {
        "http://127.0.0.1:4100": "0.2.0",
        "http://127.0.0.1:4102": "?",
        "http://127.0.0.1:4103": "-",
    }
    assert "? w1" in next(line for line in lines if "4102" in line)


def test_the_start_up_work_is_shown_while_it_runs_and_not_once_done() -> None:
    doc = status()
    doc["startup"] = {
        "phase": "reconciling",
        "rows_done": 412_000,
        "rows_expected": 1_000_000,
        "phase_seconds": 5.1,
    }
    (line,) = [x for x in render_status(doc).splitlines() if x.startswith("start-up ")]
    assert "412,000 of ~1,000,000 rows" in line
    assert " 41%" in line
    assert "writes wait" in line
    doc["startup"] = {"phase": "checking", "rows_done": 0, "rows_expected": 0, "phase_seconds": 2}
    assert "start-up checking the index (PRAGMA quick_check)" in render_status(doc)
    doc["startup"] = {"phase": "done", "rows_done": 9, "rows_expected": 9, "phase_seconds": None}
    assert "start-up" not in render_status(doc)
