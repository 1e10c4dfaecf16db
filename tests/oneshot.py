"""One-shot HTTP requests for the tests: httpx's top-level ``get``, ``put``, ``post``,
``delete``, ``request`` and ``stream``, with one TLS context for the whole test process.

httpx builds a ``Client`` for every top-level call, and every ``Client`` builds an SSL context
that parses certifi's whole CA bundle (``httpx.create_ssl_context``: about 10 ms of CPU), even
for an ``http://`` URL it never uses it on. The tests poll nodes with these calls: a py-spy
profile of the pytest workers found 59% of their CPU there. ``TLS`` is that context, built
once (an ``SSLContext`` is safe to share between threads). Everything else is httpx's own call,
unchanged: a new connection per request, the same arguments; pass ``verify=`` to trust another
CA (a test's own), as with httpx.
"""

from __future__ import annotations

from typing import Any

import httpx

TLS = httpx.create_ssl_context()


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.request`` verifying with ``TLS`` unless ``verify`` is given."""
    kwargs.setdefault("verify", TLS)
    return httpx.request(method, url, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    return request("GET", url, **kwargs)


def put(url: str, **kwargs: Any) -> httpx.Response:
    return request("PUT", url, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return request("POST", url, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return request("DELETE", url, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> Any:
    """``httpx.stream`` (a context manager giving the response) verifying with ``TLS``."""
    kwargs.setdefault("verify", TLS)
    return httpx.stream(method, url, **kwargs)
