"""``python -m dynamicemb_core export``: a DynamicEmbDump folder -> a served AOTInductor package.

    python -m dynamicemb_core export --dump DIR --out model.pt2 [--spec tables.json]
        [--collection PATH] [--pooling SUM|MEAN|NONE] [--device cpu|cuda] [--program]

Without ``--spec`` every table of the collection is served with one feature named after it, the
dump's dim, score strategy and ``dist_type``, zeros for missing keys, and per shard a capacity of
twice its rows (rounded up to whole buckets). A served table that should take the trainer's deltas
needs the trainer's layout: give its options in ``--spec``, a JSON file::

    {"tables": [{"name": "user", "features": ["user_id"], "pooling": "SUM",
                 "options": {"max_capacity": 65536, "bucket_capacity": 128,
                             "score_strategy": "TIMESTAMP", "dist_type": "roundrobin",
                             "eval_initializer_args": {"mode": "CONSTANT", "value": 0.0}}}]}

Writes the package (or, with ``--program``, the ``torch.export`` program) and ``<out>.json``: the
input order (features), output widths and collection, which a server needs to build its batches.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from dynamicemb_core.config import (
    DynamicEmbInitializerArgs,
    DynamicEmbInitializerMode,
    DynamicEmbPoolingMode,
    DynamicEmbScoreStrategy,
    DynamicEmbTableOptions,
)

__all__ = ["main", "tables_from_dump"]


@dataclass
class _Config:
    """The fields of a TorchRec embedding config the collections read."""

    name: str
    embedding_dim: int
    feature_names: List[str]
    pooling: Any


@dataclass
class _Pooling:
    name: str


def _options(raw: Dict[str, Any], dim: int) -> DynamicEmbTableOptions:
    fields = dict(raw)
    strategy = fields.pop("score_strategy", None)
    if strategy is not None:
        names = [strategy] if isinstance(strategy, str) else list(strategy)
        parsed = tuple(DynamicEmbScoreStrategy[n] for n in names)
        fields["score_strategy"] = parsed[0] if len(parsed) == 1 else parsed
    for key in ("eval_initializer_args", "initializer_args"):
        if key in fields:
            args = dict(fields[key])
            args["mode"] = DynamicEmbInitializerMode[args.get("mode", "CONSTANT")]
            fields[key] = DynamicEmbInitializerArgs(**args)
    return DynamicEmbTableOptions(dim=dim, training=False, **fields)


def tables_from_dump(
    dump: str, collection: Optional[str], spec: Optional[Dict[str, Any]], pooling: str
) -> Tuple[str, List[_Config], Dict[str, DynamicEmbTableOptions]]:
    """The collection path, table configs and options to serve a dump with (see module doc)."""
    from dynamicemb_core.checkpoint.format import read_shard_header
    from dynamicemb_core.checkpoint.manifest import entries_by_table, read_manifest

    grouped = entries_by_table(read_manifest(dump))
    collections = sorted({c for c, _ in grouped})
    if collection is None:
        if len(collections) != 1:
            raise SystemExit(
                f"export: {dump} holds collections {collections}; pick one with --collection"
            )
        collection = collections[0]
    if collection not in collections:
        raise SystemExit(f"export: {dump} has no collection {collection!r}; it has {collections}")
    present = [t for c, t in grouped if c == collection]
    wanted = {t["name"]: t for t in (spec or {}).get("tables", [])} or {t: {} for t in present}
    missing = [t for t in wanted if t not in present]
    if missing:
        raise SystemExit(
            f"export: the dump has no table {missing} in {collection!r}; it has {present}"
        )
    configs, options = [], {}
    for name, entry in wanted.items():
        files = grouped[(collection, name)]
        header = read_shard_header(os.path.join(dump, files[0].path))
        raw = dict(entry.get("options", {}))
        raw.setdefault("score_strategy", list(header.score_columns))
        raw.setdefault("dist_type", header.extra.get("dist_type", "roundrobin"))
        if "max_capacity" not in raw:
            bucket = int(raw.get("bucket_capacity", DynamicEmbTableOptions.bucket_capacity))
            rows = max(f.num_rows for f in files)
            raw["max_capacity"] = max(1, -(-2 * rows // bucket)) * bucket
        options[name] = _options(raw, header.dim)
        mode = entry.get("pooling", pooling)
        configs.append(
            _Config(name, header.dim, list(entry.get("features", [name])), _Pooling(mode))
        )
    return collection, configs, options


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dynamicemb_core export",
        description="Serve a DynamicEmbDump: build the inference collection, export, compile.",
    )
    parser.add_argument("--dump", required=True, help="DynamicEmbDump folder")
    parser.add_argument("--out", required=True, help="package to write (.pt2)")
    parser.add_argument("--spec", help="JSON: tables, features, pooling, options (module doc)")
    parser.add_argument("--collection", help="collection path inside the dump")
    parser.add_argument("--pooling", default="SUM", choices=["SUM", "MEAN", "NONE"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--program", action="store_true", help="write the torch.export program")
    args = parser.parse_args(argv)

    from dynamicemb_core.inference.collection import (
        InferenceEmbeddingBagCollection,
        InferenceEmbeddingCollection,
    )
    from dynamicemb_core.inference.export import LookupModule, compile_package, export_model

    spec = None
    if args.spec:
        with open(args.spec, encoding="utf-8") as f:
            spec = json.load(f)
    collection, configs, options = tables_from_dump(args.dump, args.collection, spec, args.pooling)
    sequence = {c.pooling.name for c in configs} == {"NONE"}
    cls = InferenceEmbeddingCollection if sequence else InferenceEmbeddingBagCollection
    served = cls.from_dump(args.dump, configs, options, args.device, collection=collection)
    model = LookupModule(served)
    num_features = len(served.feature_names)
    batch = 4  # an example batch of two ids per bag; every size is exported as dynamic
    values = torch.arange(2 * num_features * batch, device=args.device)
    offsets = torch.arange(0, values.numel() + 1, 2, device=args.device)
    program = export_model(model, (values, offsets))
    if args.program:
        torch.export.save(program, args.out)
    else:
        compile_package(program, args.out)
    pooled = DynamicEmbPoolingMode.NONE if sequence else None
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(
            {
                "collection": collection,
                "features": served.feature_names,
                "dims": served.embeddings.feature_dims,
                "output": "sequence (N, D)" if pooled else "pooled (B, sum of dims)",
                "inputs": ["values (N,) int64", "offsets (F*B+1,) int64, feature-major"],
                "tables": served.embeddings.table_sizes(),
            },
            f,
            indent=1,
        )
    sizes = ", ".join(f"{k}={v}" for k, v in served.embeddings.table_sizes().items())
    print(
        f"export: {args.out} ({'program' if args.program else 'AOTInductor package'}); "
        f"features {served.feature_names}; keys {sizes}"
    )
    return 0
