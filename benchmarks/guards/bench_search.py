"""Query latency on the indexed fixture corpus: hybrid.search, its two halves, the BM25+MMR
pipeline, and the whole golden-set evaluation.

Run: uv run python benchmarks/bench_search.py [--repeats 5] [--schema bench_search]
Targets: hybrid.search p50 < 10 ms and p95 < 25 ms; rerank.pipeline p50 < 25 ms;
metrics.evaluate_pipelines over the 48 golden queries (k=10, n=50) < 3 s.
Prints figures only; never asserts. Indexes the corpus with HashEmbedder(256) into its own
schema (default ``bench_search``; store.sync, so a re-run changes nothing), then times every
golden query --repeats times on one warm connection (one untimed warm-up pass first; the
embedder instance is shared, so its token cache is warm, except where a row says otherwise).
Percentiles interpolate linearly between closest ranks over all repeats x 48 queries.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from _common import fixture, pct, postgres_versions, print_load_end, print_machine, summary_ms, verdict

from retrieval_assets import hybrid, metrics, pg, rerank, store
from retrieval_assets.embed import HashEmbedder

DIMS = 256


def per_query(fn, queries, repeats: int) -> list[float]:
    for q in queries:  # warm-up, untimed
        fn(q)
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for q in queries:
                start = time.perf_counter()
                fn(q)
                samples.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--schema", default="bench_search")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()

    documents, chunks, golden = fixture()
    queries = [q.query for q in golden]
    conn = pg.connect(args.dsn, schema=args.schema)
    print_machine({**postgres_versions(conn), "server": pg.mask_dsn(pg.resolve_dsn(args.dsn)), "schema": args.schema})

    embedder, reranker = HashEmbedder(DIMS), rerank.LexicalReranker()
    store.Schema.create(conn, DIMS)
    report = store.sync(conn, chunks, embedder)
    print(f"\nindex: {store.count(conn)} chunks ({report}); {len(queries)} golden queries x {args.repeats} repeats, warm connection")

    rows = {
        "round trip (SELECT 1)": lambda q: conn.execute("SELECT 1").fetchone(),
        "HashEmbedder.embed([query]) (warm cache)": lambda q: embedder.embed([q]),
        "hybrid.vector_search n=50": lambda q: hybrid.vector_search(conn, embedder, q, 50),
        "hybrid.text_search n=50": lambda q: hybrid.text_search(conn, q, 50),
        "  of which hybrid.parse_query": lambda q: hybrid.parse_query(conn, q),
        "hybrid.search n=50 top_k=10": lambda q: hybrid.search(conn, embedder, q, 50, 10),
        "rerank.pipeline (BM25 + MMR) n=50 top_k=10": lambda q: rerank.pipeline(conn, embedder, reranker, q),
        "rerank.pipeline, new HashEmbedder() per call": lambda q: rerank.pipeline(conn, HashEmbedder(DIMS), reranker, q),
    }
    targets = {
        "hybrid.search n=50 top_k=10": (10, 25),
        "rerank.pipeline (BM25 + MMR) n=50 top_k=10": (25, None),
        "rerank.pipeline, new HashEmbedder() per call": (25, None),
    }
    print()
    for label, fn in rows.items():
        samples = per_query(fn, queries, args.repeats)
        note = ""
        if label in targets:
            p50_t, p95_t = targets[label]
            ms = [1000 * s for s in samples]
            note = f"  [p50 < {p50_t} ms: {verdict(pct(ms, 50) < p50_t)}"
            note += f"; p95 < {p95_t} ms: {verdict(pct(ms, 95) < p95_t)}]" if p95_t else "]"
        print(f"{label:<46} {summary_ms(samples)}{note}")

    # the whole evaluation, as the eval_run asset runs it
    walls, ev = [], None
    metrics.evaluate_pipelines(conn, embedder, reranker, golden, k=10, n=50)  # warm-up
    for _ in range(args.repeats):
        gc.collect()
        start = time.perf_counter()
        ev = metrics.evaluate_pipelines(conn, embedder, reranker, golden, k=10, n=50)
        walls.append(time.perf_counter() - start)
    cold = []
    for _ in range(args.repeats):
        gc.collect()
        start = time.perf_counter()
        metrics.evaluate_pipelines(conn, HashEmbedder(DIMS), rerank.LexicalReranker(), golden, k=10, n=50)
        cold.append(time.perf_counter() - start)
    print(f"\nmetrics.evaluate_pipelines, {len(golden)} queries, k=10 n=50: best {min(walls):.3f} s, median "
          f"{statistics.median(walls):.3f} s (runs: {', '.join(f'{w:.3f}' for w in walls)})  "
          f"[< 3 s: {verdict(min(walls) < 3)}]")
    print(f"  with a new HashEmbedder + LexicalReranker per run: best {min(cold):.3f} s, median {statistics.median(cold):.3f} s")
    print(f"  its own per-query latency (last run): p50 {ev.latency_ms['p50']:.2f} ms, p95 {ev.latency_ms['p95']:.2f} ms")
    m = ev.metrics
    print(f"  sanity (quality, not speed): pool recall@50 {ev.pool_recall:.3f}; MRR hybrid {m['hybrid'].mrr:.3f}, "
          f"rerank {m['rerank'].mrr:.3f}, mmr {m['mmr'].mrr:.3f}; recall@10 mmr {m['mmr'].recall_at_k:.3f}")
    conn.close()


if __name__ == "__main__":
    main()
    print_load_end()
