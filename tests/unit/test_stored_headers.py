"""The one rule for header values stored with an artifact (``kura.core.manifest``)."""

from __future__ import annotations

import pytest

from kura.core.manifest import Manifest, stored_header_problem

MANIFEST = {
    "artifact_id": "a" * 64,
    "producer": "turbo",
    "namespace_id": "t",
    "key": "k",
    "content_type": "application/octet-stream",
    "size": 1,
    "sha256": "b" * 64,
    "version_ms": 1,
    "created_at_ms": 1,
}


@pytest.mark.parametrize(
    "value", ["", "sig=", "a b\tc", "x" * 1024, "!#$%&'*+-.^_`|~:;,/?@[]{}()<>\"\\"]
)
def test_visible_ascii_space_and_tab_may_be_stored(value: str) -> None:
    assert stored_header_problem("x-artifact-tag", value) is None


@pytest.mark.parametrize(
    "value", ["a\r\nb", "a\rb", "a\nb", "a\x00b", "a\x01b", "a\x7fb", "café", "x" * 1025]
)
def test_control_characters_non_ascii_and_long_values_are_refused(value: str) -> None:
    assert stored_header_problem("x-artifact-tag", value) is not None


@pytest.mark.parametrize("name", ["", "a b", "a:b", "a\r\nb", "x" * 65])
def test_a_name_must_be_an_http_token(name: str) -> None:
    assert stored_header_problem(name, "v") is not None


def test_a_peer_manifest_with_a_bad_stored_header_does_not_parse() -> None:
    assert Manifest.from_json(dict(MANIFEST, headers={"x-artifact-tag": "ok"})).headers == {
        "x-artifact-tag": "ok"
    }
    with pytest.raises(ValueError, match="control character"):
        Manifest.from_json(dict(MANIFEST, headers={"x-artifact-tag": "a\r\nSet-Cookie: x"}))
