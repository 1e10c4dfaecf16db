"""A real ext4 filesystem in an image file, loop-mounted, for corrupting bytes *below* it.

Flipping a byte through the filesystem changes the file's ctime, which the node can notice.
Silent corruption (a failing disk, a bad controller) changes the bytes and nothing else. To
make that happen for real, ``Ext4Image`` unmounts the filesystem, looks up the physical block
that holds a file's byte (``debugfs bmap``), flips the byte in the image file, and mounts it
again: the file's size, inode, mtime and ctime are exactly as before, only its data differs.

Needs root (mount) and e2fsprogs (``mkfs.ext4``, ``debugfs``); either missing fails the test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

BLOCK_BYTES = 4096


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


class Ext4Image:
    def __init__(self, image: Path, mountpoint: Path, size_bytes: int = 64 * 1024 * 1024):
        self.image = image
        self.mountpoint = mountpoint
        with image.open("wb") as f:
            f.truncate(size_bytes)
        _run("mkfs.ext4", "-q", "-F", "-b", str(BLOCK_BYTES), "-O", "^has_journal", str(image))
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.mounted = False
        self.mount()

    def mount(self) -> None:
        _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        self.mounted = True

    def unmount(self) -> None:
        if self.mounted:
            _run("umount", str(self.mountpoint))
            self.mounted = False

    def flip_byte_below(self, path: Path, offset: int) -> None:
        """Flip the byte at ``offset`` of ``path`` (a file on this filesystem) in the image,
        with the filesystem unmounted, then mount it again."""
        inside = "/" + str(path.relative_to(self.mountpoint))
        self.unmount()
        out = _run("debugfs", "-R", f"bmap {inside} {offset // BLOCK_BYTES}", str(self.image))
        physical = int(out.strip().split()[-1])
        assert physical > 0, out
        at = physical * BLOCK_BYTES + offset % BLOCK_BYTES
        with self.image.open("r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0xFF]))
        self.mount()
