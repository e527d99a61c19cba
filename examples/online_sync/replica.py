"""Replica side of online sync: replay the trainer's deltas in order and check the forward matches.

    python examples/online_sync/replica.py --dir /tmp/sync

Builds the model with ``training=False`` (value rows hold embeddings only: the optimizer state in the
deltas is dropped), replays every ``delta_rank*_<seq>.pt`` in sequence order with
``ReplayContent.EMBEDDING_ONLY``, loads the dense weights, and compares its output on the held-out batch
with the trainer's, bit for bit. Exits 0 when they match, 1 otherwise.
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

from common import HELD_OUT_STEP, build_model, make_batch

from dynamicemb_core.incremental_dump import ReplayContent, replay_increment


def _sequence(path: str) -> int:
    match = re.search(r"_(\d+)\.pt$", path)
    return int(match.group(1)) if match else -1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--key-space", type=int, default=400)
    args = parser.parse_args(argv)

    model = build_model(training=False)
    files = sorted(
        glob.glob(os.path.join(args.dir, "delta_rank*_*.pt")), key=lambda p: (_sequence(p), p)
    )
    if not files:
        print(f"replica: no delta files in {args.dir}", file=sys.stderr)
        return 1
    for path in files:
        deltas = torch.load(path, weights_only=False)
        replay_increment(model, deltas, ReplayContent.EMBEDDING_ONLY)
    model.mlp.load_state_dict(torch.load(os.path.join(args.dir, "dense.pt")))
    model.eval()
    with torch.no_grad():
        indices, offsets, _ = make_batch(HELD_OUT_STEP, args.batch_size, args.key_space)
        ours = model(indices, offsets)
    reference = torch.load(os.path.join(args.dir, "reference.pt"))
    same = torch.equal(ours, reference)
    diff = (ours - reference).abs().max().item()
    print(
        f"replica: replayed {len(files)} deltas; forward {'matches' if same else 'DIFFERS'} (max |diff| {diff:g})"
    )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
