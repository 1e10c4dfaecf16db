"""``finished_in_thread``: await a call running on another thread so that a cancelled caller
does not go on before the call ends.

Cancelling the future of ``run_in_executor`` or ``asyncio.to_thread`` stops a call that has not
started; one that has keeps running on its thread. A caller that then closes the file the call
reads (a cancelled request closes its blob) leaves that thread reading a closed descriptor, or,
once the number is reused, another file.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def finished_in_thread(work: Awaitable[T]) -> T:
    """``await work`` (a thread's call); when the caller is cancelled, ``CancelledError`` is
    raised only once the call has ended (its result or exception dropped). A second
    cancellation while waiting for it is not waited out."""
    future = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await future
        raise
