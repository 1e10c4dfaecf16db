"""Manifest.from_text / from_json refuse every shape that is not a manifest with ValueError,
never another exception (a peer's header, a page entry and a bucket object's header all go
through them)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.manifest import Manifest


@pytest.mark.parametrize(
    "text",
    [
        "null",
        "[]",
        '"s"',
        "1",
        "true",
        "{}",
        '{"artifact_id": []}',
        "not json",
        "[" * 100_000,
        b"\xff\xfe",
        '{"headers": []}',
    ],
)
def test_anything_but_a_manifest_is_a_value_error(text: str | bytes) -> None:
    with pytest.raises(ValueError, match=r"invalid manifest|headers must be an object"):
        Manifest.from_text(text)


@pytest.mark.parametrize("data", [None, [], "s", 1, 2.5])
def test_from_json_refuses_a_top_level_that_is_not_an_object(data: object) -> None:
    with pytest.raises(ValueError, match="not an object"):
        Manifest.from_json(data)


@settings(max_examples=50)
@given(
    text=st.text(max_size=20),
    number=st.integers(0, 2**53),
    inline=st.booleans(),
    headers=st.dictionaries(st.sampled_from(["etag", "x-a", "content-encoding"]), st.text("ab ")),
)
def test_to_json_is_what_asdict_gives_and_round_trips(
    text: str, number: int, inline: bool, headers: dict[str, str]
) -> None:
    m = Manifest(text, text, text, text, text, number, text, number, number, inline, headers)
    got = m.to_json()
    assert got == dataclasses.asdict(m)
    assert got["headers"] is not m.headers  # a copy, as asdict's
    assert Manifest.from_json(json.loads(json.dumps(got))) == m
