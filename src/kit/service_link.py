"""Kubernetes service-link environment variables: recognising them among a program's own.

Unless a pod sets ``enableServiceLinks: false``, the kubelet gives every container the address of
every Service in its namespace, named after the Service (upper-cased, ``-`` turned into ``_``).
For a Service ``kura`` with a port ``http`` 4000/TCP on 10.0.0.1 that is::

    KURA_SERVICE_HOST=10.0.0.1           KURA_PORT=tcp://10.0.0.1:4000
    KURA_SERVICE_PORT=4000               KURA_PORT_4000_TCP=tcp://10.0.0.1:4000
    KURA_SERVICE_PORT_HTTP=4000          KURA_PORT_4000_TCP_ADDR=10.0.0.1
                                         KURA_PORT_4000_TCP_PORT=4000
                                         KURA_PORT_4000_TCP_PROTO=tcp

(https://kubernetes.io/docs/concepts/services-networking/service/#environment-variables; the
kubelet's ``pkg/kubelet/envvars``). A Service ``kura-peers`` gives ``KURA_PEERS_SERVICE_HOST``
and so on. So a program whose settings are ``KURA_*`` variables finds these among them, and one
of them (``KURA_PORT``) may even share a setting's name. ``is_service_link`` recognises exactly
these shapes, names *and* values, so that a misspelt setting is never mistaken for one.
"""

from __future__ import annotations

import ipaddress
import re

# Non-greedy: KURA_PORT_4000_TCP_PORT is the Service kura's, not a Service "kura-port-4000-tcp"'s.
_NAME = r"[A-Z0-9_]+?"
_SERVICE = re.compile(rf"^(?P<service>{_NAME})_SERVICE_(?:HOST|PORT(?:_[A-Z0-9_]+)?)$")
_PORT_LINK = re.compile(
    rf"^(?P<service>{_NAME})_PORT(?:_(?P<port>\d+)_(?P<proto>TCP|UDP|SCTP)"
    r"(?:_(?P<part>ADDR|PORT|PROTO))?)?$"
)
_URL = re.compile(r"^(?P<proto>tcp|udp|sctp)://(?P<host>\[[0-9a-fA-F:.]+\]|[0-9.]+):(?P<port>\d+)$")


def is_service_link(name: str, value: str, prefix: str) -> bool:
    """True when ``name=value`` has the exact shape of a variable the kubelet injects for a
    Service whose name makes its variables start with ``prefix`` (e.g. ``"KURA"``, no trailing
    underscore: the Service ``kura`` or ``kura-...``). Pure; never raises."""
    if name != prefix and not name.startswith(prefix + "_"):
        return False
    m = _SERVICE.match(name)
    if m is not None and _starts(m["service"], prefix):
        return _is_ip(value) if name.endswith("_SERVICE_HOST") else _is_port(value)
    m = _PORT_LINK.match(name)
    if m is None or not _starts(m["service"], prefix):
        return False
    if m["port"] is None:  # NAME_PORT: the first port's URL
        return _URL.match(value) is not None
    port, proto = m["port"], m["proto"]
    if m["part"] is None:
        url = _URL.match(value)
        return url is not None and url["proto"] == proto.lower() and url["port"] == port
    if m["part"] == "ADDR":
        return _is_ip(value)
    if m["part"] == "PORT":
        return value == port
    return value == proto.lower()


def _starts(service: str, prefix: str) -> bool:
    return service == prefix or service.startswith(prefix + "_")


def _is_port(text: str) -> bool:
    return text.isdigit() and 0 < int(text) < 65536


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
