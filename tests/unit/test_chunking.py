"""kura's FastCDC 2020 cutter (``kura.grpc.chunking``) against REAPI's definition: the test
vectors published beside remote_execution.proto (chunk offsets, sizes, SHA-256 and the gear
hash at each cut, for seeds 0 and 666), its gear table, and the windowed cut ``split`` uses
agreeing with one cut of the whole blob."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest
from pyfastcdc import FastCDC

from kura.grpc import chunking

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "proto/build/bazel/remote/execution/v2/fastcdc2020_test_vectors.txt"
IMAGE = Path(__file__).resolve().parent / "fastcdc2020" / "SekienAkashita.jpg"


def vectors() -> dict[int, list[tuple[int, int, str, int]]]:
    """The vectors file's chunks by seed: (offset, length, sha256, gear hash)."""
    by_seed: dict[int, list[tuple[int, int, str, int]]] = {}
    seed = None
    for line in VECTORS.read_text().splitlines():
        if line.startswith("# Seed:"):
            seed = int(line.split(":")[1])
            by_seed[seed] = []
        elif line and not line.startswith("#"):
            assert seed is not None
            offset, length, sha256, fingerprint = line.split("\t")
            by_seed[seed].append((int(offset), int(length), sha256, int(fingerprint)))
    return by_seed


def test_the_vectors_file_is_the_one_the_spec_describes() -> None:
    text = VECTORS.read_text()
    assert "MinSize: 4096" in text
    assert "AvgSize: 16384" in text
    assert "MaxSize: 65535" in text
    assert "Normalization: 2" in text
    data = IMAGE.read_bytes()
    assert hashlib.sha256(data).hexdigest() in text
    assert sorted(vectors()) == [0, 666]


@pytest.mark.parametrize("seed", [0, 666])
def test_the_library_reproduces_the_spec_vectors(seed: int) -> None:
    data = IMAGE.read_bytes()
    # The vectors' parameters; normalization level 2 as kura cuts (the spec's MUST).
    cdc = FastCDC(
        16384, min_size=4096, max_size=65535, normalized_chunking=chunking.NORMALIZATION, seed=seed
    )
    got = [
        (c.offset, c.length, hashlib.sha256(c.data).hexdigest(), c.gear_hash)
        for c in cdc.cut_buf(data)
    ]
    assert got == vectors()[seed]


def test_kura_parameters_are_the_spec_derivation() -> None:
    """remote_execution.proto, FastCdc2020Params: average 1 KiB..1 MiB (512 KiB recommended),
    min = avg / 4, max = avg * 4, seed 0 recommended. Upstream Kura: 512/128/2048 KiB."""
    assert chunking.AVG_CHUNK_BYTES == 512 * 1024
    assert (chunking.MIN_CHUNK_BYTES, chunking.MAX_CHUNK_BYTES) == (128 * 1024, 2 * 1024 * 1024)
    assert chunking.SEED == 0
    cutter = chunking.new_cutter()
    assert (cutter.min_size, cutter.avg_size, cutter.max_size) == (
        chunking.MIN_CHUNK_BYTES,
        chunking.AVG_CHUNK_BYTES,
        chunking.MAX_CHUNK_BYTES,
    )


def test_the_gear_table_is_the_spec_md5_table() -> None:
    """GEAR[i] is the first 64 bits (big-endian) of the MD5 of 64 bytes of value i: the spec's
    "high_64_bits(MD5(byte(i)))" as fastcdc-rs builds it. Over a run of one byte value the
    gear hash at the cut is that entry rolled (h = 2h + GEAR[b]) from the minimum size on."""
    gear = [int.from_bytes(hashlib.md5(bytes([i]) * 64).digest()[:8], "big") for i in range(256)]
    mask = (1 << 64) - 1
    cdc = FastCDC(256, min_size=64, max_size=1024, normalized_chunking=2)
    for value in (0, 1, 0x7F, 0xFF):
        chunk = next(iter(cdc.cut_buf(bytes([value]) * 1024)))
        h = 0
        for _ in range(64, chunk.length):
            h = ((h << 1) + gear[value]) & mask
        assert chunk.gear_hash == h, value


def test_the_windowed_cut_is_the_whole_blob_cut() -> None:
    """``split`` cuts ``WINDOW_BYTES`` at a time, keeping undecided bytes for the next window;
    the chunks are the same as one cut of the whole blob, for random and repetitive data."""
    rng = random.Random(28)
    block = rng.randbytes(3 * 1024 * 1024)
    data = rng.randbytes(9 * 1024 * 1024) + block + bytes(5 * 1024 * 1024) + block
    whole = [(c.offset, c.length) for c in chunking.new_cutter().cut_buf(data)]
    got: list[tuple[int, int]] = []
    base, pos, window = 0, 0, b""
    step = chunking.WINDOW_BYTES
    while True:
        window += data[pos : pos + step]
        pos += step
        final = pos >= len(data)
        decided = chunking.cut(window, final)
        got += [(base + offset, size) for offset, size, _ in decided]
        consumed = sum(size for _, size, _ in decided)
        base, window = base + consumed, window[consumed:]
        if final:
            break
    assert got == whole
    assert base == len(data)
    assert len(whole) > 20
