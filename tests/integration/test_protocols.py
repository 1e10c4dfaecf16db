"""Every public route over real HTTP: the status codes, bodies and headers each protocol
module's docstring promises and kura-behaviour.md §1.3 records for upstream Kura, plus the
probes and the metrics an operator reads.

Each test starts its own node (``node`` fixture), so no test depends on another's artifacts:
in this process (``tests.inprocess``); one test per protocol runs against a ``kura serve`` of
two processes too (a primary and a worker, ``kura.workers``), where a worker serves the route.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
from collections.abc import Callable

import httpx
import pytest

from tests import oneshot
from tests.conftest import NodeProcess
from tests.integration import rawhttp
from tests.reapi import action_result

pytestmark = pytest.mark.in_process
TWO_PROCESSES = pytest.mark.parametrize("node", [1, 2], indirect=True, ids=["1p", "2p"])

MiB = 1024 * 1024
SCOPE = "tenant_id=acme&namespace_id=app"


# -- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def node(start_node: Callable[..., NodeProcess], request: pytest.FixtureRequest) -> NodeProcess:
    """A node of ``request.param`` processes (``TWO_PROCESSES``), else one in this process."""
    return start_node(workers=getattr(request, "param", 1))


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def sample(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for key, value in samples.items():
        m = _SAMPLE.match(key)
        assert m is not None, key
        if m.group(1) != name:
            continue
        have = dict(_LABEL.findall(m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += value
    return total


def families(node: NodeProcess) -> dict[str, str]:
    """``{family: type}`` from the ``# TYPE`` lines of /metrics."""
    text = oneshot.get(node.url + "/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            found[name] = kind
    return found


def raw_request(
    node: NodeProcess, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    sock = rawhttp.connect(node.url, timeout=10)
    with sock:
        rawhttp.send_head(sock, method, path, headers)
        if body:
            sock.sendall(body)
        return rawhttp.read_response(sock)


def media_type(r: httpx.Response) -> str:
    return r.headers.get("Content-Type", "").split(";")[0].strip()


# -- Xcode CAS --------------------------------------------------------------------------------


@TWO_PROCESSES
def test_xcode_cas_post_is_204_and_get_returns_the_bytes(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.post(f"/api/cache/cas/obj1?{SCOPE}", content=b"compiled")
        assert r.status_code == 204
        assert r.content == b""
        r = c.get(f"/api/cache/cas/obj1?{SCOPE}")
        assert r.status_code == 200
        assert r.content == b"compiled"
        assert r.headers["Content-Length"] == "8"
        assert media_type(r) == "application/octet-stream"
        miss = c.get(f"/api/cache/cas/obj2?{SCOPE}")
        assert miss.status_code == 404
        assert miss.json() == {"message": "Artifact not found"}
        # Another namespace of the same tenant is another keyspace.
        assert c.get("/api/cache/cas/obj1?tenant_id=acme&namespace_id=other").status_code == 404


def test_xcode_cas_post_of_an_existing_id_is_204_without_reading_the_body(
    node: NodeProcess,
) -> None:
    with node.client() as c:
        assert c.post(f"/api/cache/cas/obj1?{SCOPE}", content=b"first").status_code == 204
    received = sample(node.metrics(), "kura_http_received_bytes_total", protocol="xcode")
    # Declare 64 MiB and send none of it: the answer must not wait for the body.
    status, _h, _b = raw_request(
        node, "POST", f"/api/cache/cas/obj1?{SCOPE}", {"Content-Length": str(64 * MiB)}
    )
    assert status == 204
    assert sample(node.metrics(), "kura_http_received_bytes_total", protocol="xcode") == received
    with node.client() as c:
        assert c.get(f"/api/cache/cas/obj1?{SCOPE}").content == b"first"


def test_xcode_cas_without_tenant_is_400(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.post("/api/cache/cas/obj1?namespace_id=app", content=b"x")
        assert r.status_code == 400
        assert r.json() == {"message": "Missing tenant_id"}
        assert c.get("/api/cache/cas/obj1").status_code == 400
    assert node.index_rows() == 0


# -- key-value --------------------------------------------------------------------------------


@TWO_PROCESSES
def test_keyvalue_put_is_204_and_get_returns_the_entries_as_json(node: NodeProcess) -> None:
    with node.client() as c:
        doc = {"cas_id": "kv1", "entries": [{"value": "a"}, {"value": "b"}]}
        r = c.put(f"/api/cache/keyvalue?{SCOPE}", json=doc)
        assert r.status_code == 204
        r = c.get(f"/api/cache/keyvalue/kv1?{SCOPE}")
        assert r.status_code == 200
        assert media_type(r) == "application/json"
        assert r.json() == {"entries": [{"value": "a"}, {"value": "b"}]}
        # Every PUT writes a new version: no existence short-cut.
        doc2 = {"cas_id": "kv1", "entries": [{"value": "c"}]}
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=doc2).status_code == 204
        assert c.get(f"/api/cache/keyvalue/kv1?{SCOPE}").json() == {"entries": [{"value": "c"}]}


def test_keyvalue_miss_is_404_with_upstreams_message(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.get(f"/api/cache/keyvalue/nothing?{SCOPE}")
        assert r.status_code == 404
        assert r.json() == {"message": "Key-value entry not found"}
        doc = {"cas_id": "kv1", "entries": []}
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=doc).status_code == 204
        other = c.get("/api/cache/keyvalue/kv1?tenant_id=acme&namespace_id=elsewhere")
        assert other.status_code == 404


# -- Gradle (Kura route) ----------------------------------------------------------------------


@TWO_PROCESSES
def test_gradle_put_is_201_when_new_then_200_and_keeps_the_first_body(node: NodeProcess) -> None:
    with node.client() as c:
        assert c.put(f"/api/cache/gradle/k1?{SCOPE}", content=b"one").status_code == 201
        assert c.put(f"/api/cache/gradle/k1?{SCOPE}", content=b"two").status_code == 200
        r = c.get(f"/api/cache/gradle/k1?{SCOPE}")
        assert (r.status_code, r.content) == (200, b"one")
        assert c.get(f"/api/cache/gradle/k2?{SCOPE}").status_code == 404
    assert node.index_rows() == 1


# -- multipart modules ------------------------------------------------------------------------

MODULE = "tenant_id=acme&namespace_id=app&hash=h1&name=Mod.framework"


@TWO_PROCESSES
def test_module_upload_start_parts_complete_then_head_and_get(node: NodeProcess) -> None:
    p1, p2, p1_again = os.urandom(3000), os.urandom(2000), os.urandom(1000)
    with node.client() as c:
        assert c.head(f"/api/cache/module/x?{MODULE}").status_code == 404
        assert c.get(f"/api/cache/module/x?{MODULE}").status_code == 404
        r = c.post(f"/api/cache/module/start?{MODULE}")
        assert r.status_code == 200
        upload_id = r.json()["upload_id"]
        assert isinstance(upload_id, str)
        assert len(upload_id) >= 16
        base = f"/api/cache/module/part?upload_id={upload_id}"
        assert c.post(f"{base}&part_number=1", content=p1).status_code == 204
        assert c.post(f"{base}&part_number=2", content=p2).status_code == 204
        # Replacing part 1 drops the old part: its file and its reservation.
        assert c.post(f"{base}&part_number=1", content=p1_again).status_code == 204
        assert len(node.staging_files()) == 2
        assert node.metric("kura_tmp_reserved_bytes") == len(p1_again) + len(p2)
        done = c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1, 2]})
        assert done.status_code == 204
        head = c.head(f"/api/cache/module/anything?{MODULE}")  # the {id} segment is ignored
        assert head.status_code == 204
        r = c.get(f"/api/cache/module/x?{MODULE}")
        assert r.status_code == 200
        assert r.content == p1_again + p2
        # The upload is gone once completed.
        assert c.post(f"{base}&part_number=3", content=b"late").status_code == 404
        r = c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1, 2]})
        assert r.status_code == 404
        # Starting an upload of a module that exists answers a null upload id.
        r = c.post(f"/api/cache/module/start?{MODULE}")
        assert (r.status_code, r.json()) == (200, {"upload_id": None})
    assert rawhttp.wait_until(lambda: node.staging_files() == [])
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_module_cache_category_and_name_are_part_of_the_key(node: NodeProcess) -> None:
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{MODULE}").json()["upload_id"]
        c.post(f"/api/cache/module/part?upload_id={upload_id}&part_number=1", content=b"m")
        c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1]})
        assert c.head(f"/api/cache/module/x?{MODULE}&cache_category=builds").status_code == 204
        assert c.head(f"/api/cache/module/x?{MODULE}&cache_category=tests").status_code == 404
        other_name = MODULE.replace("Mod.framework", "Other.framework")
        assert c.head(f"/api/cache/module/x?{other_name}").status_code == 404


@pytest.mark.parametrize("parts", [[2, 1], [1], [1, 2, 3], [], [1, 1, 2]])
def test_module_complete_needs_exactly_the_ascending_uploaded_parts(
    node: NodeProcess, parts: list[int]
) -> None:
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{MODULE}").json()["upload_id"]
        for n in (1, 2):
            r = c.post(
                f"/api/cache/module/part?upload_id={upload_id}&part_number={n}", content=b"p"
            )
            assert r.status_code == 204
        r = c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": parts})
        assert r.status_code == 400
        assert r.json() == {"message": "Parts mismatch or missing parts"}
        assert c.head(f"/api/cache/module/x?{MODULE}").status_code == 404
        # The upload survives a bad completion and can still be completed correctly.
        r = c.post(f"/api/cache/module/complete?upload_id={upload_id}", json={"parts": [1, 2]})
        assert r.status_code == 204
        assert c.get(f"/api/cache/module/x?{MODULE}").content == b"pp"


def test_module_start_without_hash_or_name_is_400(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.post("/api/cache/module/start?tenant_id=acme&name=n")
        assert (r.status_code, r.json()) == (400, {"message": "Missing hash"})
        r = c.post("/api/cache/module/start?tenant_id=acme&hash=h")
        assert (r.status_code, r.json()) == (400, {"message": "Missing name"})


def test_module_total_over_2_gib_is_422_and_a_replaced_part_counts_only_its_new_size(
    node: NodeProcess,
) -> None:
    # Real bytes: 2 GiB of parts staged in the tmp dir (about 6 s here). Upstream's rule is
    # about the sum of part sizes, and only a real upload exercises the accounting.
    ten = os.urandom(10 * MiB)
    with node.client() as c:
        upload_id = c.post(f"/api/cache/module/start?{MODULE}").json()["upload_id"]
        base = f"/api/cache/module/part?upload_id={upload_id}"
        for n in range(1, 205):  # 204 x 10 MiB = 2040 MiB
            assert c.post(f"{base}&part_number={n}", content=ten).status_code == 204
        assert c.post(f"{base}&part_number=205", content=ten[: 8 * MiB]).status_code == 204
        # Exactly 2 GiB now. Replacing a 10 MiB part by 10 MiB stays at 2 GiB: allowed.
        assert c.post(f"{base}&part_number=1", content=ten).status_code == 204
        r = c.post(f"{base}&part_number=206", content=b"x")
        assert r.status_code == 422
        assert r.json() == {"message": "Total upload size exceeds 2GB limit"}
        # Growing an existing part past the total is refused the same way.
        r = c.post(f"{base}&part_number=205", content=ten[: 8 * MiB + 1])
        assert r.status_code == 422
        # Shrinking one frees room for another part.
        assert c.post(f"{base}&part_number=2", content=ten[: 9 * MiB]).status_code == 204
        assert c.post(f"{base}&part_number=206", content=ten[:MiB]).status_code == 204
    assert len(node.staging_files()) == 206
    assert node.metric("kura_tmp_reserved_bytes") == 2 * 1024 * MiB


# -- Nx ---------------------------------------------------------------------------------------


@TWO_PROCESSES
def test_nx_put_is_200_also_when_the_hash_exists(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.put("/v1/cache/1234567890", content=b"tarball")
        assert r.status_code == 200
        r = c.put("/v1/cache/1234567890", content=b"other")
        assert r.status_code == 200
        r = c.get("/v1/cache/1234567890")
        assert (r.status_code, r.content) == (200, b"tarball")


def test_nx_miss_is_404_in_plain_text(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.get("/v1/cache/42")
    assert r.status_code == 404
    assert media_type(r) == "text/plain"
    assert r.text == "Artifact not found"


# -- Metro ------------------------------------------------------------------------------------


@TWO_PROCESSES
def test_metro_put_is_200_and_get_returns_the_exact_bytes_without_encoding(
    node: NodeProcess,
) -> None:
    body = os.urandom(5000)
    key = hashlib.sha1(b"metro").hexdigest()
    with node.client() as c:
        assert c.get(f"/api/metro/cache/{key}").status_code == 404
        assert c.put(f"/api/metro/cache/{key}", content=body).status_code == 200
        r = c.get(f"/api/metro/cache/{key}")
    assert (r.status_code, r.content) == (200, body)
    assert "Content-Encoding" not in r.headers


# -- Turborepo --------------------------------------------------------------------------------


def test_turbo_status_says_enabled(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.get("/v8/artifacts/status?slug=team1")
    assert (r.status_code, r.json()) == (200, {"status": "enabled"})


@TWO_PROCESSES
def test_turbo_put_is_202_and_get_and_head_return_the_stored_artifact_headers(
    node: NodeProcess,
) -> None:
    body = os.urandom(3000)
    headers = {"x-artifact-tag": "c2lnbmF0dXJl", "x-artifact-duration": "1234"}
    with node.client() as c:
        assert c.get("/v8/artifacts/abc123?slug=team1").status_code == 404
        r = c.put("/v8/artifacts/abc123?slug=team1", content=body, headers=headers)
        assert r.status_code == 202
        assert r.json() == {"urls": ["/v8/artifacts/abc123"]}
        r = c.get("/v8/artifacts/abc123?slug=team1")
        assert (r.status_code, r.content) == (200, body)
        assert r.headers["x-artifact-tag"] == "c2lnbmF0dXJl"
        assert r.headers["x-artifact-duration"] == "1234"
        head = c.head("/v8/artifacts/abc123?slug=team1")
        assert head.status_code == 200
        assert head.headers["Content-Length"] == str(len(body))
        assert head.headers["x-artifact-tag"] == "c2lnbmF0dXJl"
        assert head.content == b""
        assert c.head("/v8/artifacts/nothere?slug=team1").status_code == 404


def test_turbo_events_are_accepted(node: NodeProcess) -> None:
    events = [{"sessionId": "s", "source": "REMOTE", "event": "HIT", "hash": "abc", "duration": 1}]
    with node.client() as c:
        assert c.post("/v8/artifacts/events?slug=team1", json=events).status_code == 200
        assert c.post("/v8/artifacts/events?slug=team1", content=b"{no").status_code == 400


def test_turbo_query_answers_which_hashes_exist(node: NodeProcess) -> None:
    with node.client() as c:
        c.put(
            "/v8/artifacts/have?teamId=team1",
            content=b"12345",
            headers={"x-artifact-duration": "77", "x-artifact-tag": "tag"},
        )
        r = c.post("/v8/artifacts?teamId=team1", json={"hashes": ["have", "missing"]})
    assert r.status_code == 200
    assert r.json() == {
        "have": {"size": 5, "taskDurationMs": 77, "tag": "tag"},
        "missing": {"error": {"message": "Artifact not found"}},
    }


def test_turbo_teams_are_isolated_and_slug_or_team_id_name_the_same_team(
    node: NodeProcess,
) -> None:
    with node.client() as c:
        assert c.put("/v8/artifacts/h1?teamId=alpha", content=b"a").status_code == 202
        assert c.get("/v8/artifacts/h1?teamId=beta").status_code == 404
        assert c.get("/v8/artifacts/h1?slug=beta").status_code == 404
        assert c.get("/v8/artifacts/h1?slug=alpha").content == b"a"
        # teamId wins when both are given (turborepo-remote-cache does the same).
        assert c.get("/v8/artifacts/h1?teamId=beta&slug=alpha").status_code == 404
        assert c.get("/v8/artifacts/h1?teamId=alpha&slug=beta").status_code == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v8/artifacts/h1"), ("PUT", "/v8/artifacts/h1"), ("POST", "/v8/artifacts")],
)
def test_turbo_without_a_team_is_400(node: NodeProcess, method: str, path: str) -> None:
    with node.client() as c:
        body = json.dumps({"hashes": ["h1"]}).encode() if method == "POST" else b"x"
        r = c.request(method, path, content=body)
    assert r.status_code == 400
    assert "teamId" in r.json()["message"]
    assert node.index_rows() == 0


# -- Bazel HTTP cache -------------------------------------------------------------------------


@TWO_PROCESSES
def test_bazel_ac_and_cas_are_separate_keyspaces(node: NodeProcess) -> None:
    action = b"the action proto"
    digest = hashlib.sha256(action).hexdigest()
    result = action_result({"out": action})  # its one output is the CAS blob below
    with node.client() as c:
        assert c.get(f"/cache/ac/{digest}").status_code == 404
        assert c.put(f"/cache/cas/{digest}", content=action).status_code == 200
        assert c.get(f"/cache/ac/{digest}").status_code == 404
        assert c.put(f"/cache/ac/{digest}", content=result).status_code == 200
        assert c.get(f"/cache/cas/{digest}").content == action
        assert c.get(f"/cache/ac/{digest}").content == result
        head = c.head(f"/cache/cas/{digest}")
        assert (head.status_code, head.headers["Content-Length"]) == (200, str(len(action)))
    assert node.index_rows() == 2


def test_bazel_cas_put_of_an_existing_digest_is_200_without_reading_the_body(
    node: NodeProcess,
) -> None:
    blob = b"cas blob"
    digest = hashlib.sha256(blob).hexdigest()
    with node.client() as c:
        assert c.put(f"/cache/cas/{digest}", content=blob).status_code == 200
    status, _h, _b = raw_request(node, "PUT", f"/cache/cas/{digest}", {"Content-Length": "999999"})
    assert status == 200
    with node.client() as c:
        assert c.get(f"/cache/cas/{digest}").content == blob


def test_bazel_ac_put_replaces_the_action_result(node: NodeProcess) -> None:
    digest = "a" * 64
    first, second = action_result(exit_code=1), action_result(exit_code=2)
    with node.client() as c:
        assert c.put(f"/cache/ac/{digest}", content=first).status_code == 200
        assert c.put(f"/cache/ac/{digest}", content=second).status_code == 200
        assert c.get(f"/cache/ac/{digest}").content == second


# -- plain HTTP cache -------------------------------------------------------------------------


@TWO_PROCESSES
def test_http_cache_put_is_201_new_then_200_replaced_and_keeps_the_content_type(
    node: NodeProcess,
) -> None:
    with node.client() as c:
        assert c.get("/cache/ab/cdef0123").status_code == 404
        r = c.put(
            "/cache/ab/cdef0123",
            content=b"v1",
            headers={"Content-Type": "application/vnd.gradle.build-cache-artifact.v1"},
        )
        assert r.status_code == 201
        assert c.put("/cache/ab/cdef0123", content=b"v2-longer").status_code == 200
        r = c.get("/cache/ab/cdef0123")
        assert (r.status_code, r.content) == (200, b"v2-longer")
        assert media_type(r) == "application/octet-stream"
        head = c.head("/cache/ab/cdef0123")
        assert head.status_code == 200
        assert head.headers["Content-Length"] == "9"
        assert head.content == b""
        assert c.head("/cache/ab/missing").status_code == 404
    assert node.index_rows() == 1
    assert node.metric("kura_disk_used_bytes") == 9


def test_http_cache_get_returns_the_stored_content_type(node: NodeProcess) -> None:
    ct = "application/vnd.gradle.build-cache-artifact.v1"
    with node.client() as c:
        c.put("/cache/0123456789abcdef0123456789abcdef", content=b"g", headers={"Content-Type": ct})
        r = c.get("/cache/0123456789abcdef0123456789abcdef")
    assert media_type(r) == ct


# -- WebDAV -----------------------------------------------------------------------------------


@TWO_PROCESSES
def test_webdav_propfind_mkcol_put_get_as_sccache_uses_them(node: NodeProcess) -> None:
    with node.client() as c:
        for path in ("/dav", "/dav/", "/dav/a/b/"):
            r = c.request("PROPFIND", path, headers={"Depth": "0"})
            assert r.status_code == 207, path
            assert "<D:collection/>" in r.text
        r = c.request("PROPFIND", "/dav/a/b/obj", headers={"Depth": "0"})
        assert r.status_code == 404
        assert c.request("MKCOL", "/dav/a").status_code == 201
        assert c.request("MKCOL", "/dav/a/b/").status_code == 201
        assert c.put("/dav/a/b/obj", content=b"object").status_code == 201
        assert c.put("/dav/a/b/obj", content=b"object-2").status_code == 204
        r = c.request("PROPFIND", "/dav/a/b/obj", headers={"Depth": "0"})
        assert r.status_code == 207
        assert "<D:getcontentlength>8</D:getcontentlength>" in r.text
        assert "<D:href>/dav/a/b/obj</D:href>" in r.text
        assert c.get("/dav/a/b/obj").content == b"object-2"
        assert c.get("/dav/a/b/none").status_code == 404


def test_webdav_options_advertises_dav(node: NodeProcess) -> None:
    with node.client() as c:
        r = c.options("/dav/anything")
    assert r.status_code == 200
    assert r.headers["DAV"] == "1"
    allowed = {m.strip() for m in r.headers["Allow"].split(",")}
    assert {"GET", "PUT", "PROPFIND", "MKCOL"} <= allowed


# -- namespace clean --------------------------------------------------------------------------


def _fill_namespace(c: httpx.Client, tenant_q: str, namespace: str) -> None:
    q = f"{tenant_q}&namespace_id={namespace}"
    assert c.put(f"/api/cache/gradle/g?{q}", content=namespace.encode()).status_code == 201
    assert c.post(f"/api/cache/cas/x?{q}", content=namespace.encode()).status_code == 204
    kv = {"cas_id": "kv", "entries": [{"value": namespace}]}
    assert c.put(f"/api/cache/keyvalue?{q}", json=kv).status_code == 204


def _namespace_present(c: httpx.Client, namespace: str) -> list[bool]:
    q = f"tenant_id=acme&namespace_id={namespace}"
    return [
        c.get(f"/api/cache/gradle/g?{q}").status_code == 200,
        c.get(f"/api/cache/cas/x?{q}").status_code == 200,
        c.get(f"/api/cache/keyvalue/kv?{q}").status_code == 200,
    ]


@pytest.mark.parametrize(
    "clean_query",
    [
        "tenant_id=acme&namespace_id=gone",
        "account_handle=acme&project_handle=gone",  # the legacy aliases
        "tenant_id=acme&project_handle=gone",
    ],
)
def test_namespace_clean_removes_that_namespace_only(node: NodeProcess, clean_query: str) -> None:
    with node.client() as c:
        _fill_namespace(c, "tenant_id=acme", "gone")
        _fill_namespace(c, "tenant_id=acme", "kept")
        assert c.put("/v1/cache/777", content=b"nx").status_code == 200
        assert c.put("/cache/plain", content=b"plain").status_code == 201
        rows = node.index_rows()
        r = c.delete(f"/api/cache/clean?{clean_query}")
        assert r.status_code == 204
        assert _namespace_present(c, "gone") == [False, False, False]
        assert _namespace_present(c, "kept") == [True, True, True]
        assert c.get("/v1/cache/777").status_code == 200
        assert c.get("/cache/plain").status_code == 200
        assert node.index_rows() == rows - 3
        # The tombstone covers what was there, not what comes later.
        assert (
            c.put(
                "/api/cache/gradle/g?tenant_id=acme&namespace_id=gone", content=b"new"
            ).status_code
            == 201
        )
        assert c.get("/api/cache/gradle/g?tenant_id=acme&namespace_id=gone").content == b"new"


def test_namespace_clean_without_tenant_is_400_and_removes_nothing(node: NodeProcess) -> None:
    with node.client() as c:
        _fill_namespace(c, "tenant_id=acme", "gone")
        r = c.delete("/api/cache/clean?namespace_id=gone")
        assert (r.status_code, r.json()) == (400, {"message": "Missing tenant_id"})
        assert _namespace_present(c, "gone") == [True, True, True]


# -- probes -----------------------------------------------------------------------------------


def test_up_is_200_json(node: NodeProcess) -> None:
    r = oneshot.get(node.url + "/up", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["tenant_id"] == "default"
    assert body["members"] == [node.internal_url]  # node URLs as peers reach them; no peers
    assert body["ring_members"] == 1


def test_ready_is_200_with_empty_reasons(node: NodeProcess) -> None:
    r = oneshot.get(node.url + "/ready", timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["ready"] is True
    assert body["reasons"] == []
    assert body["status"] == "ok"


def test_ready_is_503_with_its_reasons_while_a_configured_peer_never_answered(
    start_node: Callable[..., NodeProcess],
) -> None:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        dead_peer = f"http://127.0.0.1:{s.getsockname()[1]}"
    node = start_node(peers=dead_peer, discovery_initial_timeout_ms=600_000)
    r = oneshot.get(node.url + "/ready", timeout=10)
    assert r.status_code == 503
    body = r.json()
    assert body["ready"] is False
    assert body["status"] == "not_ready"
    assert "initial discovery incomplete" in body["reasons"]
    assert oneshot.get(node.url + "/up", timeout=10).status_code == 200  # liveness is unaffected


# -- metrics ----------------------------------------------------------------------------------

EXPECTED_FAMILIES = {
    "kura_http_requests_total": "counter",
    "kura_http_request_duration_seconds": "histogram",
    "kura_http_inflight_requests": "gauge",
    "kura_cache_lookups_total": "counter",
    "kura_http_received_bytes_total": "counter",
    "kura_http_sent_bytes_total": "counter",
    "kura_node_info": "gauge",
    "kura_disk_used_bytes": "gauge",
    "kura_disk_limit_bytes": "gauge",
    "kura_storage_artifacts": "gauge",
    "kura_storage_evictions_total": "counter",
    "kura_storage_evicted_bytes_total": "counter",
    "kura_storage_corrupt_artifacts_total": "counter",
    "kura_storage_read_only": "gauge",
    "kura_storage_index_damaged": "gauge",
    "kura_storage_reconciled_total": "counter",
    "kura_disk_free_bytes": "gauge",
    "kura_tmp_reserved_bytes": "gauge",
    "kura_tmp_capacity_bytes": "gauge",
    "kura_tmp_waiting_reservations": "gauge",
    "kura_tmp_dir_bytes": "gauge",
    "kura_storage_quarantine_bytes": "gauge",
    "kura_scrub_scrubbed_bytes_total": "counter",
    "kura_scrub_scrubbed_artifacts_total": "counter",
    "kura_scrub_passes_total": "counter",
    "kura_repair_results_total": "counter",
}


def _normalise(found: dict[str, str]) -> dict[str, str]:
    # prometheus_client prints counters' TYPE line without the _total suffix.
    return {
        (name + "_total" if kind == "counter" and not name.endswith("_total") else name): kind
        for name, kind in found.items()
    }


def test_metrics_expose_every_documented_family(start_node: Callable[..., NodeProcess]) -> None:
    node = start_node(max_disk_bytes=3 * MiB, tmp_dir_max_bytes=2 * MiB)
    r = oneshot.get(node.url + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    found = _normalise(families(node))
    missing = {n: k for n, k in EXPECTED_FAMILIES.items() if found.get(n) != k}
    assert missing == {}, found
    samples = node.metrics()
    assert samples["kura_disk_limit_bytes"] == 3 * MiB
    assert samples["kura_tmp_capacity_bytes"] == 2 * MiB
    assert sample(samples, "kura_node_info", region="local", tenant_id="default") == 1


def test_metrics_move_with_requests(node: NodeProcess) -> None:
    before = node.metrics()
    body = os.urandom(1000)
    with node.client() as c:
        assert c.put("/cache/m/one", content=body).status_code == 201
        assert c.get("/cache/m/one").status_code == 200
        assert c.get("/cache/m/one").status_code == 200
        assert c.get("/cache/m/two").status_code == 404
        assert c.post(f"/api/cache/cas/c1?{SCOPE}", content=b"xyz").status_code == 204
        assert c.get(f"/api/cache/cas/c2?{SCOPE}").status_code == 404
        assert c.head("/cache/m/one").status_code == 200  # counted as a request, sends no body
        kv = {"cas_id": "kv", "entries": [{"value": "v"}]}
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=kv).status_code == 204
        kv_sent = len(c.get(f"/api/cache/keyvalue/kv?{SCOPE}").content)
    after = node.metrics()

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    requests = "kura_http_requests_total"
    assert delta(requests, protocol="http_cache", method="PUT", status="201") == 1
    assert delta(requests, protocol="http_cache", method="GET", status="200") == 2
    assert delta(requests, protocol="http_cache", method="GET", status="404") == 1
    assert delta(requests, protocol="xcode", method="POST", status="204") == 1
    assert delta(requests, protocol="xcode", method="GET", status="404") == 1
    latency = "kura_http_request_duration_seconds_count"
    assert delta(latency, protocol="http_cache", method="GET") == 3
    assert delta(latency, protocol="xcode", method="POST") == 1
    assert delta("kura_http_request_duration_seconds_sum", protocol="http_cache") > 0
    lookups = "kura_cache_lookups_total"
    assert delta(requests, protocol="http_cache", method="HEAD", status="200") == 1
    assert delta(lookups, protocol="http_cache", result="hit") == 3
    assert delta(lookups, protocol="keyvalue", result="hit") == 1
    assert delta(lookups, protocol="http_cache", result="miss") == 1
    assert delta(lookups, protocol="xcode", result="miss") == 1
    assert delta("kura_http_received_bytes_total", protocol="http_cache") == 1000
    assert delta("kura_http_received_bytes_total", protocol="xcode") == 3
    assert delta("kura_http_sent_bytes_total", protocol="http_cache") == 2000
    assert delta("kura_http_sent_bytes_total", protocol="keyvalue") == kv_sent > 0
    assert delta("kura_disk_used_bytes") == 1003 + kv_sent
    assert delta("kura_storage_artifacts") == 3


def test_tmp_reserved_metric_follows_an_upload_in_flight(node: NodeProcess) -> None:
    sock = rawhttp.connect(node.url)
    with sock:
        rawhttp.send_head(sock, "PUT", "/cache/inflight", {"Content-Length": str(2 * MiB)})
        sock.sendall(b"x" * MiB)
        assert rawhttp.wait_until(lambda: node.metric("kura_tmp_reserved_bytes") == 2 * MiB)
        # The upload and the scrape that reads this gauge.
        assert node.metric("kura_http_inflight_requests") == 2
        sock.sendall(b"x" * MiB)
        status, _h, _b = rawhttp.read_response(sock)
    assert status == 201
    assert node.metric("kura_tmp_reserved_bytes") == 0


# -- large artifacts (sendfile path) ----------------------------------------------------------


def test_large_artifact_get_is_byte_identical_and_head_sends_no_body(node: NodeProcess) -> None:
    body = os.urandom(8 * MiB)
    with node.client() as c:
        assert c.put("/cache/large/blob", content=body).status_code == 201
        # One keep-alive connection: a HEAD that leaked body bytes would corrupt the next GET.
        head = c.head("/cache/large/blob")
        assert head.status_code == 200
        assert head.headers["Content-Length"] == str(8 * MiB)
        assert head.content == b""
        r = c.get("/cache/large/blob")
        assert r.status_code == 200
        assert r.headers["Content-Length"] == str(8 * MiB)
        assert hashlib.sha256(r.content).digest() == hashlib.sha256(body).digest()
        again = c.get("/cache/large/blob")  # the already-verified fast path
        assert again.content == body
        for path in ("/v1/cache/8388608", "/api/metro/cache/large"):
            assert c.put(path, content=body).status_code == 200
            assert c.get(path).content == body
    assert sample(node.metrics(), "kura_http_sent_bytes_total", protocol="http_cache") == 16 * MiB
