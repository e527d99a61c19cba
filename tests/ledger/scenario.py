"""One row-ledger scenario: a row-wise sharded TorchRec model trained over gloo ranks, then every move.

``run_scenario(rank, world, case, folder)`` (a ``run_workers`` body) trains the model, erases a few
keys (holes in buckets), and checks with :mod:`dynamicemb_core.testing.row_ledger`:

1. ``DynamicEmbDump`` -> ``DynamicEmbLoad`` into a fresh twin of the same world size (rows, optimizer
   state, non-clock scores);
2. ``from_dump`` (and, at world size 1, ``from_model``) -> served collection (embeddings);
3. more training and erasures, ``incremental_dump`` -> ``replay_increment`` into the twin (the twin then
   equals the trainer), and -> ``replay`` into each served collection (keys outside the delta keep
   their rows, erased keys go, nothing else appears);
4. served lookups (and the exported program's, when ``case.export``) of held-out batches, seen and
   never-seen ids, equal the trainer's eval forward, bit for bit.

It leaves the dump and the trainer's ledger at dump time in ``folder`` for :func:`run_reload` (the
N -> M move: another world size loads the same dump).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from dynamicemb_core.testing import row_ledger as RL
from tests.shard.dist_harness import global_batch, rank_slice, shard_model

TABLES = ("a", "b")  # one shape: a mix-up of the two shows as wrong rows
FEATURES = {"a": ["fa0", "fa1"], "b": ["fb"]}
ALL_FEATURES = [f for t in TABLES for f in FEATURES[t]]


@dataclass(frozen=True)
class Case:
    """One point of the matrix."""

    pooled: bool = True
    dist_type: str = "roundrobin"
    score: str = "TIMESTAMP"
    admission: bool = False
    dedup: bool = False  # the EmbeddingCollection sharder's use_index_dedup
    export: bool = False
    aoti: bool = False
    rows: int = 300  # id space of training batches; held-out batches also read ids beyond it
    # num_embeddings of each table (0: rows). A NO_EVICTION trainer that grows after the dump
    # cannot be followed by replay into a served table of the dump's size (the replay refuses the
    # delta's capacity, tested with the doubled-capacity delta below): give it room instead.
    table_rows: int = 0
    bucket_capacity: int = 16
    steps: int = 4
    holes_in_dump: bool = True  # erase keys before the dump (a load packs the buckets)
    batch: int = 12  # global samples per step (a multiple of every world size used)
    extra: Dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"  # "cuda": one GPU a rank, NCCL (run_workers(..., backend="nccl"))

    @property
    def replayable(self) -> bool:
        return self.dist_type != "continuous"


def _strategy(case: Case) -> Any:
    from dynamicemb_core.config import DynamicEmbScoreStrategy

    return DynamicEmbScoreStrategy[case.score]


def configs_of(case: Case) -> List[Any]:
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig

    cls = EmbeddingBagConfig if case.pooled else EmbeddingConfig
    return [
        cls(
            name=t,
            embedding_dim=4,
            num_embeddings=case.table_rows or case.rows,
            feature_names=FEATURES[t],
        )
        for t in TABLES
    ]


def options_of(case: Case) -> Any:
    from dynamicemb_core import DynamicEmbTableOptions

    extra: Dict[str, Any] = {}
    if case.admission:
        from dynamicemb_core.admission import FrequencyAdmissionStrategy, KVCounter

        extra = dict(
            admit_strategy=FrequencyAdmissionStrategy(threshold=2),
            admission_counter=KVCounter(capacity=1024, bucket_capacity=16),
        )
    from dynamicemb_core.config import EvictedItemMode

    return DynamicEmbTableOptions(
        bucket_capacity=case.bucket_capacity,
        evicted_item_mode=EvictedItemMode.RETAIN_KEY,  # evictions travel in the delta: exact replay
        score_strategy=_strategy(case),
        dist_type=case.dist_type,
        **extra,
        **case.extra,
    )


def device_of(case: Case) -> torch.device:
    """Where this rank's tables live (its own GPU under NCCL)."""
    if case.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(case.device)


def build(case: Case, world: int) -> Any:
    """The sharded model (ADAM, so rows carry optimizer state)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from dynamicemb_core.planner import DynamicEmbParameterConstraints

    constraints = {
        t: DynamicEmbParameterConstraints(use_dynamicemb=True, dynamicemb_options=options_of(case))
        for t in TABLES
    }
    return shard_model(
        case.pooled,
        configs_of(case),
        constraints,
        {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.05},
        world,
        device_of(case),
        sharder_kwargs={"use_index_dedup": True} if case.dedup else None,
    )


def _batch(case: Case, step: int, rows: Optional[int] = None, max_len: int = 4) -> Any:
    space = {f: rows or case.rows for f in ALL_FEATURES}
    return global_batch(step, ALL_FEATURES, space, case.batch, max_len=max_len)


def _flat(out: Any, pooled: bool) -> List[torch.Tensor]:
    if pooled:
        return [out.detach().cpu()]
    return [out[f].values().detach().cpu() for f in ALL_FEATURES]


def train(model: Any, case: Case, rank: int, world: int, steps: range) -> None:
    from dynamicemb_core.checkpoint import set_score

    model.train()
    for step in steps:
        if case.score == "CUSTOMIZED":
            set_score(model, 10 * (step + 1))
        out = model(rank_slice(_batch(case, step), rank, world).to(device_of(case)))
        loss = sum(t.square().sum() for t in _flat_grad(out, case.pooled))
        loss.backward()


def _flat_grad(out: Any, pooled: bool) -> List[torch.Tensor]:
    return [out] if pooled else [out[f].values() for f in ALL_FEATURES]


def trainer_eval(model: Any, case: Case, rank: int, world: int, kjt: Any) -> List[torch.Tensor]:
    """The trainer's eval forward of a global batch: each rank its slice, gathered in rank order."""
    model.eval()
    with torch.no_grad():
        local = _flat(model(rank_slice(kjt, rank, world).to(device_of(case))), case.pooled)
    if world == 1:
        return local
    parts: List[Any] = [None] * world
    dist.all_gather_object(parts, local)
    return [torch.cat([p[i] for p in parts]) for i in range(len(local))]


def served_forward(served: Any, case: Case, kjt: Any) -> List[torch.Tensor]:
    with torch.no_grad():
        out = served(kjt.to(device_of(case)))
    return [out.values().cpu()] if case.pooled else [out[f].values().cpu() for f in ALL_FEATURES]


def held_out(case: Case) -> List[Any]:
    """Batches of ids seen in training and beyond the id space (never seen): bags of one id (exact
    under any sharding), then longer bags."""
    return [
        _batch(case, 900, rows=2 * case.rows, max_len=1),
        _batch(case, 901, rows=2 * case.rows, max_len=1),
        _batch(case, 902),
        _batch(case, 903, rows=2 * case.rows),
    ]


def check_held_out(
    case: Case, world: int, serve: Any, oracle: Any, batches: List[Any], what: str
) -> None:
    """Single-id bags bit for bit; longer bags too, except a pooled trainer of several ranks, which
    adds the ranks' partial sums in another order (a few ulps)."""
    RL.check_served(serve, oracle, batches[:2], what=what)
    atol = 1e-5 if case.pooled and world > 1 else 0.0
    RL.check_served(serve, oracle, batches[2:], what=what, atol=atol)


def _erase_some(model: Any, case: Case, seed: int) -> None:
    """Erase every 7th trained id of each table, remembered for the next delta (holes in buckets)."""
    from dynamicemb_core.checkpoint import erase
    from dynamicemb_core.config import EvictedItemMode

    keys = torch.arange(seed % 7, case.rows, 7, dtype=torch.int64)
    erase(model, {_collection(model): {t: keys for t in TABLES}}, EvictedItemMode.RETAIN_KEY)


def _collection(model: Any) -> str:
    from dynamicemb_core.checkpoint import find_tables

    return find_tables(model)[0].collection


def served_options(model: Any, case: Case) -> Dict[str, Any]:
    """The training options with ``max_capacity`` the planner gave each shard."""
    from dynamicemb_core.checkpoint import find_tables

    caps = {h.name: int(h.table.capacity(h.table_id)) for h in find_tables(model)}
    return {t: replace(options_of(case), max_capacity=caps[t]) for t in TABLES}


def served_classes(case: Case) -> Any:
    from dynamicemb_core.inference import (
        InferenceEmbeddingBagCollection,
        InferenceEmbeddingCollection,
    )

    return InferenceEmbeddingBagCollection if case.pooled else InferenceEmbeddingCollection


def run_scenario(rank: int, world: int, case: Case, folder: str) -> None:
    from dynamicemb_core.checkpoint import get_score, incremental_dump
    from dynamicemb_core.checkpoint.errors import IncompatibleDeltaError

    torch.manual_seed(rank)
    dump = os.path.join(folder, "dump")
    model = build(case, world)
    train(model, case, rank, world, range(case.steps))
    if case.holes_in_dump:
        _erase_some(model, case, 0)
    collection = _collection(model)
    at_dump = RL.ledger_of_model(model)
    assert at_dump, "the trainer holds no rows"
    tables_seen = {t for _, t, _ in at_dump}
    assert tables_seen == set(TABLES), tables_seen

    # 1. dump -> load into a fresh twin of the same world size
    RL.move_dump_load(dump, model, None)
    if rank == 0:
        torch.save(
            {"ledger": at_dump, "options": served_options(model, case)},
            os.path.join(folder, "ledger.pt"),
        )
    twin = build(case, world)
    RL.move_dump_load(dump, None, twin)
    full = ("embedding", "optimizer", "scores")
    RL.check_moved(
        at_dump, RL.ledger_of_model(twin), fields=full, what="DynamicEmbDump -> DynamicEmbLoad"
    )

    # 2. dump (and model) -> served collections
    cls = served_classes(case)
    options = served_options(model, case)
    served = {"from_dump": RL.move_from_dump(cls, dump, configs_of(case), options, device_of(case))}
    if world == 1:
        served["from_model"] = RL.move_from_model(cls, model)
    for how, s in served.items():
        assert s.collection == collection, (how, s.collection, collection)
        RL.check_moved(at_dump, RL.ledger_of_served(s), what=f"{how} -> served")
    if case.aoti and case.pooled:  # compiled now, attached: it must follow the replays below
        served["aoti package"] = _package(served["from_dump"], case, folder, rank)

    if not case.replayable:
        # incremental_dump cannot place keys of a continuous table: a clear refusal, nothing read
        try:
            incremental_dump(model, 0)
        except NotImplementedError as err:
            assert "continuous" in str(err)
        else:
            raise AssertionError("incremental_dump of a continuous table was not refused")
        _check_serving(model, case, rank, world, served)
        return

    # 3. more training and erasures, then the delta
    # LFU and NO_EVICTION scores are counts and insertion numbers: a threshold of get_score would
    # leave out keys trained since (by design, docs/conformance.md); 0 takes every row
    threshold = 0 if case.score in ("LFU", "NO_EVICTION") else get_score(model)
    train(model, case, rank, world, range(case.steps, case.steps + 2))
    _erase_some(model, case, 3)
    deltas = incremental_dump(model, threshold)
    now = RL.ledger_of_model(model)
    moved = RL.ledger_of_delta(deltas)
    RL.check_moved(moved, RL.select(now, moved.__contains__), fields=full, what="incremental_dump")
    d = deltas[collection]
    erased = {
        (collection, t, int(k))
        for i, t in enumerate(d.table_names)
        for k in d.erased_keys[i].tolist()
    }
    assert erased, "the scenario erases keys after the dump"
    evicted = {
        (collection, t, int(k))
        for i, t in enumerate(d.table_names)
        for k in (d.evicted_keys[i].tolist() if d.evicted_keys[i] is not None else [])
    }
    erased |= {key for key in evicted if key not in now}

    for how, s in served.items():
        if not hasattr(s, "embeddings"):
            continue  # a package reads the buffers of the collection it is attached to
        before = RL.ledger_of_served(s)
        RL.move_replay_served(s, deltas)
        after = RL.ledger_of_served(s)
        RL.check_moved(moved, after, before, removed=erased, what=f"{how} -> replay")
        RL.check_moved(now, after, what=f"{how} -> replay (whole)")

    twin_before = RL.ledger_of_model(twin)
    RL.move_replay_increment(deltas, twin)
    twin_after = RL.ledger_of_model(twin)
    RL.check_moved(
        moved, twin_after, twin_before, fields=full, removed=erased, what="replay_increment"
    )
    RL.check_moved(
        now, twin_after, fields=("embedding", "optimizer"), what="replay_increment (whole)"
    )

    # a delta of another layout is refused and leaves the served collection as it was
    s = served["from_dump"]
    other = _other_layout(deltas, collection)
    RL.check_refused(
        lambda: s.replay(other),
        lambda: RL.ledger_of_served(s),
        (IncompatibleDeltaError,),
        match=("capacity",),
        fields=("embedding",),
        what="replay of another layout",
    )
    _check_serving(model, case, rank, world, served)


class _Package:
    """An AOTInductor package of a served collection's lookup, attached to its live buffers."""

    def __init__(self, compiled: Any, module: Any) -> None:
        self.compiled, self.module = compiled, module

    def __call__(self, kjt: Any) -> Any:
        kjt = kjt.to(self.module.collection.embeddings.device)
        return self.compiled(kjt.values(), kjt.offsets())


def _package(served: Any, case: Case, folder: str, rank: int) -> _Package:
    from dynamicemb_core.inference import LookupModule, attach, compile_package, export_model
    from dynamicemb_core.inference.runtime import load_package

    module = LookupModule(served)
    first = held_out(case)[2].to(device_of(case))
    path = compile_package(
        export_model(module, (first.values(), first.offsets())),
        os.path.join(folder, f"served{rank}.pt2"),
        fast_compile=True,
        embed_constants=False,
    )
    compiled = load_package(path)
    attach(compiled, module)
    return _Package(compiled, module)


def _other_layout(deltas: Dict[str, Any], collection: str) -> Dict[str, Any]:
    """The delta with its last table's capacity doubled (as if from a larger table)."""
    import copy

    other = copy.copy(deltas[collection])
    other.meta = [dict(m) for m in other.meta]
    other.meta[-1]["current_capacity"] = 2 * int(other.meta[-1]["current_capacity"])
    return {collection: other}


def _check_serving(model: Any, case: Case, rank: int, world: int, served: Dict[str, Any]) -> None:
    batches = held_out(case)
    want = [trainer_eval(model, case, rank, world, kjt) for kjt in batches]
    for how, s in served.items():
        check_held_out(
            case,
            world,
            (lambda kjt, s=s: [s(kjt).cpu()])
            if isinstance(s, _Package)
            else (lambda kjt, s=s: served_forward(s, case, kjt)),
            lambda kjt: want[batches.index(kjt)],
            batches,
            how,
        )
    if case.export and case.pooled:
        _check_exported(served["from_dump"], case, world, batches, want)


def _check_exported(
    served: Any, case: Case, world: int, batches: List[Any], want: List[Any]
) -> None:
    from dynamicemb_core.inference import LookupModule, export_model

    module = LookupModule(served)
    device = device_of(case)
    first = batches[2].to(device)
    program = export_model(module, (first.values(), first.offsets())).module()
    check_held_out(
        case,
        world,
        lambda kjt: program(kjt.to(device).values(), kjt.to(device).offsets()),
        lambda kjt: want[batches.index(kjt)][0],
        batches,
        "exported program",
    )


def _check_packed_refuses_discard(model: Any, case: Case, world: int, dump: str) -> None:
    """After a load N -> M the keys stand where the load packed them, not at the source's slots:
    a delta that does not report its evictions (what an ``EvictedItemMode.DISCARD`` trainer
    sends) is refused before writing, naming why; the model is left as it was."""
    from dynamicemb_core.checkpoint import incremental_dump, replay_increment
    from dynamicemb_core.checkpoint.errors import IncompatibleDeltaError
    from dynamicemb_core.checkpoint.manifest import read_manifest

    if read_manifest(dump)[0].world_size == world or not case.replayable:
        return  # a load at the dump's own world size is slot-exact
    deltas = incremental_dump(model, 0)  # a delta of this world size's layout
    for delta in deltas.values():
        delta.evicted_keys = [None] * len(delta.table_names)  # as a DISCARD source's
    RL.check_refused(
        lambda: replay_increment(model, deltas, show_progress=False),
        lambda: RL.ledger_of_model(model),
        (IncompatibleDeltaError,),
        match=("world size", "evicted_item_mode=DISCARD", "nothing was written"),
        what="DISCARD replay after a load N -> M",
    )


def run_reload(rank: int, world: int, case: Case, folder: str) -> None:
    """N -> M: load the dump another world size wrote, into a model and into a served collection."""
    saved = torch.load(os.path.join(folder, "ledger.pt"), weights_only=False)
    dump = os.path.join(folder, "dump")
    model = build(case, world)
    RL.move_dump_load(dump, None, model)
    full = ("embedding", "optimizer", "scores")
    RL.check_moved(
        saved["ledger"], RL.ledger_of_model(model), fields=full, what=f"reshard -> {world}"
    )
    _check_packed_refuses_discard(model, case, world, dump)
    served = RL.move_from_dump(
        served_classes(case), dump, configs_of(case), saved["options"], device_of(case)
    )
    RL.check_moved(saved["ledger"], RL.ledger_of_served(served), what="reshard -> from_dump")
    batches = held_out(case)
    want = [trainer_eval(model, case, rank, world, kjt) for kjt in batches]
    check_held_out(
        case,
        world,
        lambda kjt: served_forward(served, case, kjt),
        lambda kjt: want[batches.index(kjt)],
        batches,
        f"served vs trainer at world {world}",
    )
