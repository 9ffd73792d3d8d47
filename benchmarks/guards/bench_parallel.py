"""The 100k exact scan and hybrid search at 0, 1 and 2 parallel workers per query, and split across two sessions.

Run (from the project root), after ``uv run python -m benchmarks.guards.scale --sizes 100000 --keep``:

    uv run python -m benchmarks.guards.bench_parallel [--queries 100] [--rounds 3]

On the kept ``bench_scale_100000_hash`` schema (its vector search as ``pipeline.retriever`` chooses
it, the exact scan of the narrow copy there), times ``dense.vector_search`` (n 50, the query vector
precomputed), ``text_search`` (ts_rank_cd), ``bm25_search`` and ``hybrid.search`` with the BM25 list
(the default's first stage and fusion, k 10) and with ``ts_rank_cd`` (the seed's, RRF), as scale.py
runs them, and ``pipeline.run`` with the default pipeline (what the command line and assets run: the
first stage, fusion and the BM25 rerank over the fetched pool), and the one-statement peer of
bench_search on the same narrow copies (``PEER_EXACT``; its ratio to hybrid.search with the seed's
parameters printed at the end), with ``max_parallel_workers_per_gather`` at each of ``--workers`` (a session setting) and the
exact scan in one statement (``$RETRIEVAL_SEARCH_SESSIONS`` 1), and as the library runs it: split across two sessions
(``pg.partner``; "split", the other statements at the server's own setting, 1 on 2 cores). The settings are rotated per query so that
load drift falls on all alike. Prints p50 / p95 per setting and the p50 ratio to the first of ``--workers``
(default 2, Postgres's default, in one statement). Prints figures only.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

from benchmarks import common
from benchmarks.guards.bench_search import PEER_OR_NARROW, peer
from retrieval_assets import partitions, pg
from retrieval_assets.search import bm25_rank, dense, hybrid, pipeline, ts_rank
from retrieval_assets.params import DEFAULT
from retrieval_assets.corpus.synthetic import Corpus

# bench_search's one-statement peer (pgvector-python's rrf.py style, the words ORed as ours take them, full
# text on our fulltext copy) with its vector CTE on the exact scan's narrow copy: the same search as
# hybrid.search with the seed's parameters, written as one statement that Postgres may run in parallel
PEER_EXACT = PEER_OR_NARROW.replace("FROM {chunks} ORDER BY embedding", "FROM {vectors} ORDER BY embedding")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema", default=common.scale_schema(100_000))
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 1, 0])
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    conn = pg.connect(args.dsn)
    common.print_machine({**common.postgres_versions(conn), "schema": args.schema,
                          "shared_buffers": conn.execute("SHOW shared_buffers").fetchone()[0]})
    embedder = partitions.embedder("hash")
    sessions = os.environ.get(pg.ENV_SESSIONS)  # put back at the end
    retriever = pipeline.retriever(conn, args.schema, embedder, DEFAULT)
    print(f"vector search of {args.schema}: {'exact scan of its ' + str(retriever.exact) + ' copy' if retriever.exact else 'HNSW'}")
    queries = Corpus(0, topics=300).queries(args.queries)
    vectors = {q: embedder.embed([q])[0] for q in queries}
    params = DEFAULT.with_(k=10, n=50, rerank=False)  # the first stage and its fusion
    seed = params.with_(lexical="ts_rank_cd", fusion="rrf", weights=(1.0, 1.0))
    assert PEER_EXACT != PEER_OR_NARROW and retriever.exact, "the peer needs the exact scan's copy"
    as_copy = functools.partial(dense._exact_query, exact=retriever.exact)  # the query bound as the copy holds vectors
    server_workers = conn.execute("SHOW max_parallel_workers_per_gather").fetchone()[0]  # what the split runs beside
    kinds = {"vector_search": lambda q: dense.vector_search(conn, args.schema, vectors[q], params.n, exact=retriever.exact),
             "text_search": lambda q: ts_rank.text_search(conn, args.schema, q, params.n),
             "bm25_search": lambda q: bm25_rank.bm25_search(conn, args.schema, q, params.n),
             "hybrid.search (ts_rank_cd)": lambda q: hybrid.search(conn, args.schema, embedder, q, seed, exact=retriever.exact),
             "hybrid.search (bm25)": lambda q: hybrid.search(conn, args.schema, embedder, q, params, exact=retriever.exact),
             "pipeline.run (default)": lambda q: pipeline.run(conn, retriever, q, DEFAULT),
             "peer + embed (one statement)": lambda q: peer(conn, args.schema, as_copy(embedder.embed([q])[0]), q, seed, PEER_EXACT)}
    settings = ["split", *args.workers]
    times = {(kind, w): [] for kind in kinds for w in settings}
    for rnd in range(args.rounds + 1):  # round 0 warms the caches, untimed
        for i, q in enumerate(queries):
            order = settings[i % len(settings):] + settings[: i % len(settings)]
            for w in order:
                os.environ[pg.ENV_SESSIONS] = "2" if w == "split" else "1"  # pg.search_sessions reads it per search
                conn.execute("SELECT set_config('max_parallel_workers_per_gather', %s, false)", (server_workers if w == "split" else str(w),))
                for kind, fn in kinds.items():
                    start = time.perf_counter()
                    fn(q)
                    if rnd:
                        times[kind, w].append(time.perf_counter() - start)
    conn.execute("RESET max_parallel_workers_per_gather")
    if sessions is None:
        os.environ.pop(pg.ENV_SESSIONS)
    else:
        os.environ[pg.ENV_SESSIONS] = sessions
    for kind in kinds:
        base = common.pct([1000 * s for s in times[kind, args.workers[0]]], 50)
        for w in settings:
            ms = [1000 * s for s in times[kind, w]]
            ratio = f"  p50 / workers {args.workers[0]}: {common.pct(ms, 50) / base:.2f}x"
            label = "split" if w == "split" else f"workers {w}"
            print(f"{kind:<28} {label:>9}: p50 {common.pct(ms, 50):6.1f} ms  p95 {common.pct(ms, 95):6.1f} ms  (n={len(ms)}){ratio}")
    ours, theirs = (common.pct(times[kind, "split"], 50) for kind in ("hybrid.search (ts_rank_cd)", "peer + embed (one statement)"))
    same = sum(len({r.chunk_id for r in hybrid.search(conn, args.schema, embedder, q, seed, exact=retriever.exact)}
                   & {row[0] for row in peer(conn, args.schema, as_copy(vectors[q]), q, seed, PEER_EXACT)}) for q in queries)
    print(f"hybrid.search (ts_rank_cd, RRF; split) against the peer (one statement, workers {server_workers}), same slots: p50 ratio "
          f"{ours / theirs:.2f}x; top 10 in common {same / (10 * len(queries)):.0%}")
    print(f"load at end: {common.load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
