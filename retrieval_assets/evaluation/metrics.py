"""Retrieval metrics of one ranked list, and their means over a query set (seed stage 05).

Contract: ``recall_at_k``, ``precision_at_k``, ``mrr`` and ``ndcg_at_k`` (binary gains, ideal
DCG over ``min(k, relevant)`` ranks) score one ranked list of chunk ids against a set of
relevant ids; ``aggregate`` averages per-query rows, overall and by golden-query kind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from retrieval_assets.corpus.golden import KINDS
from retrieval_assets.types import Metrics


def recall_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    return len(rel.intersection(ranked[:k])) / len(rel) if rel else 0.0


def precision_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    return sum(1 for cid in ranked[:k] if cid in rel) / k


def mrr(ranked: Sequence[str], rel: set[str], k: int | None = None) -> float:
    for rank, cid in enumerate(ranked[:k] if k else ranked, 1):
        if cid in rel:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(rank + 1) for rank, cid in enumerate(ranked[:k], 1) if cid in rel)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(rel)) + 1))
    return dcg / ideal if ideal else 0.0


def first_relevant_rank(ranked: Sequence[str], rel: set[str]) -> int | None:
    return next((rank for rank, cid in enumerate(ranked, 1) if cid in rel), None)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def aggregate(rows: Sequence[tuple[str, float, float, float, float]], k: int) -> Metrics:
    """Metrics from per-query (kind, recall, precision, rr, ndcg) rows, split by kind."""

    def means(part) -> Metrics:
        return Metrics(k, len(part), *(mean([r[i] for r in part]) for i in range(1, 5)))

    by_kind = {kind: means([r for r in rows if r[0] == kind]) for kind in KINDS if any(r[0] == kind for r in rows)}
    overall = means(rows)
    return Metrics(k, overall.queries, overall.recall_at_k, overall.precision_at_k, overall.mrr, overall.ndcg_at_k, by_kind)


def score_query(ranked: Sequence[str], rel: set[str], k: int) -> tuple[float, float, float, float]:
    return recall_at_k(ranked, rel, k), precision_at_k(ranked, rel, k), mrr(ranked, rel, k), ndcg_at_k(ranked, rel, k)
