"""One JSON GET for the command-line clients (``kura status``, ``kured status``), failing with a
one-line message that names the URL and what to do, never a traceback.

``urllib``'s own messages (``<urlopen error [Errno 111] Connection refused>``, ``HTTP Error 401:
Unauthorized``) say what failed but not what the user should change (issue 26, item 11).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class FetchError(Exception):
    """The GET failed; ``message`` is the one line to print."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Hints:
    """What the messages name: ``server`` (``"a kura node"``), the option or variable that sets
    the URL (``"--url or KURA_URL"``), and the one that sets a token (None: no tokens)."""

    server: str
    url_option: str
    token_option: str | None = None


def fetch_json(
    url: str, hints: Hints, token: str | None = None, timeout_seconds: float = 10
) -> Any:
    """GET ``url`` (with ``Authorization: Bearer token`` when given) and parse its JSON body.

    Raises ``FetchError`` for every failure: refused or unresolvable host, a timeout, TLS, an
    HTTP error status (401/403 name ``hints.token_option``), an answer that is not HTTP/1 (a
    gRPC port's), a body that is not JSON, and a URL that is not one: no ``http://`` or
    ``https://`` scheme (``127.0.0.1:4000``), no host, a port out of range. Blocking;
    safe to call from any thread."""
    if (problem := _malformed(url)) is not None:
        raise FetchError(
            f"{url} is not a usable URL: {problem}. Pass the right one with {hints.url_option}."
        )
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        raise FetchError(_http_error(url, exc.code, str(exc.reason), hints, token)) from None
    except urllib.error.URLError as exc:
        raise FetchError(_unreachable(url, exc.reason, hints, timeout_seconds)) from None
    except (TimeoutError, OSError) as exc:  # a timeout or reset while reading the body
        raise FetchError(_unreachable(url, exc, hints, timeout_seconds)) from None
    except http.client.HTTPException:  # not HTTP/1 (a gRPC or TLS port), or cut short
        raise FetchError(
            f"{url} did not answer in HTTP/1: is it {hints.server}'s HTTP port? Pass its URL "
            f"with {hints.url_option}."
        ) from None
    except ValueError:
        raise FetchError(
            f"{url} answered, but not with JSON: is it {hints.server}? Pass {hints.url_option}."
        ) from None


def _malformed(url: str) -> str | None:
    """What is wrong with ``url`` for an HTTP GET, or None. urllib raises a bare ValueError for
    these (``unknown url type``, ``Port out of range``), which named neither the fix nor the
    option."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port out of range or not a number, a broken [IPv6] host
        return str(exc)
    if parts.scheme not in ("http", "https"):
        if "://" in url:
            return f"the scheme must be http:// or https://, not {parts.scheme}://"
        return f"add the scheme, as in http://{url}"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "port 0 is not a port to connect to"
    return None


def _http_error(url: str, code: int, reason: str, hints: Hints, token: str | None) -> str:
    status = f"{url} answered HTTP {code} {reason}"
    if code in (401, 403) and hints.token_option:
        if token:
            return f"{status}: the token was refused; pass one with read access ({hints.token_option})."
        return f"{status}: {hints.server} requires a token; pass one with {hints.token_option}."
    if code == 404:
        return f"{status}: is it {hints.server}? Pass its URL with {hints.url_option}."
    return f"{status}."


def _unreachable(url: str, reason: object, hints: Hints, timeout_seconds: float) -> str:
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    if isinstance(reason, ConnectionRefusedError):
        return (
            f"cannot connect to {url}: connection refused: is {hints.server} running and "
            f"listening on {where}? Pass its URL with {hints.url_option}."
        )
    if isinstance(reason, TimeoutError):
        return (
            f"no answer from {url} within {timeout_seconds:g} s: is {where} the right address, "
            f"and is {hints.server} running (not stopped or overloaded)? Pass its URL with "
            f"{hints.url_option}."
        )
    if isinstance(reason, socket.gaierror):
        return (
            f"cannot resolve {parts.hostname} in {url}: pass the right URL with {hints.url_option}."
        )
    if isinstance(reason, ssl.SSLError):
        return (
            f"TLS with {url} failed ({reason}): check the scheme (http/https) and the certificate."
        )
    return f"cannot read {url}: {reason}: pass the right URL with {hints.url_option}."
