"""Real build tools against a real kura node: every client must get a remote hit served by kura.

Each test starts its own node (``start_node``: the real node in this process, ``tests.inprocess``,
on an OS-chosen port; the clients are processes of their own)
and runs one driver script from ``tests/clients/`` against it (contract in
``tests/clients/README.md``: exit 0 and a ``REMOTE HIT`` line when the second build, with all
local cache state wiped, was served by the remote cache; 1 = no hit; 2 = setup error).

A pass needs all of: the script's exit 0 and ``REMOTE HIT`` line, the hits that remote hit takes
counted by the node under the client's own protocol label (``kura_cache_lookups_total``, at least
``Client.min_hits``), and artifacts in the node's index, so a client quietly falling back to a local cache or to some other server cannot
pass. A missing tool makes the script exit 2, which fails the test: nothing here skips.

The access-control tests run against a node with ``KURA_READ_WRITE_TOKENS=tok-rw`` and
``KURA_READ_ONLY_TOKENS=tok-ro`` (README "Access control", clients.md): read-write tokens get
hits, a read-only token reads but stores nothing (Nx skips the refused upload quietly), and a
missing or unknown token never gets a hit.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest

from tests.conftest import ROOT, NodeProcess

pytestmark = [pytest.mark.clients, pytest.mark.in_process]

CLIENTS_DIR = ROOT / "tests" / "clients"
# The scripts bound each build themselves (bazel and gradle runs at 60 s each); this only stops a
# wedged script, with room for a loaded 2-core machine.
SCRIPT_TIMEOUT_SECONDS = 300.0
READ_WRITE_TOKEN = "tok-rw"
READ_ONLY_TOKEN = "tok-ro"
# "NO REMOTE HIT" contains "REMOTE HIT": only a line that starts with it is a hit.
HIT_LINE = re.compile(r"^REMOTE HIT\b", re.MULTILINE)
# Settings the scripts read from the environment; each test sets the ones it means.
SCRIPT_SETTINGS = (
    "TOKEN",
    "KEEP",
    "LAYOUT",
    "PREFIX",
    "TEAM",
    "TEAMID",
    "SIGNATURE_KEY",
    "CLIENT_CONFIG",
    "CA",
    "TARGET",
    "INPUT",
)


@dataclass(frozen=True)
class Client:
    """One driver script run: which script, the URL path under the node, the protocol label.

    ``min_hits`` is how many reads the node must have served as hits for the client's remote
    hit to be real (clients.md): ccache reads a manifest and a result, Bazel an ActionResult
    and its output, metro.sh two values, and sccache's second server start also reads its
    ``.sccache_check`` file, which alone must not count as the hit.
    """

    name: str
    script: str
    path: str
    protocol: str
    min_hits: int = 1
    env: Mapping[str, str] = field(default_factory=dict)


CCACHE = "ccache.sh"
CLIENTS = (
    Client("nx", "nx.sh", "", "nx"),
    Client("turbo", "turbo.sh", "", "turbo"),
    Client("ccache", CCACHE, "", "http_cache", 2, {"PREFIX": "/cache", "LAYOUT": "subdirs"}),
    Client("ccache-flat", CCACHE, "", "http_cache", 2, {"PREFIX": "/cache", "LAYOUT": "flat"}),
    # ccache's bazel layout is /cache/ac/<64 hex>: served by the Bazel HTTP cache module.
    Client("ccache-bazel", CCACHE, "", "bazel", 2, {"PREFIX": "/cache", "LAYOUT": "bazel"}),
    Client("gradle", "gradle.sh", "/cache/", "http_cache"),
    Client("bazel", "bazel.sh", "/cache", "bazel", 2),
    Client("metro", "metro.sh", "/api/metro/cache", "metro", 2),
    Client("sccache", "sccache.sh", "/dav", "webdav", 2),
)
BY_NAME = {c.name: c for c in CLIENTS}


@dataclass(frozen=True)
class ScriptRun:
    returncode: int
    output: str
    seconds: float

    @property
    def hit(self) -> bool:
        return HIT_LINE.search(self.output) is not None

    def describe(self) -> str:
        return f"rc={self.returncode} after {self.seconds:.1f}s, output:\n{self.output}"


def run_client(
    client: Client,
    node: NodeProcess,
    token: str | None = None,
    timeout: float = SCRIPT_TIMEOUT_SECONDS,
    **settings: str,
) -> ScriptRun:
    """Run ``client``'s driver script against ``node`` and return its exit code and output.

    The script runs in its own session so that a timeout can stop it and every daemon it started
    (Bazel and sccache servers) at once: SIGTERM first, which runs the script's cleanup trap.
    """
    script = CLIENTS_DIR / client.script
    assert script.is_file(), f"driver script {script} is missing"
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_SETTINGS}
    env.update(client.env)
    env.update(settings)
    if token is not None:
        env["TOKEN"] = token
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", str(script), node.url + client.path],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            output, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        pytest.fail(
            f"{client.script} did not finish within {timeout:.0f}s:\n{output}"
            f"\n--- node log ---\n{node.log()[-3000:]}"
        )
    return ScriptRun(proc.returncode, output, time.monotonic() - started)


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sum(node: NodeProcess, name: str, **labels: str) -> float:
    """Sum of ``name``'s samples on /metrics whose labels include ``labels`` (any label order)."""
    total = 0.0
    for key, value in node.metrics().items():
        m = SAMPLE.match(key)
        if m is None or m["name"] != name:
            continue
        have = dict(LABEL.findall(m["labels"] or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


def lookups(node: NodeProcess, protocol: str, result: str) -> float:
    return metric_sum(node, "kura_cache_lookups_total", protocol=protocol, result=result)


def requests_with_status(node: NodeProcess, protocol: str, status: int) -> float:
    """Requests ``node`` answered with ``status`` under ``protocol``, summed over methods."""
    return metric_sum(node, "kura_http_requests_total", protocol=protocol, status=str(status))


def assert_remote_hit(client: Client, node: NodeProcess, run: ScriptRun) -> None:
    """The script saw a remote hit, and this node served it and holds what the client stored."""
    context = f"{client.name}: {run.describe()}\n--- node log ---\n{node.log()[-3000:]}"
    assert run.returncode == 0, context
    assert run.hit, context
    assert lookups(node, client.protocol, "hit") >= client.min_hits, context
    assert node.index_rows() > 0, context
    assert "Traceback" not in node.log(), context


def assert_no_hit_and_nothing_stored(client: Client, node: NodeProcess, run: ScriptRun) -> None:
    context = f"{client.name}: {run.describe()}\n--- node log ---\n{node.log()[-3000:]}"
    assert not run.hit, context
    assert lookups(node, client.protocol, "hit") == 0, context
    assert node.index_rows() == 0, context
    assert "Traceback" not in node.log(), context


BAZEL_CC = Client("bazel-cc", "bazel.sh", "/cache", "bazel", 4, {"TARGET": "cc"})


def test_real_bazel_builds_a_c_binary_with_remote_hits_for_compile_and_link(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A C ``cc_binary`` (compile and link, two actions): the second build, from a fresh output
    base, gets both from kura, and the cached binary runs (``bazel.sh`` ``TARGET=cc``)."""
    node = start_node()
    run = run_client(BAZEL_CC, node)
    assert_remote_hit(BAZEL_CC, node, run)
    assert "2 remote cache hit" in run.output, run.describe()
    assert "hello ran: kura " in run.output, run.describe()


@pytest.fixture
def auth_node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    return start_node(read_write_tokens=READ_WRITE_TOKEN, read_only_tokens=READ_ONLY_TOKEN)


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_real_client_gets_a_remote_hit_served_by_kura(
    client: Client, start_node: Callable[..., NodeProcess]
) -> None:
    node = start_node()
    run = run_client(client, node)
    assert_remote_hit(client, node, run)


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_real_client_with_read_write_token_gets_a_remote_hit(
    client: Client, auth_node: NodeProcess
) -> None:
    run = run_client(client, auth_node, token=READ_WRITE_TOKEN)
    assert_remote_hit(client, auth_node, run)


def test_nx_with_read_only_token_builds_but_stores_nothing(auth_node: NodeProcess) -> None:
    # Nx treats 403 on PUT as "read-only, skip" (clients.md): both builds succeed, no hit.
    client = BY_NAME["nx"]
    run = run_client(client, auth_node, token=READ_ONLY_TOKEN)
    context = run.describe()
    assert run.returncode == 1, context  # 1 = both runs completed, no hit; 2 = a run failed
    assert_no_hit_and_nothing_stored(client, auth_node, run)
    assert lookups(auth_node, "nx", "miss") >= 1, "a read-only token may read"
    assert requests_with_status(auth_node, "nx", 403) >= 1, "the upload was refused as read-only"


def test_turbo_with_read_only_token_builds_but_stores_nothing(auth_node: NodeProcess) -> None:
    client = BY_NAME["turbo"]
    run = run_client(client, auth_node, token=READ_ONLY_TOKEN)
    assert run.returncode == 1, run.describe()
    assert_no_hit_and_nothing_stored(client, auth_node, run)
    assert lookups(auth_node, "turbo", "miss") >= 1, "a read-only token may read"
    assert requests_with_status(auth_node, "turbo", 403) >= 1, run.describe()
    # turbo 2.11 parsed the Vercel-shaped 403 and took its read-only path ("skipping uploads for
    # this run (remote cache reads remain enabled)"), not "unable to parse ... as JSON".
    assert "rejected an upload with 403" in run.output, run.describe()
    assert "unable to parse" not in run.output, run.describe()


def test_nx_without_token_is_refused_as_unauthorized(auth_node: NodeProcess) -> None:
    # Nx fails the run on any 401; it must say "Unauthorized", not "Misconfigured remote cache
    # endpoint" (which is what it says when the 401 is not exactly text/plain).
    client = BY_NAME["nx"]
    run = run_client(client, auth_node)
    assert run.returncode != 0, run.describe()
    assert "Unauthorized" in run.output, run.describe()
    assert "Misconfigured" not in run.output, run.describe()
    assert_no_hit_and_nothing_stored(client, auth_node, run)
    assert requests_with_status(auth_node, "nx", 401) >= 1


def test_ccache_without_token_gets_no_hit(auth_node: NodeProcess) -> None:
    client = BY_NAME["ccache"]
    run = run_client(client, auth_node)
    assert run.returncode == 1, run.describe()
    assert_no_hit_and_nothing_stored(client, auth_node, run)
    assert requests_with_status(auth_node, "http_cache", 401) >= 1


def test_turbo_with_unknown_token_gets_no_hit(auth_node: NodeProcess) -> None:
    # turbo.sh always sends a token (turbo disables remote caching without one); an unknown one
    # is the "missing credentials" case for turbo. A 401 only warns, the build runs locally.
    client = BY_NAME["turbo"]
    run = run_client(client, auth_node, token="not-a-configured-token")
    assert run.returncode == 1, run.describe()
    assert_no_hit_and_nothing_stored(client, auth_node, run)
    assert requests_with_status(auth_node, "turbo", 401) >= 1
