"""README.md's own client set-up, copied as written, drives each real build tool to a remote hit.

Every client snippet in README.md is a fenced code block preceded by a marker
``<!-- client: NAME FILE -->``; NAME is a driver in ``tests/clients/`` and FILE the file the block
becomes (``env`` is sourced by the script, ``settings.gradle``, ``gradle.properties``,
``bazelrc`` and ``metro.config.js`` are the tool's own files). The only substitutions are the
README's placeholders: the example URL ``http://127.0.0.1:4000`` becomes the test node's URL and
``<token>`` its read-write token. Each driver then runs with ``CLIENT_CONFIG`` pointing at those
files instead of building its own configuration (``tests/clients/README.md``), and the hit is
checked exactly as in ``test_clients`` (the script's ``REMOTE HIT``, hits counted under the
client's protocol, rows in the node's index). A missing tool fails the test.

The ``<!-- routes -->`` block of curl lines for Kura's own routes runs too, with ``curl -f``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, NodeProcess
from tests.integration.test_clients import BY_NAME, assert_remote_hit, run_client

pytestmark = [pytest.mark.clients, pytest.mark.in_process]

README = ROOT / "README.md"
EXAMPLE_URL = "http://127.0.0.1:4000"
TOKEN_PLACEHOLDER = "<token>"
TOKEN = "readme-tok"
BLOCK = re.compile(r"<!-- (?P<marker>[^>]*?) -->\n```[\w-]*\n(?P<body>.*?)^```$", re.M | re.S)
# What each driver reads from CLIENT_CONFIG (tests/clients/*.sh).
EXPECTED_FILES = {
    "nx": {"env"},
    "turbo": {"env"},
    "ccache": {"env"},
    "gradle": {"settings.gradle", "gradle.properties"},
    "bazel": {"bazelrc"},
    "metro": {"metro.config.js"},
    "sccache": {"env"},
}


def readme_blocks(text: str) -> dict[str, str]:
    """Marker (``client: nx env``, ``routes``) → the fenced block after it, verbatim."""
    blocks: dict[str, str] = {}
    for m in BLOCK.finditer(text):
        assert m["marker"] not in blocks, f"README.md marks two blocks {m['marker']!r}"
        blocks[m["marker"]] = m["body"]
    return blocks


def substitute(block: str, url: str, token: str) -> str:
    """The README's placeholders, and nothing else, replaced."""
    return block.replace(EXAMPLE_URL, url).replace(TOKEN_PLACEHOLDER, token)


def client_config(name: str, directory: Path, url: str, token: str) -> Path:
    """Write client ``name``'s README blocks into ``directory`` as the files its driver reads."""
    files = {
        marker.split()[2]: body
        for marker, body in readme_blocks(README.read_text()).items()
        if marker.startswith(f"client: {name} ")
    }
    assert set(files) == EXPECTED_FILES[name], f"README.md blocks for {name}: {sorted(files)}"
    assert EXAMPLE_URL in "".join(files.values()), f"{name}: no {EXAMPLE_URL} to point at the node"
    directory.mkdir()
    for filename, body in files.items():
        (directory / filename).write_text(substitute(body, url, token))
    return directory


def test_readme_marks_a_block_for_every_client() -> None:
    clients = {m.split()[1] for m in readme_blocks(README.read_text()) if m.startswith("client: ")}
    assert clients == set(EXPECTED_FILES)
    # Every block that needs a token says where it goes: the test node requires one.
    for name in EXPECTED_FILES:
        text = "".join(
            body
            for marker, body in readme_blocks(README.read_text()).items()
            if marker.startswith(f"client: {name} ")
        )
        assert TOKEN_PLACEHOLDER in text, f"{name}: no {TOKEN_PLACEHOLDER} in its README block"
    # ccache's line is copied from a code block, not a table cell with an escaped pipe.
    assert "\\|" not in README.read_text()


@pytest.fixture
def token_node(start_node: Callable[..., NodeProcess]) -> NodeProcess:
    return start_node(read_write_tokens=TOKEN)


# Gradle and Bazel runs take 35-75 s each on a loaded 2-core machine (JVM and Bazel server starts).
SLOW = {"gradle", "bazel"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(EXPECTED_FILES)],
)
def test_readme_configuration_gets_a_remote_hit(
    name: str, token_node: NodeProcess, tmp_path: Path
) -> None:
    config = client_config(name, tmp_path / "readme-config", token_node.url, TOKEN)
    client = BY_NAME[name]
    run = run_client(client, token_node, CLIENT_CONFIG=str(config))
    assert_remote_hit(client, token_node, run)


def test_readme_routes_work_as_written(token_node: NodeProcess, tmp_path: Path) -> None:
    block = readme_blocks(README.read_text())["routes"]
    assert EXAMPLE_URL in block, block
    assert TOKEN_PLACEHOLDER in block, block
    script = substitute(block, token_node.url, TOKEN)
    proc = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{token_node.log()[-2000:]}"
    assert "an Xcode object" in proc.stdout, proc.stdout
    assert "a Gradle entry" in proc.stdout, proc.stdout
    # A PUT to a CAS path is the mistake the README's method table warns about.
    put = subprocess.run(
        ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "--data", "x",
         "-H", f"Authorization: Bearer {TOKEN}",
         f"{token_node.url}/api/cache/cas/0123abcd?tenant_id=acme"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert put.stdout == "405", put.stdout
