"""Exceptions raised by checkpoint reading, loading and replay.

Each subclasses ``ValueError`` (STYLE rule 9: our exceptions subclass the matching builtin) so callers that
already catch bad input keep working, while tests and tools can tell the reasons apart.
"""

from __future__ import annotations

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CheckpointMismatchError",
    "CheckpointWriteError",
    "IncompatibleDeltaError",
]


class CheckpointError(ValueError):
    """A checkpoint or delta cannot be used; nothing was written to any table."""


class CheckpointCorruptError(CheckpointError):
    """A file is truncated, has a wrong magic number or version, or fails its checksum."""


class CheckpointMismatchError(CheckpointError):
    """A well-formed file was written for a table of another shape (dim, dtype, score columns, ...)."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint file failed (a full disk, no permission, ...); the message names the file
    and the OS error (``errno`` holds its number), which is chained as the cause. The folder is left
    without a manifest, so it loads as an unfinished dump, never as a partial one."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class IncompatibleDeltaError(CheckpointError):
    """A delta's layout (capacity, bucket width, score words, world size, ...) differs from the target's."""
