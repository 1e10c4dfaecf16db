"""The families a node exports stay as dashboards and alert rules know them.

``kura_metric_families.txt`` holds, sorted, every ``# HELP`` and ``# TYPE`` line of a real
``kura serve``'s ``/metrics`` (two processes, then with the object-storage tier, bucket expiry
and the gRPC port) and the label names of each series present there. It was recorded before
the metrics moved out of ``kura.app`` into their components' collectors (issue 27 item 5);
a change to a name, type, help text or label set shows here as a diff to review (dashboards and
alert rules in deploy/ depend on them), and the file is updated with it once the change is meant.
"""

from __future__ import annotations

import re
from pathlib import Path

RECORDED = Path(__file__).with_name("kura_metric_families.txt")
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="')


def family_lines(exposition: str) -> set[str]:
    """The ``# HELP``/``# TYPE`` lines of ``exposition``, and one ``series NAME{labels}`` line per
    sample name and label-name set present (``_created`` series left out), as a set."""
    lines: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            lines.add(line)
        elif line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match is not None, line
            name, labels = match.group(1), _LABEL.findall(match.group(2) or "")
            if not name.endswith("_created"):
                lines.add(f"series {name}{{{','.join(sorted(labels))}}}")
    return lines


def test_the_exported_families_types_help_texts_and_labels_are_the_recorded_ones(
    kura_exposition: str, kura_tier_exposition: str
) -> None:
    found = sorted(family_lines(kura_exposition) | family_lines(kura_tier_exposition))
    recorded = RECORDED.read_text().splitlines()
    assert [f"- {x}" for x in recorded if x not in found] + [
        f"+ {x}" for x in found if x not in recorded
    ] == []
