"""The asset graph: documents -> chunks -> chunk_index -> eval_run -> failure_report, plus the
validated golden set and a comparison across embedders. Each asset calls the pipeline modules."""


import hashlib
import statistics
import time
from pathlib import Path

import dagster as dg

from retrieval_assets import chunker, diagnose, metrics, rerank, store
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.embed import get_embedder
from retrieval_assets.types import Chunk, Document, GoldenQuery

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CORPUS = str(PROJECT_ROOT / "fixtures" / "corpus")
CODE_VERSION = "1"

embedders = dg.StaticPartitionsDefinition(["hash", "minilm", "bge-small"])

# Quality floors per embedder: the measured full-pipeline numbers rounded down to 0.05
# (fixtures/corpus/README.md). A partition without measured floors gets none.
FLOORS = {
    "hash": {"recall_at_k": 0.85, "mrr": 0.65, "ndcg_at_k": 0.70},
    "minilm": {"recall_at_k": 0.80, "mrr": 0.65, "ndcg_at_k": 0.70},
}


class CorpusConfig(dg.Config):
    corpus_dir: str = DEFAULT_CORPUS


class ChunkingConfig(dg.Config):
    max_chars: int = 1200
    overlap: int = 1


class EvalConfig(dg.Config):
    k: int = 10
    n: int = 50
    mmr_lambda: float = 0.7
    min_recall: float | None = None  # None: the partition's measured floor
    min_mrr: float | None = None
    min_ndcg: float | None = None


def _corpus_hash(chunks: list[Chunk]) -> str:
    digest = hashlib.sha256()
    for c in chunks:
        digest.update(f"{c.chunk_id}\0{c.text}\0".encode())
    return digest.hexdigest()[:16]


def _preview(rows: list[dict], limit: int = 10) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md("(empty)")
    head = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
    body = "".join("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")[:80] for v in r.values()) + " |\n" for r in rows[:limit])
    return dg.MetadataValue.md(head + body)


@dg.asset(kinds={"python", "markdown"}, group_name="retrieval", description="The corpus documents: docs/*.md then stories/*.txt.")
def documents(context: dg.AssetExecutionContext, config: CorpusConfig) -> list[Document]:
    docs = chunker.load_documents(config.corpus_dir)
    context.add_output_metadata(
        {
            "documents": len(docs),
            "characters": sum(len(d.text) for d in docs),
            "corpus_dir": config.corpus_dir,
            "preview": _preview([{"doc_id": d.doc_id, "title": d.title, "characters": len(d.text)} for d in docs], 40),
        }
    )
    return docs


@dg.asset(kinds={"python"}, group_name="retrieval", description="Heading-aware chunks of every document (max_chars, overlap).")
def chunks(context: dg.AssetExecutionContext, config: ChunkingConfig, documents: list[Document]) -> list[Chunk]:
    out = [c for d in documents for c in chunker.chunk(d, max_chars=config.max_chars, overlap=config.overlap)]
    per_doc = [sum(1 for c in out if c.doc_id == d.doc_id) for d in documents]
    context.add_output_metadata(
        {
            "chunks": len(out),
            "characters": sum(len(c.text) for c in out),
            "oversized_chunks": sum(len(c.text) > config.max_chars for c in out),
            "median_chunks_per_document": statistics.median(per_doc) if per_doc else 0,
            "preview": _preview([{"chunk_id": c.chunk_id, "heading_path": c.heading_path, "chars": len(c.text), "text": c.text} for c in out]),
        }
    )
    return out


@dg.asset(
    kinds={"python", "yaml"},
    group_name="retrieval",
    description="The validated golden query set (golden.yaml of the corpus).",
    check_specs=[dg.AssetCheckSpec("anchors_inside_chunks", asset="golden_queries", blocking=True,
                                   description="Every anchor lies inside a chunk of its document, so recall can reach 1.0.")],
)
def golden_queries(config: CorpusConfig, documents: list[Document], chunks: list[Chunk]):
    golden = metrics.load_golden(Path(config.corpus_dir) / "golden.yaml", documents)
    unreachable = [q.query_id for q in golden if not metrics.relevant(chunks, q)]
    kinds = {k: sum(q.kind == k for q in golden) for k in metrics.KINDS}
    yield dg.Output(golden, metadata={"queries": len(golden), **{f"{k}_queries": v for k, v in kinds.items()}})
    yield dg.AssetCheckResult(check_name="anchors_inside_chunks", passed=not unreachable,
                              metadata={"unreachable": ", ".join(unreachable) or "none"})


@dg.asset(
    partitions_def=embedders,
    kinds={"postgres", "pgvector"},
    group_name="retrieval",
    description="The embedder's chunk table (pgvector HNSW + full-text GIN), synced to the chunks.",
    check_specs=[dg.AssetCheckSpec("index_consistent", asset="chunk_index", blocking=True,
                                   description="Row count equals the chunk count; stored dimension equals the embedder's.")],
)
def chunk_index(context: dg.AssetExecutionContext, postgres: PostgresResource, chunks: list[Chunk]):
    embedder = get_embedder(context.partition_key)
    schema = postgres.schema(context.partition_key)
    start = time.perf_counter()
    with postgres.connect(schema) as conn:
        store.Schema.create(conn, embedder.dims)
        report = store.sync(conn, chunks, embedder)
        rows, dims = store.count(conn), store.table_dims(conn)
    seconds = time.perf_counter() - start
    yield dg.MaterializeResult(
        metadata={
            "rows": rows, "dims": dims, "embedder": embedder.name, "schema": schema,
            "inserted": report.inserted, "updated": report.updated, "deleted": report.deleted,
            "unchanged": report.unchanged, "embedded": report.embedded,
            "seconds": round(seconds, 3), "chunks_per_second": round(len(chunks) / seconds, 1) if seconds else 0.0,
        }
    )
    yield dg.AssetCheckResult(check_name="index_consistent", passed=rows == len(chunks) and dims == embedder.dims,
                              metadata={"rows": rows, "chunks": len(chunks), "dims": dims, "embedder_dims": embedder.dims})


def _metric_metadata(ev: metrics.Evaluation, prefix: str = "") -> dict:
    out: dict = {f"{prefix}fused_recall@{ev.n}": ev.pool_recall,
                 f"{prefix}latency_p50_ms": round(ev.latency_ms["p50"], 2), f"{prefix}latency_p95_ms": round(ev.latency_ms["p95"], 2)}
    for pipeline, m in ev.metrics.items():
        out.update({f"{prefix}{pipeline}/recall@k": m.recall_at_k, f"{prefix}{pipeline}/precision@k": m.precision_at_k,
                    f"{prefix}{pipeline}/mrr": m.mrr, f"{prefix}{pipeline}/ndcg@k": m.ndcg_at_k})
    return out


def _by_kind_table(evaluations: dict[str, metrics.Evaluation]) -> str:
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
    deps=[chunk_index],
    description="Golden-set evaluation of hybrid, + BM25 rerank and + MMR, with the seed's ts_rank_cd lexical list "
    "and with BM25 inside Postgres (+ corpus-level idf in the reranker); appended to the eval_runs history.",
    check_specs=[dg.AssetCheckSpec("quality_floors", asset="eval_run", blocking=True,
                                   description="recall@k, MRR and nDCG@k of the full pipeline stay above the partition's floors.")],
)
def eval_run(context: dg.AssetExecutionContext, config: EvalConfig, postgres: PostgresResource,
             golden_queries: list[GoldenQuery], chunks: list[Chunk]):
    key = context.partition_key
    embedder = get_embedder(key)
    variants = {
        "ts_rank_cd": rerank.LexicalReranker(),
        "bm25": rerank.LexicalReranker(corpus=rerank.CorpusStats.from_texts([c.text for c in chunks])),
    }
    evaluations = {}
    with postgres.connect(postgres.schema(key)) as conn:
        for lexical, reranker in variants.items():
            evaluations[lexical] = metrics.evaluate_pipelines(conn, embedder, reranker, golden_queries, k=config.k, n=config.n,
                                                              mmr_lambda=config.mmr_lambda, lexical=lexical)
    with postgres.connect(postgres.history_schema) as conn:
        for lexical, ev in evaluations.items():
            metrics.record_run(conn, ev, run_id=context.run.run_id, partition=key, embedder=embedder.name,
                               corpus_hash=_corpus_hash(chunks), code_version=CODE_VERSION,
                               variant="" if lexical == "ts_rank_cd" else f"{lexical}:")
    ev = evaluations["ts_rank_cd"]
    scored = {f"{lexical}:{p}": m.ndcg_at_k for lexical, e in evaluations.items() for p, m in e.metrics.items()}
    best = max(scored, key=scored.get)
    floors = dict(FLOORS.get(key, {}))
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


class DiagnoseConfig(dg.Config):
    what_if: bool = True  # re-run the golden set with each mechanical fix (scratch schemas)
    report_dir: str = str(PROJECT_ROOT / "reports")


@dg.asset(
    partitions_def=embedders,
    kinds={"markdown", "postgres"},
    group_name="retrieval",
    description="Every golden query the full pipeline misses, classified, with a fix and what-if results.",
)
def failure_report(context: dg.AssetExecutionContext, config: DiagnoseConfig, postgres: PostgresResource,
                   eval_run: metrics.Evaluation, golden_queries: list[GoldenQuery], documents: list[Document],
                   chunks: list[Chunk]) -> dg.MaterializeResult:
    key = context.partition_key
    embedder = get_embedder(key)
    reranker = rerank.LexicalReranker()
    with postgres.connect(postgres.schema(key)) as conn:
        misses = diagnose.diagnose(conn, embedder, reranker, golden_queries, k=eval_run.k, n=eval_run.n)
    what_ifs = []
    if config.what_if:
        other = "minilm" if key != "minilm" else "hash"
        try:
            other_embedder = get_embedder(other)
        except (ValueError, RuntimeError):
            other_embedder = None
        what_ifs = diagnose.what_if(postgres.connect, postgres.schema(key), embedder, reranker, golden_queries, documents, chunks,
                                    k=eval_run.k, n=eval_run.n, other=(other, other_embedder, postgres.schema(other)))
    report = diagnose.Report(key, eval_run.k, eval_run.n, len(golden_queries), misses, what_ifs)
    text = diagnose.render(report)
    path = Path(config.report_dir) / key / "RETRIEVAL_ANALYSIS.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    counts = {f"failures/{kind}": sum(d.failure == kind for d in misses) for kind in diagnose.FAILURES}
    rescued = {f"rescued/{w.fix}: {w.variant}": len(w.rescued) for w in what_ifs}
    return dg.MaterializeResult(metadata={"misses": len(misses), **counts, **rescued, "path": str(path),
                                          "report": dg.MetadataValue.md(text)})


@dg.asset(
    kinds={"postgres"},
    group_name="retrieval",
    deps=[dg.AssetDep(eval_run, partition_mapping=dg.AllPartitionMapping())],
    description="The latest numbers of every embedder side by side, from the eval_runs history.",
)
def embedder_comparison(postgres: PostgresResource) -> dg.MaterializeResult:
    with postgres.connect(postgres.history_schema) as conn:
        latest = metrics.latest_runs(conn)
    rows = ["| embedder | pipeline | recall@k | precision@k | MRR | nDCG@k | fused recall@n | run |", "|---|---|---|---|---|---|---|---|"]
    meta: dict = {}
    for r in latest:
        rows.append(f"| {r['partition']} | {r['pipeline']} | {r['recall_at_k']:.3f} | {r['precision_at_k']:.3f} | {r['mrr']:.3f} "
                    f"| {r['ndcg_at_k']:.3f} | {r['pool_recall']:.3f} | {r['run_id'][:8]} |")
        for name in ("recall_at_k", "mrr", "ndcg_at_k"):
            meta[f"{r['partition']}/{r['pipeline']}/{name}"] = r[name]
    return dg.MaterializeResult(metadata={"partitions": len({r["partition"] for r in latest}), "comparison": dg.MetadataValue.md("\n".join(rows)), **meta})
