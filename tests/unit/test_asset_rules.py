"""The Remote Asset API's pure rules (``kura.core.asset``): record keys, SRI, the allow-list."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import grpc
import pytest

from kura.core.asset import (
    AllowedHosts,
    AssetRecord,
    Origin,
    credentials_in,
    origin_of,
    parse_query,
    parse_sri,
    record_key,
    unsupported,
)
from kura.core.errors import InvalidRequest
from kura.grpc.origin import OriginFailed, check_addresses, portless_local


def sri(data: bytes, algorithm: str) -> str:
    return f"{algorithm}-{base64.b64encode(hashlib.new(algorithm, data).digest()).decode()}"


def test_the_key_ignores_qualifier_order_checksum_and_uri_spelling_but_not_values() -> None:
    a = parse_query(["HTTPS://Mirror.Example:443/a.tgz"], [("b", "2"), ("a", "1")])
    b = parse_query(
        ["https://mirror.example/a.tgz"],
        [("a", "1"), ("checksum.sri", sri(b"x", "sha256")), ("b", "2")],
    )
    c = parse_query(["https://mirror.example/a.tgz"], [("a", "1"), ("b", "3")])
    keys = [record_key("blob", q.uris[0], q.qualifiers) for q in (a, b, c)]
    assert keys[0] == keys[1] != keys[2]
    assert record_key("directory", b.uris[0], b.qualifiers) != keys[1]
    assert keys[0].startswith("asset/")
    assert len(keys[0]) == 6 + 64


def test_sri_takes_the_strongest_algorithm_and_refuses_what_it_cannot_check() -> None:
    both = parse_sri(f"{sri(b'x', 'sha256')} {sri(b'x', 'sha512')}?opt md5-AAAA")
    assert both.algorithm == "sha512"
    assert both.matches(hashlib.sha512(b"x").digest())
    assert parse_sri(sri(b"x", "sha256")).sha256_hex() == (hashlib.sha256(b"x").hexdigest(),)
    for bad in ("md5-AAAA", "sha256-short", "sha256-!!!", ""):
        with pytest.raises(InvalidRequest):
            parse_sri(bad)


def test_a_query_needs_a_uri_and_unique_qualifier_names() -> None:
    with pytest.raises(InvalidRequest, match="no URI"):
        parse_query([], [])
    with pytest.raises(InvalidRequest, match="twice"):
        parse_query(["urn:x"], [("a", "1"), ("a", "2")])


def test_only_a_host_named_with_its_port_and_no_wildcard_is_allowed_explicitly() -> None:
    """``mirror.internal`` alone (any port) is not explicit: it would open every port of a
    private host, kura's own internal listener included."""
    hosts = AllowedHosts.parse(
        ["mirror.internal", "mirror.internal:8443", "127.0.0.1:8080", "*.example.com", "[::1]:9"]
    )
    match = [
        hosts.match(o)
        for o in (
            origin_of(u)
            for u in (
                "http://mirror.internal:1234/x",
                "https://mirror.internal:8443/x",
                "http://127.0.0.1:8080/x",
                "http://127.0.0.1:8081/x",
                "https://cdn.example.com/x",
                "https://example.com/x",
                "http://[::1]:9/x",
            )
        )
        if o is not None
    ]
    assert match == [False, True, True, None, False, None, True]
    assert origin_of("urn:uuid:1") is None
    assert origin_of("ftp://h/x") is None
    assert not AllowedHosts.parse([])
    for bad in ("*evil.com", "host:0", "[::1"):
        with pytest.raises(ValueError, match=r"expected host|port must be|closing"):
            AllowedHosts.parse([bad])


def test_loopback_or_private_entries_without_a_port_are_named_and_bare_ipv6_refused() -> None:
    """``localhost``, ``127.0.0.1`` or ``[::1]`` without a port allow global addresses only,
    so they can never reach loopback: ``portless_local`` names them (logged at start-up) with
    what to write instead. ``[::1]`` is ``[v6]`` (any port); ``::1`` unbracketed is refused."""
    allowed = AllowedHosts.parse(
        ["localhost", "127.0.0.1", "[::1]", "10.0.0.7", "mirror.example", "127.0.0.1:8080"]
    )
    assert allowed.entries[2] == ("::1", None)
    assert portless_local(allowed) == [
        ("localhost", "localhost:PORT"),
        ("127.0.0.1", "127.0.0.1:PORT"),
        ("[::1]", "[::1]:PORT"),
        ("10.0.0.7", "10.0.0.7:PORT"),
    ]
    for bare in ("::1", "2001:db8::1:8080"):
        with pytest.raises(ValueError, match=r"IPv6 address in brackets"):
            AllowedHosts.parse([bare])


def test_a_record_survives_its_encoding() -> None:
    record = AssetRecord(
        "blob", "urn:x", (("a", "1"),), ("ab" * 32, 5), (("cd" * 32, 7),), 1234, "sha256-x"
    )
    assert AssetRecord.decode(record.encode()) == record
    with pytest.raises(ValueError, match="version 1"):
        AssetRecord.decode(b'{"v": 2}')


def test_a_records_body_keeps_no_userinfo_nor_query_but_its_key_does() -> None:
    uri = "https://user:pw@H.example:443/pkg.tar.gz?token=s3cret#frag"
    body = AssetRecord("blob", uri, (), ("ab" * 32, 5)).encode()
    for secret in (b"pw", b"s3cret", b"user"):
        assert secret not in body
    assert AssetRecord.decode(body).uri == "https://H.example:443/pkg.tar.gz#frag"
    bare = "https://h.example/pkg.tar.gz#frag"
    assert record_key("blob", uri, ()) != record_key("blob", bare, ())
    assert credentials_in(uri)
    assert credentials_in("http://@h/")
    assert not credentials_in(bare)


def test_a_records_body_holds_no_credential_and_only_sri_and_canonical_id_are_honoured() -> None:
    secret = "Bearer s3cret"
    named = [("http_header:Authorization", secret), ("bazel.auth_headers", secret)]
    query = parse_query(["https://h/x"], [*named, ("http_header_url:0:X", secret), ("a", "1")])
    body = AssetRecord("blob", "https://h/x", query.qualifiers, ("ab" * 32, 5)).encode()
    assert secret.encode() not in body
    assert b'"a","1"' in body
    assert record_key("blob", "https://h/x", query.qualifiers) != record_key(
        "blob", "https://h/x", parse_query(["https://h/x"], [("a", "1")]).qualifiers
    )
    assert unsupported(query) == [n for n, _v in sorted(query.qualifiers)]
    ok = parse_query(
        ["https://h/x"], [("checksum.sri", sri(b"x", "sha256")), ("bazel.canonical_id", "c")]
    )
    assert unsupported(ok) == []


@pytest.mark.parametrize(
    "address",
    [
        "10.1.2.3",
        "192.168.0.1",
        "172.16.5.5",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "127.0.0.1",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:10.0.0.1",
        "::ffff:0:7f00:1",  # IPv4-translated 127.0.0.1 (not "mapped")
        "::10.0.0.1",  # IPv4-compatible
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1: a NAT64 gateway forwards it there
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, its client 127.0.0.1
        "224.0.0.1",  # multicast
        "ff02::1",
    ],
)
def test_a_non_global_address_is_refused_unless_its_host_is_named_exactly(address: str) -> None:
    """Checked on the resolved address before any connection (an IP literal resolves with no
    look-up and nothing is sent to it)."""
    origin = Origin("http", address, 80)
    with pytest.raises(OriginFailed, match="not a global address") as info:
        asyncio.run(check_addresses(origin, explicit=False))
    assert info.value.code is grpc.StatusCode.PERMISSION_DENIED
    pinned = asyncio.run(check_addresses(origin, explicit=True))
    assert [r["host"] for r in pinned] == [address]


def test_a_global_address_is_allowed_by_a_wildcard() -> None:
    pinned = asyncio.run(check_addresses(Origin("https", "93.184.215.14", 443), explicit=False))
    assert [(r["host"], r["port"]) for r in pinned] == [("93.184.215.14", 443)]
    # An IPv6 address carrying a global IPv4 one is global too.
    for carrier in ("64:ff9b::5db8:d70e", "2002:5db8:d70e::1"):
        pinned = asyncio.run(check_addresses(Origin("https", carrier, 443), explicit=False))
        assert [r["host"] for r in pinned] == [carrier]
