"""The row ledger's full matrix (slow): world 1/2/3 gloo x every dist_type x EBC and EC, with the
score strategies, admission and index dedup spread over those runs so that every value meets
several world sizes and sharding rules; each run also reloads its dump at another world size.
The AOTInductor package (compiled before the replay, attached, then checked after it) runs once."""

from __future__ import annotations

import itertools

import pytest

from tests.ledger.scenario import Case, run_reload, run_scenario
from tests.shard.dist_harness import run_workers

SCORES = ("TIMESTAMP", "STEP", "LFU", "CUSTOMIZED", "NO_EVICTION")
GRID = list(
    itertools.product((1, 2, 3), ("continuous", "roundrobin", "hash_roundrobin"), (True, False))
)


def _case(i: int, world: int, dist_type: str, pooled: bool) -> Case:
    return Case(
        pooled=pooled,
        dist_type=dist_type,
        score=SCORES[i % len(SCORES)],
        admission=i % 2 == 1,
        dedup=not pooled and i % 4 < 2,
        export=pooled,
        batch=12,
        table_rows=1200 if SCORES[i % len(SCORES)] == "NO_EVICTION" else 0,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("i", "world", "dist_type", "pooled"),
    [(i, *g) for i, g in enumerate(GRID)],
    ids=[f"w{w}-{d}-{'ebc' if p else 'ec'}" for w, d, p in GRID],
)
def test_matrix(tmp_path, i: int, world: int, dist_type: str, pooled: bool) -> None:
    case = _case(i, world, dist_type, pooled)
    run_workers(run_scenario, case, str(tmp_path), world=world, timeout=600)
    run_workers(run_reload, case, str(tmp_path), world=world % 3 + 1, timeout=600)


@pytest.mark.slow
def test_aoti_package_follows_replay(tmp_path) -> None:
    case = Case(export=True, aoti=True)
    run_workers(run_scenario, case, str(tmp_path), world=1, timeout=900)
