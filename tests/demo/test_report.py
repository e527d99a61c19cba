"""The demo's report: evictions per step from cumulative counts, the title, and the PNG's layout."""

from __future__ import annotations

from pathlib import Path

from dynamicemb_core.demo.report import (
    History,
    IntervalRecord,
    RunInfo,
    TableStats,
    evictions_per_step,
    plot,
    title,
)

NAMES = ["t_user_id", "t_item_id"]


def _history() -> History:
    """Two tables of 1000 slots: the user table fills by step 20 and then evicts, the item one never."""
    history = History()
    user = [(400, 0), (1000, 50), (1000, 450), (1000, 1250)]
    item = [(100, 0), (200, 0), (300, 0), (400, 0)]
    for i, ((us, ue), (is_, ie)) in enumerate(zip(user, item)):
        history.add(
            IntervalRecord(
                step=10 * (i + 1),
                loss=0.7 - 0.01 * i,
                samples_per_s=1000.0,
                tables={
                    "t_user_id": TableStats(us, 1000, ue),
                    "t_item_id": TableStats(is_, 1000, ie),
                },
            )
        )
    return history


def _info() -> RunInfo:
    return RunInfo(
        tables=NAMES, rows=1000, policy="TIMESTAMP (LRU)", steps=40, batch_size=64, world=2
    )


def test_evictions_per_step_differences_cumulative_counts() -> None:
    history = _history()
    assert evictions_per_step(history, "t_user_id") == [0.0, 5.0, 40.0, 80.0]
    assert evictions_per_step(history, "t_item_id") == [0.0, 0.0, 0.0, 0.0]


def test_title_names_tables_capacity_policy_steps_and_cache() -> None:
    text = title(_info(), _history())
    assert "2 dynamic tables (t_user_id, t_item_id)" in text
    assert "num_embeddings 1000 -> 1000 slots per table" in text
    assert "eviction: TIMESTAMP (LRU)" in text
    assert "40 steps x 64 samples x 2 process(es)" in text
    assert "no cache" in text


def test_plot_has_a_column_per_table_and_a_loss_panel(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "demo.png"
    seen = {}
    original = plt.close

    def keep(fig=None):  # read the figure's axes before the plot closes it
        seen["axes"] = [(a.get_title(), a.get_ylabel(), len(a.lines)) for a in fig.axes]
        seen["colors"] = [a.lines[0].get_color() for a in fig.axes if a.lines]
        seen["suptitle"] = fig._suptitle.get_text()
        original(fig)

    plt.close = keep
    try:
        plot(_history(), str(path), _info())
    finally:
        plt.close = original
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    axes = seen["axes"]
    assert len(axes) == 2 * len(NAMES) + 1  # occupancy and evictions per table, then loss
    titles = [t for t, _, _ in axes if t]
    assert titles == [
        "t_user_id\n1000 keys / 1000 slots at the end",
        "1250 evicted in all",
        "t_item_id\n400 keys / 1000 slots at the end",
        "0 evicted in all",
    ]
    assert axes[-1][1] == "loss (BCE, interval mean)"
    # one colour per table (occupancy and evictions share it), distinct between tables
    occ_user, ev_user, occ_item, ev_item = seen["colors"][:4]
    assert occ_user == ev_user and occ_item == ev_item and occ_user != occ_item
    assert seen["suptitle"] == title(_info(), _history())
