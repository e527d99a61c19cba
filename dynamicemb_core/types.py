"""The contracts plugins implement: Storage, Counter, AdmissionStrategy, and their small enums.

These ABCs are the whole plugin surface (ARCHITECTURE.md principle 4). The core never imports a
plugin; it asks :mod:`dynamicemb_core.plugins` for a factory by name and talks to the result only
through the methods below.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Sequence, Tuple, Union

import torch

from dynamicemb_core.devices import normalize_device

if TYPE_CHECKING:  # pragma: no cover
    from dynamicemb_core.config import DynamicEmbInitializerArgs

__all__ = [
    "AdmissionStrategy",
    "CopyMode",
    "Counter",
    "DynamicEmbError",
    "DynamicEmbWarning",
    "MemoryType",
    "Storage",
    "StorageTableSpec",
]


# The seed's ``dynamicemb.types`` also names these; they live with the options (resolved lazily: the
# options module imports this one).
_FROM_CONFIG = (
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "MAX_BUCKET_CAPACITY",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
)


def __getattr__(name: str) -> object:
    if name in _FROM_CONFIG:
        import dynamicemb_core.config as config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DynamicEmbError(RuntimeError):
    """Raised when a table operation cannot be completed (for example a key that cannot be placed)."""


class DynamicEmbWarning(UserWarning):
    """Warnings the user can act on: insert failures under WARNING mode, decreasing CUSTOMIZED scores."""


class MemoryType(enum.Enum):
    """Where a component keeps its memory; used by ``memory_usage``."""

    DEVICE = "device"  # the table's accelerator (or the CPU for a CPU table)
    HOST = "host"  # host (pinned where possible) memory
    EXTERNAL = "external"  # another process or disk: Redis, RocksDB, ...


class CopyMode(enum.Enum):
    """Whether a storage returns rows as views into its own memory or as fresh copies."""

    VIEW = "view"  # caller must not keep the tensor past the next mutating call
    COPY = "copy"  # caller owns the result


@dataclass(frozen=True)
class StorageTableSpec:
    """One logical table a :class:`Storage` holds.

    Attributes:
        name: the table's name (unique inside one storage).
        dim: embedding width in elements.
        row_width: whole stored row in elements: embedding followed by optimizer state.
        dtype: element dtype of the row.
        num_scores: score words kept per key (1, or 2 for the compound strategy).
        capacity: how many keys the storage should be prepared to hold (a hint; 0 = unknown).
    """

    name: str
    dim: int
    row_width: int
    dtype: torch.dtype = torch.float32
    num_scores: int = 1
    capacity: int = 0


class Storage(abc.ABC):
    """A key -> (row, scores) store for several logical tables, addressed by table id.

    A Storage is the last tier (or the only tier) behind a device cache. Rows are whole stored rows
    (embedding then optimizer state) of ``spec.row_width`` elements; scores are int64 words in the
    order of the table's score strategy tuple. Every method validates its whole input before it writes
    anything, and a backend that cannot reach its data raises rather than returning zeros.
    """

    def __init__(
        self, tables: Sequence[StorageTableSpec], device: Union[torch.device, str]
    ) -> None:
        self.tables = list(tables)
        self.device = normalize_device(device)

    @abc.abstractmethod
    def find(
        self, table_id: int, keys: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Look keys up in one table.

        Args:
            table_id: index into ``self.tables``.
            keys: (n,) int64.

        Returns:
            ``(found, rows, scores)``: (n,) bool; (n, row_width) of the table's dtype, rows of missing
            keys are unspecified; (n, num_scores) int64. All on ``self.device``.
        """

    @abc.abstractmethod
    def insert(
        self, table_id: int, keys: torch.Tensor, rows: torch.Tensor, scores: torch.Tensor
    ) -> None:
        """Insert or overwrite keys. ``keys`` (n,) int64 unique; ``rows`` (n, row_width); ``scores`` (n, num_scores) int64."""

    @abc.abstractmethod
    def erase(self, table_id: int, keys: torch.Tensor) -> None:
        """Remove keys; missing keys are ignored."""

    @abc.abstractmethod
    def size(self, table_id: int) -> int:
        """Number of keys stored for the table."""

    @abc.abstractmethod
    def export(
        self, table_id: int, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(keys, rows, scores)`` batches covering every key of the table once."""

    def dump(self, path: str) -> None:  # noqa: B027 (optional hook, no-op default)
        """Persist everything under ``path``. The default writes nothing: durable backends override."""

    def load(self, path: str) -> None:  # noqa: B027 (optional hook, no-op default)
        """Read back what :meth:`dump` wrote. The default reads nothing."""

    def flush(self) -> None:  # noqa: B027 (optional hook, no-op default)
        """Make previous writes durable/visible. Default: nothing buffered."""

    def close(self) -> None:  # noqa: B027 (optional hook, no-op default)
        """Release connections and handles."""

    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes this storage holds in ``mem_type`` memory (0 when unknown)."""
        return 0


class Counter(abc.ABC):
    """A counter table mapping a key to an accumulated frequency, used by admission."""

    @abc.abstractmethod
    def add(self, keys: torch.Tensor, frequencies: torch.Tensor, inplace: bool) -> torch.Tensor:
        """Add frequencies for unique ``keys``; return the accumulated frequency of each key.

        Missing keys start at the given frequency; with ``inplace`` the sums are stored.
        """

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor) -> None:
        """Forget keys (for example once they are admitted)."""

    @abc.abstractmethod
    def memory_usage(self, mem_type: MemoryType = MemoryType.DEVICE) -> int:
        """Bytes held in ``mem_type`` memory."""

    @abc.abstractmethod
    def load(self, key_file: str, counter_file: str) -> None:
        """Load keys and frequencies written by :meth:`dump`."""

    @abc.abstractmethod
    def dump(self, key_file: str, counter_file: str) -> None:
        """Write keys (int64) and frequencies (int64) to two files."""

    @abc.abstractmethod
    def create(self, device: torch.device) -> "Counter":
        """Return a fresh, empty counter of the same configuration on ``device``."""


class AdmissionStrategy(abc.ABC):
    """Decides which keys missing from a table are admitted (stored) after counting."""

    @abc.abstractmethod
    def admit(self, keys: torch.Tensor, frequencies: torch.Tensor) -> torch.Tensor:
        """Return a (n,) bool mask of the keys to admit, given their accumulated frequencies."""

    @abc.abstractmethod
    def get_initializer_args(self) -> Optional["DynamicEmbInitializerArgs"]:
        """Initializer for keys that are not admitted (None: the table's own initializer)."""
