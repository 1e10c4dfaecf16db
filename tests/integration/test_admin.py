"""``kura admin`` (issue 29 item 5, ``kura.api.admin``) as an operator runs it: a real
subprocess against a real node, over the data directory's ``admin.sock`` and over the public
port with a ``clean`` token, as a table and as ``--json``. Two writers, one of them
"malicious", write into ``main``; the operator lists the writers, the bad one's entries, and
purges exactly those. A caller without ``clean`` is refused and nothing changes."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.unix_socket import socket_address
from tests.conftest import NodeProcess, node_env
from tests.e2e.mesh import Mesh, wait_for
from tests.inprocess import start_in_process

pytestmark = pytest.mark.in_process

ADMIN = "tok-admin-abcdefghij"  # read, clean
GOOD = "tok-good-abcdefghijk"
EVIL = "tok-evil-abcdefghijk"
CREDENTIALS = (
    f"{ADMIN} name=ops rights=read,clean\n"
    f"{GOOD} name=good rights=read,write\n"
    f"{EVIL} name=evil rights=read,write\n"
)
GOOD_KEYS, EVIL_KEYS = ("good-1", "good-2"), ("poisoned-1",)


@dataclass
class Admin:
    """``kura admin`` pointed at a node: its data directory (the socket) and public URL."""

    data_dir: Path
    url: str

    @classmethod
    def of(cls, node: NodeProcess) -> Admin:
        return cls(node.data_dir, node.url)

    def run(self, *args: str, via: str = "socket", token: str | None = ADMIN) -> Ran:
        """``kura admin ARGS`` over ``via`` ("socket": --data-dir; "url": --url and token)."""
        where = (
            ["--data-dir", str(self.data_dir)]
            if via == "socket"
            else ["--url", self.url, *(["--token", token] if token else [])]
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("KURA_")}
        done = subprocess.run(
            [sys.executable, "-m", "kura.cli", "admin", *where, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
        assert "Traceback" not in done.stderr, done.stderr
        return Ran(done.returncode, done.stdout, done.stderr)


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        """The printed JSON document (``--json``), once the command succeeded."""
        assert self.code == 0, self.err
        doc = json.loads(self.out)
        assert isinstance(doc, dict)
        return doc


def put(node: NodeProcess, token: str, key: str) -> None:
    with node.client(headers={"Authorization": f"Bearer {token}"}) as c:
        r = c.put(f"/ns/main/cache/ccache/{key}", content=f"bytes of {key}".encode())
        assert r.status_code in (200, 201), r.text


def held(node: NodeProcess, key: str) -> bool:
    with node.client(headers={"Authorization": f"Bearer {GOOD}"}) as c:
        return c.get(f"/ns/main/cache/ccache/{key}").status_code == 200


@dataclass
class Served:
    """The fixture's node, and ``kura admin`` pointed at it."""

    node: NodeProcess
    cli: Admin

    def run(self, *args: str, via: str = "socket", token: str | None = ADMIN) -> Ran:
        return self.cli.run(*args, via=via, token=token)


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[Served]:
    credentials = tmp_path / "credentials"
    credentials.write_text(CREDENTIALS)
    env = node_env(
        tmp_path,
        tokens_file=credentials,
        namespace_rules="main:min_age=1h;pr-*:max_age=2d",
        expiry_interval="1s",
    )
    node = start_in_process(tmp_path, env)
    for key in GOOD_KEYS:
        put(node, GOOD, key)
    for key in EVIL_KEYS:
        put(node, EVIL, key)
    yield Served(node, Admin.of(node))
    assert node.stop() == 0, node.log()[-3000:]


VIAS = ("socket", "url")


@pytest.mark.parametrize("via", VIAS)
def test_admin_lists_namespaces_writers_and_a_writers_entries(admin: Served, via: str) -> None:
    (main,) = [
        n
        for n in admin.run("namespaces", "--json", via=via).json()["namespaces"]
        if n["namespace"] == "main"
    ]
    assert main["artifacts"] == 3
    assert main["rule"]["pattern"] == "main"
    assert main["rule"]["min_age_seconds"] == 3600
    table = admin.run("namespaces", via=via)
    assert table.code == 0, table.err
    assert table.out.splitlines()[0].split()[:2] == ["NAMESPACE", "RULE"]
    assert any(line.split()[:3] == ["main", "main", "-"] for line in table.out.splitlines())

    writers = admin.run("writers", "main", "--json", via=via).json()["writers"]
    assert [(w["writer"], w["entries"]) for w in writers] == [
        ("token:good", 2),
        ("token:evil", 1),
    ]
    table = admin.run("writers", "main", via=via)
    rows = {line.split()[0]: line.split() for line in table.out.splitlines()[2:]}
    assert rows["token:evil"][-3] == "1", table.out
    assert rows["token:good"][-3] == "2", table.out

    entries = admin.run("entries", "main", "token:evil", "--json", via=via).json()["entries"]
    assert [e["key"] for e in entries] == [f"ccache/{k}" for k in EVIL_KEYS]
    table = admin.run("entries", "main", "token:evil", via=via)
    assert "poisoned-1" in table.out
    assert "good-1" not in table.out


def test_admin_lists_every_namespace_on_a_node_without_rules(tmp_path: Path) -> None:
    """Without ``KURA_NAMESPACE_RULES`` nothing measures namespaces in the background: the list
    is measured when asked (it was empty before)."""
    credentials = tmp_path / "credentials"
    credentials.write_text(CREDENTIALS)
    node = start_in_process(tmp_path, node_env(tmp_path, tokens_file=credentials))
    try:
        for key in GOOD_KEYS:
            put(node, GOOD, key)
        doc = Admin.of(node).run("namespaces", "--json").json()
        rows = {n["namespace"]: n for n in doc["namespaces"]}
        assert set(rows) == {"main"}, doc
        assert rows["main"]["artifacts"] == 2
        assert rows["main"]["used_bytes"] == sum(len(f"bytes of {k}") for k in GOOD_KEYS)
        assert rows["main"]["rule"]["pattern"] == "(default)"
    finally:
        assert node.stop() == 0, node.log()[-3000:]


@pytest.mark.parametrize("via", VIAS)
def test_admin_purges_exactly_the_malicious_writers_entries(admin: Served, via: str) -> None:
    refused = admin.run("purge", "main", "--writer", "token:evil", via=via)
    assert refused.code == 2, refused  # no --yes: nothing done
    assert "--yes" in refused.err
    assert held(admin.node, "poisoned-1")
    done = admin.run("purge", "main", "--writer", "token:evil", "--yes", "--json", via=via).json()
    assert (done["entries"], done["writer"]) == (1, "token:evil")
    assert not held(admin.node, "poisoned-1")
    assert all(held(admin.node, key) for key in GOOD_KEYS)
    writers = admin.run("writers", "main", "--json", via=via).json()["writers"]
    assert [w["writer"] for w in writers] == ["token:good"]
    table = admin.run("purge", "main", "--writer", "token:good", "--yes", via=via)
    assert table.out.startswith("purged writer token:good from namespace main at version ")
    assert ": 2 entries (" in table.out, table.out


@pytest.mark.parametrize("token", [None, GOOD, "not-a-token"])
def test_admin_over_the_port_without_a_clean_token_is_refused_and_changes_nothing(
    admin: Served, token: str | None
) -> None:
    for args in (("writers", "main"), ("purge", "main", "--writer", "token:evil", "--yes")):
        ran = admin.run(*args, via="url", token=token)
        assert ran.code == 3, ran
        assert ran.out == ""
        assert "HTTP 40" in ran.err
        assert "KURA_ADMIN_TOKEN" in ran.err
    with admin.node.client(headers={"Authorization": f"Bearer {token}"} if token else {}) as c:
        statuses = {
            c.get("/_admin/namespaces").status_code,
            c.post("/_admin/purge?namespace=main&writer=token:evil").status_code,
        }
    assert statuses == ({401} if token != GOOD else {403})
    assert held(admin.node, "poisoned-1")


def test_admin_answers_unknown_names_and_an_unreachable_node_with_their_own_exit_codes(
    admin: Served, tmp_path: Path
) -> None:
    unknown = admin.run("writers", "nobody-here")
    assert unknown.code == 4, unknown
    assert "holds no entry" in unknown.err
    assert admin.run("entries", "main", "token:nobody").code == 4
    # A purge is recorded even where the writer holds nothing: its entries may be on a peer
    # only, and the purge must reach them and block their late copies.
    nothing = admin.run("purge", "main", "--writer", "token:nobody", "--yes", "--json").json()
    assert (nothing["entries"], nothing["writer"]) == (0, "token:nobody")
    assert nothing["version_ms"] > 0
    assert admin.run("writers", "bad/namespace").code == 2
    empty = tmp_path / "not-a-node"
    empty.mkdir()
    ran = Admin(empty, "").run("namespaces")
    assert ran.code == 1, ran
    assert f"no socket at {empty / 'admin.sock'}" in ran.err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    ran = Admin(empty, closed).run("namespaces", via="url")
    assert ran.code == 1, ran
    assert "connection refused" in ran.err


def test_the_admin_socket_is_its_owners_replaces_a_stale_one_and_goes_at_stop(
    tmp_path: Path,
) -> None:
    """In a data directory whose path is longer than a socket address holds (through
    /proc/self/fd, kit.unix_socket), as a deployment's may be."""
    base = tmp_path / ("d" * 110)
    data = base / "data"
    data.mkdir(parents=True)
    address, fd = socket_address(data, "admin.sock")
    stale = socket.socket(socket.AF_UNIX)  # what a node killed mid-run leaves: a dead socket
    stale.bind(address)
    stale.close()
    assert fd is not None  # the long way round was taken
    os.close(fd)
    env = node_env(base, read_write_tokens="tok-rw")
    node = start_in_process(base, env)
    try:
        assert node.data_dir == data
        mode = (data / "admin.sock").stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600
        ran = Admin.of(node).run("namespaces", "--json")
        assert ran.json()["namespaces"] == []
    finally:
        assert node.stop() == 0, node.log()[-3000:]
    assert not (data / "admin.sock").exists()


def test_a_malicious_writers_entries_are_found_and_purged_on_every_node_of_a_mesh(
    tmp_path: Path,
) -> None:
    """Issue 29's provenance scenario end to end: ``good`` writes into ``main`` through node 0,
    ``evil`` through node 1, and replication gives all three nodes both. The operator lists
    main's writers and evil's entries with ``kura admin`` over node 0's port, purges evil, and
    on every node evil's entries are gone while good's are served (``kura admin`` over each
    node's own socket shows good alone)."""
    credentials = tmp_path / "credentials"
    credentials.write_text(CREDENTIALS)
    mesh = Mesh(tmp_path, 3, in_process=True, read_through="never", tokens_file=credentials)
    try:
        a, b, _c = mesh.nodes
        for key in GOOD_KEYS:
            put(a, GOOD, key)
        for key in EVIL_KEYS:
            put(b, EVIL, key)
        everything = (*GOOD_KEYS, *EVIL_KEYS)
        for node in mesh.nodes:
            assert wait_for(lambda n=node: all(held(n, k) for k in everything), 30)
        operator = Admin.of(a)
        writers = operator.run("writers", "main", "--json", via="url").json()["writers"]
        assert {(w["writer"], w["entries"]) for w in writers} == {
            ("token:good", 2),
            ("token:evil", 1),
        }
        listed = operator.run("entries", "main", "token:evil", "--json", via="url").json()
        assert [e["key"] for e in listed["entries"]] == ["ccache/poisoned-1"]
        purged = operator.run(
            "purge", "main", "--writer", "token:evil", "--yes", "--json", via="url"
        ).json()
        assert purged["entries"] == 1
        for node in mesh.nodes:
            assert wait_for(lambda n=node: not held(n, "poisoned-1"), 30), node.log()[-2000:]
            assert all(held(node, key) for key in GOOD_KEYS)
            here = Admin.of(node).run("writers", "main", "--json").json()["writers"]
            assert [(w["writer"], w["entries"]) for w in here] == [("token:good", 2)]
    finally:
        assert mesh.stop_all() == [0, 0, 0]


def test_with_workers_writes_are_recorded_by_the_primary_and_admin_is_the_primarys(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """With ``KURA_WORKERS=2`` the port is shared by the primary and a worker, which forwards
    writes (and ``/_admin/``) to the primary: each write records its credential's writer
    whichever process took its connection, and ``kura admin`` answers over the port and over
    the primary's socket alike."""
    credentials = tmp_path / "credentials"
    credentials.write_text(CREDENTIALS)
    node = start_node(workers=2, tokens_file=credentials)
    keys = [f"w-{i}" for i in range(8)]
    for key in keys:  # one connection each: the kernel spreads them over both processes
        put(node, GOOD if key != "w-7" else EVIL, key)
    for via in VIAS:
        writers = Admin.of(node).run("writers", "main", "--json", via=via).json()["writers"]
        assert [(w["writer"], w["entries"]) for w in writers] == [
            ("token:good", 7),
            ("token:evil", 1),
        ], via


OVERLAY_CLEAN = "tok-pr-clean-abcdefghij"


def test_an_overlay_credential_with_clean_sees_only_the_namespace_it_writes(
    tmp_path: Path,
) -> None:
    """A pull request's credential that may clean its own namespace lists that one alone, not
    every team's names, sizes and rules; a node's unlimited admin credential lists them all."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        CREDENTIALS + f"{OVERLAY_CLEAN} name=pr rights=read,write,clean read=pr-123,main "
        "write=pr-123\n"
    )
    node = start_in_process(tmp_path, node_env(tmp_path, tokens_file=credentials))
    try:
        put(node, GOOD, "good-1")  # into main
        with node.client(headers={"Authorization": f"Bearer {OVERLAY_CLEAN}"}) as c:
            r = c.put("/cache/ccache/pr-1", content=b"the PR's own")  # into pr-123, its overlay
            assert r.status_code in (200, 201), r.text
            listed = c.get("/_admin/namespaces")
            assert listed.status_code == 200, listed.text
            assert [n["namespace"] for n in listed.json()["namespaces"]] == ["pr-123"]
            assert c.post("/_admin/purge?namespace=main&writer=token:good").status_code == 403
        every = Admin.of(node).run("namespaces", "--json", via="url").json()["namespaces"]
        assert sorted(n["namespace"] for n in every) == ["main", "pr-123"]
        assert held(node, "good-1")
    finally:
        assert node.stop() == 0, node.log()[-3000:]


def test_a_token_without_a_url_is_refused_not_ignored(admin: Served) -> None:
    """``--token`` goes with ``--url``: over the socket it would be silently unused, so a user
    who meant to reach another node is told (exit 2) instead of being answered by this one."""
    ran = admin.cli.run("--token", ADMIN, "namespaces", via="socket")
    assert ran.code == 2, ran
    assert "--url" in ran.err
