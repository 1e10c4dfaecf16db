"""``storage.body_count``: a body staged in the tmp dir (``blobs.stage_body``) and one read into
memory (``small_body.buffer_small`` + ``check_digest``) are refused by the same checks, with the
same error and message, for every way a body can be wrong; the staged one leaves no file and no
reserved bytes. Real ``TmpBudget`` over a real tmp dir."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kura.core.errors import (
    DigestMismatch,
    IncompleteBody,
    InvalidRequest,
    KuraError,
    PayloadTooLarge,
)
from kura.storage.blobs import stage_body
from kura.storage.body_count import BodyCount, check_sha256
from kura.storage.budget import TmpBudget
from kura.storage.small_body import buffer_small, check_digest

BODY = b"0123456789"
# (chunks, limit_bytes, declared_length, expected_sha256, error, message)
BAD = [
    ((BODY, b"x"), 10, None, None, PayloadTooLarge, "limit of 10 bytes"),
    ((BODY[:6], BODY[6:]), 20, 8, None, InvalidRequest, "longer than its declared"),
    ((BODY[:4],), 20, 10, None, IncompleteBody, "ended after 4 of 10"),
    ((BODY,), 20, 10, hashlib.sha256(b"other").hexdigest(), DigestMismatch, "not the digest"),
]


async def _body(chunks: tuple[bytes, ...]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _staged_error(
    tmp_path: Path, chunks: tuple[bytes, ...], limit: int, declared: int | None, sha: str | None
) -> KuraError:
    budget = TmpBudget(1024, tmp_dir=tmp_path)
    path = tmp_path / "upload"
    with pytest.raises(KuraError) as raised, budget.try_reserve(declared or 1) as reservation:
        await stage_body(
            _body(chunks),
            path,
            reservation,
            limit_bytes=limit,
            declared_length=declared,
            expected_sha256=sha,
        )
    assert not path.exists()
    assert budget.reserved_bytes == 0
    return raised.value


async def _buffered_error(
    chunks: tuple[bytes, ...], limit: int, declared: int | None, sha: str | None
) -> KuraError:
    async def read() -> None:
        got = await buffer_small(_body(chunks), 1024, limit_bytes=limit, declared_length=declared)
        assert isinstance(got, bytes)  # never spills: the threshold is above every body here
        check_digest(got, sha)

    with pytest.raises(KuraError) as raised:
        await read()
    return raised.value


@pytest.mark.parametrize(("chunks", "limit", "declared", "sha", "error", "message"), BAD)
def test_staged_and_buffered_bodies_are_refused_alike(
    tmp_path: Path,
    chunks: tuple[bytes, ...],
    limit: int,
    declared: int | None,
    sha: str | None,
    error: type[KuraError],
    message: str,
) -> None:
    staged = asyncio.run(_staged_error(tmp_path, chunks, limit, declared, sha))
    buffered = asyncio.run(_buffered_error(chunks, limit, declared, sha))
    assert type(staged) is type(buffered) is error
    assert str(staged) == str(buffered)
    assert message in str(staged)


def test_a_body_within_its_limits_is_counted_to_its_size() -> None:
    count = BodyCount(limit_bytes=10, declared_length=10)
    assert [count.add(c) for c in (b"0123", b"", b"456789")] == [4, 4, 10]
    assert count.finish() == 10
    assert BodyCount(limit_bytes=10, declared_length=None).finish() == 0
    check_sha256(hashlib.sha256(BODY).hexdigest(), None)
    check_sha256(hashlib.sha256(BODY).hexdigest(), hashlib.sha256(BODY).hexdigest())


def test_the_limit_is_checked_before_the_declared_length() -> None:
    count = BodyCount(limit_bytes=5, declared_length=4)
    with pytest.raises(PayloadTooLarge) as raised:
        count.add(b"123456")
    assert raised.value.limit_bytes == 5
