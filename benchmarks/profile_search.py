"""Where a query's time goes (rerank.pipeline, stage by stage) and candidate fixes measured beside it.

Run: uv run python benchmarks/profile_search.py [--repeats 3] [--cprofile]
Not the project's code: the candidates below are proposals for retrieval_assets, measured on
scratch copies of the index (schema ``bench_profile``, dropped at the end). Prints figures only.

Candidates:
  storage   ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE PLAIN (vector kept in the heap
            row, not TOAST), issued in Schema.create before rows are written (SET STORAGE affects
            new rows only); ALTER COLUMN tsv SET STORAGE MAIN is measured too, alone
  fetch     rerank.fetch with binary results (conn.cursor(binary=True)): pgvector's binary loader
            is np.frombuffer, its text loader parses 256 floats per row in Python
  bm25      LexicalReranker with the word Counter of a text cached (functools.lru_cache on text)
The fetch and bm25 candidates were adopted (rerank.fetch reads binary, rerank caches word
counts); their before/after figures are in RESULTS.md, and this script now measures the library
as it is beside the storage candidate, which was not adopted.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time

from _common import drop_chunks, drop_schema, fixture, pct, postgres_versions, print_load_end, print_machine

from retrieval_assets import hybrid, pg, rerank, store
from retrieval_assets.embed import HashEmbedder

SCHEMA = "bench_profile"
FETCH_SQL = """SELECT chunk_id, doc_id, heading_path, start_char, end_char, text, embedding
               FROM chunks WHERE chunk_id = ANY(%s)"""


def staged_pipeline(conn, embedder, reranker, query, acc, n=50, top_k=10):
    """rerank.trace's steps, timed one by one (same calls, same order)."""
    t0 = time.perf_counter()
    vector = hybrid.vector_search(conn, embedder, query, n)
    t1 = time.perf_counter()
    text = hybrid.text_search(conn, query, n)
    t2 = time.perf_counter()
    fused = hybrid.rrf([vector, text])[:n]
    t3 = time.perf_counter()
    rows = rerank.fetch(conn, [r.chunk_id for r in fused])
    t4 = time.perf_counter()
    pool = [r for r in fused if r.chunk_id in rows]
    reranked = reranker.rerank(query, [rows[r.chunk_id][0] for r in pool], len(pool))
    t5 = time.perf_counter()
    final = rerank.mmr(embedder.embed([query])[0], reranked, [rows[r.chunk_id][1] for r in reranked], lam=0.7, top_k=top_k)
    t6 = time.perf_counter()
    for key, d in zip(("vector_search", "text_search", "rrf", "fetch", "rerank (BM25)", "embed query + mmr"),
                      (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5)):
        acc.setdefault(key, []).append(d)
    acc.setdefault("total", []).append(t6 - t0)
    return final


def measure(fn, queries, repeats):
    for q in queries:
        fn(q)
    samples = []
    for _ in range(repeats):
        for q in queries:
            start = time.perf_counter()
            fn(q)
            samples.append(1000 * (time.perf_counter() - start))
    return samples


def p(samples) -> str:
    return f"{pct(samples, 50):6.2f}/{pct(samples, 95):6.2f}"


def build(conn, chunks, alters):
    drop_chunks(conn)
    store.Schema.create(conn, 256)
    for statement in alters:
        conn.execute(statement)
    store.sync(conn, chunks, HashEmbedder(256))
    conn.execute("VACUUM ANALYZE chunks")
    return conn.execute(
        "SELECT pg_relation_size('chunks') / 8192, pg_relation_size(reltoastrelid) / 8192 FROM pg_class WHERE oid = 'chunks'::regclass"
    ).fetchone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()

    documents, chunks, golden = fixture()
    queries = [q.query for q in golden]
    conn = pg.connect(args.dsn, schema=SCHEMA)
    print_machine(postgres_versions(conn))
    embedder = HashEmbedder(256)

    # 1. the current code, stage by stage
    pages = build(conn, chunks, [])
    acc: dict[str, list[float]] = {}
    for q in queries:
        staged_pipeline(conn, embedder, rerank.LexicalReranker(), q, {})
    for _ in range(args.repeats):
        for q in queries:
            staged_pipeline(conn, embedder, rerank.LexicalReranker(), q, acc)
    total = sum(acc["total"])
    print(f"\n1. rerank.pipeline on the current code, by stage ({len(queries)} queries x {args.repeats}; "
          f"heap/TOAST pages {pages[0]}/{pages[1]}):")
    print(f"  {'stage':<20} {'mean ms':>8} {'p50 ms':>7} {'share':>6}")
    for key, values in acc.items():
        ms = [1000 * v for v in values]
        share = f"{100 * sum(values) / total:5.1f}%" if key != "total" else ""
        print(f"  {key:<20} {sum(ms) / len(ms):8.2f} {pct(ms, 50):7.2f} {share:>6}")
    rt = measure(lambda q: conn.execute("SELECT 1").fetchone(), queries, args.repeats)
    print(f"  (one round trip, SELECT 1: p50 {pct(rt, 50):.2f} ms; vector_search makes 4, text_search 2, fetch 1)")

    plans = {}
    for label, q in (("text_search", queries[0]), ("vector_search", queries[0])):
        if label == "text_search":
            pos, neg = hybrid.parse_query(conn, q)
            rows = conn.execute(
                """EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT chunk_id, ts_rank_cd(tsv, q, 32) AS score
                   FROM chunks, CAST(%(pos)s AS tsquery) AS q
                   WHERE tsv @@ q AND (%(neg)s::tsquery IS NULL OR NOT tsv @@ %(neg)s::tsquery)
                   ORDER BY score DESC, chunk_id LIMIT 50""", {"pos": pos, "neg": neg}).fetchall()
        else:
            rows = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT chunk_id FROM chunks ORDER BY embedding <=> %s LIMIT 50",
                (embedder.embed([q])[0],)).fetchall()
        lines, in_scan = [], False
        for (line,) in rows:
            if "Scan" in line:
                lines.append(line)
                in_scan = True
            elif in_scan and ("Buffers" in line or "Rows Removed" in line):
                lines.append(line)
                in_scan = "Buffers" not in line
            elif "Execution Time" in line:
                lines.append(line)
        plans[label] = lines
    print("\n  plans for the first golden query (Sort keys omitted):")
    for label, lines in plans.items():
        print(f"  {label}:")
        for line in lines:
            print(f"    {line.strip()[:110]}")

    if args.cprofile:
        prof = cProfile.Profile()
        reranker = rerank.LexicalReranker()
        prof.enable()
        for q in queries:
            rerank.pipeline(conn, embedder, reranker, q)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    # 2. fetch and BM25 alone, on each query's fused pool
    pools = []
    for q in queries:
        ids = [r.chunk_id for r in hybrid.rrf([hybrid.vector_search(conn, embedder, q, 50), hybrid.text_search(conn, q, 50)])[:50]]
        rows = rerank.fetch(conn, ids)
        pools.append((q, ids, [rows[i][0] for i in ids if i in rows]))
    by_query = {q: (ids, cs) for q, ids, cs in pools}
    print(f"\n2. the two Python-side stages alone, {len(queries)} fused pools x {args.repeats} (p50/p95 ms):")
    for label, fn in (
        ("rerank.fetch (binary results)", lambda q: rerank.fetch(conn, by_query[q][0])),
        ("  server part (same query inside count(*))", lambda q: conn.execute(
            f"SELECT count(*) FROM ({FETCH_SQL}) s", (by_query[q][0],)).fetchone()),
        ("LexicalReranker.rerank (warm word counts)", lambda q: rerank.LexicalReranker().rerank(q, by_query[q][1], 50)),
    ):
        print(f"  {label:<44} {p(measure(fn, queries, args.repeats))}")

    # 3. candidates, one at a time and together
    print(f"\n3. candidates in the pipeline (p50/p95 ms over {len(queries)} queries x {args.repeats}):")
    print(f"  {'variant':<44} {'heap/toast':>10} {'vector':>13} {'text':>13} {'hybrid':>13} {'pipeline':>13}")
    storage = ["ALTER TABLE chunks ALTER COLUMN embedding SET STORAGE PLAIN",
               "ALTER TABLE chunks ALTER COLUMN tsv SET STORAGE MAIN"]
    variants = [
        ("current", []),
        ("storage: embedding PLAIN", storage[:1]),
        ("storage: embedding PLAIN + tsv MAIN", storage),
    ]
    reranker = rerank.LexicalReranker()
    for label, alters in variants:
        pages = build(conn, chunks, alters)
        rerank._word_counts.cache_clear()
        gc.collect()
        vec = measure(lambda q: hybrid.vector_search(conn, embedder, q, 50), queries, args.repeats)
        txt = measure(lambda q: hybrid.text_search(conn, q, 50), queries, args.repeats)
        hyb = measure(lambda q: hybrid.search(conn, embedder, q, 50, 10), queries, args.repeats)
        pipe = measure(lambda q: staged_pipeline(conn, embedder, reranker, q, {}), queries, args.repeats)
        same = all(
            [r.chunk_id for r in staged_pipeline(conn, embedder, reranker, q, {})]
            == [r.chunk_id for r in rerank.pipeline(conn, embedder, rerank.LexicalReranker(), q)]
            for q in queries
        )
        print(f"  {label:<44} {f'{pages[0]}/{pages[1]}':>10} {p(vec):>13} {p(txt):>13} {p(hyb):>13} {p(pipe):>13}"
              f"{'' if same else '  RESULTS DIFFER'}")
        if label == "storage: embedding PLAIN":
            rerank._word_counts.cache_clear()
            walls = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for q in queries:
                    staged_pipeline(conn, embedder, reranker, q, {})
                walls.append(time.perf_counter() - start)
            print(f"  {'  48 pipelines back to back (first run cold)':<44} runs: {', '.join(f'{w:.3f} s' for w in walls)}")
    conn.close()
    drop_schema(args.dsn, SCHEMA)


if __name__ == "__main__":
    main()
    print_load_end()
