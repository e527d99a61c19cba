"""Replica side of online sync: serve the trainer's tables read-only, kept fresh by its deltas.

    python examples/online_sync/replica.py --dir /tmp/sync [--export]

Builds the served model: the two tables as an ``InferenceEmbeddingBagCollection`` (keys and
embeddings only, no optimizer state), empty, under the trainer's MLP. Replays every
``delta_rank*_<seq>.pt`` in sequence order into it (``InferenceEmbeddingBagCollection.replay``,
embeddings only), loads the dense weights, and compares its output on the held-out batch with the
trainer's, bit for bit. With ``--export`` the served model is exported (``torch.export``) after the
first delta and the remaining deltas are replayed under it: the exported program must give the same
answer without being exported again. Exits 0 when everything matches, 1 otherwise.

Every file is read with ``weights_only=True`` (deltas through ``load_deltas``): anyone who can write
to the sync folder can put a file there, and a pickle loaded with ``weights_only=False`` runs
whatever code it names. A file that is not in the format is refused (CheckpointCorruptError).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import HELD_OUT_STEP, build_replica, make_batch

from dynamicemb_core.incremental_dump import load_deltas


def _sequence(path: str) -> int:
    match = re.search(r"_(\d+)\.pt$", path)
    return int(match.group(1)) if match else -1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--key-space", type=int, default=400)
    parser.add_argument("--export", action="store_true", help="serve an exported program too")
    args = parser.parse_args(argv)

    model = build_replica()
    model.mlp.load_state_dict(torch.load(os.path.join(args.dir, "dense.pt"), weights_only=True))
    model.eval()
    served = model.sparse.collection
    indices, offsets, _ = make_batch(HELD_OUT_STEP, args.batch_size, args.key_space)
    files = sorted(
        glob.glob(os.path.join(args.dir, "delta_rank*_*.pt")), key=lambda p: (_sequence(p), p)
    )
    if not files:
        print(f"replica: no delta files in {args.dir}", file=sys.stderr)
        return 1
    exported = None
    for i, path in enumerate(files):
        served.replay(load_deltas(path))
        if args.export and i == 0:
            from dynamicemb_core.inference import export_model

            exported = export_model(model, (indices, offsets)).module()
    with torch.no_grad():
        ours = model(indices, offsets)
    reference = torch.load(os.path.join(args.dir, "reference.pt"), weights_only=True)
    same = torch.equal(ours, reference)
    diff = (ours - reference).abs().max().item()
    print(
        f"replica: replayed {len(files)} deltas into {served.embeddings.table_sizes()}; forward "
        f"{'matches' if same else 'DIFFERS'} (max |diff| {diff:g})"
    )
    if exported is not None:
        program_same = torch.equal(exported(indices, offsets), reference)
        print(f"replica: exported program {'matches' if program_same else 'DIFFERS'}")
        same = same and program_same
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
