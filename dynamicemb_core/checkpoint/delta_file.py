"""Delta files: :func:`incremental_dump` results shipped between machines, in a format with no code.

A delta travels from a trainer to replicas through a folder or a bucket that others may be able to
write to. ``torch.save`` of a :class:`DeltaDumpResult` is a pickle of arbitrary objects, and loading
one with ``weights_only=False`` runs whatever code a crafted file names. :func:`save_deltas` writes
plain containers only (dicts, lists, str, int, float, bool, None and tensors), which
``torch.load(..., weights_only=True)`` reads without running code; :func:`load_deltas` reads with
exactly that and refuses, with :class:`~dynamicemb_core.checkpoint.errors.CheckpointCorruptError`
naming the file, anything that is not a delta file of this format.

``meta["table_options"]`` travels as its plain fields (sizes, enums, dtypes, initializer
arguments, plugin *names*); plugin objects, callables and the ``*_options`` dicts stay behind: a
delta carries a table's layout, not its configuration or the credentials in it. A loaded delta's
``table_options`` is rebuilt from those fields (what :func:`replay_increment` compares).

The format::

    {"format": "dynamicemb_core.delta", "version": 1,
     "collections": {collection: {field of DeltaDumpResult: [one value per table]}}}
"""

from __future__ import annotations

import dataclasses
import enum
import io
from typing import Any, Dict, Mapping

import torch

from dynamicemb_core import config as _config
from dynamicemb_core.checkpoint.atomic import atomic_write
from dynamicemb_core.checkpoint.errors import CheckpointCorruptError
from dynamicemb_core.checkpoint.types import DeltaDumpResult
from dynamicemb_core.config import DynamicEmbInitializerArgs, DynamicEmbTableOptions

__all__ = ["DELTA_FORMAT", "DELTA_FORMAT_VERSION", "load_deltas", "save_deltas"]

DELTA_FORMAT = "dynamicemb_core.delta"
DELTA_FORMAT_VERSION = 1

# The enums an option may hold, by name: the only classes a file can make the loader build.
_ENUMS: Dict[str, type] = {
    name: obj
    for name, obj in vars(_config).items()
    if isinstance(obj, type) and issubclass(obj, enum.Enum) and name in _config.__all__
}
_DROPPED = object()  # an option value that does not travel (a callable, a plugin instance)
# Fields that configure plugins: they may hold credentials, and a replica brings its own.
_PLUGIN_OPTION_FIELDS = frozenset(
    f.name for f in dataclasses.fields(DynamicEmbTableOptions) if f.name.endswith("_options")
)
# Fields holding one value per table (a list, column-aligned with table_names).
_PER_TABLE_FIELDS = frozenset(
    f.name for f in dataclasses.fields(DeltaDumpResult) if f.default_factory is list
)
_TENSOR_FIELDS = ("keys", "values", "optimizer_states", "scores")
_OPTIONAL_TENSOR_FIELDS = ("evicted_keys", "erased_keys")


class _Refused(Exception):
    """Internal: what is wrong with a file's content (turned into CheckpointCorruptError)."""


# -- table options: plain fields only -------------------------------------------------------------


def _encode_option(value: Any) -> Any:
    if isinstance(value, enum.Enum):  # before int: an IntEnum is an int, but pickles as its class
        if _ENUMS.get(type(value).__name__) is type(value):
            return {"enum": type(value).__name__, "value": value.value}
        return _DROPPED
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, DynamicEmbInitializerArgs):
        return {"initializer": {f.name: _encode_option(getattr(value, f.name))
                                for f in dataclasses.fields(value)}}  # fmt: skip
    if isinstance(value, (tuple, list)):
        items = [_encode_option(v) for v in value]
        return _DROPPED if any(i is _DROPPED for i in items) else {"tuple": items}
    return _DROPPED


def _decode_option(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (tag, body), = value.items()  # fmt: skip
        if tag == "tuple" and isinstance(body, list):
            return tuple(_decode_option(v) for v in body)
        if tag == "dtype" and isinstance(body, str):
            dtype = getattr(torch, body, None)
            if isinstance(dtype, torch.dtype):
                return dtype
        if tag == "initializer" and isinstance(body, dict):
            return DynamicEmbInitializerArgs(**{k: _decode_option(v) for k, v in body.items()})
    if isinstance(value, dict) and set(value) == {"enum", "value"} and value["enum"] in _ENUMS:
        return _ENUMS[value["enum"]](value["value"])
    raise _Refused(f"an option value {value!r} of no known form")


def _encode_options(options: DynamicEmbTableOptions) -> Dict[str, Any]:
    out = {}
    for f in dataclasses.fields(options):
        if f.name in _PLUGIN_OPTION_FIELDS:
            continue
        encoded = _encode_option(getattr(options, f.name))
        if encoded is not _DROPPED:
            out[f.name] = encoded
    return out


def _decode_options(fields: Any) -> DynamicEmbTableOptions:
    if not isinstance(fields, dict):
        raise _Refused(f"meta['table_options'] is a {type(fields).__name__}, not a dict")
    known = {f.name for f in dataclasses.fields(DynamicEmbTableOptions)} - _PLUGIN_OPTION_FIELDS
    unknown = sorted(set(fields) - known)
    if unknown:
        raise _Refused(f"meta['table_options'] has fields {unknown} DynamicEmbTableOptions lacks")
    try:
        return DynamicEmbTableOptions(**{k: _decode_option(v) for k, v in fields.items()})
    except (TypeError, ValueError) as exc:
        raise _Refused(f"meta['table_options'] is not valid: {exc}") from None


# -- plain values ----------------------------------------------------------------------------------


def _plain(value: Any, where: str) -> Any:
    """``value`` as weights_only-safe containers; TypeError naming ``where`` for anything else."""
    if value is None or type(value) in (bool, int, float, str):  # exact: no IntEnum, no subclass
        return value
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()  # a view would ship its whole base storage
        return tensor
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TypeError(
        f"save_deltas: {where} is a {type(value).__name__}; a delta file holds tensors, numbers, "
        f"strings, lists and dicts only"
    )


def _encode_collection(name: str, delta: DeltaDumpResult) -> Dict[str, Any]:
    if not isinstance(delta, DeltaDumpResult):
        raise TypeError(
            f"save_deltas: deltas[{name!r}] is a {type(delta).__name__}, not a DeltaDumpResult"
        )
    out: Dict[str, Any] = {}
    for f in dataclasses.fields(delta):
        value = getattr(delta, f.name)
        if f.name == "meta":
            metas = []
            for i, meta in enumerate(value):
                meta = dict(meta)
                if isinstance(meta.get("table_options"), DynamicEmbTableOptions):
                    meta["table_options"] = _encode_options(meta["table_options"])
                metas.append(_plain(meta, f"deltas[{name!r}].meta[{i}]"))
            out["meta"] = metas
        else:
            out[f.name] = _plain(value, f"deltas[{name!r}].{f.name}")
    return out


def _decode_collection(name: str, body: Any) -> DeltaDumpResult:
    if not isinstance(body, dict):
        raise _Refused(f"collection {name!r} is a {type(body).__name__}, not a dict")
    names = body.get("table_names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise _Refused(f"collection {name!r}: table_names is not a list of str")
    fields = {f.name for f in dataclasses.fields(DeltaDumpResult)}
    unknown = sorted(set(body) - fields)
    if unknown:
        raise _Refused(f"collection {name!r}: fields {unknown} DeltaDumpResult lacks")
    values: Dict[str, Any] = {}
    for field in sorted(fields & set(body)):
        column = body[field]
        if field not in _PER_TABLE_FIELDS:  # a scalar field of the result (none in version 1)
            values[field] = column
            continue
        if not isinstance(column, list) or len(column) != len(names):
            raise _Refused(
                f"collection {name!r}: {field} is not a list of {len(names)} (one per table)"
            )
        for i, item in enumerate(column):
            where = f"collection {name!r} table {names[i]!r}: {field}"
            if field in _TENSOR_FIELDS and not isinstance(item, torch.Tensor):
                raise _Refused(f"{where} is a {type(item).__name__}, not a tensor")
            if field in _OPTIONAL_TENSOR_FIELDS and not (
                item is None or isinstance(item, torch.Tensor)
            ):
                raise _Refused(f"{where} is a {type(item).__name__}, not a tensor or None")
            if field == "meta" and not isinstance(item, dict):
                raise _Refused(f"{where} is a {type(item).__name__}, not a dict")
        if field == "meta":
            column = [
                {**m, "table_options": _decode_options(m["table_options"])}
                if "table_options" in m
                else dict(m)
                for m in column
            ]
        values[field] = list(column)
    return DeltaDumpResult(**values)


# -- the files -------------------------------------------------------------------------------------


def save_deltas(deltas: Mapping[str, DeltaDumpResult], path: str) -> int:
    """Write ``{collection: DeltaDumpResult}`` (what :func:`incremental_dump` returns) to ``path``.

    The file holds plain containers only, so :func:`load_deltas` reads it with
    ``torch.load(..., weights_only=True)``. It is written atomically (a temp file, fsync, rename):
    a replica polling the folder sees the previous file or the whole new one, never a prefix.

    Returns:
        The number of bytes written.

    Raises:
        TypeError: naming the collection and field, for a value that is not a tensor, number,
            string, list or dict (nothing is written).
    """
    if not isinstance(deltas, Mapping):
        raise TypeError(
            f"save_deltas: deltas must be a mapping {{collection: DeltaDumpResult}} (what "
            f"incremental_dump returns), got {type(deltas).__name__}"
        )
    content = {
        "format": DELTA_FORMAT,
        "version": DELTA_FORMAT_VERSION,
        "collections": {str(k): _encode_collection(str(k), v) for k, v in deltas.items()},
    }
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return atomic_write(path, [buffer.getbuffer()])


def load_deltas(path: str) -> Dict[str, DeltaDumpResult]:
    """Read a file written by :func:`save_deltas`: ``{collection: DeltaDumpResult}``, on the CPU.

    Reads with ``torch.load(..., weights_only=True)``: a file naming any Python object other than
    plain containers and tensors is refused before anything in it runs.

    Raises:
        CheckpointCorruptError: naming ``path``, for a file that is not a delta file of this format
            (a pickle of other objects, ``torch.save`` of a ``DeltaDumpResult`` itself, another
            version, a damaged or inconsistent file).
    """
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:  # an unpickling refusal, a truncated zip, not a torch file at all
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise CheckpointCorruptError(
            f"load_deltas: {path} is not a delta file written by save_deltas, or is damaged; "
            f"refused without running anything in it ({type(exc).__name__}: {reason})"
        ) from None
    try:
        if not isinstance(content, dict) or content.get("format") != DELTA_FORMAT:
            raise _Refused(f"it has no '{DELTA_FORMAT}' format tag")
        if content.get("version") != DELTA_FORMAT_VERSION:
            raise _Refused(
                f"it is version {content.get('version')!r}; this reader knows "
                f"{DELTA_FORMAT_VERSION}"
            )
        collections = content.get("collections")
        if not isinstance(collections, dict):
            raise _Refused("'collections' is not a dict")
        return {str(k): _decode_collection(str(k), v) for k, v in collections.items()}
    except _Refused as exc:
        raise CheckpointCorruptError(
            f"load_deltas: {path} is not a valid delta file: {exc}"
        ) from None
