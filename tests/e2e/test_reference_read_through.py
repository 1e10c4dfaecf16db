"""An action-cache hit on a node that reads through to its peers (kura.storage.service
``missing``): the blobs an ActionResult references are fetched from the peer like the entry
itself, so read-through does not turn every hit into a miss."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import pytest

from tests.conftest import NodeProcess
from tests.e2e.mesh import manifests, status, wait_for
from tests.reapi import action_result

pytestmark = pytest.mark.in_process


def test_a_read_through_action_result_fetches_its_outputs_from_the_peer(
    start_node: Callable[..., NodeProcess],
) -> None:
    # ``holder`` has no peers, so it never ships to ``reader``; ``reader`` only reads through.
    holder = start_node("holder")
    reader = start_node("reader", peers=holder.internal_url, read_through="always")
    assert wait_for(lambda: status(reader)["ready"] is True, 30), status(reader)
    output = b"an object file only the holder has"
    result = action_result({"out/a.o": output})
    key = hashlib.sha256(b"an action").hexdigest()
    with holder.client() as c:
        assert (
            c.put(f"/cache/cas/{hashlib.sha256(output).hexdigest()}", content=output).status_code
            == 200
        )
        assert c.put(f"/cache/ac/{key}", content=result).status_code == 200
    assert manifests(reader) == {}
    with reader.client() as c:
        r = c.get(f"/cache/ac/{key}")
    assert (r.status_code, r.content) == (200, result)
    assert reader.metric('kura_read_through_total{result="hit"}') == 2
    # Both copies are stored, in the background after they were served (mesh.read_through:
    # "served before it is durable"): a loaded machine commits them after the response.
    fetched = {f"ac/{key}", f"cas/{hashlib.sha256(output).hexdigest()}"}
    assert wait_for(lambda: {m["key"] for m in manifests(reader).values()} == fetched, 30), (
        manifests(reader)
    )
