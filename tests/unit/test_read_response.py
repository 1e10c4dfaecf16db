"""``ByteStream.Read`` sends each ``ReadResponse`` encoded by hand (``read_response``), with one
copy of its bytes instead of three: the encoding must be exactly protobuf's."""

from __future__ import annotations

import pytest

from kura.grpc.bytestream import read_response
from kura.protos.google.bytestream import bytestream_pb2 as bs


@pytest.mark.parametrize("size", [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 20, (1 << 21) + 5])
def test_read_response_is_protobufs_encoding(size: int) -> None:
    data = (bytes(range(256)) * (size // 256 + 1))[:size]
    encoded = read_response(data)
    assert encoded == bs.ReadResponse(data=data).SerializeToString()
    assert bs.ReadResponse.FromString(encoded).data == data
