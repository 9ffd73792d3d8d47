"""Golden-set evaluation of every pipeline, its history, and the comparison across embedders."""

import hashlib

import dagster as dg

from retrieval_assets import evaluation, history, partitions
from retrieval_assets.defs.partitions import embedders
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.params import DEFAULT
from retrieval_assets.pipeline import Retriever
from retrieval_assets.rerank import CorpusStats, LexicalReranker
from retrieval_assets.types import Chunk, GoldenQuery

EVAL_VERSION = "2"  # the eval_run asset's code_version, recorded with every history row


class EvalConfig(dg.Config):
    k: int = DEFAULT.k
    n: int = DEFAULT.n
    mmr_lambda: float = DEFAULT.mmr_lambda
    min_recall: float | None = None  # None: the partition's measured floor
    min_mrr: float | None = None
    min_ndcg: float | None = None


def _corpus_hash(chunks: list[Chunk]) -> str:
    digest = hashlib.sha256()
    for c in chunks:
        digest.update(f"{c.chunk_id}\0{c.text}\0".encode())
    return digest.hexdigest()[:16]


def _metric_metadata(ev: evaluation.Evaluation, prefix: str = "") -> dict:
    out: dict = {f"{prefix}fused_recall@{ev.n}": ev.pool_recall,
                 f"{prefix}latency_p50_ms": round(ev.latency_ms["p50"], 2), f"{prefix}latency_p95_ms": round(ev.latency_ms["p95"], 2)}
    for pipeline, m in ev.metrics.items():
        out.update({f"{prefix}{pipeline}/recall@k": m.recall_at_k, f"{prefix}{pipeline}/precision@k": m.precision_at_k,
                    f"{prefix}{pipeline}/mrr": m.mrr, f"{prefix}{pipeline}/ndcg@k": m.ndcg_at_k})
    return out


def _by_kind_table(evaluations: dict[str, evaluation.Evaluation]) -> str:
    rows = ["| lexical list | pipeline | kind | queries | recall@k | precision@k | MRR | nDCG@k |", "|---|---|---|---|---|---|---|---|"]
    for variant, ev in evaluations.items():
        for pipeline, m in ev.metrics.items():
            for kind, row in [("all", m), *m.by_kind.items()]:
                rows.append(f"| {variant} | {pipeline} | {kind} | {row.queries} | {row.recall_at_k:.3f} | {row.precision_at_k:.3f} "
                            f"| {row.mrr:.3f} | {row.ndcg_at_k:.3f} |")
    return "\n".join(rows)


@dg.asset(
    partitions_def=embedders,
    kinds={"postgres", "python"},
    group_name="retrieval",
    deps=["chunk_index"],
    code_version=EVAL_VERSION,
    description="Golden-set evaluation of hybrid, + BM25 rerank and + MMR, with the seed's ts_rank_cd lexical list "
    "and with BM25 inside Postgres (+ corpus-level idf in the reranker); appended to the eval_runs history.",
    check_specs=[dg.AssetCheckSpec("quality_floors", asset="eval_run", blocking=True,
                                   description="recall@k, MRR and nDCG@k of the full pipeline stay above the partition's floors.")],
)
def eval_run(context: dg.AssetExecutionContext, config: EvalConfig, postgres: PostgresResource,
             golden_queries: list[GoldenQuery], chunks: list[Chunk]):
    key = context.partition_key
    embedder = partitions.embedder(key)
    try:
        params = DEFAULT.with_(k=config.k, n=config.n, mmr_lambda=config.mmr_lambda)
    except ValueError as exc:
        raise dg.Failure(f"eval_run config: {exc}") from None
    variants = {
        "ts_rank_cd": LexicalReranker(),
        "bm25": LexicalReranker(corpus=CorpusStats.from_texts([c.text for c in chunks])),
    }
    evaluations = {}
    with postgres.connect() as conn:
        for lexical, reranker in variants.items():
            retriever = Retriever(postgres.schema(key), embedder, reranker)
            evaluations[lexical] = evaluation.evaluate_pipelines(conn, retriever, golden_queries, params.with_(lexical=lexical))
        for lexical, ev in evaluations.items():
            history.record_run(conn, postgres.history_schema, ev, run_id=context.run.run_id, partition=key, embedder=embedder.name,
                               corpus_hash=_corpus_hash(chunks), code_version=EVAL_VERSION,
                               variant="" if lexical == "ts_rank_cd" else f"{lexical}:")
    ev = evaluations["ts_rank_cd"]
    scored = {f"{lexical}:{p}": m.ndcg_at_k for lexical, e in evaluations.items() for p, m in e.metrics.items()}
    best = max(scored, key=scored.get)
    floors = dict(partitions.get(key).floors)
    for name, override in (("recall_at_k", config.min_recall), ("mrr", config.min_mrr), ("ndcg_at_k", config.min_ndcg)):
        if override is not None:
            floors[name] = override
    final = ev.metrics["mmr"]
    below = {name: getattr(final, name) for name, floor in floors.items() if getattr(final, name) < floor}
    metadata = {"k": ev.k, "n": ev.n, **_metric_metadata(ev), **_metric_metadata(evaluations["bm25"], "bm25:"),
                "best_pipeline": best, "best_ndcg@k": scored[best], "by_kind": dg.MetadataValue.md(_by_kind_table(evaluations))}
    yield dg.Output(ev, metadata=metadata)
    yield dg.AssetCheckResult(
        check_name="quality_floors", passed=not below,
        metadata={"floors": str(floors or "none measured for this partition"), "below": str(below or "none")},
    )


@dg.asset(
    kinds={"postgres"},
    group_name="retrieval",
    deps=[dg.AssetDep("eval_run", partition_mapping=dg.AllPartitionMapping())],
    description="The latest numbers of every embedder side by side, from the eval_runs history.",
)
def embedder_comparison(postgres: PostgresResource) -> dg.MaterializeResult:
    with postgres.connect() as conn:
        latest = history.latest_runs(conn, postgres.history_schema)
    rows = ["| embedder | pipeline | recall@k | precision@k | MRR | nDCG@k | fused recall@n | run |", "|---|---|---|---|---|---|---|---|"]
    meta: dict = {}
    for r in latest:
        rows.append(f"| {r['partition']} | {r['pipeline']} | {r['recall_at_k']:.3f} | {r['precision_at_k']:.3f} | {r['mrr']:.3f} "
                    f"| {r['ndcg_at_k']:.3f} | {r['pool_recall']:.3f} | {r['run_id'][:8]} |")
        for name in ("recall_at_k", "mrr", "ndcg_at_k"):
            meta[f"{r['partition']}/{r['pipeline']}/{name}"] = r[name]
    return dg.MaterializeResult(metadata={"partitions": len({r["partition"] for r in latest}), "comparison": dg.MetadataValue.md("\n".join(rows)), **meta})
