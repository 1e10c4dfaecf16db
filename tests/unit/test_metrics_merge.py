"""``kura.workers.metrics_merge``: the node's /metrics combines the workers' families as the
collectors that define them say (``across_processes``), with no list of families of its own."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from kura.api.auth import TokenAuth
from kura.api.auth_metrics import auth_collector
from kura.api.metrics import KuraMetrics, Scraped, counts, gauge
from kura.workers.metrics_merge import Carry, merge


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if not s.name.endswith("_created")
    }


def test_equal_labels_are_summed_and_new_ones_added() -> None:
    primary, worker = KuraMetrics("r", "t"), KuraMetrics("r", "t")
    for _ in range(3):
        primary.count_lookup("nx", True)
        primary.observe_request("nx", "GET", 200, 0.002)
    for _ in range(5):
        worker.count_lookup("nx", True)
        worker.observe_request("nx", "GET", 200, 0.002)
    worker.count_lookup("turbo", False)
    worker.bytes_out_child("nx").inc(100)
    merged = samples(
        merge(
            primary.exposition().decode(),
            [worker.exposition().decode()],
            primary.across_processes,
        )
    )
    hit = ("kura_cache_lookups_total", (("protocol", "nx"), ("result", "hit")))
    assert merged[hit] == 8
    assert merged[("kura_cache_lookups_total", (("protocol", "turbo"), ("result", "miss")))] == 1
    assert (
        merged[
            ("kura_http_request_duration_seconds_count", (("method", "GET"), ("protocol", "nx")))
        ]
        == 8
    )
    assert merged[("kura_http_sent_bytes_total", (("protocol", "nx"),))] == 100
    # A family the workers do not add to keeps the primary's value (kura_node_info is 1).
    assert merged[("kura_node_info", (("region", "r"), ("tenant_id", "t")))] == 1


def test_tls_reloads_are_the_most_any_process_made_and_expiry_the_earliest() -> None:
    def exposition(reloads: float, failures: float, expiry: float) -> str:
        return (
            "# TYPE kura_public_tls_reloads_total counter\n"
            f"kura_public_tls_reloads_total {reloads}\n"
            "# TYPE kura_public_tls_reload_failures_total counter\n"
            f"kura_public_tls_reload_failures_total {failures}\n"
            "# TYPE kura_public_tls_certificate_expiry_timestamp_seconds gauge\n"
            f"kura_public_tls_certificate_expiry_timestamp_seconds {expiry}\n"
        )

    primary = KuraMetrics("r", "t")
    primary.register(auth_collector(TokenAuth((), ()), None))
    merged = samples(
        merge(
            exposition(0, 2, 300),
            [exposition(1, 1, 200), exposition(1, 0, 400)],
            primary.across_processes,
        )
    )
    assert merged[("kura_public_tls_reloads_total", ())] == 1  # one swap, not one a process
    assert merged[("kura_public_tls_reload_failures_total", ())] == 2
    assert merged[("kura_public_tls_certificate_expiry_timestamp_seconds", ())] == 200


def test_a_family_a_component_adds_is_combined_as_its_collector_says() -> None:
    # No list in the merge names these: a worker's new family is summed by default, and one its
    # collector declares as the primary's keeps the primary's value.
    def node(waiting: float, held: dict[str, int]) -> KuraMetrics:
        metrics = KuraMetrics("r", "t")
        metrics.register(
            Scraped(
                gauge("kura_test_waiting", "Waiting.", lambda: waiting),
                counts("kura_test_held", "Held.", "kind", lambda: held),
                gauge("kura_test_share", "The primary's share.", lambda: waiting),
                across_processes={"kura_test_share": "primary"},
            )
        )
        return metrics

    primary = node(2, {"a": 1})
    workers = [node(3, {"a": 4, "b": 5}).exposition().decode() for _ in range(2)]
    merged = samples(merge(primary.exposition().decode(), workers, primary.across_processes))
    assert merged[("kura_test_waiting", ())] == 8
    assert merged[("kura_test_held_total", (("kind", "a"),))] == 9
    assert merged[("kura_test_held_total", (("kind", "b"),))] == 10
    assert merged[("kura_test_share", ())] == 2


def test_counts_of_a_worker_that_died_restarted_or_did_not_answer_are_kept() -> None:
    """The node's counted families never fall when a worker goes (kura.workers.metrics_merge
    ``Carry``); its gauges are not carried."""
    primary = KuraMetrics("r", "t")
    primary.observe_request("nx", "GET", 200, 0.002)

    def worker(requests: int, in_flight: int) -> str:
        m = KuraMetrics("r", "t")
        for _ in range(requests):
            m.count_lookup("nx", True)
            m.observe_request("nx", "GET", 200, 0.002)
        m.count_inflight(lambda: in_flight)
        return m.exposition().decode()

    carry = Carry()
    across = primary.across_processes
    hit = ("kura_cache_lookups_total", (("protocol", "nx"), ("result", "hit")))
    count = ("kura_http_request_duration_seconds_count", (("method", "GET"), ("protocol", "nx")))

    def scrape(
        answers: dict[int, tuple[int, str]],
    ) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        for slot, (pid, text) in answers.items():
            carry.read(slot, pid, text, across)
        texts = [text for _pid, text in answers.values()]
        carried = carry.exposition(set(answers))
        return samples(
            merge(primary.exposition().decode(), texts + ([carried] if carried else []), across)
        )

    first = scrape({1: (101, worker(7, 2)), 2: (102, worker(5, 1))})
    assert first[hit] == 12
    assert first[count] == 13
    # Worker 2 died (or did not answer): its 5 stay counted.
    gone = scrape({1: (101, worker(8, 0))})
    assert gone[hit] == 13
    assert gone[count] == 14
    # Worker 2 is back as a new process that counted 1 so far: 5 retired + 1.
    back = scrape({1: (101, worker(8, 0)), 2: (202, worker(1, 0))})
    assert back[hit] == 14
    assert back[count] == 15
    # Histogram buckets are carried with their counts; a gauge is the live processes' only.
    assert first[("kura_http_inflight_requests", ())] == 3
    assert back[("kura_http_inflight_requests", ())] == 0
    le = (
        "kura_http_request_duration_seconds_bucket",
        (("le", "+Inf"), ("method", "GET"), ("protocol", "nx")),
    )
    assert back[le] == back[count]


def test_texts_read_out_of_order_never_roll_a_count_back_or_count_twice() -> None:
    """Two scrapes at once may hand ``Carry`` an older text after a newer one."""
    primary = KuraMetrics("r", "t")
    across = primary.across_processes
    hit = ("kura_cache_lookups_total", (("protocol", "nx"), ("result", "hit")))

    def worker(lookups: int) -> str:
        m = KuraMetrics("r", "t")
        for _ in range(lookups):
            m.count_lookup("nx", True)
        return m.exposition().decode()

    def carried(carry: Carry) -> float:
        text = carry.exposition(set())
        assert text is not None
        return samples(merge(primary.exposition().decode(), [text], across)).get(hit, 0.0)

    same = Carry()
    same.read(1, 100, worker(50), across)
    same.read(1, 100, worker(40), across)  # the older text, read last
    assert carried(same) == 50  # the worker died: its 50 stay, not 40

    reused = Carry()
    reused.read(1, 100, worker(40), across)
    reused.read(1, 200, worker(3), across)  # a new process in the slot: 40 retire
    reused.read(1, 100, worker(45), across)  # a late text of the old process
    assert carried(reused) == 43
