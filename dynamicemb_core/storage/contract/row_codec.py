"""The byte layout external storages (Redis, RocksDB) use for one stored row, and for keys.

A value is a fixed 8-byte header, the score words, then the row, all little-endian::

    offset  size           field
    0       1              format version (ROW_FORMAT_VERSION, currently 1)
    1       1              dtype code of the row elements (see DTYPE_CODES)
    2       1              num_scores
    3       1              reserved, 0
    4       4              row_width as uint32 (elements: embedding then optimizer state)
    8       8*num_scores   score words, int64, in the table's strategy-tuple order
    ...     row_width*item the row elements (float32 / float16 / bfloat16 / float64)

A reader compares the whole header with the one its table spec implies and raises
:class:`RowFormatError` on any difference, so a table re-created with another dim, optimizer,
dtype or score strategy never reads old bytes as numbers. Keys are 8-byte little-endian int64,
optionally after a fixed prefix. Encoding and decoding are batched numpy operations: one join or one
``tobytes`` per call, never a per-element Python loop.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from dynamicemb_core.types import StorageTableSpec

__all__ = [
    "DTYPE_CODES",
    "HEADER_BYTES",
    "KEY_BYTES",
    "ROW_FORMAT_VERSION",
    "RowCodec",
    "RowFormatError",
    "decode_keys",
    "decode_spans",
    "encode_keys",
]

ROW_FORMAT_VERSION = 1
HEADER_BYTES = 8
KEY_BYTES = 8
DTYPE_CODES: Dict[torch.dtype, int] = {
    torch.float32: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.float64: 4,
}
_DTYPE_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}


class RowFormatError(ValueError):
    """A stored value does not have the layout this table expects."""


def _require_little_endian() -> None:
    # Rows are copied as raw bytes of the tensor; on a big-endian host those bytes would not be the
    # documented little-endian layout.
    if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
        raise NotImplementedError("the row codec supports little-endian hosts only")


def _split(buf: bytes, width: int) -> List[bytes]:
    return [buf[i : i + width] for i in range(0, len(buf), width)]


def encode_keys(keys: torch.Tensor, prefix: bytes = b"") -> List[bytes]:
    """``prefix + int64 little-endian`` for each key of a (n,) int64 tensor (any device)."""
    _require_little_endian()
    raw = (
        keys.detach()
        .to("cpu", torch.int64)
        .contiguous()
        .numpy()
        .view(np.uint8)
        .reshape(-1, KEY_BYTES)
    )
    if prefix:
        head = np.frombuffer(prefix, dtype=np.uint8)
        raw = np.concatenate([np.broadcast_to(head, (raw.shape[0], head.size)), raw], axis=1)
    return _split(raw.tobytes(), raw.shape[1]) if raw.shape[0] else []


def decode_keys(raw: Sequence[bytes], prefix_len: int = 0) -> torch.Tensor:
    """Inverse of :func:`encode_keys`: (n,) int64 CPU tensor from encoded keys."""
    if not raw:
        return torch.empty(0, dtype=torch.int64)
    joined = np.frombuffer(b"".join(raw), dtype=np.uint8).reshape(len(raw), prefix_len + KEY_BYTES)
    return torch.from_numpy(
        np.ascontiguousarray(joined[:, prefix_len:]).view("<i8").reshape(-1).copy()
    )


class RowCodec:
    """Encodes and decodes the stored rows of one table.

    Args:
        spec: the table; fixes dtype, row_width and num_scores of every value.
        context: prefix for error messages (``"demb-redis: table 'user'"``).
    """

    def __init__(self, spec: StorageTableSpec, context: str = "") -> None:
        _require_little_endian()
        if spec.dtype not in DTYPE_CODES:
            raise TypeError(
                f"table {spec.name!r}: dtype {spec.dtype} has no stored-row code; supported: "
                f"{sorted(str(d) for d in DTYPE_CODES)}"
            )
        if not 0 < spec.row_width < 2**32 or not 0 < spec.num_scores < 256:
            raise ValueError(
                f"table {spec.name!r}: row_width / num_scores out of range for the header"
            )
        self.spec = spec
        self.context = context or f"table {spec.name!r}"
        self.item_bytes = torch.empty(0, dtype=spec.dtype).element_size()
        self.scores_bytes = 8 * spec.num_scores
        self.row_bytes = spec.row_width * self.item_bytes
        self.value_bytes = HEADER_BYTES + self.scores_bytes + self.row_bytes
        self.header = self._header(
            ROW_FORMAT_VERSION, DTYPE_CODES[spec.dtype], spec.num_scores, spec.row_width
        )
        self._zero_value = bytes(self.value_bytes)

    @staticmethod
    def _header(version: int, dtype_code: int, num_scores: int, row_width: int) -> np.ndarray:
        head = np.zeros(HEADER_BYTES, dtype=np.uint8)
        head[0], head[1], head[2] = version, dtype_code, num_scores
        head[4:8] = np.frombuffer(np.uint32(row_width).astype("<u4").tobytes(), dtype=np.uint8)
        return head

    def encode(self, rows: torch.Tensor, scores: torch.Tensor) -> List[bytes]:
        """One value per row. ``rows`` (n, row_width) of the spec's dtype, ``scores`` (n, num_scores) int64."""
        n = rows.shape[0]
        if n == 0:
            return []
        row_u8 = (
            rows.detach()
            .to("cpu")
            .contiguous()
            .view(torch.uint8)
            .numpy()
            .reshape(n, self.row_bytes)
        )
        score_u8 = (
            scores.detach()
            .to("cpu", torch.int64)
            .contiguous()
            .numpy()
            .view(np.uint8)
            .reshape(n, -1)
        )
        out = np.empty((n, self.value_bytes), dtype=np.uint8)
        out[:, :HEADER_BYTES] = self.header
        out[:, HEADER_BYTES : HEADER_BYTES + self.scores_bytes] = score_u8
        out[:, HEADER_BYTES + self.scores_bytes :] = row_u8
        return _split(out.tobytes(), self.value_bytes)

    def decode_items(
        self, items: Sequence[Tuple[bytes, bytes]], prefix_len: int = 0
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode stored ``(key, value)`` pairs, e.g. one page of an export scan.

        Args:
            items: keys as :func:`encode_keys` wrote them (after a ``prefix_len``-byte prefix) and
                their values.
            prefix_len: bytes before each key's int64.

        Returns:
            ``(keys, rows, scores)`` on the CPU: (n,) int64, (n, row_width), (n, num_scores) int64.

        Raises:
            RowFormatError: a value's length or header differs from this table's layout.
        """
        keys = decode_keys([k for k, _ in items], prefix_len)
        _, rows, scores = self.decode([v for _, v in items], keys)
        return keys, rows, scores

    def decode(
        self, values: Sequence[Optional[bytes]], keys: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Decode values fetched for n keys (None = missing).

        Args:
            values: n stored values or None.
            keys: the (n,) keys, only to name the first bad one in an error.

        Returns:
            ``(found, rows, scores)`` on the CPU: (n,) bool, (n, row_width) of the spec's dtype
            (zeros where missing), (n, num_scores) int64 (zeros where missing).

        Raises:
            RowFormatError: a value's length or header differs from this table's layout.
        """
        n = len(values)
        found_np = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        if n == 0 or not found_np.any():
            rows = torch.zeros(n, self.spec.row_width, dtype=self.spec.dtype)
            return (
                torch.from_numpy(found_np),
                rows,
                torch.zeros(n, self.spec.num_scores, dtype=torch.int64),
            )
        if {len(v) for v in values if v is not None} != {self.value_bytes}:
            bad, value = next(
                (i, v) for i, v in enumerate(values) if v is not None and len(v) != self.value_bytes
            )
            self._raise(bad, keys, f"stored value is {len(value)} bytes", value)
        # Missing keys get an all-zero value, so one join and one copy decode the whole batch.
        zero = self._zero_value
        arr = np.frombuffer(b"".join([zero if v is None else v for v in values]), dtype=np.uint8)
        arr = arr.reshape(n, self.value_bytes)
        mismatch = (arr[:, :HEADER_BYTES] != self.header).any(axis=1) & found_np
        if mismatch.any():
            bad = int(np.argmax(mismatch))
            self._raise(bad, keys, "stored header differs", values[bad])
        body = arr[:, HEADER_BYTES + self.scores_bytes :].copy(order="C")
        rows = torch.from_numpy(body).view(self.spec.dtype).reshape(n, self.spec.row_width)
        words = arr[:, HEADER_BYTES : HEADER_BYTES + self.scores_bytes].copy(order="C").view("<i8")
        return (
            torch.from_numpy(found_np),
            rows,
            torch.from_numpy(words).reshape(n, self.spec.num_scores),
        )

    def describe(self, value: bytes) -> str:
        """The header fields of a stored value, for error messages."""
        if len(value) < HEADER_BYTES:
            return f"{len(value)} bytes, too short for a header"
        version, code, num_scores = value[0], value[1], value[2]
        width = int.from_bytes(value[4:8], "little")
        dtype = _DTYPE_BY_CODE.get(code, f"unknown code {code}")
        return f"version {version}, dtype {dtype}, num_scores {num_scores}, row_width {width}"

    def _raise(
        self, index: int, keys: Optional[torch.Tensor], what: str, value: Optional[bytes]
    ) -> None:
        key = f" key {int(keys[index])}" if keys is not None else ""
        expected = self.describe(bytes(self.header) + b"\0" * (self.value_bytes - HEADER_BYTES))
        raise RowFormatError(
            f"{self.context}{key}: {what} ({self.describe(value or b'')}); this reader expects "
            f"{expected} ({self.value_bytes} bytes). The table was written with another dim, "
            f"optimizer, dtype or score strategy: use a fresh namespace or migrate the data"
        )


def decode_spans(
    codecs: Sequence["RowCodec"],
    spans: Sequence[Tuple[int, int, int]],
    values: Sequence[Optional[bytes]],
    keys: torch.Tensor,
) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Decode a multi-table call's values, grouped by table.

    Args:
        codecs: one codec per table id.
        spans: ``[(table id, start, end)]``: table id's values are ``values[start:end]``.
        values, keys: the call's values and keys in that (table) order.

    Returns:
        ``(found, rows, scores)`` covering ``values`` in order: one per span, or a single one for
        all of them when every table present shares one layout (one join and one copy for the
        whole call). A bad value raises the error of its own table's codec.
    """
    if not spans:
        return []
    first = codecs[spans[0][0]]
    if len(spans) > 1 and all(np.array_equal(codecs[t].header, first.header) for t, _, _ in spans):
        try:
            return [first.decode(values, keys)]
        except RowFormatError:
            pass  # decode per table below: the error then names the right table
    return [codecs[t].decode(values[a:b], keys[a:b]) for t, a, b in spans]
