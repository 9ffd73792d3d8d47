"""Fusion of ranked lists (seed stage 03's reciprocal rank fusion, and convex combinations).

Contract: ``rrf`` fuses ranked lists by ``sum(weight / (k + rank))``; ``convex`` by a weighted
sum of each list's scores normalised over the list (``normalise``: min-max or z-score); ``fuse``
picks one by ``params.fusion``, with ``query_weights``: the fixed weights, or (``params.evidence_shift``) weights that
move toward the vector list as the lexical list's evidence for this query (``lexical_evidence``) is weak. Fused lists
break ties by chunk_id and keep each item's rank per list.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval_assets.params import DEFAULT, RetrievalParams
from retrieval_assets.types import Hit, Ranked


def rrf(lists: Sequence[Sequence[Hit]], k: int = DEFAULT.rrf_k, weights: Sequence[float] | None = None) -> list[Ranked]:
    """Reciprocal rank fusion: score(d) = sum over lists holding d of weight / (k + rank)."""
    weights = weights or [1.0] * len(lists)
    if len(weights) != len(lists):
        raise ValueError(f"{len(weights)} weights for {len(lists)} lists")
    scores: dict[str, float] = {}
    ranks: dict[str, list[int | None]] = {}
    for i, hits in enumerate(lists):
        for hit in hits:
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + weights[i] / (k + hit.rank)
            ranks.setdefault(hit.chunk_id, [None] * len(lists))[i] = hit.rank
    order = sorted(scores, key=lambda cid: (-scores[cid], cid))
    return [Ranked(cid, scores[cid], rank, tuple(ranks[cid])) for rank, cid in enumerate(order, 1)]


def normalise(scores: np.ndarray, method: str) -> np.ndarray:
    """``scores`` mapped to [0, 1] by min-max, or to standard scores by z-score; a constant list maps to 1 (min-max) or 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    if method == "minmax":
        spread = scores.max() - scores.min()
        return (scores - scores.min()) / spread if spread > 0 else np.ones_like(scores)
    if method == "zscore":
        std = scores.std()
        return (scores - scores.mean()) / std if std > 0 else np.zeros_like(scores)
    raise ValueError(f"unknown normalisation '{method}' (known: minmax, zscore)")


def convex(lists: Sequence[Sequence[Hit]], method: str = "minmax", weights: Sequence[float] | None = None) -> list[Ranked]:
    """Convex combination: score(d) = sum over lists of weight * normalised score, where a list that lacks
    d contributes its lowest normalised score (0 for min-max): absent counts as worst seen (Bruch et al., TOIS 2023)."""
    weights = weights or [1.0] * len(lists)
    if len(weights) != len(lists):
        raise ValueError(f"{len(weights)} weights for {len(lists)} lists")
    ids = sorted({h.chunk_id for hits in lists for h in hits})
    position = {cid: i for i, cid in enumerate(ids)}
    total = np.zeros(len(ids))
    ranks = np.zeros((len(ids), len(lists)), dtype=np.int64)  # 0: not in that list
    for j, hits in enumerate(lists):
        if not hits:
            continue
        norm = normalise([h.score for h in hits], method)
        column = np.full(len(ids), norm.min())
        rows = np.fromiter((position[h.chunk_id] for h in hits), dtype=np.int64, count=len(hits))
        column[rows] = norm
        ranks[rows, j] = [h.rank for h in hits]
        total += weights[j] * column
    order = np.lexsort((np.arange(len(ids)), -total))  # ids are sorted: ties by chunk_id
    return [Ranked(ids[i], float(total[i]), rank, tuple(int(r) or None for r in ranks[i])) for rank, i in enumerate(order, 1)]


def lexical_evidence(lexical: Sequence[Hit]) -> float:
    """The lexical list's evidence for its query, in [0, 1]: its top score over its ``ceiling`` (``types.ScoredList``; BM25:
    the score of a chunk of average length holding every query term once), at most 1. A top hit that matches only a
    small share of the query's idf mass scores low. 1 (full evidence: nothing moves) for an empty list or one without a
    ceiling (ts_rank_cd's, RM3's expanded list)."""
    ceiling = getattr(lexical, "ceiling", 0.0)
    if not lexical or ceiling <= 0:
        return 1.0
    return float(min(1.0, max(0.0, lexical[0].score / ceiling)))


def query_weights(lists: Sequence[Sequence[Hit]], params: RetrievalParams = DEFAULT) -> tuple[float, ...]:
    """The fusion weights of ``lists`` (vector, lexical, SPLADE) for this query: ``params.weights`` and
    ``params.sparse_weight``, with ``params.evidence_shift * (1 - lexical_evidence)`` of the lexical weight moved to
    the vector list (their sum kept). Non-increasing in the evidence for the vector weight, non-decreasing for the
    lexical; ``evidence_shift`` 0, or fewer than two lists: the fixed weights exactly."""
    weights = (*params.weights, params.sparse_weight)[: len(lists)]
    if not params.evidence_shift or len(lists) < 2:
        return weights
    moved = weights[1] * params.evidence_shift * (1.0 - lexical_evidence(lists[1]))
    return (weights[0] + moved, weights[1] - moved, *weights[2:])


def fuse(lists: Sequence[Sequence[Hit]], params: RetrievalParams = DEFAULT) -> list[Ranked]:
    """The first-stage lists (vector, lexical and, when given, the SPLADE list) fused by ``params.fusion`` with
    ``query_weights`` (``rrf`` with ``params.rrf_k``)."""
    weights = query_weights(lists, params)
    if params.fusion == "rrf":
        return rrf(lists, params.rrf_k, weights)
    return convex(lists, params.fusion, weights)
