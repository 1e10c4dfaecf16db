"""The hooks (``kured.actuators.hooks``): a hook command never outlives the agent, and a failed
hook's message is bounded."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from kit import command
from kit.wait import wait_until_async
from kured.actuators.hooks import OUTPUT_SHOWN_CHARS, Hook, HookError

DOC = {"node": "n1", "event": "pre-drain", "time": "t", "lock_holder": "n1", "kured": "kura"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0): it is gone for our purpose once reaped or defunct
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _hook(command: list[str], timeout: float = 60.0) -> Hook:
    session: Any = None  # a command-only hook never uses the HTTP session
    return Hook(session, "pre-drain", "", command, timeout)


async def test_a_cancelled_agent_kills_the_hook_and_its_children(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 60 & echo $$ $! > {pids}; wait"
    task = asyncio.create_task(_hook(["sh", "-c", script]).run(DOC))
    assert await wait_until_async(
        lambda: pids.exists() and len(pids.read_text().split()) == 2, 10.0
    )
    shell, sleeper = (int(x) for x in pids.read_text().split())
    assert _alive(shell)
    assert _alive(sleeper)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not _alive(shell)
    assert await wait_until_async(lambda: not _alive(sleeper), 5.0)  # killed with its group


async def test_a_hook_command_sees_the_document_and_a_minimal_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KURED_SECRET_TOKEN", "hunter2")
    out = tmp_path / "out"
    code = (
        "import os, sys; open(sys.argv[1], 'w').write(sys.stdin.read() + '\\n' + "
        "repr(sorted(k for k in os.environ if k.startswith('KURED'))))"
    )
    await _hook([sys.executable, "-c", code, str(out)]).run(DOC)
    doc, env = out.read_text().splitlines()
    assert '"node": "n1"' in doc
    assert env == repr(["KURED_HOOK_EVENT", "KURED_NODE"])


async def test_a_failed_hook_shows_only_the_end_of_its_output() -> None:
    code = "import sys; sys.stdout.write('x' * 100000 + 'END'); sys.exit(3)"
    with pytest.raises(HookError) as err:
        await _hook([sys.executable, "-c", code]).run(DOC)
    assert "exited 3" in err.value.message
    assert err.value.message.endswith("END")
    assert len(err.value.message) < OUTPUT_SHOWN_CHARS + 100


async def test_a_hook_command_that_cannot_start_or_overruns_is_a_hook_error() -> None:
    with pytest.raises(HookError, match="could not start"):
        await _hook(["/nonexistent/hook"]).run(DOC)
    with pytest.raises(HookError, match=r"did not finish within 0\.2s"):
        await _hook(["sleep", "30"], timeout=0.2).run(DOC)


async def _refusing_server(endless: bool, done: asyncio.Event) -> tuple[web.AppRunner, str]:
    """Answers 500: a forged log line, then 10 MB (``endless``: then nothing until ``done``)."""

    async def post(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(status=500)
        await response.prepare(request)
        await response.write(b"no\nFAKE LOG LINE\x1b[2J" + b"x" * (10 << 20))
        if endless:
            await done.wait()
        return response

    app = web.Application()
    app.router.add_post("/hook", post)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"


@pytest.mark.parametrize("endless", [False, True])
async def test_a_refusing_hook_url_is_read_bounded_and_shown_escaped(endless: bool) -> None:
    done = asyncio.Event()
    runner, url = await _refusing_server(endless, done)
    try:
        async with aiohttp.ClientSession() as session:
            hook = Hook(session, "pre-drain", url, (), 30.0)
            started = time.monotonic()
            with pytest.raises(HookError) as err:
                await hook.run(DOC)
            assert time.monotonic() - started < 10  # not the 30 s timeout: the read stopped
    finally:
        done.set()
        await runner.cleanup()
    message = err.value.message
    assert "answered 500: no\\nFAKE LOG LINE\\x1b[2J" in message, message
    assert "\n" not in message
    assert "\x1b" not in message
    assert len(message) < OUTPUT_SHOWN_CHARS + 100


async def test_a_failed_hook_commands_output_is_escaped() -> None:
    with pytest.raises(HookError) as err:
        await _hook(["sh", "-c", "printf 'no\\nFAKE LOG LINE'; exit 2"]).run(DOC)
    assert err.value.message.endswith("exited 2: no\\nFAKE LOG LINE"), err.value.message


async def test_a_hook_commands_output_is_not_kept_whole() -> None:
    """kit.command.run with tail_bytes keeps the end only, read as it comes."""
    code = "import sys; [sys.stdout.write('y' * 65536) for _ in range(800)]; print('END')"
    done = await command.run([sys.executable, "-c", code], 30, merge_stderr=True, tail_bytes=100)
    assert done.returncode == 0
    assert len(done.stdout) == 100
    assert done.stdout.endswith("END\n")
