"""Real Bazel 4.2.3 (Debian bazel-bootstrap) against kura's gRPC cache,
``--remote_cache=grpc://127.0.0.1:PORT``: the second build, from a fresh output base (no local
action cache, outputs or server: what ``bazel clean --expunge`` leaves), is a remote cache hit,
and kura's own metrics count the hit; then the same with a token. Two workspaces: a genrule, and
a C ``cc_binary`` (compile and link: two hits, and the cached binary runs). Over TLS (grpcs://) this
Bazel cannot connect at all: Debian's build runs gRPC-Java's netty on JDK 17 and fails with "JDK
provider does not support ALPN protocol" before any request, so the TLS + token variant is
shown with the Python gRPC client instead (``test_auth_limits``).

The driver is ``tests/clients/bazel.sh``, the script the HTTP client test runs, offline: this
Bazel's ``@bazel_tools`` loads its C++ and Java rule names from ``@rules_cc`` and
``@rules_java``, which it would download, so for ``TARGET=cc`` the script writes two small
repositories that give Bazel's native rules those names (``--override_repository``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from kura_harness.launch.process import free_port
from tests import oneshot
from tests.conftest import NodeProcess
from tests.integration.test_clients import BY_NAME, Client, requests_with_status, run_client

pytestmark = [pytest.mark.clients, pytest.mark.in_process]

BAZEL = Client("bazel-grpc", "bazel.sh", "", "grpc", 2)
BAZEL_CC = Client("bazel-grpc-cc", "bazel.sh", "", "grpc", 4, {"TARGET": "cc"})
BAZEL_ARCHIVE = Client("bazel-grpc-archive", "bazel.sh", "", "grpc", 1, {"TARGET": "archive"})
TOKEN = "tok-bazel-0123456789"  # 16+ characters: KURA_TOKENS_FILE takes it too


def assert_hit_counted(node: NodeProcess, run_output: str, hit: bool, min_hits: int) -> None:
    assert hit, run_output + "\n--- node log ---\n" + node.log()[-3000:]
    # Run 2 found each ActionResult (an AC hit) and read its output over ByteStream.
    assert node.metric('kura_cache_lookups_total{protocol="grpc",result="hit"}') >= min_hits
    assert node.metric('kura_grpc_requests_total{code="OK",method="GetActionResult"}') >= 1
    assert node.metric('kura_grpc_requests_total{code="OK",method="UpdateActionResult"}') >= 1
    assert node.metric('kura_grpc_requests_total{code="OK",method="Write"}') >= 1


@pytest.mark.parametrize("client", [BAZEL, BAZEL_CC], ids=["genrule", "cc_binary"])
def test_bazel_over_grpc_gets_a_remote_hit(
    start_node: Callable[..., NodeProcess], client: Client
) -> None:
    port = free_port()
    node = start_node(grpc_port=port)
    run = run_client(client, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"))
    assert run.returncode == 0, run.describe()
    assert_hit_counted(node, run.describe(), run.hit, client.min_hits)


@pytest.mark.parametrize("client", [BAZEL, BAZEL_CC], ids=["genrule", "cc_binary"])
def test_bazel_over_grpc_with_a_token(
    start_node: Callable[..., NodeProcess], client: Client
) -> None:
    """Bazel's ``--remote_header`` goes as gRPC metadata: with access control on, the build
    gets its hit with a read-write token and no refusal is counted."""
    port = free_port()
    node = start_node(grpc_port=port, read_write_tokens=TOKEN, read_only_tokens="tok-other")
    run = run_client(client, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"), token=TOKEN)
    assert run.returncode == 0, run.describe()
    assert_hit_counted(node, run.describe(), run.hit, client.min_hits)
    assert node.metric_sum("kura_auth_refusals_total") == 0


def test_bazel_with_an_instance_name_of_two_segments(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``--remote_instance_name=org/team-1`` gets its hit (refused as "invalid instance name"
    before issue 28), in the namespace ``org~team-1``, which a DELETE over HTTP cleans."""
    port = free_port()
    node = start_node(grpc_port=port)
    run = run_client(
        BAZEL, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"), INSTANCE="org/team-1"
    )
    assert run.returncode == 0, run.describe()
    assert_hit_counted(node, run.describe(), run.hit, BAZEL.min_hits)
    assert node.index_rows() >= 3  # the output, the Action, the Command, the ActionResult
    # The same namespace over HTTP: its clean removes everything the build stored.
    assert oneshot.delete(f"{node.url}/ns/org~team-1/cache").status_code == 204
    assert node.index_rows() == 0


def test_bazel_4_with_a_read_only_token_still_builds(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A read-only token is told ``update_enabled: false`` (test_contract), except by a Bazel
    older than 6.0, which turns that answer into a fatal "not authorized to write local results"
    (bazelbuild/bazel#16624): Debian's Bazel 4.2.3 builds with it (exit 34 without the
    exception), its uploads are refused and nothing is stored."""
    port = free_port()
    node = start_node(grpc_port=port, read_write_tokens="tok-rw", read_only_tokens=TOKEN)
    run = run_client(BAZEL, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"), token=TOKEN)
    assert "run1 rc=0" in run.output, run.describe()
    assert "not authorized" not in run.output, run.describe()
    assert not run.hit, run.describe()  # nothing was written for the second build to hit
    assert node.metric('kura_grpc_requests_total{code="OK",method="GetCapabilities"}') >= 1
    assert node.index_rows() == 0


@pytest.mark.parametrize("over", ["grpc", "http"])
def test_bazel_with_a_write_cas_credential_builds_storing_blobs_and_no_action_result(
    start_node: Callable[..., NodeProcess], tmp_path: Path, over: str
) -> None:
    """A pull request's Bazel with ``rights=read,write:cas`` (issue 29): its CAS uploads are
    stored, its action results refused (403 / PERMISSION_DENIED, which Bazel reports as a
    warning), and the build succeeds; so the second build has no entry to hit. Bazel 4.2.3 is
    told ``update_enabled: true`` over gRPC (bazel#16624) and uploads; Bazel 6 and later is
    told false (test_contract) and uploads nothing."""
    credentials = tmp_path / "credentials"
    credentials.write_text(f"{TOKEN} name=pr rights=read,write:cas\n")
    port = free_port()
    node = start_node(grpc_port=port, read_write_tokens="tok-rw", tokens_file=credentials)
    if over == "grpc":
        run = run_client(
            BAZEL, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"), token=TOKEN
        )
        refused = 'kura_grpc_requests_total{code="PERMISSION_DENIED",method="UpdateActionResult"}'
        assert node.metric(refused) >= 1, run.describe()
    else:
        run = run_client(BY_NAME["bazel"], node, token=TOKEN)
        assert requests_with_status(node, "bazel", 403) >= 1, run.describe()
        assert requests_with_status(node, "bazel", 200) >= 1, run.describe()  # its cas/ PUTs
    assert "run1 rc=0" in run.output, run.describe()
    assert not run.hit, run.describe()  # no action result was stored for the second build
    assert node.index_rows() >= 1  # the blobs: outputs, Action, Command
    assert node.metric('kura_auth_refusals_total{reason="forbidden"}') >= 1


def test_bazel_fetches_an_http_archive_through_kura_once_the_origin_is_gone(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``--experimental_remote_downloader=grpc://…`` (the Remote Asset API, ``kura.grpc.asset``):
    run 1 fetches an ``http_archive`` through kura, which downloads it from an origin on
    loopback (allowed explicitly); the origin is then stopped and run 1 cleaned with ``bazel
    clean --expunge`` (the repository cache off), and run 2 still gets the archive from kura."""
    port, origin_port = free_port(), free_port()
    node = start_node(grpc_port=port, asset_fetch_allowed_hosts=f"127.0.0.1:{origin_port}")
    client = dataclasses.replace(
        BAZEL_ARCHIVE, env={**BAZEL_ARCHIVE.env, "ORIGIN_PORT": str(origin_port)}
    )
    run = run_client(client, dataclasses.replace(node, url=f"grpc://127.0.0.1:{port}"))
    assert run.returncode == 0, run.describe() + "\n--- node log ---\n" + node.log()[-3000:]
    assert "origin stopped" in run.output
    # One download from the origin (run 1); run 2's FetchBlob was answered from kura.
    assert node.metric('kura_asset_origin_downloads_total{result="stored"}') == 1
    assert node.metric('kura_grpc_requests_total{code="OK",method="FetchBlob"}') >= 2
