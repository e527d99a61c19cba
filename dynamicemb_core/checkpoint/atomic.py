"""Crash-safe file writes: a temp file in the same folder, fsync, ``os.replace``, fsync of the folder.

A reader therefore sees either the previous complete file or the new complete file, never a prefix. The
checkpoint's manifest is written last with the same function, so a dump that dies halfway leaves no
manifest and is refused by the loader.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterable, Union

__all__ = ["atomic_write", "fsync_dir"]

Chunk = Union[bytes, bytearray, memoryview]


def fsync_dir(path: str) -> None:
    """Flush a folder's entries to disk so a rename inside it survives a power cut (POSIX only)."""
    if os.name != "posix":  # pragma: no cover - Windows has no directory fsync
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, chunks: Iterable[Chunk]) -> int:
    """Write ``chunks`` to ``path`` atomically and durably.

    Args:
        path: destination file; its folder must exist.
        chunks: byte buffers written in order (tensors' memory views avoid a copy).

    Returns:
        The number of bytes written.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    written = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                written += memoryview(chunk).nbytes
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return written
