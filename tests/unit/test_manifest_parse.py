"""Manifest.from_text / from_json refuse every shape that is not a manifest with ValueError,
never another exception (a peer's header, a page entry and a bucket object's header all go
through them)."""

from __future__ import annotations

import pytest

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
