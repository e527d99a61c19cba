"""The row byte layout of external storages, at its old import path (external plugins import it from here).

The code lives in :mod:`dynamicemb_core.storage.contract.row_codec`; this module only re-exports it.
"""

from dynamicemb_core.storage.contract.row_codec import (
    DTYPE_CODES,
    HEADER_BYTES,
    KEY_BYTES,
    ROW_FORMAT_VERSION,
    RowCodec,
    RowFormatError,
    decode_keys,
    decode_spans,
    encode_keys,
)

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
