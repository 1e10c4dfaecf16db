"""The silence matchers and maintenance flags (issue 31, item 3): the matcher syntax, its
template, the API v2 object it becomes, and the rules between the flags."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from kit.settings import SettingsError
from kured.core.silence_matchers import Matcher, parse_matcher
from kured.settings import Settings, add_arguments, load_settings


def _load(*argv: str, env: dict[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(["--node-id", "n1", *argv]), env or {})


@pytest.mark.parametrize(
    ("text", "want", "api"),
    [
        ("instance=%s:9100", Matcher("instance", "=", "%s:9100"), ("n1:9100", False, True)),
        ("severity!=critical", Matcher("severity", "!=", "critical"), ("critical", False, False)),
        ('node=~"%s(:.*)?"', Matcher("node", "=~", "%s(:.*)?"), ("n1(:.*)?", True, True)),
        ("job!~kube-.*", Matcher("job", "!~", "kube-.*"), ("kube-.*", True, False)),
        (" a = b ", Matcher("a", "=", "b"), ("b", False, True)),
    ],
)
def test_a_matcher_parses_and_becomes_the_api_v2_object_for_the_node(
    text: str, want: Matcher, api: tuple[str, bool, bool]
) -> None:
    got = parse_matcher(text)
    assert got == want
    obj = got.for_node("n1")
    assert (obj["value"], obj["isRegex"], obj["isEqual"]) == api
    assert obj["name"] == want.name


@pytest.mark.parametrize("text", ["instance", "=value", "1abc=x", "node=~(", "node!~[a-"])
def test_a_bad_matcher_is_refused_at_load(text: str) -> None:
    with pytest.raises(SettingsError, match="alertmanager-silence-matcher"):
        _load("--alertmanager-url", "http://am:9093", "--alertmanager-silence-matcher", text)


def test_a_url_needs_a_matcher_and_a_matcher_needs_a_url() -> None:
    with pytest.raises(SettingsError, match="needs at least one --alertmanager-silence-matcher"):
        _load("--alertmanager-url", "http://am:9093")
    with pytest.raises(SettingsError, match="matcher needs --alertmanager-url"):
        _load("--alertmanager-silence-matcher", "a=b")


def test_matchers_repeat_on_the_command_line_and_split_on_semicolons_in_the_environment() -> None:
    flags = _load(
        "--alertmanager-url",
        "http://am:9093",
        "--alertmanager-silence-matcher",
        "instance=~%s(:[0-9]{1,5})?",
        "--alertmanager-silence-matcher",
        "severity!=critical",
    )
    env = _load(
        env={
            "KURED_ALERTMANAGER_URL": "http://am:9093",
            "KURED_ALERTMANAGER_SILENCE_MATCHER": "instance=~%s(:[0-9]{1,5})?;severity!=critical",
        }
    )
    want = (Matcher("instance", "=~", "%s(:[0-9]{1,5})?"), Matcher("severity", "!=", "critical"))
    assert flags.alertmanager_silence_matcher == want
    assert env.alertmanager_silence_matcher == want


def test_hook_flags_and_their_defaults() -> None:
    s = _load("--pre-drain-hook-command", "/bin/ticket open --node", "--hook-timeout", "1m")
    assert s.pre_drain_hook_command == ("/bin/ticket", "open", "--node")
    assert s.hook_timeout == 60.0
    assert (s.pre_drain_hook_url, s.post_uncordon_hook_url, s.post_uncordon_hook_command) == (
        "",
        "",
        (),
    )
    assert s.alertmanager_silence_duration == 1800.0
    with pytest.raises(SettingsError, match="pre-drain-hook-url"):
        _load("--pre-drain-hook-url", "ftp://x/")


@pytest.mark.parametrize(
    "matchers",
    [
        ("severity!=critical",),
        ("alertname=~Node.*", "severity!=critical"),
        ("instance=%%s",),
        ("instance!=%s",),  # negative: it would silence every other node
        ("instance!~%s(:[0-9]+)?",),
    ],
)
def test_a_silence_must_name_the_node_in_one_matcher_at_least(matchers: tuple[str, ...]) -> None:
    """Else it silences those alerts on every node, cluster-wide, during each reboot."""
    flags = [f for m in matchers for f in ("--alertmanager-silence-matcher", m)]
    with pytest.raises(SettingsError, match="at least one matcher must name the node with %s"):
        _load("--alertmanager-url", "http://am:9093", *flags)
    ok = _load(
        "--alertmanager-url",
        "http://am:9093",
        *flags,
        "--alertmanager-silence-matcher",
        "instance=%v",
    )
    assert len(ok.alertmanager_silence_matcher) == len(matchers) + 1


def test_the_node_name_in_a_regex_matcher_is_a_literal() -> None:
    node = "ip-10-0-0-1.ec2.internal"
    regex = parse_matcher("instance=~%s(:[0-9]+)?").for_node(node)["value"]
    assert regex == r"ip-10-0-0-1\.ec2\.internal(:[0-9]+)?"
    assert re.fullmatch(regex, node + ":9100")
    assert not re.fullmatch(regex, "ip-10-0-0-1xec2xinternal:9100")  # "." is no wildcard
    assert parse_matcher("instance!~%s").for_node("a+b")["value"] == r"a\+b"
    assert parse_matcher("instance=%s").for_node(node)["value"] == node  # no regex: unescaped


def test_parsing_the_settings_imports_no_http_client() -> None:
    """The matchers are a value type of kured.core: the settings need no aiohttp."""
    code = "import sys, kured.settings; print(sorted(m for m in sys.modules if 'aiohttp' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out
