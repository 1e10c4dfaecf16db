"""Token files re-read on change, against a real ``kura serve`` (kura.api.token_file).

A rotation renamed over the file takes effect without a restart (the old token 401, the new one
200, same process; with workers, once any process refuses the old token every process takes the
new one); a file rewritten in place is seen too; a re-read that fails (the file
removed, a malformed line) keeps the last good set and logs; comments and blank lines are no
tokens; a read-only file's tokens read but do not write.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for

pytestmark = pytest.mark.in_process

ROTATION_TIMEOUT_SECONDS = 20.0  # the node stats once a second; generous when loaded
PATH = "/cache/plain/rotated"
PR_TOKEN = "pr-tok-0123456789"  # KURA_TOKENS_FILE: 16 characters at least


def write_atomically(path: Path, text: str) -> None:
    """Write beside ``path`` and rename over it, as an operator (or a Secret volume) would."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def status_with(node: NodeProcess, token: str, method: str = "GET") -> int:
    headers = {"Authorization": f"Bearer {token}"}
    body = b"v" if method == "PUT" else None
    return oneshot.request(
        method, node.url + PATH, headers=headers, content=body, timeout=10
    ).status_code


def logged(node: NodeProcess, failures: int) -> bool:
    """The node looks at its files once a second, requests or not."""
    return node.log().count("cannot re-read token file") >= failures


def test_a_rotated_token_file_takes_effect_without_a_restart(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    rw = tmp_path / "rw-tokens"
    rw.write_text("# CI tokens\n\nold-token\n   \n")
    node = start_node(read_write_tokens_file=rw, workers=2)  # every process follows the file
    pid = node.proc.pid
    assert status_with(node, "old-token", "PUT") == 201
    assert status_with(node, "# CI tokens") == 401  # a comment is not a token
    assert status_with(node, "new-token") == 401

    write_atomically(rw, "# rotated\nnew-token\n")
    assert wait_for(lambda: status_with(node, "old-token") == 401, ROTATION_TIMEOUT_SECONDS), (
        node.log()[-2000:]
    )
    assert status_with(node, "new-token") == 200
    assert status_with(node, "new-token", "PUT") in (200, 201)

    rw.write_text("new-token\nthird-token\n")  # in place this time (size changes)
    assert wait_for(lambda: status_with(node, "third-token") == 200, ROTATION_TIMEOUT_SECONDS)
    assert node.proc.pid == pid
    assert node.proc.poll() is None
    assert "token file" in node.log()
    # The primary's count (kura.workers.metrics_merge): a worker that had not yet caught up
    # with the rename reads the rewritten file at once, up to a second before the primary does.
    assert wait_for(
        lambda: node.metric("kura_auth_token_file_reloads_total") == 2, ROTATION_TIMEOUT_SECONDS
    )


def test_a_failed_re_read_keeps_the_last_good_tokens_and_logs(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    rw, ro = tmp_path / "rw", tmp_path / "ro"
    rw.write_text("good-rw\n")
    ro.write_text("good-ro\n")
    node = start_node(read_write_tokens_file=rw, read_only_tokens_file=ro)
    assert status_with(node, "good-rw", "PUT") == 201
    assert status_with(node, "good-ro") == 200
    assert status_with(node, "good-ro", "PUT") == 403  # read-only file: reads, no writes

    rw.write_text("has a space\nother\n")  # malformed: the whole re-read is refused
    assert wait_for(lambda: logged(node, 1), ROTATION_TIMEOUT_SECONDS)
    assert status_with(node, "good-rw") == 200
    assert status_with(node, "other") == 401

    rw.unlink()  # gone: still the last good set
    assert wait_for(lambda: logged(node, 2), ROTATION_TIMEOUT_SECONDS)
    assert status_with(node, "good-rw", "PUT") in (200, 201)

    write_atomically(rw, "fixed-rw\n")  # a good file again is taken
    assert wait_for(lambda: status_with(node, "fixed-rw") == 200, ROTATION_TIMEOUT_SECONDS)
    assert status_with(node, "good-rw") == 401
    assert status_with(node, "good-ro") == 200


def test_a_missing_token_file_refuses_to_start(tmp_path: Path) -> None:
    from tests.conftest import node_env, spawn_node

    env = node_env(tmp_path, read_write_tokens_file=tmp_path / "absent")
    with pytest.raises(RuntimeError, match=r"token file \S+ does not exist"):
        spawn_node(tmp_path, env)


def test_a_malformed_token_file_refuses_to_start_naming_the_setting(tmp_path: Path) -> None:
    from tests.conftest import node_env, spawn_node

    path = tmp_path / "ro"
    path.write_text("ok\ntwo words\n")
    env = node_env(tmp_path, read_only_tokens_file=path)
    with pytest.raises(RuntimeError, match=r"KURA_READ_ONLY_TOKENS_FILE .*line 2"):
        spawn_node(tmp_path, env)


def test_a_rewritten_credentials_file_changes_a_tokens_rights_without_a_restart(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """KURA_TOKENS_FILE (issue 29): each token with the rights its line names, re-read like the
    token files: widened, then a line the parser refuses (the last good rights stay), then
    narrowed again."""
    credentials = tmp_path / "credentials"
    credentials.write_text(f"# a pull request's job\n{PR_TOKEN} name=pr-123 rights=read\n")
    node = start_node(tokens_file=credentials)
    assert f"auth on: credentials file {credentials};" in node.log()  # the start-up line
    assert status_with(node, PR_TOKEN, "PUT") == 403
    assert status_with(node, PR_TOKEN) == 404  # it reads: a miss, not a refusal

    write_atomically(credentials, f"{PR_TOKEN} name=pr-123 rights=read,write\n")
    assert wait_for(
        lambda: status_with(node, PR_TOKEN, "PUT") in (200, 201), ROTATION_TIMEOUT_SECONDS
    ), node.log()[-2000:]
    assert node.metric("kura_auth_token_file_failing") == 0

    # an overlay that writes a namespace it does not read, written whole: refused by the
    # parser, not as a torn read
    write_atomically(credentials, f"{PR_TOKEN} rights=read,write read=main write=pr-123\n")
    assert wait_for(lambda: logged(node, 1), ROTATION_TIMEOUT_SECONDS)
    assert "line 1: keys 'read' and 'write': the write namespace must be one of" in node.log()
    assert PR_TOKEN not in node.log()  # a refused line is named by its number, never its token
    assert status_with(node, PR_TOKEN, "PUT") in (200, 201)
    assert node.metric("kura_auth_token_file_failing") == 1
    ready = oneshot.request("GET", node.url + "/ready", timeout=10).json()
    assert f"token file {credentials}: the last re-read failed" in " ".join(ready["warnings"])

    write_atomically(credentials, f"{PR_TOKEN} rights=read\n")
    assert wait_for(lambda: status_with(node, PR_TOKEN, "PUT") == 403, ROTATION_TIMEOUT_SECONDS)
    assert status_with(node, PR_TOKEN) == 200
    assert node.metric("kura_auth_token_file_failing") == 0


def test_a_malformed_credentials_file_refuses_to_start_naming_the_line_and_key(
    tmp_path: Path,
) -> None:
    from tests.conftest import node_env, spawn_node

    path = tmp_path / "credentials"
    path.write_text(f"{PR_TOKEN} rights=read,write\nsecret-token-0123 rights=read owner=me\n")
    env = node_env(tmp_path, tokens_file=path)
    with pytest.raises(RuntimeError, match=r"KURA_TOKENS_FILE .*line 2: unknown key 'owner'") as e:
        spawn_node(tmp_path, env)
    assert "secret-token" not in str(e.value)


def test_a_token_in_two_sources_refuses_to_start_naming_where_never_the_token(
    tmp_path: Path,
) -> None:
    """A pull request's token narrowed in KURA_TOKENS_FILE but left in KURA_READ_WRITE_TOKENS
    would keep write and clean (the union): the node does not start."""
    from tests.conftest import node_env, spawn_node

    path = tmp_path / "credentials"
    path.write_text(f"# PRs\n{PR_TOKEN} name=pr rights=read,write:cas\n")
    env = node_env(tmp_path, tokens_file=path, read_write_tokens=PR_TOKEN)
    with pytest.raises(
        RuntimeError, match=r"line 2: this token is also listed in KURA_READ_W"
    ) as e:
        spawn_node(tmp_path, env)
    assert PR_TOKEN not in str(e.value)
