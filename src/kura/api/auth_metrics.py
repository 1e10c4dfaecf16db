"""Metrics of client credentials and public TLS, registered whether or not they are configured
(zeros then), so dashboards and alerts can rely on the families:

* ``kura_auth_refusals_total{reason}``: 401s (``missing``, ``invalid``) and 403s
  (``forbidden``) from ``TokenAuth`` on the public routes;
* ``kura_auth_token_file_reloads_total``: token files re-read after a change;
* ``kura_auth_jwks_keys``: verification keys held (1 for a fixed key, 0 without JWT);
* ``kura_public_tls_reloads_total``, ``kura_public_tls_reload_failures_total``: certificate
  reloads done and refused (the old certificate kept);
* ``kura_public_tls_certificate_expiry_timestamp_seconds``: the served leaf's notAfter (0
  without TLS), for an expiry alert.
"""

from __future__ import annotations

from kura.api.auth import TokenAuth
from kura.api.metrics import KuraMetrics
from kura.api.public_tls import PublicTls


def watch_auth(metrics: KuraMetrics, auth: TokenAuth, tls: PublicTls | None) -> None:
    metrics.watch_counts(
        "kura_auth_refusals",
        "Public requests refused for credentials: missing or invalid (401), forbidden (403).",
        "reason",
        lambda: dict(auth.refusals_total),
    )
    metrics.watch_value(
        "counter",
        "kura_auth_token_file_reloads",
        "Token files re-read after a change.",
        lambda: auth.token_file_reloads_total,
    )
    metrics.watch_value(
        "gauge",
        "kura_auth_jwks_keys",
        "JWT verification keys held (1 for KURA_AUTH_JWT_PUBLIC_KEY, 0 without JWT).",
        lambda: auth.jwt.key_count if auth.jwt is not None else 0,
    )
    metrics.watch_value(
        "counter",
        "kura_public_tls_reloads",
        "Public TLS certificate reloads after the files changed.",
        lambda: tls.reloads_total if tls else 0,
    )
    metrics.watch_value(
        "counter",
        "kura_public_tls_reload_failures",
        "Changed certificate files that did not load (the old certificate kept serving).",
        lambda: tls.reload_failures_total if tls else 0,
    )
    metrics.watch_value(
        "gauge",
        "kura_public_tls_certificate_expiry_timestamp_seconds",
        "notAfter of the public listener's certificate, unix seconds (0 without TLS).",
        lambda: tls.expiry_timestamp_seconds if tls else 0,
    )
