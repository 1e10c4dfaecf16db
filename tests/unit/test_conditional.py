"""kura.core.conditional.none_match: RFC 9110 §13.1.2 weak comparison of If-None-Match lists."""

from __future__ import annotations

import pytest

from kura.core.conditional import none_match

TAG = '"' + "ab" * 32 + '"'


@pytest.mark.parametrize(
    ("lines", "matches"),
    [
        ([], False),
        ([TAG], True),
        ([f"W/{TAG}"], True),
        (["*"], True),
        ([' "x" , ' + TAG], True),
        (['"x"', TAG], True),  # two field lines are one list (§5.3)
        ([f'"x",,{TAG}'], True),
        (['"x"'], False),
        ([TAG.strip('"')], False),  # unquoted: malformed
        ([f"garbage, {TAG}"], False),  # malformed list: served as if absent
        ([f"{TAG}, garbage"], False),
        (['"' + "ab" * 32], False),
        ([""], False),
    ],
)
def test_none_match(lines: list[str], matches: bool) -> None:
    assert none_match(lines, TAG) is matches
