"""The contracts plugins implement: Storage, Counter, AdmissionStrategy, and their small enums.

These ABCs are the whole plugin surface (ARCHITECTURE.md principle 4). The core never imports a
plugin; it asks :mod:`dynamicemb_core.plugins` for a factory by name and talks to the result only
through the methods below.
"""

from __future__ import annotations

import abc
import enum
import inspect
import warnings
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import torch

from dynamicemb_core.devices import normalize_device

__all__ = [
    "BUCKET_ALIGNMENT",
    "DEMB_TABLE_ALIGN_SIZE",
    "MAX_BUCKET_CAPACITY",
    "AdmissionStrategy",
    "CopyMode",
    "Counter",
    "DynamicEmbError",
    "DynamicEmbInitializerArgs",
    "DynamicEmbInitializerMode",
    "DynamicEmbWarning",
    "MemoryType",
    "PerTableStorage",
    "Storage",
    "StorageTableSpec",
    "common_row_dtype",
]

# The seed's ``dynamicemb.types`` names these; the options (dynamicemb_core.config) re-export them.
# Bucket widths must be multiples of this many slots: the CUDA probe reads a bucket's digests in
# 16-byte vectors (see csrc/include/dynamicemb/bucket_layout.h).
BUCKET_ALIGNMENT: int = 16
# The seed's name for the alignment table capacities are rounded to (the same number).
DEMB_TABLE_ALIGN_SIZE: int = BUCKET_ALIGNMENT
# Sentinel bucket_capacity meaning "one bucket spanning the whole (per-rank) table".
MAX_BUCKET_CAPACITY: int = 2**63 - 1


class DynamicEmbInitializerMode(enum.Enum):
    """How a new embedding row is filled."""

    NORMAL = "normal"
    TRUNCATED_NORMAL = "truncated_normal"
    UNIFORM = "uniform"
    CONSTANT = "constant"
    DEBUG = "debug"


@dataclass
class DynamicEmbInitializerArgs:
    """Parameters of an initializer; ``lower``/``upper`` left None are completed by the planner."""

    mode: DynamicEmbInitializerMode = DynamicEmbInitializerMode.UNIFORM
    mean: float = 0.0
    std_dev: float = 1.0
    lower: Optional[float] = None
    upper: Optional[float] = None
    value: float = 0.0


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


def _own_methods(cls: type) -> set:
    """Names defined by ``cls`` or a base below the contract classes."""
    names: set = set()
    for klass in cls.__mro__:
        if klass.__module__ == __name__:
            break
        names.update(vars(klass))
    return names


def _has_per_table_find(cls: type) -> bool:
    """Whether ``cls`` (or a base of it outside this module) defines find(self, table_id, ...)."""
    for klass in cls.__mro__:
        if klass.__module__ == __name__:
            return False
        find = vars(klass).get("find")
        if find is not None:
            try:
                params = list(inspect.signature(find).parameters)
            except (TypeError, ValueError):
                return False
            return len(params) >= 2 and params[1] == "table_id"
    return False


def common_row_dtype(tables: Sequence[StorageTableSpec]) -> torch.dtype:
    """The dtype of a multi-table call's rows matrix: the one dtype every table stores.

    One rows matrix cannot carry two dtypes bit for bit (torch's float16 -> float32 -> float16
    does not keep NaN payloads), so a multi-table storage holds tables of one dtype; tables of
    another dtype go to another storage (the core builds one storage per table).
    """
    dtypes = sorted({str(spec.dtype) for spec in tables})
    if len(dtypes) != 1:
        raise ValueError(
            f"a Storage holds tables of one dtype (its calls carry one rows matrix); got "
            f"{', '.join(f'{spec.name!r}: {spec.dtype}' for spec in tables)}. Use one storage "
            "per dtype"
        )
    return tables[0].dtype


class _StorageBase(abc.ABC):  # noqa: B024 (the contracts below declare the abstract methods)
    """What both storage contracts share: the tables, the device, and the optional hooks."""

    def __init__(
        self, tables: Sequence[StorageTableSpec], device: Union[torch.device, str]
    ) -> None:
        self.tables = list(tables)
        self.device = normalize_device(device)

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


class Storage(_StorageBase):
    """A key -> (row, scores) store for several logical tables; every call addresses all of them.

    A Storage is the last tier (or the only tier) behind a device cache. Each data call takes
    ``(keys, table_ids)``: two (n,) int64 tensors on one device, pair i naming key ``keys[i]`` of
    table ``table_ids[i]`` (an index into ``self.tables``), so one call can touch every table and a
    backend can serve it with one round trip. The tables of one Storage share a dtype
    (:attr:`row_dtype`); rows travel in one (n, :attr:`max_row_width`) matrix of it: a key of table t uses the first ``tables[t].row_width`` columns (the rest
    are ignored on insert and zero on find); scores in one (n, :attr:`max_num_scores`) int64 matrix,
    the first ``tables[t].num_scores`` words in the order of the table's score strategy tuple.

    Every method validates its whole input before it writes anything
    (:mod:`dynamicemb_core.storage.contract.checks`), and a backend that cannot reach its data raises
    rather than returning zeros. Plugins written against the older per-table contract subclass
    :class:`PerTableStorage` instead; the core wraps them (``dynamicemb_core.plugins.as_storage``).
    """

    # True on a subclass written against the 0.1 per-table signatures (see __init_subclass__).
    _per_table_contract = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Recognise a subclass written for the 0.1 contract, where ``Storage`` was per table.

        Such a class defines ``find(self, table_id, keys)`` and ``size(table_id)``. It keeps
        working: it is marked, warned about (``DeprecationWarning``: subclass
        :class:`PerTableStorage` instead), given the multi-table abstract ``sizes`` it lacks, and
        ``as_storage`` (every path by which the core receives a storage) wraps it in the per-table
        adapter like a :class:`PerTableStorage`.
        """
        super().__init_subclass__(**kwargs)
        if not _has_per_table_find(cls) or "sizes" in _own_methods(cls):
            return
        cls._per_table_contract = True
        warnings.warn(
            f"{cls.__module__}.{cls.__qualname__} subclasses dynamicemb_core.types.Storage with the "
            "0.1 per-table signatures (find(table_id, keys), size(table_id)); subclass "
            "PerTableStorage instead (same methods), or implement the multi-table contract "
            "(find(keys, table_ids)). It is wrapped in the per-table adapter meanwhile",
            DeprecationWarning,
            stacklevel=3,  # the class statement (through ABCMeta.__new__)
        )

        def sizes(self: "Storage", table_ids: Optional[Sequence[int]] = None) -> List[int]:
            ids = range(len(self.tables)) if table_ids is None else table_ids
            return [int(self.size(t)) for t in ids]  # type: ignore[attr-defined]

        cls.sizes = sizes  # type: ignore[method-assign]

    @property
    def max_row_width(self) -> int:
        """Columns of the rows matrix: the widest table's ``row_width``."""
        return max(spec.row_width for spec in self.tables)

    @property
    def max_num_scores(self) -> int:
        """Columns of the scores matrix: the most score words any table keeps."""
        return max(spec.num_scores for spec in self.tables)

    @property
    def row_dtype(self) -> torch.dtype:
        """The dtype rows travel in: the one dtype every table of this storage stores."""
        return common_row_dtype(self.tables)

    @abc.abstractmethod
    def find(
        self, keys: torch.Tensor, table_ids: torch.Tensor
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Look ``(table id, key)`` pairs up, in any mix of tables.

        Args:
            keys: (n,) int64.
            table_ids: (n,) int64 on the keys' device, each in ``[0, len(self.tables))``.

        Returns:
            ``(found, rows, scores)``: (n,) bool; (n, max_row_width) of ``row_dtype``, rows of
            missing keys unspecified and columns past the key's table's width zero; (n,
            max_num_scores) int64. All on ``self.device``.
        """

    @abc.abstractmethod
    def insert(
        self,
        keys: torch.Tensor,
        table_ids: torch.Tensor,
        rows: torch.Tensor,
        scores: torch.Tensor,
    ) -> None:
        """Insert or overwrite pairs (unique within the call).

        ``rows`` (n, max_row_width) of ``row_dtype`` and ``scores`` (n, max_num_scores) int64, on
        the keys' device; columns past each key's table's width are ignored.
        """

    @abc.abstractmethod
    def erase(self, keys: torch.Tensor, table_ids: torch.Tensor) -> None:
        """Remove pairs; missing ones are ignored."""

    @abc.abstractmethod
    def sizes(self, table_ids: Optional[Sequence[int]] = None) -> List[int]:
        """Keys stored per table, for ``table_ids`` (default: every table), in that order."""

    @abc.abstractmethod
    def export(
        self, table_ids: Optional[Sequence[int]] = None, batch_size: int = 65536
    ) -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Yield ``(keys, table_ids, rows, scores)`` batches (at most ``batch_size`` pairs each,
        shaped as :meth:`find` returns them) that cover every key of the given tables (default:
        every table) once."""


class PerTableStorage(_StorageBase):
    """The per-table storage contract (before 0.2): one table id per call.

    Still accepted everywhere a :class:`Storage` is: the core wraps an instance in
    ``dynamicemb_core.plugins.PerTableAdapter``, which splits each multi-table call by table id
    into one call per table present. Write a :class:`Storage` when the backend can serve several
    tables in one round trip; this one when it cannot gain from that.
    """

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
