"""``kura.mesh.load_report``: a worker's ``LoadTally`` reported into the primary's
``PublicLoad`` (virtual time) gives the node's signal: in flight summed over processes until a
report is stale or its worker gone, and one EWMA over every process's samples."""

from __future__ import annotations

import json
import random

import pytest

from kit.clock import ManualClock
from kura.mesh.load_report import RECENT_SAMPLES, REMOTE_STALE_SECONDS, LoadReport, LoadTally
from kura.mesh.peer_pace import PublicLoad


def test_a_workers_requests_in_flight_count_in_the_primarys_factor() -> None:
    clock = ManualClock()
    primary, worker = PublicLoad(clock, target_seconds=0.1), LoadTally()
    primary.started()
    for _ in range(3):
        worker.started()
    assert primary.inflight_total() == 1  # nothing reported yet
    primary.merge("worker-1", worker.take())
    assert primary.inflight == 1
    assert primary.inflight_total() == 4
    assert primary.factor() == 5.0
    worker.ended()
    primary.merge("worker-1", worker.take())  # a newer report replaces the last one
    assert primary.inflight_total() == 3


def test_a_stale_or_forgotten_report_no_longer_counts() -> None:
    clock = ManualClock()
    primary, worker = PublicLoad(clock, target_seconds=0.1), LoadTally()
    worker.started()
    primary.merge("worker-1", worker.take())
    primary.merge("worker-2", worker.take())
    assert primary.inflight_total() == 2
    primary.forget("worker-2")
    assert primary.inflight_total() == 1
    clock.advance(REMOTE_STALE_SECONDS + 0.1)
    assert primary.inflight_total() == 0
    assert primary.factor() == 1.0


def test_the_merged_ewma_is_the_ewma_of_every_sample() -> None:
    """Many samples in one report (more than it carries one by one): the same EWMA, to within
    the weight of the summarised ones, as feeding each sample; not the worker's own average."""
    rng = random.Random(7)
    samples = [rng.uniform(0.0, 0.05) for _ in range(500)] + [0.4] * 30  # a slow tail, last
    direct, merged = PublicLoad(ManualClock(), 0.1), PublicLoad(ManualClock(), 0.1)
    worker = LoadTally()
    for s in samples:
        direct.sample(s)
        worker.sample(s)
    report = worker.take()
    assert len(report.recent) == RECENT_SAMPLES
    assert report.older_count == len(samples) - RECENT_SAMPLES
    merged.merge("worker-1", LoadReport.from_json(json.loads(json.dumps(report.to_json()))))
    want = direct.latency_ewma_seconds()
    assert merged.latency_ewma_seconds() == pytest.approx(want, rel=0.002)
    assert want > 0.3  # the tail dominates, as in one process; a mean of all would be ~0.04
    assert sum(samples) / len(samples) < 0.05


def test_a_workers_samples_join_the_primarys_own() -> None:
    clock = ManualClock()
    primary, worker = PublicLoad(clock, target_seconds=0.1), LoadTally()
    for _ in range(100):
        primary.sample(0.01)
    for _ in range(10):
        worker.sample(1.0)
    primary.merge("worker-1", worker.take())
    # 10 slow samples after the primary's fast ones: 1 - 0.9**10 of the way to 1 s.
    fast = 0.01 * (1 - 0.9**100)
    assert primary.latency_ewma_seconds() == pytest.approx(1 - (1 - fast) * 0.9**10, rel=1e-9)
    assert primary.factor() > 6.0


def test_a_tally_reports_until_the_primary_knows_it_is_idle() -> None:
    tally = LoadTally()
    assert not tally.pending()
    tally.started()
    assert tally.pending()
    assert tally.take() == LoadReport(inflight=1)
    assert tally.pending()  # still in flight: reported again before it goes stale
    tally.sample(0.02)
    tally.ended()
    assert tally.take() == LoadReport(inflight=0, recent=(0.02,))
    assert not tally.pending()  # the primary already has 0 and every sample


@pytest.mark.parametrize(
    "doc",
    [{}, {"inflight": -1}, {"inflight": 0, "recent": [0.1] * (RECENT_SAMPLES + 1)}, "x", None],
)
def test_a_malformed_report_is_refused(doc: object) -> None:
    with pytest.raises(ValueError, match="not a load report"):
        LoadReport.from_json(doc)
