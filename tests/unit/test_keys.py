"""Key validation and artifact identity (kura.core.keys).

The property that matters: whatever a client sends, a key that passes validation can never name
a path outside the store, so even a layout that used keys as file names would stay inside its
root (field report B08). Identity follows Kura's rule (kura-behaviour.md §1.2).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.errors import InvalidRequest
from kura.core.keys import (
    ALNUM_HASH,
    HEX_SHA256,
    MAX_KEY_CHARS,
    NAMESPACE,
    PATH_KEY,
    SAFE_NAME,
    Alphabet,
    artifact_id,
    validate,
)

ROOT = Path("/srv/kura-store/root")

# Characters that make traversal interesting, plus a few ordinary ones and some hostile ones.
HOSTILE = st.text(alphabet="ab.-_~/\\%\x00\n :", max_size=40)
# Keys built from segments that are often "." or "..": validation must catch every one.
SEGMENTS = st.lists(st.sampled_from([".", "..", "...", "a", ".a", "a.", "~", "-", ""]), max_size=9)


def _accepts(value: str, alphabet: Alphabet) -> bool:
    try:
        validate(value, alphabet, "key")
    except InvalidRequest:
        return False
    return True


def _assert_contained(key: str) -> None:
    assert not key.startswith("/")
    assert all(seg not in (".", "..", "") for seg in key.split("/")), key
    assert "\x00" not in key
    assert "\\" not in key
    resolved = Path(ROOT, key).resolve()
    assert resolved.is_relative_to(ROOT.resolve()), (key, resolved)
    assert resolved != ROOT.resolve()


@pytest.mark.parametrize("alphabet", [PATH_KEY, SAFE_NAME], ids=lambda a: a.name)
@given(data=st.data())
@settings(max_examples=300)
def test_any_accepted_key_stays_inside_the_store_root(
    alphabet: Alphabet, data: st.DataObject
) -> None:
    key = data.draw(
        st.one_of(
            HOSTILE,
            SEGMENTS.map("/".join),
            st.from_regex(alphabet.pattern, fullmatch=True),
        )
    )
    if _accepts(key, alphabet):
        _assert_contained(key)


@given(st.from_regex(PATH_KEY.pattern, fullmatch=True))
def test_every_key_the_path_syntax_generates_is_accepted_and_contained(key: str) -> None:
    if len(key) <= MAX_KEY_CHARS:
        assert validate(key, PATH_KEY, "key") == key
        _assert_contained(key)


@given(st.from_regex(SAFE_NAME.pattern, fullmatch=True))
def test_a_safe_name_is_exactly_one_path_segment(key: str) -> None:
    assert validate(key, SAFE_NAME, "name") == key
    assert PurePosixPath(key).name == key
    _assert_contained(key)


BAD_PATH_KEYS = [
    "",
    ".",
    "..",
    "/abs",
    "a/",
    "/",
    "a//b",
    "a/./b",
    "a/../b",
    "../escape",
    "a/..",
    "a\\b",
    "a\x00b",
    "a b",
    "a\nb",
    "a%2e%2e",
    "é",
    "a/" * 8 + "toodeep",
    "x" * 256,
    "a/" + "x" * (MAX_KEY_CHARS + 1),
]


@pytest.mark.parametrize("key", BAD_PATH_KEYS)
def test_known_bad_path_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidRequest, match="invalid cache key"):
        validate(key, PATH_KEY, "cache key")


@pytest.mark.parametrize("key", ["", ".", "..", "a/b", "a\x00", " a", "x" * 256])
def test_known_bad_safe_names_are_rejected(key: str) -> None:
    with pytest.raises(InvalidRequest):
        validate(key, SAFE_NAME, "name")


@pytest.mark.parametrize(
    ("key", "alphabet"),
    [
        ("A" * 64, HEX_SHA256),
        ("a" * 63, HEX_SHA256),
        ("g" * 64, HEX_SHA256),
        ("a" * 129, ALNUM_HASH),
        ("a.b", ALNUM_HASH),
        (".hidden", NAMESPACE),
        ("a/b", NAMESPACE),
        ("x" * 129, NAMESPACE),
    ],
)
def test_other_alphabets_reject_what_they_do_not_describe(key: str, alphabet: Alphabet) -> None:
    with pytest.raises(InvalidRequest) as raised:
        validate(key, alphabet, "field")
    assert alphabet.description in raised.value.message


def test_rejection_message_names_the_field_and_truncates_long_values() -> None:
    with pytest.raises(InvalidRequest) as raised:
        validate("../" + "x" * 500, PATH_KEY, "WebDAV path")
    message = raised.value.message
    assert message.startswith("invalid WebDAV path '../")
    assert "..." in message
    assert len(message) < 300


@pytest.mark.parametrize(
    ("value", "alphabet"),
    [("a/b.c/d~e-f_g", PATH_KEY), ("...", PATH_KEY), ("a" * 64, HEX_SHA256), ("", NAMESPACE)],
)
def test_good_keys_are_returned_unchanged(value: str, alphabet: Alphabet) -> None:
    assert validate(value, alphabet, "key") == value


def test_artifact_id_follows_kuras_rule() -> None:
    import hashlib

    expected = hashlib.sha256(b"xcode\x00default\x00ns\x00blob/abc").hexdigest()
    assert artifact_id("xcode", "default", "ns", "blob/abc") == expected


NAMES = st.text(alphabet="abc.-_~/", max_size=6)


@given(NAMES, NAMES, NAMES, NAMES)
def test_artifact_id_is_stable_64_hex(producer: str, tenant: str, namespace: str, key: str) -> None:
    first = artifact_id(producer, tenant, namespace, key)
    assert first == artifact_id(producer, tenant, namespace, key)
    assert HEX_SHA256.pattern.fullmatch(first)


@given(
    st.tuples(NAMES, NAMES, NAMES, NAMES),
    st.tuples(NAMES, NAMES, NAMES, NAMES),
)
def test_artifact_id_differs_when_producer_tenant_namespace_or_key_differs(
    a: tuple[str, str, str, str], b: tuple[str, str, str, str]
) -> None:
    # Fields cannot contain NUL (validation), so the 0x00 separators make the encoding
    # injective: moving characters between fields must give another identity.
    if a != b:
        assert artifact_id(*a) != artifact_id(*b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("nx", "t", "ns", "k"), ("metro", "t", "ns", "k")),
        (("nx", "t", "ns", "k"), ("nx", "u", "ns", "k")),
        (("nx", "t", "ns", "k"), ("nx", "t", "other", "k")),
        (("nx", "t", "ns", "k"), ("nx", "t", "ns", "k2")),
        (("nx", "t", "ab", "c"), ("nx", "t", "a", "bc")),
    ],
)
def test_artifact_id_separates_each_field(
    a: tuple[str, str, str, str], b: tuple[str, str, str, str]
) -> None:
    assert artifact_id(*a) != artifact_id(*b)
