"""Golden-set evaluation of the pipeline: hybrid, + rerank and + MMR from one trace per query.

Contract: ``evaluate_pipelines(conn, retriever, golden, params)`` runs ``pipeline.run`` once
per golden query and scores its fused list (``hybrid``), its reranked pool (``rerank``) and its
final list (``mmr``) at ``params.k``, with the fused pool's recall at ``params.n``, per-query
results and latencies. ``report`` prints the by-kind table; ``as_dict`` is the JSON form.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import psycopg

from retrieval_assets.search import pipeline
from retrieval_assets.corpus.golden import relevant_sets
from retrieval_assets.evaluation.metrics import aggregate, first_relevant_rank, mean, recall_at_k, score_query
from retrieval_assets.params import DEFAULT, RetrievalParams
from retrieval_assets.progress import Progress
from retrieval_assets.types import GoldenQuery, Metrics

PIPELINES = ("hybrid", "rerank", "mmr")


@dataclass(frozen=True)
class QueryResult:
    query_id: str
    kind: str
    relevant: tuple[str, ...]
    ranked: dict[str, tuple[str, ...]]  # pipeline -> chunk ids of its top k
    best_rank: int | None  # first relevant rank in the full reranked pool
    pool_rank: int | None  # first relevant rank in the fused pool
    seconds: float
    ranks: dict[str, int | None] = field(default_factory=dict)  # first relevant rank in vector, text, fused, reranked, final
    query_vector: np.ndarray | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Evaluation:
    """Hybrid, + rerank and + MMR measured from one trace per query."""

    params: RetrievalParams
    metrics: dict[str, Metrics]
    pool_recall: float  # recall@n of the fused pool, the ceiling of every reranker over it
    queries: list[QueryResult] = field(repr=False)

    @property
    def k(self) -> int:
        return self.params.k

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def latency_ms(self) -> dict[str, float]:
        seconds = sorted(q.seconds for q in self.queries)
        pick = lambda p: 1000 * seconds[min(len(seconds) - 1, int(p * len(seconds)))] if seconds else 0.0  # noqa: E731
        return {"p50": pick(0.5), "p95": pick(0.95)}

    def failures(self, pipeline_name: str = "mmr") -> list[QueryResult]:
        return [q for q in self.queries if not set(q.ranked[pipeline_name]) & set(q.relevant)]

    def hits(self, pipeline_name: str = "mmr") -> set[str]:
        """Query ids with a relevant chunk in the pipeline's top k."""
        return {q.query_id for q in self.queries if set(q.ranked[pipeline_name]) & set(q.relevant)}


def evaluate_pipelines(conn: psycopg.Connection, retriever: pipeline.Retriever, golden: Sequence[GoldenQuery],
                       params: RetrievalParams = DEFAULT, *, first_stage_cache: dict | None = None,
                       progress: Callable[[str], object] | None = None) -> Evaluation:
    """Score hybrid, hybrid + rerank and hybrid + rerank + MMR in one pass over the golden set.

    ``first_stage_cache`` (a dict owned by the caller) keeps each query's trace so that later
    evaluations with other fusion weights or second stages skip the searches. ``progress`` gets a
    line at most every 10 s (``progress.Progress``).
    """
    rel = relevant_sets(conn, retriever.schema, golden)
    per_pipeline: dict[str, list] = {p: [] for p in PIPELINES}
    pool_recall, results = [], []
    tick = Progress(progress, len(golden), f"evaluated queries ({params.lexical} list)")
    for done, q in enumerate(golden, 1):
        start = time.perf_counter()
        key = pipeline.first_stage_key(q.query, params)
        cached = first_stage_cache.get(key) if first_stage_cache is not None else None
        t = pipeline.run(conn, retriever, q.query, params, first_stage=cached)
        if first_stage_cache is not None:
            first_stage_cache.setdefault(key, t)
        seconds = time.perf_counter() - start
        lists = {"hybrid": [r.chunk_id for r in t.fused], "rerank": [r.chunk_id for r in t.reranked],
                 "mmr": [r.chunk_id for r in t.final]}
        relevant = rel[q.query_id]
        stages = {"vector": t.vector, "text": t.text, "fused": t.fused, "reranked": t.reranked, "final": t.final}
        ranks = {name: first_relevant_rank([h.chunk_id for h in hits], relevant) for name, hits in stages.items()}
        for p in PIPELINES:
            per_pipeline[p].append((q.kind, *score_query(lists[p], relevant, params.k)))
        pool_recall.append(recall_at_k(lists["hybrid"], relevant, params.n))
        results.append(QueryResult(
            q.query_id, q.kind, tuple(sorted(relevant)), {p: tuple(lists[p][: params.k]) for p in PIPELINES},
            first_relevant_rank(lists["rerank"], relevant), first_relevant_rank(lists["hybrid"], relevant), seconds,
            ranks, t.query_vector))
        tick(done)
    return Evaluation(params, {p: aggregate(per_pipeline[p], params.k) for p in PIPELINES}, mean(pool_recall), results)


def report(m: Metrics, *, title: str = "all", file=None) -> None:
    """Print one row for all queries and one per kind."""
    out = file or sys.stdout
    print(f"{'':<12} {'queries':>7} {'recall@' + str(m.k):>10} {'prec@' + str(m.k):>8} {'MRR':>6} {'nDCG@' + str(m.k):>8}", file=out)
    for name, row in [(title, m), *m.by_kind.items()]:
        print(f"{name:<12} {row.queries:>7} {row.recall_at_k:>10.3f} {row.precision_at_k:>8.3f} {row.mrr:>6.3f} {row.ndcg_at_k:>8.3f}", file=out)


def as_dict(ev: Evaluation) -> dict:
    """The evaluation as JSON-ready data: parameters, pool recall, latency, metrics, misses."""
    return {
        "k": ev.k,
        "n": ev.n,
        "params": asdict(ev.params),
        "pool_recall_at_n": ev.pool_recall,
        "latency_ms": ev.latency_ms,
        "pipelines": {p: asdict(m) for p, m in ev.metrics.items()},
        "failures": [{"query_id": q.query_id, "kind": q.kind, "best_rank": q.best_rank} for q in ev.failures()],
    }
