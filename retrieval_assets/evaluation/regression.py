"""Did retrieval get worse since the last run? Paired, per-query, with a bootstrap interval.

Contract: ``paired_bootstrap(diffs)`` returns the mean of the per-query differences and its
percentile bootstrap interval (``resamples`` draws of the queries with replacement, fixed
seed, vectorised). ``compare(conn, schema, run_id, ...)`` pairs the per-query nDCG@k of one
pipeline in run ``run_id`` with the latest earlier run of the same partition and corpus that
has per-query history, over the queries present in both whose document, query and anchor are
unchanged (``doc_hash``), and fails when the mean drop exceeds ``max_drop`` and the interval
lies below 0. It never raises for a missing, incomparable or empty baseline: the verdict
passes and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import psycopg

from retrieval_assets.evaluation import history


def paired_bootstrap(diffs: np.ndarray, *, resamples: int = 10_000, confidence: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of ``diffs``, the interval by the percentile bootstrap."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        return 0.0, 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(d.mean()), float(low), float(high)


@dataclass(frozen=True)
class Change:
    query_id: str
    kind: str
    rank_before: int | None
    rank_after: int | None
    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str
    baseline: str | None = None  # run id
    paired: int = 0
    excluded: tuple[str, ...] = ()  # queries left out: changed document, query or anchor, or absent from one run
    mean: float = 0.0
    low: float = 0.0
    high: float = 0.0
    worse: list[Change] = field(default_factory=list)
    better: list[Change] = field(default_factory=list)


def pair(before: dict[str, dict], after: dict[str, dict]) -> tuple[list[Change], tuple[str, ...]]:
    """Per-query changes between two runs' ``history.query_rows`` (by query id), over the queries in
    both whose ``doc_hash`` is unchanged, and the ids left out (changed, or in one run only)."""
    same = sorted(q for q in after if q in before and after[q]["doc_hash"] == before[q]["doc_hash"])
    excluded = tuple(sorted(set(after) ^ set(before) | {q for q in after if q in before and q not in same}))
    changes = [Change(q, after[q]["kind"], before[q]["first_rank"], after[q]["first_rank"], before[q]["ndcg_at_k"],
                      after[q]["ndcg_at_k"]) for q in same]
    return changes, excluded


def compare(conn: psycopg.Connection, schema: str, run_id: str, *, partition: str, corpus: str, pipeline: str = "mmr",
            max_drop: float = 0.02, confidence: float = 0.95) -> Verdict:
    """The verdict on run ``run_id`` against the latest earlier comparable run (see the contract)."""
    current = history.query_rows(conn, schema, run_id, pipeline)
    if not current:
        return Verdict(True, f"nothing to compare: run {run_id[:8]} has no per-query history for {pipeline}")
    base_id = history.previous_run(conn, schema, run_id, partition=partition, corpus=corpus)
    if base_id is None:
        return Verdict(True, f"no baseline: no earlier run of partition {partition} on corpus {corpus} with per-query history")
    baseline = history.query_rows(conn, schema, base_id, pipeline)
    k_now, k_then = next(iter(current.values()))["k"], next(iter(baseline.values()), {"k": None})["k"]
    if k_now != k_then:
        return Verdict(True, f"no comparable baseline: run {base_id[:8]} used k={k_then}, this run k={k_now}", base_id)
    changes, excluded = pair(baseline, current)
    if not changes:
        return Verdict(True, f"no comparable queries: every query's document changed since run {base_id[:8]}", base_id, 0, excluded)
    mean, low, high = paired_bootstrap(np.array([c.delta for c in changes]), confidence=confidence)
    regressed = mean < -max_drop and high < 0
    scope = f"{len(changes)} queries" + (f" ({len(excluded)} left out: document, query or anchor changed, or not in both runs)" if excluded else "")
    reason = (f"nDCG@{k_now} of {pipeline} changed by {mean:+.4f} (95% interval {low:+.4f} to {high:+.4f}) over {scope} "
              f"since run {base_id[:8]}; " + ("fails: the drop exceeds" if regressed else "passes: threshold") + f" {max_drop}")
    worse = sorted((c for c in changes if c.delta < 0), key=lambda c: c.delta)
    better = sorted((c for c in changes if c.delta > 0), key=lambda c: -c.delta)
    return Verdict(not regressed, reason, base_id, len(changes), excluded, mean, low, high, worse, better)


def render_changes(changes: list[Change], limit: int = 20) -> str:
    """A Markdown table of per-query changes: ranks and nDCG before and after."""
    if not changes:
        return "none"
    rows = ["| query | kind | rank before | rank after | nDCG before | nDCG after | change |", "|---|---|---|---|---|---|---|"]
    rank = lambda r: "-" if r is None else str(r)  # noqa: E731
    rows += [f"| {c.query_id} | {c.kind} | {rank(c.rank_before)} | {rank(c.rank_after)} | {c.before:.3f} | {c.after:.3f} | {c.delta:+.3f} |"
             for c in changes[:limit]]
    return "\n".join(rows)
