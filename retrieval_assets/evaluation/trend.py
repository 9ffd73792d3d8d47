"""Headline metrics over the last runs, per partition: a Markdown table and a PNG plot.

Contract: ``table(rows)`` and ``plot(rows, path)`` take ``history.trend`` rows (oldest first per
partition); ``plot`` draws recall@k, MRR and nDCG@k against run time, one line per partition,
with matplotlib's non-interactive Agg backend, and writes a PNG at ``path``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from retrieval_assets.replace import replaced

METRICS = (("recall_at_k", "recall@k"), ("mrr", "MRR"), ("ndcg_at_k", "nDCG@k"))


def table(rows: list[dict]) -> str:
    if not rows:
        return "no runs yet"
    lines = ["| partition | run | time (UTC) | k | recall@k | MRR | nDCG@k |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['partition']} | {r['run_id'][:8]} | {r['created_at']:%Y-%m-%d %H:%M} | {r['k']} | {r['recall_at_k']:.4f} "
              f"| {r['mrr']:.4f} | {r['ndcg_at_k']:.4f} |" for r in rows]
    return "\n".join(lines)


def plot(rows: list[dict], path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    by_partition: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_partition[r["partition"]].append(r)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(12, 3.4), sharex=True)
    for ax, (field, label) in zip(axes, METRICS):
        for partition, series in sorted(by_partition.items()):
            ax.plot([r["created_at"] for r in series], [r[field] for r in series], marker="o", label=partition)
        ax.set_title(label)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save(fig, path)


def save(fig, path: str | Path) -> Path:
    """Write a matplotlib figure as a PNG at ``path`` (its folder made) and close it. The file is replaced whole
    (``replace.replaced``), so a reader never sees half of it while another process writes the same plot."""
    from matplotlib import pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with replaced(path, "wb") as out:
            fig.savefig(out, format="png", dpi=90)
    finally:
        plt.close(fig)
    return path
