"""HTTPS on the public listener, with the certificate reloaded when its files change.

``KURA_PUBLIC_TLS_CERT_PATH`` (the chain, leaf first, PEM) and ``KURA_PUBLIC_TLS_KEY_PATH``
(its key, PEM) make the public listener speak TLS 1.2+ with the defaults of
``ssl.create_default_context`` (no client certificate asked for: clients authenticate with
tokens). ``run()`` looks at both files every ``POLL_SECONDS`` (inode, size, mtime, following
symlinks, so a Kubernetes Secret's atomic ``..data`` swap is seen) and, on a change, loads the
pair into a scratch context first: only a pair that loads and matches is then loaded into the
live context, so a half-written or mismatched pair keeps the old certificate serving and is
logged. OpenSSL copies the certificate into each connection when it is accepted, so new
handshakes get the new certificate and open connections keep theirs. The gRPC listener takes
the same pair from ``loaded`` (``kura.grpc.server``), so both ports swap together.
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path

from kit.backoff import every

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
_Signature = tuple[tuple[int, int, int], ...]


class PublicTls:
    """The live server context for ``cert``/``key``; the first load raises ``OSError`` naming
    both files, so a node never starts without its certificate."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._signature = self._stat()
        try:
            self.context.load_cert_chain(str(cert), str(key))
            self.expiry_timestamp_seconds = _not_after(cert)
        except (ssl.SSLError, ValueError) as exc:  # OpenSSL's words alone name no file
            raise OSError(
                f"cannot load the public TLS certificate {cert} with the key {key} "
                f"(KURA_PUBLIC_TLS_CERT_PATH, KURA_PUBLIC_TLS_KEY_PATH): {exc}"
            ) from exc
        # (generation, (key PEM, chain PEM)) of the pair in the live context, swapped as one
        # value: the gRPC server's certificate fetcher reads it from grpcio's threads.
        self.loaded: tuple[int, tuple[bytes, bytes]] = (0, (key.read_bytes(), cert.read_bytes()))
        self.reloads_total = 0
        self.reload_failures_total = 0
        self._failed: str | None = None

    def _stat(self) -> _Signature:
        stats = (os.stat(self.cert), os.stat(self.key))
        return tuple((s.st_ino, s.st_size, s.st_mtime_ns) for s in stats)

    def reload_if_changed(self) -> bool:
        """Load a changed pair into the live context; True when it did. Never raises."""
        try:
            signature = self._stat()
            if signature == self._signature:
                return False
            pair = (self.key.read_bytes(), self.cert.read_bytes())
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                str(self.cert), str(self.key)
            )
            self.context.load_cert_chain(str(self.cert), str(self.key))
            expiry = _not_after(self.cert)
            if (self.key.read_bytes(), self.cert.read_bytes()) != pair:
                return False  # changed again while loading: the next poll loads it whole
        except (OSError, ssl.SSLError, ValueError) as exc:
            if self._failed != str(exc):
                self.reload_failures_total += 1
                self._failed = str(exc)
                log.warning("cannot reload the public TLS certificate, keeping the old: %s", exc)
            return False
        self._signature, self._failed = signature, None
        self.expiry_timestamp_seconds = expiry
        self.loaded = (self.loaded[0] + 1, pair)
        self.reloads_total += 1
        log.info("public TLS certificate reloaded from %s", self.cert)
        return True

    async def run(self) -> None:
        """Poll for a changed pair until cancelled."""

        async def poll() -> None:
            self.reload_if_changed()

        await every(poll, POLL_SECONDS, what="public TLS certificate check", log=log)


def _not_after(cert: Path) -> float:
    """The leaf's (first certificate's) notAfter as unix seconds; ``ValueError`` if unparsable."""
    from cryptography import x509  # ~9 MiB per process: loaded only when TLS is configured

    leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    return leaf.not_valid_after_utc.timestamp()
