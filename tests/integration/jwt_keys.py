"""Signing keys and tokens for the JWT tests: a test's own issuer, made with ``cryptography``
and PyJWT (the same libraries kura verifies with, used here on the signing side)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

ISSUER = "https://issuer.test"
AUDIENCE = "kura-test"
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: PrivateKey) -> str:
    return (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )


def write_public_key(key: PrivateKey, path: Path) -> Path:
    path.write_text(public_pem(key))
    return path


def claims(scope: str = "cache:read cache:write", ttl: float = 600, **extra: Any) -> dict[str, Any]:
    now = int(time.time())
    body: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "ci",
        "iat": now,
        "exp": now + int(ttl),
        "scope": scope,
    }
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def token(
    key: PrivateKey, alg: str = "RS256", headers: dict[str, Any] | None = None, **claim_args: Any
) -> str:
    return jwt.encode(claims(**claim_args), key, algorithm=alg, headers=headers)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned_token(**claim_args: Any) -> str:
    """An ``alg: none`` token (RFC 7519 §6): header and claims, empty signature."""
    header = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return f"{header}.{_b64(json.dumps(claims(**claim_args)).encode())}."


def hs256_with_public_key(key: PrivateKey, **claim_args: Any) -> str:
    """The algorithm-confusion forgery (RFC 8725 §2.1): HS256 keyed with the public key's PEM,
    which anyone holds. Built by hand: PyJWT refuses to make it."""
    import hashlib
    import hmac

    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64(json.dumps(claims(**claim_args)).encode())
    signing_input = f"{header}.{payload}".encode()
    mac = hmac.new(public_pem(key).encode(), signing_input, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(mac)}"
