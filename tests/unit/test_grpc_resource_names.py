"""ByteStream resource names: every accepted shape, and the malformed ones refused."""

from __future__ import annotations

import pytest

from kura.core.errors import InvalidRequest
from kura.grpc.resource_names import BlobName, parse_read, parse_write

H = "ab" * 32
U = "9f3c2a1e-0000-4000-8000-000000000001"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"blobs/{H}/12", BlobName("", H, 12)),
        (f"main/blobs/{H}/0", BlobName("main", H, 0)),
        (f"org/team-1/blobs/{H}/0", BlobName("org~team-1", H, 0)),
        (f"a/b.c/d/compressed-blobs/zstd/{H}/5", BlobName("a~b.c~d", H, 5, compressor="zstd")),
        (f"compressed-blobs/identity/{H}/5", BlobName("", H, 5)),
        (f"compressed-blobs/zstd/{H}/5", BlobName("", H, 5, compressor="zstd")),
    ],
)
def test_read_names(name: str, expected: BlobName) -> None:
    assert parse_read(name) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"uploads/{U}/blobs/{H}/12", BlobName("", H, 12, U)),
        (f"team-a/uploads/{U}/blobs/{H}/12", BlobName("team-a", H, 12, U)),
        (f"org/team-1/uploads/{U}/blobs/{H}/12", BlobName("org~team-1", H, 12, U)),
        (f"uploads/{U}/blobs/{H}/12/some/metadata", BlobName("", H, 12, U)),
        (f"uploads/{U}/compressed-blobs/identity/{H}/3", BlobName("", H, 3, U)),
        (f"uploads/{U}/compressed-blobs/zstd/{H}/3", BlobName("", H, 3, U, "zstd")),
        (f"blobs/{H}/7", BlobName("", H, 7, "")),
        (f"main/blobs/{H}/7", BlobName("main", H, 7, "")),
    ],
)
def test_write_names(name: str, expected: BlobName) -> None:
    assert parse_write(name) == expected


@pytest.mark.parametrize(
    "name",
    [
        "",
        f"blobs/{H}",
        f"blobs/{H.upper()}/1",
        f"blobs/{H}/-1",
        f"blobs/{H}/1e3",
        f"blobs/{H}/99999999999999999999",
        f"a/actions/blobs/{H}/1",
        f"a~b/blobs/{H}/1",
        f"a//blobs/{H}/1",
        f"/a/blobs/{H}/1",
        f".hidden/blobs/{H}/1",
        f"compressed-blobs/deflate/{H}/1",
        f"compressed-blobs/ZSTD/{H}/1",
        f"compressed-blobs/{H}/1",
        f"blobs/{H}/1/extra",
        "x" * 2000,
    ],
)
def test_bad_read_names(name: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_read(name)


@pytest.mark.parametrize(
    "name",
    [f"uploads//blobs/{H}/1", f"uploads/{U}", f"uploads/{U}/blobz/{H}/1", f"uploads/{U}/{H}/1"],
)
def test_bad_write_names(name: str) -> None:
    with pytest.raises(InvalidRequest):
        parse_write(name)
