"""Version skew: the previous release of kura (``tests/e2e/previous.py``: ``PREVIOUS_RELEASE``,
built once per session from this repository's history) beside HEAD (issue 31 item 1).

* A 3-node mesh of mixed versions under concurrent writes through six protocols' routes and
  namespace cleans (route root and ``/api/cache/clean``): two HEAD nodes and one previous, then
  one HEAD node rolled to the previous release on its data dir (one HEAD, two previous), then
  the whole mesh on HEAD. Every acknowledged write must be on every node with its bytes (SHA-256
  of what each node serves), every acknowledged clean must have taken effect on every node, and
  no read, during the run or after, may serve wrong bytes.
* A wiped node bootstraps from a peer of the other version: HEAD from the previous release,
  then the previous release from HEAD (the bootstrap's manifests and bodies cross versions).
* One data dir forward and back: previous → HEAD → previous, and HEAD → previous → HEAD, with
  writes by each. Every start serves everything every version wrote: HEAD changed neither the
  metadata schema nor the blob layout, so the previous release opens HEAD's data dir
  (docs/upgrading.md promises it). A release that bumps a format moves this test with it. What
  each start printed is printed (``-rA`` or ``-s`` shows it).
* HEAD's ``kura admin rollout-gate``, run where deploy/kura/rollout.sh runs it (beside the
  mesh, not inside a pod), judges a mesh with a previous-release node, whose own ``kura admin``
  has no such command.

HEAD's mesh nodes run in this process (``Mesh(in_process=True)``); the previous release's
always run as processes (``python -m kura.cli serve`` with its export first on PYTHONPATH). The
data-dir runs start every node as a process, so each start's output is its own log file.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import kura
from kura.core.versions import WIRE_VERSION
from kura_harness.launch import LaunchError
from tests import oneshot
from tests.conftest import NodeProcess, node_env, spawn_node
from tests.e2e.mesh import Mesh, manifests, wait_for
from tests.e2e.previous import PREVIOUS_RELEASE, Release, build_release, statuses, versions

HEAD = kura.__version__
RUN = os.urandom(3).hex()  # keys of one run never collide with another's
# The protocols whose own routes the tests write and read through (``new_write``).
PROTOCOLS = ("http", "nx", "turbo", "gradle", "xcode", "bazel")


@pytest.fixture(autouse=True)
def quiet_httpx(caplog: pytest.LogCaptureFixture) -> None:
    """httpx logs every request at INFO: keep the report (``-rA``) to what the tests print."""
    caplog.set_level(logging.WARNING, logger="httpx")


@pytest.fixture(scope="session")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The previous release, exported, with its stubs, proven to run its own code."""
    return build_release(PREVIOUS_RELEASE, tmp_path_factory.mktemp("previous") / "kura")


@dataclass(frozen=True)
class Entry:
    """An acknowledged write: where to read it, the SHA-256 of the bytes it must return."""

    path: str
    sha256: str
    by: str  # which node (and version) acknowledged it


def new_write(protocol: str, n: int, rng: random.Random) -> tuple[str, str, bytes]:
    """(method, path, body) of a new artifact ``n`` of ``protocol``; the path also reads it."""
    size = rng.randint(300_000, 1_200_000) if rng.random() < 0.1 else rng.randint(1, 40_000)
    body = rng.randbytes(size)
    if protocol == "http":
        return "PUT", f"/cache/skew/{RUN}/{n}", body
    if protocol == "nx":
        return "PUT", f"/v1/cache/{rng.getrandbits(40)}{n:06d}", body
    if protocol == "turbo":
        return "PUT", f"/v8/artifacts/{RUN}{n:08d}?slug=team", body
    if protocol == "gradle":
        return "PUT", f"/api/cache/gradle/skew-{RUN}-{n}?tenant_id=t", body
    if protocol == "xcode":
        return "POST", f"/api/cache/cas/skew-{RUN}-{n}?tenant_id=t&namespace_id=p", body
    assert protocol == "bazel"
    return "PUT", f"/cache/cas/{hashlib.sha256(body).hexdigest()}", body


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Tally:
    """What reading acknowledged writes back found."""

    checked: int = 0  # reads of an acknowledged write from a node
    lost: list[str] = field(default_factory=list)  # never served (404 or an error)
    wrong: list[str] = field(default_factory=list)  # served with other bytes


def check_entries(node: NodeProcess, label: str, entries: list[Entry], patience: float) -> Tally:
    """Read every entry from ``node``: right bytes, wrong bytes, or lost once ``patience``
    seconds of retries (replication still on its way) did not bring it."""
    tally = Tally()
    with node.client() as c:
        last: dict[str, httpx.Response] = {}

        def served(path: str) -> bool:
            last[path] = c.get(path)
            return last[path].status_code != 404

        for entry in entries:
            wait_for(functools.partial(served, entry.path), patience, interval=0.1)
            tally.checked += 1
            r = last.get(entry.path)
            if r is None or r.status_code != 200:
                status = r.status_code if r is not None else "no answer"
                tally.lost.append(f"{entry.path} on {label}: {status} (written via {entry.by})")
            elif digest(r.content) != entry.sha256:
                tally.wrong.append(f"{entry.path} on {label}: {len(r.content)} wrong bytes")
    return tally


def write_entries(
    node: NodeProcess, label: str, count: int, rng: random.Random, start: int
) -> list[Entry]:
    """Write ``count`` artifacts round the protocols through ``node``; each must be
    acknowledged (2xx)."""
    entries = []
    with node.client() as c:
        for n in range(start, start + count):
            method, path, body = new_write(PROTOCOLS[n % len(PROTOCOLS)], n, rng)
            r = c.request(method, path, content=body)
            assert 200 <= r.status_code < 300, (label, path, r.status_code, r.text)
            entries.append(Entry(path, digest(body), label))
    return entries


# --- the mixed mesh ---------------------------------------------------------------------------


@dataclass
class Clean:
    """An acknowledged namespace clean and the paths written into the namespace before it."""

    namespace: str
    how: str
    by: str
    gone: list[str]


class Load:
    """Writers, a cleaner and a reader against the nodes of ``mesh`` that are up, in threads,
    until ``stop``. A request counts only when its node was up (and not restarted) for all of
    it: a non-2xx answer then is a refusal; one to a node going down is excused."""

    def __init__(self, mesh: Mesh, labels: list[str]) -> None:
        self.mesh = mesh
        self.labels = labels
        self.lock = threading.Lock()
        self.up = [True] * len(mesh.nodes)
        self.generation = [0] * len(mesh.nodes)
        self.acked: list[Entry] = []
        self.cleans: list[Clean] = []
        self.refused: list[str] = []
        self.excused = 0
        self.reads = 0
        self.read_misses = 0
        self.wrong_during: list[str] = []
        self.stop = threading.Event()
        self.counter = 0
        self.threads: list[threading.Thread] = []

    # -- the nodes that are up --

    def pick(self, rng: random.Random) -> tuple[int, int]:
        """(index, generation) of a node that is up (waits while none is)."""
        while True:
            with self.lock:
                up = [i for i, u in enumerate(self.up) if u]
                if up:
                    i = rng.choice(up)
                    return i, self.generation[i]
            time.sleep(0.05)

    def judged(self, i: int, generation: int) -> bool:
        with self.lock:
            return self.up[i] and self.generation[i] == generation

    def down(self, i: int) -> None:
        with self.lock:
            self.up[i] = False
            self.generation[i] += 1

    def back(self, i: int, label: str) -> None:
        with self.lock:
            self.labels[i] = label
            self.up[i] = True

    def request(
        self, rng: random.Random, method: str, path: str, body: bytes | None = None
    ) -> tuple[httpx.Response | None, str, bool]:
        """(response or None on a transport error, node label, judged)."""
        i, generation = self.pick(rng)
        node, label = self.mesh.nodes[i], self.labels[i]
        try:
            r: httpx.Response | None = oneshot.request(
                method, node.url + path, content=body, timeout=30
            )
        except httpx.HTTPError:
            r = None
        return r, label, self.judged(i, generation)

    def outcome(self, r: httpx.Response | None, judged: bool, what: str) -> bool:
        """Whether ``r`` acknowledged; records a refusal by a node that stayed up."""
        if r is not None and 200 <= r.status_code < 300:
            return True
        with self.lock:
            if judged:
                self.refused.append(f"{what}: {r.status_code if r else 'transport error'}")
            else:
                self.excused += 1
        return False

    # -- the threads --

    def writer(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            with self.lock:
                self.counter += 1
                n = self.counter
            method, path, body = new_write(PROTOCOLS[n % len(PROTOCOLS)], n, rng)
            r, label, judged = self.request(rng, method, path, body)
            if self.outcome(r, judged, f"{method} {path} on {label}"):
                with self.lock:
                    self.acked.append(Entry(path, digest(body), label))

    def cleaner(self, seed: int) -> None:
        """Rounds of: write 3 entries into a fresh namespace, clean it through another node
        (its route root or /api/cache/clean), then write one more entry into it, which must
        survive the clean."""
        rng = random.Random(seed)
        k = 0
        while not self.stop.is_set():
            k += 1
            ns = f"skew-{RUN}-c{k}"
            gone = [f"/ns/{ns}/cache/{RUN}/{k}/{j}" for j in range(3)]
            for path in gone:  # acknowledged or not, the clean must remove it
                r, label, judged = self.request(rng, "PUT", path, rng.randbytes(2000))
                self.outcome(r, judged, f"PUT {path} on {label}")
            how = rng.choice(("route_root", "clean_endpoint"))
            target = (
                f"/ns/{ns}/cache"
                if how == "route_root"
                else f"/api/cache/clean?tenant_id=t&namespace_id={ns}"
            )
            r, label, judged = self.request(rng, "DELETE", target)
            if not self.outcome(r, judged, f"DELETE {target} on {label}"):
                continue
            with self.lock:
                self.cleans.append(Clean(ns, how, label, gone))
            time.sleep(0.01)  # a later millisecond than the clean's version, on any node
            body = rng.randbytes(1500)
            path = f"/ns/{ns}/cache/{RUN}/{k}/after"
            r, label, judged = self.request(rng, "PUT", path, body)
            if self.outcome(r, judged, f"PUT {path} on {label}"):
                with self.lock:
                    self.acked.append(Entry(path, digest(body), label))

    def reader(self, seed: int) -> None:
        """Reads acknowledged entries from nodes that are up: a miss may be replication on its
        way; other bytes never."""
        rng = random.Random(seed)
        while not self.stop.is_set():
            with self.lock:
                entry = rng.choice(self.acked) if self.acked else None
            if entry is None:
                time.sleep(0.05)
                continue
            r, label, _judged = self.request(rng, "GET", entry.path)
            with self.lock:
                self.reads += 1
                if r is not None and r.status_code == 200 and digest(r.content) != entry.sha256:
                    self.wrong_during.append(f"{entry.path} on {label} during the run")
                elif r is None or r.status_code != 200:
                    self.read_misses += 1

    def start(self) -> None:
        for target, seed in (
            (self.writer, 1),
            (self.writer, 2),
            (self.cleaner, 3),
            (self.reader, 4),
        ):
            thread = threading.Thread(target=target, args=(seed,), name=f"skew-{seed}")
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not any(t.is_alive() for t in self.threads)


@pytest.fixture
def mixed_mesh(tmp_path: Path, previous: Release) -> Iterator[Mesh]:
    """Nodes 0 and 1 on HEAD (in this process), node 2 on the previous release (a process).
    ``read_through=never``: a node serves only what it holds, so a replica that never arrived
    shows as lost instead of being fetched from a peer."""
    mesh = Mesh(
        tmp_path,
        3,
        in_process=True,
        prefixes={2: previous.prefix},
        discovery_settle_ms=200,
        read_through="never",
    )
    try:
        yield mesh
    finally:
        rcs = mesh.stop_all()
        assert rcs == [0, 0, 0], rcs


def gone(client: httpx.Client, path: str) -> bool:
    return client.get(path).status_code == 404


def roll(mesh: Mesh, load: Load, i: int, to: Release | None) -> None:
    """Stop node ``i`` (SIGTERM) and start it on its data dir as ``to`` (None: HEAD)."""
    load.down(i)
    assert mesh.nodes[i].stop() == 0, mesh.nodes[i].log()[-3000:]
    if to is None:
        mesh.prefixes.pop(i, None)
    else:
        mesh.prefixes[i] = to.prefix
    mesh.restart(i)
    label = f"n{i} {'HEAD ' + HEAD if to is None else 'previous ' + to.version}"
    load.back(i, label)


def peer_versions(node: NodeProcess) -> dict[str, tuple[object, object]]:
    """``{peer internal URL: (wire_version, kura_version)}`` as ``node``'s ``/status`` reports
    them (HEAD's shape; None until a probe answered)."""
    peers = statuses([node])[0]["peers"]
    return {p["node_url"]: (p["wire_version"], p["kura_version"]) for p in peers}  # type: ignore[attr-defined]


def test_a_mixed_version_mesh_loses_no_acknowledged_write_and_serves_no_wrong_byte(
    mixed_mesh: Mesh, previous: Release
) -> None:
    mesh = mixed_mesh
    mesh.wait_ready()
    prev = previous.version
    labels = [f"n0 HEAD {HEAD}", f"n1 HEAD {HEAD}", f"n2 previous {prev}"]
    assert versions(mesh.nodes) == [HEAD, HEAD, prev]
    # HEAD reports each peer's wire and kura version as last seen, and the mix as a warning
    # (0.1.0 sends no version: wire 1, kura version unknown).
    seen = {mesh.nodes[1].internal_url: (WIRE_VERSION, HEAD), mesh.nodes[2].internal_url: (1, None)}
    assert wait_for(lambda: peer_versions(mesh.nodes[0]) == seen, 20), peer_versions(mesh.nodes[0])
    assert any("mixed versions" in w for w in statuses([mesh.nodes[0]])[0]["warnings"])  # type: ignore[attr-defined]
    load = Load(mesh, labels)
    phases = []
    load.start()
    try:
        time.sleep(4)  # HEAD, HEAD, previous
        phases.append(("HEAD, HEAD, previous", len(load.acked), len(load.cleans)))
        roll(mesh, load, 1, previous)  # a rollback of one node, on its data dir
        assert versions(mesh.nodes) == [HEAD, prev, prev]
        time.sleep(4)  # HEAD, previous, previous
        phases.append(("HEAD, previous, previous", len(load.acked), len(load.cleans)))
        roll(mesh, load, 1, None)  # the upgrade again, then the last previous node's
        roll(mesh, load, 2, None)
        assert versions(mesh.nodes) == [HEAD, HEAD, HEAD]
        alike = {n.internal_url: (WIRE_VERSION, HEAD) for n in mesh.nodes[1:]}
        assert wait_for(lambda: peer_versions(mesh.nodes[0]) == alike, 20)
        time.sleep(3)  # HEAD everywhere
        phases.append(("HEAD, HEAD, HEAD", len(load.acked), len(load.cleans)))
    finally:
        load.finish()
    mesh.wait_drained(90)
    assert [s["outbox_messages"] for s in statuses(mesh.nodes)] == [0, 0, 0]

    total = Tally()
    for node, label in zip(mesh.nodes, load.labels, strict=True):
        tally = check_entries(node, label, load.acked, patience=20)
        total.checked += tally.checked
        total.lost += tally.lost
        total.wrong += tally.wrong
    not_cleaned = []
    for node, label in zip(mesh.nodes, load.labels, strict=True):
        with node.client() as c:
            for clean in load.cleans:
                for path in clean.gone:
                    if not wait_for(functools.partial(gone, c, path), 30):
                        not_cleaned.append(f"{path} on {label} ({clean.how} via {clean.by})")

    print(f"\nversion skew: previous {prev} ({previous.commit}) and HEAD {HEAD}")
    for name, acked, cleans in phases:
        print(f"  by the end of {name}: {acked} writes and {cleans} cleans acknowledged")
    print(
        f"  acknowledged={len(load.acked)} checked={total.checked} lost={len(total.lost)} "
        f"wrong={len(total.wrong) + len(load.wrong_during)} "
        f"(reads during the run={load.reads}, of which misses={load.read_misses}, "
        f"wrong={len(load.wrong_during)}; after={total.checked}, wrong={len(total.wrong)})"
    )
    print(
        f"  cleans acknowledged={len(load.cleans)} "
        f"({sum(c.how == 'route_root' for c in load.cleans)} route root, "
        f"{sum(c.how == 'clean_endpoint' for c in load.cleans)} /api/cache/clean), "
        f"paths checked gone={len(load.cleans) * 3 * len(mesh.nodes)}, "
        f"still served={len(not_cleaned)}; refused by an up node={len(load.refused)}, "
        f"unacknowledged while a node stopped={load.excused}"
    )
    by_writer: dict[str, int] = {}
    for entry in load.acked:
        by_writer[entry.by] = by_writer.get(entry.by, 0) + 1
    print(f"  acknowledged by: {dict(sorted(by_writer.items()))}")

    assert len(load.acked) >= 100, "too little load to say anything"
    assert any("previous" in by for by in by_writer), by_writer
    assert len(load.cleans) >= 3, load.cleans
    assert any("previous" in c.by for c in load.cleans), "no clean went through a previous node"
    assert total.checked == len(load.acked) * 3
    assert total.lost == [], total.lost[:20]
    assert total.wrong == [], total.wrong[:20]
    assert load.wrong_during == [], load.wrong_during[:20]
    assert not_cleaned == [], not_cleaned[:20]
    assert load.refused == [], load.refused[:20]
    # Every node holds the same artifacts at the same versions (``inline`` aside: it says how
    # each node stores its copy).
    views = [
        {aid: {k: v for k, v in m.items() if k != "inline"} for aid, m in manifests(n).items()}
        for n in mesh.nodes
    ]
    assert views[0] == views[1] == views[2]
    assert len(views[0]) >= len(load.acked)


def test_a_wiped_node_bootstraps_everything_from_a_peer_of_the_other_version(
    tmp_path: Path, previous: Release
) -> None:
    prev = previous.version
    mesh = Mesh(
        tmp_path,
        2,
        in_process=True,
        prefixes={0: previous.prefix},
        discovery_settle_ms=200,
        read_through="never",
    )
    try:
        mesh.wait_ready()
        assert versions(mesh.nodes) == [prev, HEAD]
        rng = random.Random(7)
        written = write_entries(mesh.nodes[0], f"n0 previous {prev}", 40, rng, 0)
        mesh.wait_drained()
        report = []
        # n1 (HEAD) loses its data dir while down: only a bootstrap from n0 (previous) refills
        # it (n0's outbox for it is empty).
        for i, label, more in ((1, f"n1 HEAD {HEAD}", 40), (0, f"n0 previous {prev}", 0)):
            assert mesh.nodes[i].stop() == 0
            shutil.rmtree(tmp_path / f"n{i}" / "data")
            shutil.rmtree(tmp_path / f"n{i}" / "tmp")
            node = mesh.restart(i)
            mesh.wait_ready()
            tally = check_entries(node, label + " (wiped)", written, patience=30)
            assert tally.lost == [], tally.lost
            assert tally.wrong == [], tally.wrong
            boot = statuses([node])[0]["bootstrap"]
            assert isinstance(boot, dict)
            applied = sum(int(p["artifacts_done"]) for p in boot["peers"])
            report.append(
                f"{label} wiped: bootstrapped {applied} artifacts, served "
                f"{tally.checked} of {len(written)} right"
            )
            assert applied >= len(written), boot
            # Then the wiped node writes, and the other one is wiped next (previous from HEAD).
            written += write_entries(node, label, more, rng, len(written))
            mesh.wait_drained()
        print("\n" + "\n".join(report))
    finally:
        rcs = mesh.stop_all()
        assert rcs == [0, 0], rcs


# --- one data dir, forward and back -----------------------------------------------------------


@dataclass
class Start:
    """One start of a node on the shared data dir: who, how it ended, what it printed."""

    who: str
    outcome: str  # "served" or "refused (exit N)"
    printed: list[str]


class DataDirRun:
    """Starts of one node directory by alternating versions, as processes; keeps each start's
    output (its own ``node-N.log``: stderr, where kura logs, with the listening line)."""

    def __init__(self, directory: Path, previous: Release) -> None:
        self.directory = directory
        self.previous = previous
        self.env = node_env(directory, discovery_settle_ms=0)
        self.starts: list[Start] = []

    def start(self, release: Release | None) -> NodeProcess | None:
        """Start ``release`` (None: HEAD) on the data dir: the node, or None when it refused to
        start (the refusal is then checked: it names both versions)."""
        who = "HEAD " + HEAD if release is None else "previous " + release.version
        log = self.directory / f"node-{len(list(self.directory.glob('node-*.log')))}.log"
        prefix = () if release is None else release.prefix
        try:
            node = spawn_node(self.directory, self.env, prefix)
        except LaunchError as error:
            text = log.read_text(errors="replace") if log.exists() else str(error)
            self.starts.append(Start(who, f"refused ({str(error).splitlines()[0]})", []))
            self.starts[-1].printed = text.splitlines()
            return None
        assert versions([node]) == [HEAD if release is None else release.version]
        self.starts.append(Start(who, "served", []))
        return node

    def stop(self, node: NodeProcess) -> None:
        assert node.stop() == 0, node.log()[-3000:]
        self.starts[-1].printed = node.log().splitlines()

    def report(self) -> str:
        lines = [f"data dir {self.directory / 'data'}:"]
        for n, start in enumerate(self.starts):
            lines.append(f"  start {n}: {start.who}: {start.outcome}; it printed:")
            lines += [f"    | {line}" for line in start.printed]
        return "\n".join(lines)


def serve_all(run: DataDirRun, node: NodeProcess, entries: list[Entry]) -> Tally:
    tally = check_entries(node, run.starts[-1].who, entries, patience=0)
    assert tally.lost == [], tally.lost
    assert tally.wrong == [], tally.wrong
    assert tally.checked == len(entries)
    return tally


def test_a_data_dir_goes_previous_to_head_and_back(tmp_path: Path, previous: Release) -> None:
    run = DataDirRun(tmp_path / "node", previous)
    rng = random.Random(31)
    try:
        node = run.start(previous)
        assert node is not None, run.report()
        written = write_entries(node, run.starts[-1].who, 30, rng, 0)
        run.stop(node)

        node = run.start(None)
        assert node is not None, (
            f"HEAD must start on the previous release's data dir\n{run.report()}"
        )
        serve_all(run, node, written)
        written += write_entries(node, run.starts[-1].who, 30, rng, 30)
        run.stop(node)

        node = run.start(previous)
        assert node is not None, (
            f"the previous release must open HEAD's data dir (docs/upgrading.md)\n{run.report()}"
        )
        tally = serve_all(run, node, written)
        run.stop(node)
    finally:
        print("\n" + run.report())
    print(
        f"previous -> HEAD -> {run.starts[-1].who}: {tally.checked} of {len(written)} served right"
    )


def test_a_data_dir_goes_head_to_previous_and_back_with_the_previous_writes_kept(
    tmp_path: Path, previous: Release
) -> None:
    run = DataDirRun(tmp_path / "node", previous)
    rng = random.Random(13)
    try:
        node = run.start(None)
        assert node is not None, run.report()
        written = write_entries(node, run.starts[-1].who, 30, rng, 0)
        run.stop(node)

        node = run.start(previous)
        assert node is not None, (
            f"the previous release must open HEAD's data dir (docs/upgrading.md)\n{run.report()}"
        )
        serve_all(run, node, written)
        written += write_entries(node, run.starts[-1].who, 30, rng, 30)
        run.stop(node)

        node = run.start(None)
        assert node is not None, f"HEAD must start again on its data dir\n{run.report()}"
        tally = serve_all(run, node, written)
        run.stop(node)
    finally:
        print("\n" + run.report())
    print(f"HEAD -> previous -> HEAD: {tally.checked} of {len(written)} served right")


def test_heads_rollout_gate_run_beside_the_mesh_judges_a_previous_release_node(
    mixed_mesh: Mesh, previous: Release
) -> None:
    """deploy/kura/rollout.sh's pre-check on the first upgrade: the pod it gates still runs the
    previous release, whose ``kura admin`` has no ``rollout-gate`` (argparse: exit 2), so the
    script runs HEAD's gate beside the mesh against the pods' public URLs."""
    mesh = mixed_mesh
    mesh.wait_ready()
    old_cli = subprocess.run(
        [*previous.prefix, sys.executable, "-m", "kura.cli", "admin", "rollout-gate", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert old_cli.returncode == 2, old_cli
    urls = [n.url for n in mesh.nodes]
    argv = ["admin", "rollout-gate", "--url", urls[2], "--mesh-url", ",".join(urls)]
    gate = subprocess.run(
        [sys.executable, "-m", "kura.cli", *argv, "--wait", "60"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert gate.returncode == 0, (gate.stdout, gate.stderr)
