"""kured's shoutrrr notification URLs read into apprise's, the message templates, and the
configuration errors a bad ``--notify-url`` or template gives at start (kured.core.notify_urls,
kured.settings). Every translated URL is also checked with apprise itself: the real library
must build a notifier from it."""

from __future__ import annotations

import argparse
import subprocess
import sys

import apprise
import pytest

from kit.settings import SettingsError
from kured.actuators.notify import check_url
from kured.core.notify_urls import check_template, redact, render, translate
from kured.settings import add_arguments, describe, load_settings

SLACK_A, SLACK_B, SLACK_C = "T00000000", "B00000000", "XXXXXXXXXXXXXXXXXXXXXXXX"


@pytest.mark.parametrize(
    ("shoutrrr", "apprise_url", "plugin"),
    [
        (
            "smtp://127.0.0.1:2525/?from=kured@example.com&to=a@example.com,b@example.com&encryption=None",
            "mailto://127.0.0.1:2525?from=kured%40example.com&to=a%40example.com%2Cb%40example.com&mode=insecure",
            "NotifyEmail",
        ),
        (
            "smtp://user:secret@mail.example.com:587/?fromaddress=k@example.com&toaddresses=o@example.com",
            "mailto://user:secret@mail.example.com:587?from=k%40example.com&to=o%40example.com&mode=starttls",
            "NotifyEmail",
        ),
        (
            "smtp://user:secret@mail.example.com:465/?from=k@example.com&to=o@example.com",
            "mailtos://user:secret@mail.example.com:465?from=k%40example.com&to=o%40example.com&mode=ssl",
            "NotifyEmail",
        ),
        ("generic://hooks.example.com/kured", "jsons://hooks.example.com/kured", "NotifyJSON"),
        (
            "generic://hooks.example.com:8080/kured?disabletls=yes",
            "json://hooks.example.com:8080/kured",
            "NotifyJSON",
        ),
        ("generic+http://127.0.0.1:9000/h", "json://127.0.0.1:9000/h", "NotifyJSON"),
        ("generic+https://hooks.example.com/h", "jsons://hooks.example.com/h", "NotifyJSON"),
        (
            f"slack://kured@{SLACK_A}/{SLACK_B}/{SLACK_C}",
            f"slack://kured@{SLACK_A}/{SLACK_B}/{SLACK_C}",
            "NotifySlack",
        ),
        (
            f"slack://hook:{SLACK_A}-{SLACK_B}-{SLACK_C}@webhook",
            f"slack://{SLACK_A}/{SLACK_B}/{SLACK_C}",
            "NotifySlack",
        ),
        (
            "slack://xoxb:123456789012-1234567890123-abcdefABCDEF@general",
            "slack://xoxb-123456789012-1234567890123-abcdefABCDEF/#general",
            "NotifySlack",
        ),
        (
            "discord://abcdefTOKEN0123456789@123456789012345678",
            "discord://123456789012345678/abcdefTOKEN0123456789",
            "NotifyDiscord",
        ),
        (
            "telegram://123456789:AAbbCCdd@telegram?chats=@kured,-1001234",
            "tgram://123456789:AAbbCCdd/%40kured/-1001234",
            "NotifyTelegram",
        ),
        (
            "gotify://gotify.example.com/AbCdEf123",
            "gotifys://gotify.example.com/AbCdEf123",
            "NotifyGotify",
        ),
        (
            "pushover://shoutrrr:azGDORePK8gMaC0QOYAMyEEuzJnyUi@uQiRzpo4DXghDmr9QzzfQu27cmVRsG",
            "pover://uQiRzpo4DXghDmr9QzzfQu27cmVRsG@azGDORePK8gMaC0QOYAMyEEuzJnyUi",
            "NotifyPushover",
        ),
        ("json://127.0.0.1:9000/h", "json://127.0.0.1:9000/h", "NotifyJSON"),  # apprise's own
    ],
)
def test_shoutrrr_urls_map_to_apprise_urls_apprise_accepts(
    shoutrrr: str, apprise_url: str, plugin: str
) -> None:
    assert translate(shoutrrr) == apprise_url
    built = apprise.Apprise.instantiate(apprise_url)
    assert type(built).__name__ == plugin
    assert check_url(apprise_url) == apprise_url


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("teams://group@tenant/altId/groupOwner?host=org.webhook.office.com", "workflows://"),
        ("smtp://mail.example.com/?to=o@example.com", "needs ?from=ADDRESS&to="),
        ("smtp://mail.example.com/?from=a@b.c&to=o@example.com&encryption=maybe", "encryption"),
        ("discord://only-a-host", "discord://TOKEN@WEBHOOKID"),
        ("telegram://token@telegram", "chats="),
        ("not a url", "not a URL"),
    ],
)
def test_urls_that_do_not_map_are_refused_with_the_fix(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("?", r"\?")):
        translate(url)


def test_a_scheme_apprise_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mattermost:// is an unknown scheme"):
        check_url(translate("mattermost://chat.example.com/token"))


def test_templates_substitute_the_node_as_go_fmt_does() -> None:
    assert render("Draining node %s", "n1") == "Draining node n1"
    assert render("%v rebooted, %s back: 100%%", "n1") == "n1 rebooted, n1 back: 100%"
    assert render("no verb", "n1") == "no verb"
    assert check_template("Node %s rebooted & uncordoned successfully!")
    for bad in ("node %d", "50% done", "ends with %"):
        with pytest.raises(ValueError, match="%"):
            check_template(bad)


def test_redact_keeps_only_scheme_and_host() -> None:
    assert redact("slack://hook:SECRET-TOKEN@webhook") == "slack://webhook"
    assert redact("mailto://user:pw@mail.example.com:587?to=a@b.c") == "mailto://mail.example.com"


def _load(*argv: str) -> object:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_settings(parser.parse_args(["--node-id", "n1", *argv]), {})


def test_settings_take_repeatable_urls_kureds_default_templates_and_redact_the_log() -> None:
    s = _load(
        "--notify-url",
        f"slack://hook:{SLACK_A}-{SLACK_B}-{SLACK_C}@webhook",
        "--notify-url",
        "generic+http://127.0.0.1:9/h",
    )
    assert s.notify_url == (  # type: ignore[attr-defined]
        f"slack://hook:{SLACK_A}-{SLACK_B}-{SLACK_C}@webhook",
        "generic+http://127.0.0.1:9/h",
    )
    assert s.message_template_drain == "Draining node %s"  # type: ignore[attr-defined]
    assert s.message_template_reboot == "Rebooting node %s"  # type: ignore[attr-defined]
    assert s.message_template_uncordon == "Node %s rebooted & uncordoned successfully!"  # type: ignore[attr-defined]
    logged = describe(s)  # type: ignore[arg-type]
    assert "--notify-url=slack://webhook;generic+http://127.0.0.1" in logged
    assert SLACK_C not in logged


def test_the_environment_separates_urls_with_semicolons() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    s = load_settings(
        parser.parse_args(["--node-id", "n1"]),
        {
            "KURED_NOTIFY_URL": "json://a.example.com/x;smtp://m.example.com/?from=k@example.com&to=a@example.com,b@example.com"
        },
    )
    assert len(s.notify_url) == 2


def test_bad_urls_and_templates_are_all_reported_at_start() -> None:
    with pytest.raises(SettingsError) as raised:
        _load(
            "--notify-url",
            "teams://g@t/a/o",
            "--notify-url",
            "nosuch://x",
            "--message-template-reboot",
            "rebooting %d",
        )
    text = "\n".join(raised.value.problems)
    assert "teams://" in text  # a repeatable flag reports its first bad value
    assert "%d" in text
    with pytest.raises(SettingsError, match="nosuch://"):
        _load("--notify-url", "json://127.0.0.1:9/h", "--notify-url", "nosuch://x")


def test_the_cli_exits_2_on_an_unknown_scheme_and_help_lists_the_notify_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kured.cli", "--node-id", "n1", "--notify-url", "nosuch://x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "nosuch://" in out.stderr
    assert "apprise cannot use this URL" in out.stderr
    help_text = subprocess.run(
        [sys.executable, "-m", "kured.cli", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for flag in (
        "--notify-url",
        "--message-template-drain",
        "--message-template-reboot",
        "--message-template-uncordon",
        "--notify-timeout",
        "--lease-name",
        "--lease-namespace",
        "--release-lock-of-deleted-nodes",
        "--deleted-node-grace",
    ):
        assert flag in help_text


def test_endpoint_keeps_scheme_host_and_port_only() -> None:
    from kured.core.notify_urls import endpoint

    assert endpoint("https://u:pw@am.example:9093/TOKEN/x?t=Q") == "https://am.example:9093"
    assert endpoint("http://hooks.example/p?token=T") == "http://hooks.example"
    assert endpoint("http://[::1]:8080/s") == "http://[::1]:8080"
    assert endpoint("http://h:notaport/s") == "(an invalid URL)"
