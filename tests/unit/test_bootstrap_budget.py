"""The bootstrap budget's pure rules (``kura.mesh.bootstrap_budget``): the disk allowance, the
version gate that merges passes, and the share reported in ``/ready``."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kura.core.manifest import Manifest
from kura.mesh.bootstrap_budget import DiskAllowance, VersionGate, budget_report


@dataclass
class Peer:
    peer: str = "p"
    listed_artifacts: int = 0
    listed_bytes: int = 0
    artifacts_total: int = 0
    bytes_total: int = 0
    applied_artifacts: int = 0
    applied_bytes: int = 0
    skipped_artifacts: int = 0
    skipped_bytes: int = 0
    budget_stopped: bool = False


def manifest(version_ms: int, artifact_id: str) -> Manifest:
    return Manifest(
        artifact_id=artifact_id,
        producer="http",
        namespace_id="",
        key=artifact_id,
        content_type="application/octet-stream",
        size=1,
        sha256="0" * 64,
        version_ms=version_ms,
        created_at_ms=version_ms,
    )


def test_the_allowance_counts_stored_and_claimed_bytes_and_one_claim_per_artifact() -> None:
    used = [600]
    allowance = DiskAllowance(1000, lambda: used[0])
    assert allowance.claim("a", 300) is True
    assert allowance.claim("a", 300) is None  # another pass claimed it: counted once
    assert allowance.claim("b", 101) is False  # 600 + 300 + 101 > 1000
    assert allowance.claim("b", 100) is True
    used[0] += 300  # "a" committed ...
    allowance.release("a")  # ... and released
    assert allowance.claimed_bytes == 100
    assert allowance.claim("c", 1) is False


def test_converged_peers_report_the_union_once() -> None:
    # Two peers list the same 200; the passes applied 60 + 40 and each skipped the other 100.
    a = Peer("a", 200, 2000, 200, 2000, 60, 600, 100, 1000, True)
    b = Peer("b", 200, 2000, 200, 2000, 40, 400, 100, 1000, True)
    report = budget_report([a, b], 1000)
    assert report.stopped
    assert (report.held_artifacts, report.peer_artifacts, report.held_percent) == (100, 200, 50)
    assert "holding 50% of the peers' data (100 of 200 artifacts, 1000 of 2000 bytes)" in (
        report.warning("the rest is served by read-through")
    )


def test_disjoint_peers_report_both_halves() -> None:
    newer = Peer("n", 100, 1000, 100, 1000, 100, 1000, 0, 0, False)
    older = Peer("o", 100, 1000, 100, 1000, 0, 0, 100, 1000, True)
    report = budget_report([newer, older], 1000)
    assert (report.held_artifacts, report.skipped_artifacts, report.peer_artifacts) == (
        100,
        100,
        200,
    )


def test_what_was_already_held_counts_as_held() -> None:
    restarted = Peer("a", 50, 500, 10, 100, 10, 100, 0, 0, False)
    report = budget_report([restarted], 1000)
    assert (report.held_artifacts, report.peer_artifacts, report.stopped) == (50, 50, False)
    assert budget_report([], 1000).held_percent == 100


async def test_the_gate_admits_across_passes_newest_first_while_engaged() -> None:
    engaged = [True]
    gate = VersionGate(lambda: engaged[0])
    admitted: list[tuple[str, int]] = []

    async def walk(peer: str, versions: list[int]) -> None:
        for v in versions:
            await gate.turn(peer, manifest(v, f"{peer}{v}"), lambda: None)
            admitted.append((peer, v))
            await asyncio.sleep(0)
        gate.leave(peer)

    gate.join("old")
    gate.join("new")
    await asyncio.gather(walk("old", [5, 3, 1]), walk("new", [6, 4, 2]))
    assert [v for _, v in admitted] == [6, 5, 4, 3, 2, 1]


async def test_a_counting_pass_holds_the_others_until_it_walks_and_an_open_gate_never_waits() -> (
    None
):
    gate = VersionGate(lambda: True)
    gate.join("counting")
    gate.join("ready")
    waiting = asyncio.create_task(gate.turn("ready", manifest(9, "x"), lambda: None))
    for _ in range(20):  # let it run as far as it can
        await asyncio.sleep(0)
    assert not waiting.done()
    gate.leave("counting")  # e.g. its pass failed, or its peer listed nothing
    await asyncio.wait_for(waiting, 5)

    open_gate = VersionGate(lambda: False)
    open_gate.join("counting")
    await asyncio.wait_for(open_gate.turn("other", manifest(1, "y"), lambda: None), 5)
