"""Metrics of client credentials and public TLS, registered whether or not they are configured
(zeros then), so dashboards and alerts can rely on the families:

* ``kura_auth_refusals_total{reason}``: 401s (``missing``, ``invalid``) and 403s
  (``forbidden``) from ``TokenAuth`` on the public routes;
* ``kura_auth_token_file_reloads_total``: token files re-read after a change;
* ``kura_auth_token_file_failing``: 1 while a token file's last re-read failed (its last
  good set still in use; the file is named in a /ready warning and the log);
* ``kura_auth_jwks_keys``: verification keys held (1 for a fixed key, 0 without JWT);
* ``kura_public_tls_reloads_total``, ``kura_public_tls_reload_failures_total``: certificate
  reloads done and refused (the old certificate kept);
* ``kura_public_tls_certificate_expiry_timestamp_seconds``: the served leaf's notAfter (0
  without TLS), for an expiry alert.
* ``kura_internal_auth_failures_total{reason}`` (``peer_auth_collector``): requests to
  ``/_internal/`` refused for missing or invalid peer credentials.

Across worker processes (``kura.workers.metrics_merge``): refusals are summed; the token file
reload count, the failing flag and the key count are the primary's (workers take in what it took,
``api.auth.TokenAuth.share``); the TLS reloads are the most any process made (one swap is
counted once, not once per process) and the expiry is the earliest any process still serves
(an expiry alert fires until every process has the renewed certificate).
"""

from __future__ import annotations

from kura.api.auth import TokenAuth
from kura.api.metrics import Scraped, counter, counts, gauge
from kura.api.peer_auth import PeerAuth
from kura.api.public_tls import PublicTls


def auth_collector(auth: TokenAuth, tls: PublicTls | None) -> Scraped:
    """The client credential and public TLS families of one process."""
    return Scraped(
        counts(
            "kura_auth_refusals",
            "Public requests refused for credentials: missing or invalid (401), forbidden (403).",
            "reason",
            lambda: dict(auth.refusals_total),
        ),
        counter(
            "kura_auth_token_file_reloads",
            "Token files re-read after a change.",
            lambda: auth.token_file_reloads_total,
        ),
        gauge(
            "kura_auth_token_file_failing",
            "1 while a token file's last re-read failed (its previous tokens still in use).",
            lambda: auth.token_file_failing,
        ),
        gauge(
            "kura_auth_jwks_keys",
            "JWT verification keys held (1 for KURA_AUTH_JWT_PUBLIC_KEY, 0 without JWT).",
            lambda: auth.jwt.key_count if auth.jwt is not None else 0,
        ),
        counter(
            "kura_public_tls_reloads",
            "Public TLS certificate reloads after the files changed.",
            lambda: tls.reloads_total if tls else 0,
        ),
        counter(
            "kura_public_tls_reload_failures",
            "Changed certificate files that did not load (the old certificate kept serving).",
            lambda: tls.reload_failures_total if tls else 0,
        ),
        gauge(
            "kura_public_tls_certificate_expiry_timestamp_seconds",
            "notAfter of the public listener's certificate, unix seconds (0 without TLS).",
            lambda: tls.expiry_timestamp_seconds if tls else 0,
        ),
        across_processes={
            "kura_auth_token_file_reloads": "primary",
            "kura_auth_token_file_failing": "primary",
            "kura_auth_jwks_keys": "primary",
            "kura_public_tls_reloads": "max",
            "kura_public_tls_reload_failures": "max",
            "kura_public_tls_certificate_expiry_timestamp_seconds": "min",
        },
    )


def peer_auth_collector(peer_auth: PeerAuth) -> Scraped:
    """``kura_internal_auth_failures_total{reason}`` of the internal listener (``api.peer_auth``)."""
    return Scraped(
        counts(
            "kura_internal_auth_failures",
            "Requests to /_internal/ refused for missing or invalid peer credentials.",
            "reason",
            lambda: peer_auth.failures_total,
        )
    )
