"""``storage.small_body``: what is buffered, what spills, and the errors, on plain iterators."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator

import pytest

from kura.core.errors import DigestMismatch, IncompleteBody, InvalidRequest, PayloadTooLarge
from kura.storage.small_body import buffer_small, check_digest, fits_inline


async def _body(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _run(chunks: tuple[bytes, ...], **kwargs: object) -> bytes | AsyncIterator[bytes]:
    async def go() -> bytes | AsyncIterator[bytes]:
        return await buffer_small(_body(*chunks), 10, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_fits_inline() -> None:
    assert fits_inline(10, 10)
    assert not fits_inline(10, 11)
    assert fits_inline(10, None)  # chunked: buffered, may spill
    assert not fits_inline(0, 1)
    assert not fits_inline(0, None)


def test_a_body_within_the_threshold_is_returned_whole() -> None:
    assert _run((b"abc", b"defg"), limit_bytes=100, declared_length=7) == b"abcdefg"
    assert _run((b"abc", b"defghij"), limit_bytes=100, declared_length=None) == b"abcdefghij"
    assert _run((), limit_bytes=100, declared_length=0) == b""


def test_a_chunked_body_past_the_threshold_spills_with_every_byte_in_order() -> None:
    chunks = (b"12345", b"67890", b"x", b"yz")

    async def go() -> bytes:
        got = await buffer_small(_body(*chunks), 10, limit_bytes=100, declared_length=None)
        assert not isinstance(got, bytes)
        return b"".join([c async for c in got])

    assert asyncio.run(go()) == b"".join(chunks)


def test_errors() -> None:
    with pytest.raises(PayloadTooLarge):
        _run((b"123456",), limit_bytes=5, declared_length=None)
    with pytest.raises(InvalidRequest, match="longer than its declared"):
        _run((b"1234", b"56"), limit_bytes=100, declared_length=4)
    with pytest.raises(IncompleteBody):
        _run((b"123",), limit_bytes=100, declared_length=4)
    data = b"body"
    assert check_digest(data, None) == hashlib.sha256(data).hexdigest()
    assert check_digest(data, hashlib.sha256(data).hexdigest()) == hashlib.sha256(data).hexdigest()
    with pytest.raises(DigestMismatch):
        check_digest(data, hashlib.sha256(b"other").hexdigest())
