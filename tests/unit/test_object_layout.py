"""The object-storage tier's URL and layout rules (``core.object_layout``) and the object
header (``storage.object_store``): a namespace is one prefix, the empty one included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from kura.core.manifest import Manifest
from kura.core.object_layout import namespace_prefix, object_key, parse_url
from kura.storage.object_header import decode_header, encode_header


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://bucket/a/b/", ("bucket", "a/b")),
    ],
)
def test_urls_that_parse(url: str, parsed: tuple[str, str]) -> None:
    assert parse_url(url) == parsed


@pytest.mark.parametrize(
    "url", ["https://bucket/p", "s3:///p", "s3://b/a//c", "s3://b/../x", "s3://b/p?x=1", "b/p"]
)
def test_urls_that_do_not(url: str) -> None:
    with pytest.raises(ValueError, match="must"):
        parse_url(url)


def test_a_namespace_is_one_prefix_and_never_an_empty_segment() -> None:
    assert namespace_prefix("t", "") == "t/ns-/"
    assert object_key("t", "", "a" * 64) == "t/ns-/" + "a" * 64
    assert object_key("t", "web", "b" * 64).startswith(namespace_prefix("t", "web"))
    assert not object_key("t", "web2", "b").startswith(namespace_prefix("t", "web"))


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_object_header_round_trips_whatever_the_chunking(chunk: int) -> None:
    m = Manifest(
        "a" * 64, "nx", "ns", "key", "text/plain", 5, "f" * 64, 123, 100, False, {"X-A": "b"}
    )
    decoded, rest = asyncio.run(decode_header(_chunks(encode_header(m) + b"hello", chunk)))
    assert decoded == m
    assert b"hello".startswith(rest)


def test_an_object_without_a_header_is_refused() -> None:
    with pytest.raises(ValueError, match="no kura-object header"):
        asyncio.run(decode_header(_chunks(b"x" * 100, 10)))
