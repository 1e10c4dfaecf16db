"""What every bare app of ``bench/stacks.py`` loads at start: the seeded blobs.

``STACKS_ROOT`` (environment) is a directory of files named by their key (sha256 hex of the
body, written by ``bench/stacks.py`` before the servers start). Every process of every server
loads all of them into a dict once, so a GET from memory finds its key in whichever process
the kernel hands the connection to. A PUT stores into a dict of its own process.
"""

from __future__ import annotations

import os

PREFIXES = ("/mem/", "/stream/", "/file/")
STREAM_CHUNK_BYTES = 64 * 1024  # the streamed GET's write size: 16 writes per 1 MiB body
# PUT bodies kept per process: the dict is emptied when it reaches this many keys, so a run of
# 1 KiB PUTs at tens of thousands per second stays at about 60 MiB per process.
PUT_KEYS_MAX = 50_000


def root() -> str:
    """The seed directory (``STACKS_ROOT``)."""
    return os.environ["STACKS_ROOT"]


def load_blobs() -> tuple[dict[str, bytes], dict[str, str]]:
    """(key -> body bytes, key -> absolute file path) of every file in ``root()``."""
    blobs: dict[str, bytes] = {}
    paths: dict[str, str] = {}
    base = root()
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                blobs[name] = f.read()
            paths[name] = path
    return blobs, paths
