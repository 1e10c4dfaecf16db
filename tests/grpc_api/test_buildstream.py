"""Real BuildStream 2 (PyPI buildstream 2.8.1) with kura as its artifact cache,
``artifacts: servers: [{url: http://127.0.0.1:PORT, push: true}]``: one checkout builds an
``import`` element and pushes it, a fresh checkout (its own empty cache) pulls it and builds
nothing. BuildStream reaches artifacts by the Remote Asset API (``kura.grpc.asset``: FetchBlob and
PushBlob for the artifact, FetchDirectory and PushDirectory for its sources) and their content by
the CAS, all through its bundled buildbox-casd; without the Remote Asset API it stops at once with
"does not implement the Remote Asset Fetch service". The driver is ``tests/clients/bst.sh``.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess
from tests.integration.test_clients import Client, run_client
from tests.integration.test_public_tls import make_ca, make_leaf

pytestmark = [pytest.mark.clients, pytest.mark.in_process]

BST = Client("bst", "bst.sh", "", "grpc")
TOKEN = "tok-bst"


@pytest.mark.parametrize("secured", [False, True], ids=["open", "tls-token"])
def test_buildstream_pulls_from_a_fresh_checkout_what_another_pushed(
    start_node: Callable[..., NodeProcess], tmp_path: Path, secured: bool
) -> None:
    """Open, and over TLS with a read-write token (buildbox-casd sends a token over TLS only)."""
    port = free_port()
    settings: dict[str, object] = {}
    env: dict[str, str] = {}
    if secured:
        ca = make_ca(tmp_path)
        cert, key = make_leaf(tmp_path, "node", 1)
        settings = {"public_tls_cert_path": cert, "public_tls_key_path": key}
        settings["read_write_tokens"] = TOKEN
        env = {"TOKEN": TOKEN, "CA": str(ca)}
    node = start_node(grpc_port=port, **settings)
    if secured:
        node.verify = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    url = f"{'grpcs' if secured else 'grpc'}://127.0.0.1:{port}"
    run = run_client(BST, dataclasses.replace(node, url=url), **env)
    assert run.returncode == 0, run.describe() + "\n--- node log ---\n" + node.log()[-3000:]
    assert run.hit, run.describe()
    assert node.metric('kura_grpc_requests_total{code="OK",method="PushBlob"}') >= 1
    # The fresh checkout's look-up of the artifact was a hit.
    assert node.metric('kura_grpc_requests_total{code="OK",method="FetchBlob"}') >= 2
