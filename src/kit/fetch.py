"""One JSON request for the command-line clients (``kura status``, ``kured status``, ``kura
admin``), over TCP or a unix socket, failing with a one-line message that names the URL (or
socket) and what to do, never a traceback.

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
    """The request failed; ``message`` is the one line to print, ``status`` the HTTP status
    answered (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Hints:
    """What the messages name: ``server`` (``"a kura node"``), the option or variable that sets
    the URL (``"--url or KURA_URL"``), and the one that sets a token (None: no tokens)."""

    server: str
    url_option: str
    token_option: str | None = None
    right: str = "read"  # what a refused token lacks, in the 401/403 message


def fetch_json(
    url: str,
    hints: Hints,
    token: str | None = None,
    timeout_seconds: float = 10,
    *,
    method: str = "GET",
) -> Any:
    """``method`` (GET, or a POST without a body) ``url`` (with ``Authorization: Bearer
    token`` when given) and parse its JSON body.

    Raises ``FetchError`` for every failure: refused or unresolvable host, a timeout, TLS, an
    HTTP error status (401/403 name ``hints.token_option``; the answer's JSON ``message``
    quoted), an answer that is not HTTP/1 (a gRPC port's), a body that is not JSON, and a URL
    that is not one: no ``http://`` or ``https://`` scheme (``127.0.0.1:4000``), no host, a
    port out of range. Blocking; safe to call from any thread."""
    if (problem := _malformed(url)) is not None:
        raise FetchError(
            f"{url} is not a usable URL: {problem}. Pass the right one with {hints.url_option}."
        )
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        message = _http_error(url, exc.code, str(exc.reason), hints, token, _detail(exc.read()))
        raise FetchError(message, exc.code) from None
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


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over the unix socket ``path``."""

    def __init__(self, path: str, timeout_seconds: float) -> None:
        super().__init__("localhost", timeout=timeout_seconds)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def fetch_json_unix(
    socket_path: str,
    target: str,
    hints: Hints,
    timeout_seconds: float = 10,
    *,
    method: str = "GET",
    shown: str | None = None,
) -> Any:
    """``fetch_json`` of ``target`` (a path and query) over the unix socket ``socket_path``,
    named ``shown`` (default the path) in messages. ``FetchError`` as ``fetch_json``'s, and
    for a socket that is absent, refuses (a node that crashed left it) or may not be opened
    (its mode lets its owner in only)."""
    where = shown or socket_path
    connection = _UnixConnection(socket_path, timeout_seconds)
    try:
        connection.request(method, target, body=b"" if method == "POST" else None)
        resp = connection.getresponse()
        body = resp.read()
    except FileNotFoundError:
        raise FetchError(
            f"no socket at {where}: is {hints.server} running there? Pass its directory with "
            f"{hints.url_option}."
        ) from None
    except ConnectionRefusedError:
        raise FetchError(
            f"nothing listens on {where} (left by {hints.server} that stopped without removing "
            f"it?): is it running? Pass its directory with {hints.url_option}."
        ) from None
    except PermissionError:
        raise FetchError(
            f"permission denied on {where}: only the user {hints.server} runs as may use it "
            "(mode 0600); run this as that user."
        ) from None
    except (TimeoutError, OSError) as exc:
        raise FetchError(f"cannot read {where}: {exc}") from None
    except http.client.HTTPException:
        raise FetchError(f"{where} did not answer in HTTP/1: is it {hints.server}'s?") from None
    finally:
        connection.close()
    if resp.status >= 400:
        message = _http_error(where, resp.status, resp.reason, hints, None, _detail(body))
        raise FetchError(message, resp.status)
    try:
        return json.loads(body)
    except ValueError:
        raise FetchError(f"{where} answered, but not with JSON: is it {hints.server}'s?") from None


def _detail(body: bytes) -> str | None:
    """The ``message`` of a JSON error body (kura's ``{"message": ...}``), if any."""
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    message = doc.get("message") if isinstance(doc, dict) else None
    return message[:500] if isinstance(message, str) else None


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


def _http_error(
    url: str, code: int, reason: str, hints: Hints, token: str | None, detail: str | None = None
) -> str:
    status = f"{url} answered HTTP {code} {reason}"
    said = f" ({detail})" if detail else ""
    if code in (401, 403) and hints.token_option:
        if token:
            return (
                f"{status}: the token was refused{said}; pass one with {hints.right} access "
                f"({hints.token_option})."
            )
        return f"{status}: {hints.server} requires a token; pass one with {hints.token_option}."
    if code == 404:
        if detail:
            return f"{status}: {detail}."
        return f"{status}: is it {hints.server}? Pass its URL with {hints.url_option}."
    return f"{status}{said}."


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
