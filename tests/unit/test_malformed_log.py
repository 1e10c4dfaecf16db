"""No token reaches the malformed-request log line (``kura.api.malformed.without_credentials``),
whatever shape of aiohttp's parser messages: each request below is fed to both of aiohttp's
request parsers (the C one and the pure-Python one, which aiohttp uses without its
extensions), and each message quotes the secret before the cut and not after it."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp.http_parser import HttpRequestParserC, HttpRequestParserPy

from kura.api.malformed import without_credentials

SECRET = "writerwriterwrit0002"
REQUESTS = {
    "space before the colon": f"Authorization : Bearer {SECRET}",
    "folded header": f"Authorization: Bearer\r\n {SECRET}",
    "control character, any name": f"X-Auth-Token: {SECRET}\x01",
    "no scheme, control character": f"Authorization: {SECRET}\x7f",
    "over-long value": f"Authorization: Bearer {SECRET}{'a' * 9000}",
}


def _messages(raw: bytes) -> list[str]:
    loop = asyncio.new_event_loop()
    try:
        said = []
        for parser_class in (HttpRequestParserC, HttpRequestParserPy):
            parser = parser_class(mock.Mock(), loop, 2**16, max_line_size=8190, max_field_size=8190)
            with pytest.raises(Exception) as raised:  # noqa: PT011 (each parser's own class)
                parser.feed_data(raw)
            said.append(str(getattr(raised.value, "message", raised.value)))
        return said
    finally:
        loop.close()


@pytest.mark.parametrize("header", REQUESTS.values(), ids=REQUESTS.keys())
def test_a_header_value_is_never_logged(header: str) -> None:
    for message in _messages(f"GET /up HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n".encode()):
        assert SECRET in message  # what aiohttp says: the line, secret and all
        assert SECRET not in without_credentials(message), message


@pytest.mark.parametrize(
    "line", [f"GET /up?token={SECRET}\x01 HTTP/1.1", f"GET /a b?token={SECRET} HTTP/1.1"]
)
def test_a_query_is_never_logged(line: str) -> None:
    for message in _messages(f"{line}\r\nHost: x\r\n\r\n".encode()):
        assert SECRET in message
        assert SECRET not in without_credentials(message), message


def test_a_message_without_a_quoted_line_is_kept() -> None:
    text = "Got more than 8190 bytes (9000) when reading Header value is too long."
    assert without_credentials(text) == text
