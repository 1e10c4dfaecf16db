"""Signed bearer tokens (JWT, RFC 7519): what a token grants, and whether to believe it.

A token is believed only when all of these hold, else ``Unauthenticated`` (401):

* its header names an algorithm from ``ALLOWED_ALGORITHMS`` that fits the verifying key's type
  (RSA: RS*/PS*; EC: the ES* of the key's curve; Ed25519/Ed448: EdDSA). ``none`` and every
  HMAC algorithm are refused outright: HS256 "signed" with a public key is the classic
  algorithm-confusion forgery (RFC 8725 §2.1 and §3.1);
* its signature verifies with ``KURA_AUTH_JWT_PUBLIC_KEY`` or, with ``KURA_AUTH_JWT_JWKS_URL``,
  with the JWKS key its ``kid`` names (the only key when the set has one and the header names
  none);
* ``exp`` is present and in the future, ``nbf`` (if any) has passed, both with
  ``LEEWAY_SECONDS`` of clock skew; ``iss`` equals ``KURA_AUTH_JWT_ISSUER`` and ``aud`` names
  ``KURA_AUTH_JWT_AUDIENCE`` (RFC 7519 §4.1).

What it grants (``Grant``), from two claims:

* ``scope``: space-separated, the OAuth 2.0 shape (RFC 8693 §4.2) that turborepo-remote-cache
  also reads (``JWT_READ_SCOPES``/``JWT_WRITE_SCOPES``). Each scope grants rights
  (``kura.core.rights``), and a token has those of all its scopes (``SCOPE_RIGHTS``):

  - ``cache:read``: ``read``;
  - ``cache:write``: ``read``, ``write`` (so ``write:cas``) and ``clean``, what it granted
    before rights were finer than read and write;
  - ``cache:write:cas``: ``read`` and ``write:cas`` (a pull-request build's Bazel: it uploads
    blobs whose bytes kura checks against their digest, never an entry);
  - ``cache:clean``: ``clean``.

  Other scopes are ignored; with none of these the token is valid but grants nothing (403).
* ``namespaces``: optional array of strings. Absent: every namespace. Present: only these. A
  request's namespace is the Kura ``namespace_id`` (``""`` for tenant scope), the Turborepo
  team (``teamId`` or ``slug``), ``nx`` or ``metro`` for those fixed namespaces, and ``""`` for
  the Bazel, HTTP-cache and WebDAV routes (``kura.api.grant_scope``).
* ``read_namespaces`` (array of strings) and ``write_namespace`` (string), optional: an
  overlay (``kura.core.overlay``; the credentials file's ``read=`` and ``write=``): the
  namespaces read in order, and the one written, which must be one of them. A request that
  names no namespace reads them in order and writes ``write_namespace``; one that names
  another namespace of the list reads it only. ``write_namespace`` alone reads that namespace
  only; ``read_namespaces`` alone writes none. A token with these and ``namespaces`` too is
  refused (401): the overlay already says which namespaces it may touch.

Who it is: ``sub`` (optional) names the writer of what the token writes and of its refusals
in the log (``jwt:<sub>``, ``kura.core.provenance``; without one, the token's fingerprint).

JWKS keys are fetched at start and every ``KURA_AUTH_JWT_JWKS_REFRESH_SECONDS``, and sooner
(at most every ``UNKNOWN_KID_REFETCH_SECONDS``) when a token names a ``kid`` not in the set, so
a rotated signing key is picked up. A failed fetch keeps the last good set and is logged.
A worker process (``kura.workers``) fetches the primary's set instead of the issuer's and
forwards a request whose ``kid`` it has not got to the primary rather than refuse it
(``follow``), so no process refuses a key another one holds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from kura.core import provenance
from kura.core.errors import ForwardToPrimary, Unauthenticated
from kura.core.overlay import Overlay, overlay_from
from kura.core.rights import READ_WRITE, Access, Rights

log = logging.getLogger(__name__)

ALLOWED_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
# What each scope grants (module docstring); a token has the union of its scopes' rights.
SCOPE_RIGHTS: dict[str, Rights] = {
    "cache:read": frozenset({Access.READ}),
    "cache:write": READ_WRITE,
    "cache:write:cas": frozenset({Access.READ, Access.WRITE_CAS}),
    "cache:clean": frozenset({Access.CLEAN}),
}
LEEWAY_SECONDS = 30
UNKNOWN_KID_REFETCH_SECONDS = 30.0
JWKS_FETCH_TIMEOUT_SECONDS = 10.0
_EC_ALGORITHM = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


@dataclass(frozen=True)
class Grant:
    """What a believed token allows: its ``rights``, in ``namespaces`` (None = all), through
    its ``overlay`` (None: none); ``writer``, who it is (``kura.core.provenance.of_jwt``)."""

    rights: Rights
    namespaces: frozenset[str] | None
    overlay: Overlay | None = None
    writer: str = field(default="", compare=False)

    @staticmethod
    def scopes_granting(access: Access) -> str:
        """Which scopes grant ``access``, for a refusal's message: ``JWT scope cache:write``."""
        scopes = [s for s, rights in SCOPE_RIGHTS.items() if access in rights]
        return "JWT scope " + " or ".join(scopes)


def looks_like_jwt(token: str) -> bool:
    """True when ``token`` has the JWS compact shape ``header.payload.signature`` with a JSON
    header (RFC 7515 §7.1); the signature part may be empty (an ``alg: none`` token)."""
    if token.count(".") != 2:
        return False
    try:
        return isinstance(jwt.get_unverified_header(token), dict)
    except jwt.PyJWTError:
        return False


def algorithms_for(key: Any) -> frozenset[str]:
    """The allowed algorithms a public key can verify (empty for any other key type)."""
    if isinstance(key, rsa.RSAPublicKey):
        return frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGORITHM.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()


def load_public_key(value: str) -> Any:
    """A PEM public key from ``value``: the PEM text itself or the path of a file holding it.
    Raises ``ValueError`` for anything else (a private key, a secret, an unreadable file)."""
    text = value if value.lstrip().startswith("-----BEGIN") else Path(value).read_text()
    key = load_pem_public_key(text.encode())
    if not algorithms_for(key):
        raise ValueError(f"unsupported key type {type(key).__name__}")
    return key


class JwtVerifier:
    """Verifies tokens against one public key or a JWKS URL (exactly one of the two)."""

    looks_like_jwt = staticmethod(looks_like_jwt)

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        public_key: Any = None,
        jwks_url: str | None = None,
        jwks_refresh_seconds: float = 300.0,
    ) -> None:
        if (public_key is None) == (jwks_url is None):
            raise ValueError("give exactly one of public_key and jwks_url")
        self._issuer = issuer
        self._audience = audience
        self._public_key = public_key
        self._jwks_url = jwks_url
        self._jwks_refresh_seconds = jwks_refresh_seconds
        self._jwks: dict[str, jwt.PyJWK] = {}  # kid ("" when absent) -> key
        self._refetch = asyncio.Event()
        self._last_fetch = 0.0
        self._session: Callable[[], aiohttp.ClientSession] = aiohttp.ClientSession
        self._defer_unknown_kid = False
        self.jwks_document: dict[str, Any] | None = None  # the last good set, as fetched

    def follow(self, jwks_url: str, session: Callable[[], aiohttp.ClientSession]) -> None:
        """Make this a worker's verifier: fetch the JWKS from ``jwks_url`` (the primary's
        set) with ``session``, and raise ``ForwardToPrimary`` for a token whose ``kid`` is
        not in the set, so the primary, which fetches from the issuer, decides. No-op for a
        fixed key. Call before ``start``."""
        if self._jwks_url is not None:
            self._jwks_url, self._session, self._defer_unknown_kid = jwks_url, session, True

    def verify(self, token: str) -> Grant:
        """The token's ``Grant``; ``Unauthenticated`` when it is not to be believed."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise Unauthenticated(f"invalid token: algorithm {alg!r} is not allowed")
        key = self._key_for(header)
        if alg not in algorithms_for(key):
            raise Unauthenticated(f"invalid token: algorithm {alg} does not fit the key")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=LEEWAY_SECONDS,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(f"invalid token: {exc}") from None
        return grant_from(claims, token)

    def _key_for(self, header: dict[str, Any]) -> Any:
        if self._public_key is not None:
            return self._public_key
        kid = header.get("kid")
        keys = self._jwks
        if isinstance(kid, str) and kid in keys:
            found = keys[kid]
        elif kid is None and len(keys) == 1:
            found = next(iter(keys.values()))
        else:
            self._refetch.set()  # maybe the signer rotated: fetch the set again soon
            if self._defer_unknown_kid:
                raise ForwardToPrimary("a kid not in this worker's JWKS")
            raise Unauthenticated("invalid token: no key in the JWKS matches its kid")
        if found.algorithm_name and found.algorithm_name != header.get("alg"):
            raise Unauthenticated("invalid token: algorithm does not match the JWKS key")
        return found.key

    async def run(self) -> None:
        """Keep the JWKS fresh (no-op for a fixed key); runs until cancelled. The first fetch is
        ``start``'s, made before the node listens."""
        if self._jwks_url is None:
            return
        async with self._session() as session:
            while True:
                self._refetch.clear()
                # With no key yet (the fetch failed), try again sooner.
                interval = self._jwks_refresh_seconds if self._jwks else UNKNOWN_KID_REFETCH_SECONDS
                try:
                    async with asyncio.timeout(interval):
                        await self._refetch.wait()
                    spacing = min(UNKNOWN_KID_REFETCH_SECONDS, self._jwks_refresh_seconds)
                    wait = self._last_fetch + spacing - time.monotonic()
                    await asyncio.sleep(max(0.0, wait))
                except TimeoutError:
                    pass
                await self._fetch(session)

    async def start(self) -> None:
        """Fetch the JWKS once (no-op for a fixed key). A failure is logged, never raised: the
        node serves plain tokens meanwhile and ``run`` tries again."""
        if self._jwks_url is not None:
            async with self._session() as session:
                await self._fetch(session)

    async def _fetch(self, session: aiohttp.ClientSession) -> None:
        assert self._jwks_url is not None
        self._last_fetch = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=JWKS_FETCH_TIMEOUT_SECONDS)
            async with session.get(self._jwks_url, timeout=timeout) as resp:
                resp.raise_for_status()
                doc = json.loads(await resp.read())
            keys = {}
            for jwk in jwt.PyJWKSet.from_dict(doc).keys:
                keys[jwk.key_id or ""] = jwk
        except (aiohttp.ClientError, TimeoutError, ValueError, jwt.PyJWTError) as exc:
            log.warning(
                "cannot fetch the JWKS %s (keeping %d keys): %s",
                self._jwks_url,
                len(self._jwks),
                exc,
            )
            return
        if keys.keys() != self._jwks.keys():
            log.info("JWKS %s: %d keys", self._jwks_url, len(keys))
        self._jwks, self.jwks_document = keys, doc

    @property
    def key_count(self) -> int:
        return 1 if self._public_key is not None else len(self._jwks)


def grant_from(claims: dict[str, Any], token: str = "") -> Grant:
    """The ``Grant`` in verified claims of ``token``; ``Unauthenticated`` for a malformed grant
    claim. Its writer is ``jwt:<sub>`` (``kura.core.provenance.of_jwt``)."""
    scope = claims.get("scope", "")
    if not isinstance(scope, str):
        raise Unauthenticated("invalid token: scope must be a space-separated string")
    scopes = set(scope.split())
    namespaces = claims.get("namespaces")
    if namespaces is not None and not (
        isinstance(namespaces, list) and all(isinstance(n, str) for n in namespaces)
    ):
        raise Unauthenticated("invalid token: namespaces must be an array of strings")
    rights: Rights = frozenset().union(*(SCOPE_RIGHTS.get(s, frozenset()) for s in scopes))
    return Grant(
        rights,
        None if namespaces is None else frozenset(namespaces),
        _overlay(claims),
        provenance.of_jwt(claims.get("sub"), token),
    )


def _overlay(claims: dict[str, Any]) -> Overlay | None:
    """The overlay of ``read_namespaces``/``write_namespace`` (module docstring);
    ``Unauthenticated`` for a malformed one."""
    reads, write = claims.get("read_namespaces"), claims.get("write_namespace")
    if reads is None and write is None:
        return None
    if claims.get("namespaces") is not None:
        raise Unauthenticated(
            "invalid token: give either namespaces or read_namespaces/write_namespace"
        )
    if reads is not None and not (
        isinstance(reads, list) and all(isinstance(n, str) for n in reads)
    ):
        raise Unauthenticated("invalid token: read_namespaces must be an array of strings")
    if write is not None and not isinstance(write, str):
        raise Unauthenticated("invalid token: write_namespace must be a string")
    try:
        return overlay_from(reads, write)
    except ValueError as exc:
        raise Unauthenticated(f"invalid token: read_namespaces/write_namespace: {exc}") from None
