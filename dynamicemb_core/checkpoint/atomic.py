"""Crash-safe file writes: a temp file in the same folder, fsync, ``os.replace``, fsync of the folder.

A reader therefore sees either the previous complete file or the new complete file, never a prefix. The
checkpoint's manifest is written last with the same function, so a dump that dies halfway leaves no
manifest and is refused by the loader.

The temp file is ``.<name>.<random>.tmp`` beside the destination. A write that fails removes it; a
process killed mid-write cannot, so :func:`remove_stale_temps` deletes that pattern and the next
``DynamicEmbDump`` into the folder calls it before writing.
"""

from __future__ import annotations

import glob
import os
import tempfile
from typing import Iterable, List, Union

from dynamicemb_core.checkpoint.errors import CheckpointWriteError

__all__ = ["atomic_write", "fsync_dir", "remove_stale_temps"]

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

    Raises:
        CheckpointWriteError: the OS refused a step (a full disk, no permission, ...); the message
            names ``path`` and no temp file is left.
    """
    try:
        return _atomic_write(path, chunks)
    except OSError as err:
        raise CheckpointWriteError(
            f"writing checkpoint file {path} failed: {err.strerror or err} (errno {err.errno})",
            err.errno,
        ) from err


def remove_stale_temps(folder: str, names: Iterable[str]) -> List[str]:
    """Delete temp files that an interrupted :func:`atomic_write` left in ``folder``.

    Args:
        folder: where the destinations live.
        names: destination-name globs (``"*.demb"``, ``"MANIFEST.json"``); only ``.<name>.*.tmp``
            files matching one of them are touched.

    Returns:
        The paths removed.
    """
    removed = []
    for name in names:
        for path in glob.glob(os.path.join(folder, f".{name}.*.tmp")):
            if os.path.isfile(path) and not os.path.islink(path):
                os.unlink(path)
                removed.append(path)
    return removed


def _atomic_write(path: str, chunks: Iterable[Chunk]) -> int:
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
