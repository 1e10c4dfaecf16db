"""Real clients against ``/ns/<namespace>/`` (the namespaced Bazel/HTTP-cache and WebDAV routes)
and through overlay credentials (``kura.core.overlay``).

ccache and sccache: a remote hit, stored under that namespace; a ``DELETE`` of the route root
cleans exactly it, and the same client stores there again and hits. Bazel: a remote hit whose
action result and CAS blobs are all in that namespace.

Overlays (issue 29 item 2): Nx, Turborepo, ccache and Gradle build on "main" with main's
credential, then as a pull request with one that reads pr-123 then main and writes pr-123: the
pull request gets main's entries as remote hits and its writes land in pr-123 only."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import oneshot
from tests.conftest import NodeProcess
from tests.integration.test_clients import (
    BY_NAME,
    CCACHE,
    Client,
    assert_no_hit_and_nothing_stored,
    assert_remote_hit,
    lookups,
    requests_with_status,
    run_client,
)

pytestmark = [pytest.mark.clients, pytest.mark.in_process]
TOKEN = "ns-rw"

CLIENTS = (
    Client(
        "ccache", CCACHE, "", "http_cache", 2, {"PREFIX": "/ns/team1/cache", "LAYOUT": "subdirs"}
    ),
    Client("sccache", "sccache.sh", "/ns/team1/dav", "webdav", 2),
)
ROOTS = {"ccache": "/ns/team1/cache", "sccache": "/ns/team1/dav"}


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_a_real_client_on_a_namespaced_url_hits_and_a_root_delete_cleans_only_that_namespace(
    client: Client, start_node: Callable[..., NodeProcess]
) -> None:
    node = start_node(read_write_tokens=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    other = oneshot.put(node.url + "/cache/ab/outside", content=b"namespace ''", headers=auth)
    assert other.status_code == 201
    run = run_client(client, node, token=TOKEN)
    assert_remote_hit(client, node, run)
    held = node.namespace_rows()
    # ccache's 100 ms default connect timeout may skip one PUT on a loaded machine; the hit
    # proves what it read was stored in team1.
    assert held.get("team1", 0) >= 1, held
    assert held[""] == 1, held

    r = oneshot.delete(node.url + ROOTS[client.name], headers=auth)
    assert r.status_code == 204, r.text
    assert node.namespace_rows() == {"": 1}
    assert oneshot.get(node.url + "/cache/ab/outside", headers=auth).content == b"namespace ''"
    # The same client stores into the cleaned namespace again and hits.
    again = run_client(client, node, token=TOKEN)
    assert again.returncode == 0, again.describe()
    assert again.hit, again.describe()
    assert node.namespace_rows().get("team1", 0) >= 1, f"{again.describe()}\n{node.log()[-4000:]}"


def test_real_bazel_gets_a_remote_hit_in_a_namespace_with_its_references_checked_there(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Bazel's action results are hits only while their CAS blobs are stored, looked up in the
    namespace of the path (``kura.api.bazel_http``): a hit here proves both are in team1."""
    client = Client("bazel", "bazel.sh", "/ns/team1/cache", "bazel", 2)
    node = start_node(read_write_tokens=TOKEN)
    run = run_client(client, node, token=TOKEN)
    assert_remote_hit(client, node, run)
    assert set(node.namespace_rows()) == {"team1"}


# --- overlays (issue 29 item 2): a pull request reads main's entries and never writes them.
MAIN_TOKEN = "main-token-0123456789"
PR_TOKEN = "pr-123-token-0123456789"
# The two recipes of README.md "Overlay namespaces": main's job and a pull request's.
OVERLAYS = (
    f"{MAIN_TOKEN} name=main rights=read,write write=main\n"
    f"{PR_TOKEN} name=pr-123 rights=read,write read=pr-123,main write=pr-123\n"
)


@pytest.fixture
def overlay_node(start_node: Callable[..., NodeProcess], tmp_path: Path) -> NodeProcess:
    credentials = tmp_path / "credentials"
    credentials.write_text(OVERLAYS)
    return start_node(tokens_file=credentials)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass(frozen=True)
class Poisoning:
    """One client of the poisoning scenario: its settings on main and on the pull request,
    and where the pull request's own artifact for one of main's keys is PUT."""

    client: Client
    main: dict[str, str]
    pr: dict[str, str]
    put: str  # formatted with the key
    put_status: int


POISONINGS = {
    "nx": Poisoning(BY_NAME["nx"], {}, {}, "/v1/cache/{key}", 200),
    "turbo": Poisoning(
        BY_NAME["turbo"],
        {"TEAM": "main"},
        {"TEAM": "pr-123"},
        "/v8/artifacts/{key}?slug=pr-123",
        202,
    ),
}


@pytest.mark.parametrize("name", POISONINGS)
def test_a_pull_request_hits_mains_entries_and_its_writes_never_reach_main(
    name: str, overlay_node: NodeProcess
) -> None:
    """The CREEP scenario with a real Nx and Turborepo: main builds with main's credential;
    the pull request builds the same sources with its overlay credential and gets main's
    entries as remote hits, storing nothing; it then writes its own artifact under main's
    key, which lands in pr-123 only: the pull request reads its own bytes back, and main's
    next build is still served main's (the script compares the restored output with its
    source, so a poisoned artifact would not pass)."""
    case, node = POISONINGS[name], overlay_node
    client, source = case.client, f"overlay {name} {uuid.uuid4().hex}"
    main = run_client(client, node, token=MAIN_TOKEN, INPUT=source, **case.main)
    assert_remote_hit(client, node, main)
    held = node.namespace_rows()
    assert set(held) == {"main"}, held
    (key,) = node.keys(client.protocol, "main")

    hits = lookups(node, client.protocol, "hit")
    pr = run_client(client, node, token=PR_TOKEN, INPUT=source, **case.pr)
    assert_remote_hit(client, node, pr)
    assert lookups(node, client.protocol, "hit") >= hits + 2, pr.describe()  # both PR runs
    assert node.namespace_rows() == held, "the PR's hits were main's entries: it stored nothing"

    poison = b"the pull request's artifact for main's key"
    with node.client(headers=bearer(PR_TOKEN)) as c:
        assert c.put(case.put.format(key=key), content=poison).status_code == case.put_status
        assert c.get(case.put.format(key=key)).content == poison  # its own, before main's
    assert node.namespace_rows() == {**held, "pr-123": 1}
    with node.client(headers=bearer(MAIN_TOKEN)) as c:
        url = case.put.format(key=key).replace("pr-123", "main")
        assert c.get(url).content != poison
    again = run_client(client, node, token=MAIN_TOKEN, INPUT=source, **case.main)
    assert_remote_hit(client, node, again)
    assert node.namespace_rows() == {**held, "pr-123": 1}


def test_turbo_with_a_pull_requests_credential_naming_main_as_its_team_stores_nothing(
    overlay_node: NodeProcess,
) -> None:
    """Turborepo's team must agree with the credential: the pull request's token with
    ``--team main`` reads main but every upload is refused (403, turbo's read-only path), so
    nothing is stored anywhere."""
    client, node = BY_NAME["turbo"], overlay_node
    run = run_client(client, node, token=PR_TOKEN, TEAM="main")
    assert run.returncode == 1, run.describe()
    assert_no_hit_and_nothing_stored(client, node, run)
    assert requests_with_status(node, "turbo", 403) >= 1, run.describe()
    assert "rejected an upload with 403" in run.output, run.describe()


# ccache through the credential alone (the /cache prefix names no namespace), Gradle through a
# /ns/ path naming the pull request's own namespace.
OVERLAY_CLIENTS = {
    "ccache": (
        Client("ccache", CCACHE, "", "http_cache", 2, {"PREFIX": "/cache"}),
        Client("ccache", CCACHE, "", "http_cache", 2, {"PREFIX": "/cache"}),
    ),
    "gradle": (
        Client("gradle", "gradle.sh", "/cache/", "http_cache"),
        Client("gradle", "gradle.sh", "/ns/pr-123/cache/", "http_cache"),
    ),
}


@pytest.mark.parametrize("name", OVERLAY_CLIENTS)
def test_a_pull_request_build_hits_mains_entries_and_writes_its_own_namespace(
    name: str, overlay_node: NodeProcess
) -> None:
    """The same sources built on main, then by the pull request: a remote hit from main's
    entries, nothing stored; changed sources on the pull request (ccache; Gradle's upload
    goes by the same route and rules): stored in pr-123 only, and hit from there."""
    (on_main, on_pr), node = OVERLAY_CLIENTS[name], overlay_node
    source = f"overlay{uuid.uuid4().hex}"
    assert_remote_hit(on_main, node, run_client(on_main, node, token=MAIN_TOKEN, INPUT=source))
    held = node.namespace_rows()
    assert set(held) == {"main"}, held

    hits = lookups(node, "http_cache", "hit")
    pr = run_client(on_pr, node, token=PR_TOKEN, INPUT=source)
    assert_remote_hit(on_pr, node, pr)
    assert lookups(node, "http_cache", "hit") >= hits + 2 * on_pr.min_hits, pr.describe()
    assert node.namespace_rows() == held, "the PR's hits were main's entries"

    if name == "gradle":  # its writes take the ccache case's path; two more builds cost ~40 s
        return
    changed = run_client(on_pr, node, token=PR_TOKEN, INPUT=source + "pr")
    assert_remote_hit(on_pr, node, changed)
    rows = node.namespace_rows()
    assert rows["main"] == held["main"], rows
    assert rows.get("pr-123", 0) >= 1, rows
