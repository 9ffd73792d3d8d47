"""A zip split over several files, read in place, and the checks of what is extracted from it.

Contract: ``Joined(paths)`` reads the files ``paths`` as one seekable stream (``zipfile.ZipFile`` opens a split
zip through it, never joined on disk); ``crc32(path)`` is a file's CRC-32 and ``intact(path, size, crc)`` says
whether a file has a zip member's size and CRC-32 (False when it is missing or unreadable).
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Sequence
from pathlib import Path


class Joined(io.RawIOBase):
    """The files ``paths`` read as one seekable stream (a split zip, in place)."""

    def __init__(self, paths: Sequence[Path]):
        self._files = [open(p, "rb") for p in paths]
        self._starts, total = [], 0
        for f in self._files:
            self._starts.append(total)
            total += os.fstat(f.fileno()).st_size
        self._size, self._pos = total, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence] + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        view, done = memoryview(buffer).cast("B"), 0
        while done < len(view) and self._pos < self._size:
            i = max(j for j, s in enumerate(self._starts) if s <= self._pos)
            f = self._files[i]
            f.seek(self._pos - self._starts[i])
            n = f.readinto(view[done:done + (self._starts[i + 1] - self._pos if i + 1 < len(self._files) else len(view))])
            if not n:
                break
            done, self._pos = done + n, self._pos + n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def crc32(path: Path) -> int:
    """The CRC-32 of the file ``path``, read in 4 MB blocks."""
    crc = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return crc


def intact(path: Path, size: int, crc: int) -> bool:
    """Whether ``path`` has ``size`` bytes and CRC-32 ``crc`` (a zip member's, extracted whole)."""
    try:
        return path.stat().st_size == size and crc32(path) == crc
    except OSError:
        return False
