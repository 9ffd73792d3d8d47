"""The ``benchmark`` group: external benchmarks, partitioned by embedder like the retrieval group.

``cranfield_report`` indexes Cranfield 1400 (title + abstract, our chunker, ``store.sync``) into
a scratch schema ``bench_cranfield_<embedder>`` (after the resource's prefix), then scores
vector, the lexical list, hybrid (RRF), + BM25 rerank and + MMR, for each lexical list of
``hybrid.LEXICAL`` (ts_rank_cd, BM25 inside Postgres), beside a bm25s peer computed in the same
run, and records the table as metadata. The logic is ``retrieval_assets.corpus.datasets``; this
module only wires it. Not part of any corpus's ``evaluate_embedders`` job (it has no corpus: group ``benchmark``).
"""

import time

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.corpus import datasets

from retrieval_assets.evaluation import benchmark
from retrieval_assets.defs.partitions import embedders
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.params import default_for


class CranfieldConfig(dg.Config):
    data_dir: str = str(datasets.DEFAULT_CRANFIELD)  # the folder holding cran.all.1400, cran.qry, cranqrel
    k: int = 10  # nDCG cut-off
    depth: int = 100  # documents per ranked list; recall@depth; MRR over the whole list
    n: int = benchmark.CRANFIELD.n  # chunks per first-stage list and in the fused rerank pool
    mmr_lambda: float = benchmark.CRANFIELD.mmr_lambda
    peer: bool = True  # the bm25s baseline (dev dependency) in the same run
    cross_check: bool = True  # recompute every number with pytrec_eval (dev dependency) when installed


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@dg.asset(
    partitions_def=embedders,
    kinds={"postgres", "python"},
    group_name="benchmark",
    description="Cranfield 1400 as distributed: nDCG@10, recall@100 and MRR of the default pipeline and of the seed's "
    "stages beside a bm25s peer, per embedder.",
)
def cranfield_report(context: dg.AssetExecutionContext, config: CranfieldConfig, postgres: PostgresResource) -> dg.MaterializeResult:
    key = context.partition_key
    bench = datasets.load_cranfield(config.data_dir)
    embedder = partitions.embedder(key)
    schema = postgres.schema(key, "cranfield")
    params = benchmark.CRANFIELD.with_(k=config.n, n=config.n, mmr_lambda=config.mmr_lambda)
    rankers: dict[str, benchmark.Ranker] = {}
    if config.peer:
        rankers["bm25s"] = benchmark.bm25s_ranker(bench.documents, k1=1.2, b=0.75, depth=config.depth)
    with postgres.connect() as conn:
        start = time.perf_counter()
        chunks, report = benchmark.index_benchmark(conn, schema, bench, embedder)
        index_s = time.perf_counter() - start
        context.log.info(f"indexed {len(chunks)} chunks into {schema} in {index_s:.1f} s ({report.embedded} embedded)")
        rankers.update(benchmark.our_rankers(conn, schema, embedder, chunks, params=params, depth=config.depth))
        rankers["default pipeline"] = benchmark.params_ranker(conn, schema, embedder, chunks, default_for(key).with_(k=config.n, n=config.n),
                                                                   depth=config.depth)
        scores = benchmark.evaluate_rankers(bench, rankers, k=config.k, depth=config.depth, progress=context.log.info)

    rows = [("peer" if name == "bm25s" else key, s) for name, s in scores.items()]
    meta: dict = {
        "embedder": embedder.name, "schema": schema, "data_dir": config.data_dir,
        "documents": len(bench.documents), "queries": next(iter(scores.values())).queries if scores else 0,
        "chunks": len(chunks), "index_seconds": round(index_s, 2), "embedded": report.embedded,
        "table": dg.MetadataValue.md(benchmark.markdown_table(rows, k=config.k, depth=config.depth)),
    }
    for name, s in scores.items():
        meta.update({f"{name}/ndcg@{config.k}": s.ndcg, f"{name}/recall@{config.depth}": s.recall, f"{name}/mrr": s.mrr})
    ours = [s for name, s in scores.items() if name != "bm25s"]
    best = max(ours, key=lambda s: s.ndcg)
    meta.update({"best_pipeline": best.name, f"best/ndcg@{config.k}": best.ndcg})
    if "bm25s" in scores:
        meta[f"best_minus_peer/ndcg@{config.k}"] = best.ndcg - scores["bm25s"].ndcg
    if config.cross_check and _importable("pytrec_eval"):
        meta["max_diff_vs_pytrec_eval"] = max(benchmark.trec_eval_check(bench, scores, k=config.k, depth=config.depth).values())
    return dg.MaterializeResult(metadata=meta)
