"""``kura serve``'s environment (issue 26, item 11): a misspelt ``KURA_*`` variable stops the
start naming the setting meant, Kubernetes service links are ignored, and the start-up log says
whether and how clients authenticate. Real ``kura serve`` processes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests import oneshot
from tests.conftest import NodeProcess, node_env, serve_refused

pytestmark = pytest.mark.in_process

# What the kubelet injects into every pod of a namespace with a Service ``kura`` (port 4000) and
# a Service ``kura-internal`` (port 4100), as setting names for node_env / start_node.
SERVICE_LINKS = {
    "service_host": "10.96.0.10",
    "service_port": "4000",
    "service_port_http": "4000",
    "port_4000_tcp": "tcp://10.96.0.10:4000",
    "port_4000_tcp_addr": "10.96.0.10",
    "port_4000_tcp_port": "4000",
    "port_4000_tcp_proto": "tcp",
    "internal_service_host": "10.96.0.11",
    "internal_service_port": "4100",
    # Shares its name with the setting KURA_INTERNAL_PORT, as KURA_PORT does with KURA_PORT.
    "internal_port": "tcp://10.96.0.11:4100",
    "internal_port_4100_tcp": "tcp://10.96.0.11:4100",
    "internal_port_4100_tcp_addr": "10.96.0.11",
    "internal_port_4100_tcp_port": "4100",
    "internal_port_4100_tcp_proto": "tcp",
}


def test_a_misspelt_setting_stops_the_start_naming_the_setting_meant(tmp_path: Path) -> None:
    # KURA_READ_WRITE_TOKEN (singular): on main the node started open and accepted writes.
    stderr = serve_refused(node_env(tmp_path, read_write_token="tok1", workers=1), cwd=tmp_path)
    assert (
        "KURA_READ_WRITE_TOKEN is not a known setting: did you mean KURA_READ_WRITE_TOKENS?"
        in stderr
    ), stderr
    assert "KURA_ALLOW_UNKNOWN_SETTINGS=true" in stderr
    assert "tok1" not in stderr  # a value may be a secret: only names are printed
    assert not (tmp_path / "data").exists()


def test_kubernetes_service_links_are_ignored_even_where_they_share_a_settings_name(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(workers=1, **SERVICE_LINKS)
    assert oneshot.get(node.url + "/up", timeout=10).status_code == 200
    # The link's tcp://10.96.0.11:4100 was not read as the internal port: the default, 0 (the
    # OS chooses), was used.
    assert not node.internal_url.endswith(":4100"), node.internal_url
    links = [line for line in node.log().splitlines() if "service-link variables" in line]
    assert len(links) == 1, node.log()
    assert f"ignoring {len(SERVICE_LINKS)} Kubernetes service-link variables" in links[0]
    assert "KURA_INTERNAL_PORT KURA_INTERNAL_PORT_4100_TCP" in links[0]


def test_unknown_settings_may_be_allowed_and_are_warned_once(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(workers=1, allow_unknown_settings="true", read_write_token="tok1")
    assert oneshot.get(node.url + "/up", timeout=10).status_code == 200
    log = node.log()
    warnings = [line for line in log.splitlines() if "unknown variables" in line]
    assert len(warnings) == 1, log
    assert "WARNING" in warnings[0]
    assert "did you mean KURA_READ_WRITE_TOKENS?" in warnings[0]
    assert "tok1" not in log
    # The node is open, and its log says so.
    assert "auth off: every client may read and write" in log


def test_the_start_up_log_says_how_clients_and_peers_authenticate_never_with_a_token(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(
        workers=1,
        read_write_tokens="rw-secret-1,rw-secret-2",
        read_only_tokens="ro-secret-1",
        internal_tokens="peer-secret-1",
    )
    log = node.log()
    assert (
        "auth on: 2 read-write tokens (KURA_READ_WRITE_TOKENS), 1 read-only token "
        "(KURA_READ_ONLY_TOKENS); /metrics open; peers: 1 internal token"
    ) in log, log
    assert "secret" not in log
