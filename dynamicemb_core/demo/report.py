"""What the training demo records per interval, and its printed summary and PNG plot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

__all__ = ["History", "IntervalRecord", "TableStats", "format_interval", "format_summary", "plot"]


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


def plot(history: History, path: str) -> None:
    """Loss and per-table occupancy over steps, written as a PNG (matplotlib's Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r.step for r in history.records]
    fig, (ax_loss, ax_occ) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax_loss.plot(steps, [r.loss for r in history.records], marker="o", markersize=3)
    ax_loss.set_ylabel("loss (BCE, interval mean)")
    ax_loss.grid(alpha=0.3)
    for name in history.records[0].tables:
        ax_occ.plot(steps, [100 * r.tables[name].occupancy for r in history.records], label=name)
    ax_occ.set_ylabel("table occupancy (%)")
    ax_occ.set_xlabel("step")
    ax_occ.set_ylim(0, 105)
    ax_occ.legend(loc="lower right")
    ax_occ.grid(alpha=0.3)
    fig.suptitle("dynamicemb-core demo: DLRM with dynamic tables")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
