"""References must resolve, over real HTTP against real nodes (issue 10, deliverable 6).

* Bazel's action cache (``/cache/ac/``): an upload must be a REAPI v2 ActionResult (400 and
  nothing left behind otherwise, zero-byte included); a GET whose entry references a CAS blob
  that is not stored (an output file, stdout, a Tree, or a file inside a Tree) is a 404 counted
  as a miss (``kura.api.action_cache``). ccache's padded ``layout=bazel`` keys stay raw.
* Key-value entries: an entry whose referenced CAS object was evicted is a miss
  (``kura.api.keyvalue``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import sqlite3
import time
from collections.abc import Callable

import pytest

from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.reapi import action_result, tree

pytestmark = pytest.mark.in_process

SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>.*)\})?$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def lookups(node: NodeProcess, protocol: str, result: str) -> float:
    total = 0.0
    for key, value in node.metrics().items():
        m = SAMPLE.match(key)
        if m is None or m["name"] != "kura_cache_lookups_total":
            continue
        labels = dict(LABEL.findall(m["labels"] or ""))
        if labels.get("protocol") == protocol and labels.get("result") == result:
            total += value
    return total


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- Bazel action cache -------------------------------------------------------------------------

# Which referenced blob a case leaves out of the CAS ("" = none: a hit).
MISSING = ["", "output file", "stdout", "tree", "tree root file", "tree child file"]


def test_an_action_result_hits_only_while_every_referenced_blob_is_stored(
    node: NodeProcess,
) -> None:
    """Every kind of reference, each left out once: 404 and a miss; all present: the hit."""
    with node.client() as c:
        for case in MISSING:
            tag = case.encode() or b"all"
            blobs = {
                "output file": b"object file " + tag,
                "stdout": b"compiler said " + tag,
                "tree root file": b"header " + tag,
                "tree child file": b"nested header " + tag,
            }
            tree_bytes = tree({"a.h": blobs["tree root file"]}, {"b.h": blobs["tree child file"]})
            blobs["tree"] = tree_bytes
            result = action_result(
                {"out/a.o": blobs["output file"]},
                stdout=blobs["stdout"],
                trees={"out/include": tree_bytes},
            )
            for what, content in blobs.items():
                if what != case:
                    assert c.put(f"/cache/cas/{_sha(content)}", content=content).status_code == 200
            key = _sha(b"action " + tag)
            assert c.put(f"/cache/ac/{key}", content=result).status_code == 200
            misses = lookups(node, "bazel", "miss")
            r = c.get(f"/cache/ac/{key}")
            if case:
                assert r.status_code == 404, (case, r.text)
                assert "not stored" in r.json()["message"], case
                assert _sha(blobs[case]) in r.json()["message"], case
                assert lookups(node, "bazel", "miss") == misses + 1, case
                assert c.head(f"/cache/ac/{key}").status_code == 404, case
            else:
                assert (r.status_code, r.content) == (200, result)
                assert c.head(f"/cache/ac/{key}").status_code == 200


def test_an_action_result_whose_output_was_stored_then_evicted_is_a_miss(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The LRU eviction of an output blob turns its ActionResult into a 404. The retention
    floor is off: with it, the hit would keep the output (``test_retention``)."""
    node = start_node(max_disk_bytes=100 * 1024, min_retention="0")
    output = os.urandom(40 * 1024)
    result = action_result({"out/a.o": output})
    key = _sha(b"evicted action")
    with node.client() as c:
        assert c.put(f"/cache/cas/{_sha(output)}", content=output).status_code == 200
        assert c.put(f"/cache/ac/{key}", content=result).status_code == 200
        assert c.get(f"/cache/ac/{key}").content == result
        # The hit touched the entry and its output at the same instant; rewrite the entry a
        # moment later so the output is the least recently used artifact.
        touched_ms = time.time() * 1000
        assert wait_for(lambda: time.time() * 1000 > touched_ms + 2, 1)
        assert c.put(f"/cache/ac/{key}", content=result).status_code == 200
        for i in range(2):
            filler = os.urandom(40 * 1024)
            assert c.put(f"/cache/cas/{_sha(filler)}", content=filler).status_code == 200, i
        assert c.get(f"/cache/cas/{_sha(output)}").status_code == 404
        assert node.metric("kura_storage_evictions_total") >= 1
        r = c.get(f"/cache/ac/{key}")
    assert r.status_code == 404, r.text
    assert _key_stored(node, f"ac/{key}"), "the entry itself must still be stored"


GARBAGE = {
    "zero bytes": b"",
    "text": b"this is not an ActionResult",
    "random bytes": bytes(range(256)) * 4,
    "json": b'{"output_files": []}',
    "unknown field only": b"\x78\x01",  # field 15, a varint: parses, but is no ActionResult
    "malformed digest": b"\x12\x0b\x0a\x01a\x12\x06\x0a\x02XY\x10\x01",
}


@pytest.mark.parametrize("body", list(GARBAGE.values()), ids=list(GARBAGE))
def test_an_upload_that_is_not_an_action_result_is_400_and_leaves_nothing(
    node: NodeProcess, body: bytes
) -> None:
    key = _sha(b"garbage")
    with node.client() as c:
        r = c.put(f"/cache/ac/{key}", content=body)
        assert r.status_code == 400, r.text
        assert "ActionResult" in r.json()["message"]
        assert c.get(f"/cache/ac/{key}").status_code == 404
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_ccache_padded_keys_under_ac_are_stored_and_served_raw(node: NodeProcess) -> None:
    """ccache's layout=bazel key: its 40-hex key padded with its first 24 digits."""
    short = hashlib.sha1(b"a ccache result key").hexdigest()
    key = short + short[:24]
    for body in (b"ccache's own result format, not a protobuf", b""):
        with node.client() as c:
            assert c.put(f"/cache/ac/{key}", content=body).status_code == 200
            r = c.get(f"/cache/ac/{key}")
        assert (r.status_code, r.content) == (200, body)


def _key_stored(node: NodeProcess, key: str) -> bool:
    db = node.data_dir / "index.sqlite3"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT 1 FROM artifacts WHERE key = ?", (key,)).fetchone() is not None
    finally:
        conn.close()


# -- key-value entries ----------------------------------------------------------------------------

SCOPE = "tenant_id=acme&namespace_id=ios"


def compile_job_value(cas_id: str) -> str:
    """A key-value ``value`` as Tuist's client sends it: base64 of Xcode's compile-job result,
    whose CAS reference is field 1 (65 bytes: 0x00 + the 64-hex id), then its checksum."""
    raw = b"\x0a\x41\x00" + cas_id.encode() + b"\x12\x40" + _sha(cas_id.encode()).encode()
    return base64.b64encode(b"\x08\x01" + raw).decode()


def test_a_keyvalue_entry_whose_cas_object_was_evicted_is_a_miss(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(max_disk_bytes=100 * 1024, min_retention="0")  # the floor would keep it
    obj = os.urandom(40 * 1024)
    cas_id = hashlib.sha256(obj + b"cache-v1").hexdigest().upper()  # Tuist's fingerprint
    entry = {"cas_id": "0~key", "entries": [{"value": compile_job_value(cas_id)}]}
    with node.client() as c:
        assert c.post(f"/api/cache/cas/{cas_id}?{SCOPE}", content=obj).status_code == 204
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=entry).status_code == 204
        hits = lookups(node, "keyvalue", "hit")
        r = c.get(f"/api/cache/keyvalue/0~key?{SCOPE}")
        assert (r.status_code, r.json()) == (200, {"entries": entry["entries"]})
        assert lookups(node, "keyvalue", "hit") == hits + 1
        # As above: make the CAS object, not the entry, the least recently used artifact.
        touched_ms = time.time() * 1000
        assert wait_for(lambda: time.time() * 1000 > touched_ms + 2, 1)
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=entry).status_code == 204
        for i in range(2):
            filler = os.urandom(40 * 1024)
            assert c.post(f"/api/cache/cas/filler{i}?{SCOPE}", content=filler).status_code == 204
        assert c.get(f"/api/cache/cas/{cas_id}?{SCOPE}").status_code == 404
        misses = lookups(node, "keyvalue", "miss")
        r = c.get(f"/api/cache/keyvalue/0~key?{SCOPE}")
        assert r.status_code == 404, r.text
        assert r.json()["message"] == "Key-value entry not found"
        assert lookups(node, "keyvalue", "miss") == misses + 1
    assert _key_stored(node, "action_cache/0~key"), "the entry itself must still be stored"


def test_a_keyvalue_entry_is_a_miss_when_its_cas_object_was_never_stored(
    node: NodeProcess,
) -> None:
    entry = {"cas_id": "k2", "entries": [{"value": compile_job_value("AB" * 32)}]}
    with node.client() as c:
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=entry).status_code == 204
        assert c.get(f"/api/cache/keyvalue/k2?{SCOPE}").status_code == 404
        assert c.post(f"/api/cache/cas/{'AB' * 32}?{SCOPE}", content=b"obj").status_code == 204
        assert c.get(f"/api/cache/keyvalue/k2?{SCOPE}").status_code == 200
        # The object lives in its own namespace: another namespace's entry does not see it.
        other = "tenant_id=acme&namespace_id=android"
        assert c.put(f"/api/cache/keyvalue?{other}", json=entry).status_code == 204
        assert c.get(f"/api/cache/keyvalue/k2?{other}").status_code == 404


def test_an_entry_whose_referenced_object_file_was_removed_behind_the_node_is_a_miss(
    start_node: Callable[..., NodeProcess],
) -> None:
    """B29 (and B01 without its restart): the CAS object a key-value entry names, and the
    output an ActionResult names, are gone from the disk while the node runs (an operator's
    clean-up, a lost file). The entries are misses (404), not hits pointing at nothing, on a
    key-value GET, a Bazel ``/ac/`` GET and ``FindMissingBlobs``'s HTTP twin, the CAS HEAD."""
    node = start_node()
    obj, output = os.urandom(64 * 1024), os.urandom(64 * 1024)
    cas_id = hashlib.sha256(obj + b"cache-v1").hexdigest().upper()  # Tuist's fingerprint
    entry = {"cas_id": "0~gone", "entries": [{"value": compile_job_value(cas_id)}]}
    action = _sha(b"action whose output is removed")
    with node.client() as c:
        assert c.post(f"/api/cache/cas/{cas_id}?{SCOPE}", content=obj).status_code == 204
        assert c.put(f"/api/cache/keyvalue?{SCOPE}", json=entry).status_code == 204
        assert c.put(f"/cache/cas/{_sha(output)}", content=output).status_code == 200
        result = action_result({"out/a.o": output})
        assert c.put(f"/cache/ac/{action}", content=result).status_code == 200
        assert c.get(f"/api/cache/keyvalue/0~gone?{SCOPE}").status_code == 200
        assert c.get(f"/cache/ac/{action}").status_code == 200
        files = node.blob_files()
        assert len(files) == 2  # the two 64 KiB bodies; the entries are inline
        for path in files:
            path.unlink()
        misses = lookups(node, "keyvalue", "miss")
        r = c.get(f"/api/cache/keyvalue/0~gone?{SCOPE}")
        assert r.status_code == 404, r.text
        assert lookups(node, "keyvalue", "miss") == misses + 1
        assert c.get(f"/cache/ac/{action}").status_code == 404
        # The objects' rows went with the files: a re-upload stores them again, and the entries
        # hit again.
        assert c.post(f"/api/cache/cas/{cas_id}?{SCOPE}", content=obj).status_code == 204
        assert c.put(f"/cache/cas/{_sha(output)}", content=output).status_code == 200
        assert c.get(f"/api/cache/keyvalue/0~gone?{SCOPE}").status_code == 200
        assert c.get(f"/cache/ac/{action}").status_code == 200
