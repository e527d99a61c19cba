"""Trainer side of online sync: train, and ship what changed as numbered delta files.

    python examples/online_sync/trainer.py --dir /tmp/sync --steps 30 --dump-every 10

Writes into ``--dir``:
- ``delta_rank<r>_<seq>.pt``: ``incremental_dump`` results (``save_deltas``: a format that loads with
  ``weights_only=True``), every ``--dump-every`` steps and once more after
  the last step (training goes on after the last periodic dump, and those updates must ship too);
- ``dense.pt``: the MLP's weights (a delta carries embeddings only; without the dense part a replica's
  forward is a fresh model's);
- ``reference.pt``: the trainer's output on the held-out batch, for the replica to compare against.

This run owns its rank's file sequence: it removes that rank's delta files left by an earlier run before
writing, so a shorter run cannot leave a previous run's higher-numbered files to be replayed after its own.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from typing import List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import HELD_OUT_STEP, build_model, make_batch

from dynamicemb_core.checkpoint.atomic import atomic_write
from dynamicemb_core.checkpoint.collectives import global_rank
from dynamicemb_core.incremental_dump import get_score, incremental_dump, save_deltas


def _save(obj: object, path: str) -> None:
    """A tensor or state dict (weights_only-safe), written atomically."""
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write(path, [buf.getbuffer()])  # a replica never sees half a file


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dump-every", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--key-space", type=int, default=400)
    args = parser.parse_args(argv)

    os.makedirs(args.dir, exist_ok=True)
    rank = global_rank()
    for stale in glob.glob(os.path.join(args.dir, f"delta_rank{rank}_*.pt")):
        os.unlink(stale)

    model = build_model(training=True)
    dense_opt = torch.optim.SGD(model.mlp.parameters(), lr=0.05)
    threshold = get_score(model)  # everything touched from now on
    seq = 0

    def dump() -> None:
        nonlocal threshold, seq
        deltas = incremental_dump(model, threshold)
        threshold = get_score(model)
        save_deltas(deltas, os.path.join(args.dir, f"delta_rank{rank}_{seq:04d}.pt"))  # atomic
        rows = sum(k.numel() for d in deltas.values() for k in d.keys)
        print(f"dump {seq}: {rows} changed rows")
        seq += 1

    model.train()
    for step in range(args.steps):
        indices, offsets, labels = make_batch(step, args.batch_size, args.key_space)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(indices, offsets), labels)
        dense_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        if (step + 1) % args.dump_every == 0:
            dump()
    if args.steps % args.dump_every != 0 or args.steps == 0:
        dump()  # the steps after the last periodic dump

    _save(model.mlp.state_dict(), os.path.join(args.dir, "dense.pt"))
    model.eval()
    with torch.no_grad():
        indices, offsets, _ = make_batch(HELD_OUT_STEP, args.batch_size, args.key_space)
        _save(model(indices, offsets), os.path.join(args.dir, "reference.pt"))
    print(f"trainer: {args.steps} steps, {seq} delta files in {args.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
