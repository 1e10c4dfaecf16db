"""The configuration reference stays complete: every setting the code reads is documented."""

from __future__ import annotations

from pathlib import Path

from kit.settings import options_of
from kura.settings import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_kura_setting_is_in_the_configuration_reference() -> None:
    text = (DOCS / "configuration.md").read_text()
    missing = [
        o.env for _f, o in options_of(Settings) if f"`{o.env}`" not in text or o.flag not in text
    ]
    assert missing == []


def test_every_kured_flag_is_in_the_kured_reference() -> None:
    from kured.settings import Settings as KuredSettings

    text = (DOCS / "kured.md").read_text()
    missing = [
        o.flag
        for _f, o in options_of(KuredSettings)
        if f"`{o.flag}`" not in text or f"`{o.env}`" not in text
    ]
    assert missing == []
