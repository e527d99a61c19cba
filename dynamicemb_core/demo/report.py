"""What the training demo records per interval, and its printed summary and PNG plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

__all__ = [
    "History",
    "IntervalRecord",
    "RunInfo",
    "TableStats",
    "evictions_per_step",
    "format_interval",
    "format_summary",
    "plot",
    "title",
]


@dataclass
class TableStats:
    """One dynamic table over all ranks: keys stored, slots, keys evicted so far."""

    size: int
    capacity: int
    evictions: int

    @property
    def occupancy(self) -> float:
        return self.size / self.capacity if self.capacity else 0.0


@dataclass
class IntervalRecord:
    """Everything printed and plotted for one logging interval."""

    step: int
    loss: float
    samples_per_s: float
    tables: Dict[str, TableStats]


@dataclass
class History:
    """All intervals of a run, in order."""

    records: List[IntervalRecord] = field(default_factory=list)

    def add(self, record: IntervalRecord) -> None:
        self.records.append(record)


def format_interval(r: IntervalRecord) -> str:
    tables = "  ".join(
        f"{name}: {t.size}/{t.capacity} ({t.occupancy:.0%}) ev {t.evictions}"
        for name, t in r.tables.items()
    )
    return f"step {r.step:5d}  loss {r.loss:.4f}  {r.samples_per_s:8.0f} samples/s  {tables}"


def format_summary(
    history: History, seconds: float, samples: int, plot_path: str, world: int
) -> str:
    first, last = history.records[0], history.records[-1]
    lines = [
        "",
        f"trained {last.step} steps, {samples} samples on {world} process(es) in {seconds:.1f} s "
        f"({samples / max(seconds, 1e-9):.0f} samples/s)",
        f"loss: first interval {first.loss:.4f} -> last interval {last.loss:.4f}",
    ]
    for name, t in last.tables.items():
        lines.append(
            f"table {name}: {t.size} keys in {t.capacity} slots ({t.occupancy:.0%}), "
            f"{t.evictions} evictions"
        )
    lines.append(f"plot: {plot_path}")
    return "\n".join(lines)


@dataclass
class RunInfo:
    """What the run was, for the plot's title: tables, capacity, eviction policy, steps."""

    tables: List[str]
    rows: int  # num_embeddings asked of each table
    policy: str  # e.g. "TIMESTAMP (least recently used evicted first)"
    steps: int
    batch_size: int  # samples per step per process
    world: int
    cache: str = "no cache: each table's rows all on its device"


def evictions_per_step(history: History, name: str) -> List[float]:
    """Per interval, table ``name``'s evictions divided by the interval's steps.

    The records hold cumulative counts; the first interval starts from step 0 and 0 evictions.
    """
    out: List[float] = []
    step, evicted = 0, 0
    for r in history.records:
        t = r.tables[name]
        out.append((t.evictions - evicted) / max(r.step - step, 1))
        step, evicted = r.step, t.evictions
    return out


def title(info: RunInfo, history: History) -> str:
    """Three lines naming the run: model and tables; capacity and policy; steps, processes, cache."""
    capacities = sorted({history.records[-1].tables[n].capacity for n in info.tables})
    slots = "/".join(str(c) for c in capacities)
    return (
        f"dynamicemb-core demo: DLRM, {len(info.tables)} dynamic tables "
        f"({', '.join(info.tables)})\n"
        f"num_embeddings {info.rows} -> {slots} slots per table (all ranks); "
        f"eviction: {info.policy}\n"
        f"{info.steps} steps x {info.batch_size} samples x {info.world} process(es); {info.cache}"
    )


def plot(history: History, path: str, info: RunInfo) -> None:
    """A PNG (matplotlib's Agg backend): one column per table, loss underneath.

    Per table, in its own colour: occupancy (% of its slots holding a key) and evictions per
    step. Training loss spans the bottom row. The title says what the run was (:func:`title`).
    A run with a cache would add a hit-rate row; the demo's tables are not cached, which the
    title says.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(history.records[0].tables)
    steps = [r.step for r in history.records]
    # matplotlib's default colour cycle ("C0", "C1", ...): one colour per table
    colors = [f"C{i % 10}" for i in range(len(names))]
    n = len(names)
    fig = plt.figure(figsize=(max(4.2 * n, 10), 9))
    grid = fig.add_gridspec(3, n, height_ratios=[1, 1, 1.1])
    first_occ = first_ev = None
    for col, name in enumerate(names):
        color = colors[col]
        last = history.records[-1].tables[name]
        ax_occ = fig.add_subplot(grid[0, col], sharey=first_occ)
        first_occ = first_occ or ax_occ
        ax_occ.plot(steps, [100 * r.tables[name].occupancy for r in history.records], color=color)
        ax_occ.set_title(
            f"{name}\n{last.size} keys / {last.capacity} slots at the end", fontsize=10
        )
        ax_occ.set_ylim(0, 105)
        ax_occ.grid(alpha=0.3)
        ax_ev = fig.add_subplot(grid[1, col], sharex=ax_occ, sharey=first_ev)
        first_ev = first_ev or ax_ev
        per_step = evictions_per_step(
            history, name
        )  # each value covers the interval up to its step
        ax_ev.plot(steps, per_step, color=color, marker=".", drawstyle="steps-pre")
        ax_ev.set_xlabel("step")
        ax_ev.grid(alpha=0.3)
        ax_ev.set_title(f"{last.evictions} evicted in all", fontsize=9)  # never over the data
        if col == 0:
            ax_occ.set_ylabel("occupancy (% of slots)")
            ax_ev.set_ylabel("evictions per step")
    ax_loss = fig.add_subplot(grid[2, :])
    ax_loss.plot(steps, [r.loss for r in history.records], color="black", marker="o", markersize=3)
    ax_loss.set_ylabel("loss (BCE, interval mean)")
    ax_loss.set_xlabel("step")
    ax_loss.grid(alpha=0.3)
    fig.suptitle(title(info, history), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
