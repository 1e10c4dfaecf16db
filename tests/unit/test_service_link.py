"""Kubernetes service links among ``KURA_*`` / ``KURED_*`` settings (kit.service_link,
kit.settings.screen_environment; issue 26, item 11): exactly the kubelet's shapes are ignored,
a misspelt setting is refused naming the one meant."""

from __future__ import annotations

import argparse

import pytest

from kit.service_link import is_service_link
from kit.settings import SettingsError
from kura.cli import build_parser
from kura.settings import Settings
from kura.settings import load_settings as load_kura
from kured.settings import add_arguments
from kured.settings import load_settings as load_kured


def kura_settings(environ: dict[str, str], *flags: str) -> Settings:
    return load_kura(build_parser().parse_args(["serve", *flags]), environ)


def kured_problems(environ: dict[str, str]) -> list[str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SettingsError) as raised:
        load_kured(parser.parse_args(["--node-id", "n1"]), environ)
    return raised.value.problems


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KURA_SERVICE_HOST", "10.0.0.1"),
        ("KURA_SERVICE_PORT", "4000"),
        ("KURA_SERVICE_PORT_HTTP", "4000"),
        ("KURA_SERVICE_PORT_GRPC_WEB", "4200"),
        ("KURA_PORT", "tcp://10.0.0.1:4000"),
        ("KURA_PORT_4000_TCP", "tcp://10.0.0.1:4000"),
        ("KURA_PORT_4000_TCP_ADDR", "10.0.0.1"),
        ("KURA_PORT_4000_TCP_PORT", "4000"),
        ("KURA_PORT_4000_TCP_PROTO", "tcp"),
        ("KURA_PORT_53_UDP", "udp://10.0.0.1:53"),
        ("KURA_PEERS_SERVICE_HOST", "fd00::10"),
        ("KURA_PEERS_PORT", "tcp://[fd00::10]:4100"),
    ],
)
def test_the_kubelets_shapes_are_service_links(name: str, value: str) -> None:
    assert is_service_link(name, value, "KURA")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KURA_PORT", "4000"),  # the setting itself
        ("KURA_GPRC_PORT", "4001"),  # a misspelt KURA_GRPC_PORT has a link's name, not its value
        ("KURA_SERVICE_HOST", "kura.example"),  # a link's host is an IP address
        ("KURA_PORT_4000_TCP", "tcp://10.0.0.1:4001"),  # the port in the name and value differ
        ("KURA_PORT_4000_TCP", "udp://10.0.0.1:4000"),
        ("KURA_PORT_4000_TCP_PORT", "4001"),
        ("KURA_PORT_4000_TCP_PROTO", "TCP"),
        ("KURA_READ_WRITE_TOKEN", "tok1"),
        ("KURAX_SERVICE_HOST", "10.0.0.1"),  # another Service's (kurax)
        ("KURED_PORT", "tcp://10.0.0.1:8080"),
    ],
)
def test_anything_else_is_not_a_service_link(name: str, value: str) -> None:
    assert not is_service_link(name, value, "KURA")


def test_kura_port_holding_a_service_link_is_ignored_and_a_port_is_read() -> None:
    # A Service named kura makes the kubelet set KURA_PORT=tcp://IP:PORT in every pod of the
    # namespace, over the image's KURA_PORT=4000: it must not stop the start. A pod that sets it
    # to such a value itself cannot be told apart; no port is a URL, so it gets the default too.
    assert kura_settings({"KURA_PORT": "tcp://10.0.0.1:4000"}).port == 4000
    assert kura_settings({"KURA_PORT": "4100"}).port == 4100
    assert kura_settings({"KURA_PORT": "tcp://10.0.0.1:4000"}, "--port", "4200").port == 4200


def test_every_unknown_kura_variable_is_listed_with_the_other_problems() -> None:
    with pytest.raises(SettingsError) as raised:
        kura_settings(
            {
                "KURA_READ_WRITE_TOKEN": "tok1",
                "KURA_MAX_DISK": "10GiB",
                "KURA_COMPLETELY_DIFFERENT": "1",
                "KURA_PORT": "abc",
                "KURA_SERVICE_HOST": "10.0.0.1",
            }
        )
    problems = raised.value.problems
    assert "KURA_READ_WRITE_TOKEN is not a known setting: did you mean KURA_READ_WRITE_TOKENS?" in (
        problems
    )
    assert any(
        p.startswith("KURA_MAX_DISK is not a known setting: did you mean KURA_MAX_DISK_")
        for p in problems
    )
    assert "KURA_COMPLETELY_DIFFERENT is not a known setting" in problems
    assert any(p.startswith("KURA_PORT='abc'") for p in problems)
    assert not any("KURA_SERVICE_HOST" in p for p in problems)


def test_variables_of_kuras_other_commands_are_not_unknown() -> None:
    s = kura_settings(
        {"KURA_URL": "http://127.0.0.1:4000", "KURA_TOKEN": "t", "KURA_FAILPOINTS": ""}
    )
    assert s.port == 4000


def test_kured_refuses_a_misspelt_variable_and_ignores_its_service_links() -> None:
    problems = kured_problems(
        {
            "KURED_REBOOT_DAY": "mon",
            "KURED_PORT": "tcp://10.0.0.2:8080",
            "KURED_SERVICE_HOST": "10.0.0.2",
            "KURED_METRICS_PORT": "tcp://10.0.0.3:8080",  # a Service kured-metrics
            "KURED_STATUS_URL": "http://127.0.0.1:8080",  # kured status's
        }
    )
    assert problems == [
        "KURED_REBOOT_DAY is not a known setting: did you mean KURED_REBOOT_DAYS?",
        "KURED_ALLOW_UNKNOWN_SETTINGS=true starts anyway, ignoring unknown variables",
    ]
