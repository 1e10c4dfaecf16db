"""``GET /_internal/anti_entropy/range``: every prefix length finds exactly its artifacts.

A range page is strictly after its cursor; the cursor used to be the prefix itself, so a
64-digit prefix (a whole artifact_id) left that artifact out of its own range.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests import oneshot
from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process

TOKEN = "range-peer-token"


def ids_in_range(node: NodeProcess, prefix: str, limit: int = 1000) -> list[str]:
    """Every artifact_id the route lists for ``prefix``, following ``next_after``."""
    found: list[str] = []
    after: str | None = None
    while True:
        params = {"prefix": prefix, "limit": str(limit)}
        if after is not None:
            params["after"] = after
        r = oneshot.get(
            node.internal_url + "/_internal/anti_entropy/range",
            params=params,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert r.status_code == 200, r.text
        page = r.json()
        found += [m["artifact_id"] for m in page["manifests"]]
        after = page["next_after"]
        if after is None:
            return found


def test_each_prefix_length_lists_exactly_the_ids_that_start_with_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("range", internal_tokens=TOKEN)
    with node.client() as c:
        for i in range(40):
            assert c.put(f"/cache/range/{i}", content=b"body %d" % i).status_code == 201
    everything = ids_in_range(node, "")
    assert len(everything) == 40
    assert everything == sorted(everything)
    for aid in everything[:8]:
        for n in (1, 2, 3, 17, 63, 64):
            want = [a for a in everything if a.startswith(aid[:n])]
            assert ids_in_range(node, aid[:n]) == want, (aid, n)
            # One row per page walks the same range, each id exactly once.
            assert ids_in_range(node, aid[:n], limit=1) == want, (aid, n)
    # A prefix no id has: an empty range, whatever digit it ends in.
    missing = next(p for p in ("0", "8", "f") if not any(a.startswith(p * 3) for a in everything))
    assert ids_in_range(node, missing * 3) == []
