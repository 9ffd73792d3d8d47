"""BM25 inside Postgres: what keeping the statistics costs sync, and how fast the query is.

Run: uv run python benchmarks/bench_bm25.py [--repeats 5] [--scale-schema bench_scale_100000]
Targets (issue 11): statistics cost sync at most 30% extra time; BM25 query p50 under 10 ms on
Cranfield and under 50 ms at 100k chunks. Prints figures only; never asserts.

Sync overhead: the fixture corpus and Cranfield are synced into a fresh table, alternately with
the postings maintenance on and off (store._add_terms / store._drop_terms replaced by no-ops),
median of the repeats. Query latency: every query once to warm up, then p50/p95 over all of
them, warm connection, for bm25_search and for the seed's text_search (ts_rank_cd).
Lookup cost: a posting read by range scan against a primary-key lookup, and on the scale schema
bm25_search latency for several hybrid.LOOKUP_COST values.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from contextlib import contextmanager

from _common import fixture, print_machine

from retrieval_assets import datasets, hybrid, pg, store
from retrieval_assets.embed import HashEmbedder


@contextmanager
def postings(enabled: bool):
    saved = store._add_terms, store._drop_terms
    if not enabled:
        store._add_terms = lambda conn, ids: None
        store._drop_terms = lambda conn, ids: None
    try:
        yield
    finally:
        store._add_terms, store._drop_terms = saved


def sync_seconds(conn, chunks, embedder, enabled: bool) -> float:
    store.drop(conn)
    store.Schema.create(conn, embedder.dims)
    with postings(enabled):
        start = time.perf_counter()
        store.sync(conn, chunks, embedder)
        return time.perf_counter() - start


def overhead(name: str, conn, chunks, repeats: int) -> None:
    embedder = HashEmbedder()
    embedder.embed([c.text for c in chunks])  # warm the token cache: time the write path, not hashing
    times = {True: [], False: []}
    for _ in range(repeats):
        for enabled in (False, True):
            times[enabled].append(sync_seconds(conn, chunks, embedder, enabled))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{name}: {len(chunks)} chunks, sync with statistics {on:.3f} s, without {off:.3f} s, overhead {100 * (on / off - 1):.0f}%")


def latency(name: str, conn, queries: list[str], kinds=(("bm25_search", hybrid.bm25_search), ("text_search (ts_rank_cd)", hybrid.text_search))) -> None:
    for label, search in kinds:
        for q in queries:
            search(conn, q, 50)
        ms = []
        for q in queries:
            start = time.perf_counter()
            search(conn, q, 50)
            ms.append(1000 * (time.perf_counter() - start))
        ms.sort()
        print(f"{name}: {label} over {len(ms)} queries: p50 {ms[len(ms) // 2]:.1f} ms, p95 {ms[int(0.95 * len(ms))]:.1f} ms")


def lookup_cost(name: str, conn) -> None:
    """What hybrid.LOOKUP_COST stands for: a primary-key lookup of one (term, chunk) pair against
    one posting read in a term's range scan, both inside one statement as bm25_search runs them."""
    terms = [r[0] for r in conn.execute("SELECT term FROM term_df ORDER BY df DESC LIMIT 20")]
    pairs = conn.execute("SELECT term, chunk_id FROM chunk_terms TABLESAMPLE SYSTEM (5) LIMIT 20000").fetchall()
    scan, lookup = [], []
    for _ in range(5):
        start = time.perf_counter()
        read = conn.execute("SELECT count(*) FROM chunk_terms WHERE term = ANY(%s) AND tf > 0", (terms,)).fetchone()[0]
        scan.append((time.perf_counter() - start) / read)
        start = time.perf_counter()
        conn.execute(
            """SELECT count(*) FROM unnest(%s::text[], %s::text[]) AS p(term, chunk_id)
               CROSS JOIN LATERAL (SELECT tf FROM chunk_terms t WHERE t.term = p.term AND t.chunk_id = p.chunk_id) x""",
            ([t for t, _ in pairs], [c for _, c in pairs]),
        ).fetchone()
        lookup.append((time.perf_counter() - start) / len(pairs))
    s, lk = statistics.median(scan), statistics.median(lookup)
    print(f"{name}: posting read in a range scan {1e6 * s:.2f} us, key lookup {1e6 * lk:.2f} us: one lookup = {lk / s:.1f} postings "
          f"(hybrid.LOOKUP_COST is {hybrid.LOOKUP_COST})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scale-schema", default="bench_scale_100000", help="an indexed schema of benchmarks/scale.py, if present")
    args = parser.parse_args()
    print_machine()

    _, chunks, golden = fixture()
    with pg.connect(schema="bench_bm25") as conn:
        overhead("fixture corpus", conn, chunks, args.repeats)
        store.sync(conn, chunks, HashEmbedder())
        latency("fixture corpus", conn, [q.query for q in golden])
        lookup_cost("fixture corpus", conn)

    try:
        cranfield = datasets.load_cranfield()
    except datasets.DatasetError as exc:
        print(f"Cranfield skipped: {exc}")
    else:
        chunks = datasets.chunk_documents(cranfield.documents)
        with pg.connect(schema="bench_bm25") as conn:
            overhead("Cranfield", conn, chunks, args.repeats)
            store.sync(conn, chunks, HashEmbedder())
            latency("Cranfield", conn, list(cranfield.queries.values()))
            store.drop(conn)

    with pg.connect(schema=args.scale_schema) as conn:
        if store.table_dims(conn) is None:
            print(f"scale: schema {args.scale_schema} has no chunk table; run benchmarks/scale.py --keep first")
            return
        store.Schema.create(conn, store.table_dims(conn))  # backfills postings for a table that predates them
        n = store.count(conn)
        texts = [r[0] for r in conn.execute("SELECT text FROM chunks TABLESAMPLE SYSTEM (1) LIMIT 400")]
        rng = random.Random(0)
        queries = []
        for text in texts:
            words = [w for w in text.split() if w.isalpha()]
            if len(words) >= 4:
                queries.append(" ".join(rng.sample(words, rng.randint(2, 4))))
        latency(f"scale ({n} chunks)", conn, queries[:200])
        lookup_cost(f"scale ({n} chunks)", conn)
        saved = hybrid.LOOKUP_COST
        try:
            for cost in (4, 12, 25, 50):  # the choice between key lookups and reading every posting
                hybrid.LOOKUP_COST = cost
                latency(f"scale ({n} chunks), LOOKUP_COST {cost}", conn, queries[:200], kinds=(("bm25_search", hybrid.bm25_search),))
        finally:
            hybrid.LOOKUP_COST = saved


if __name__ == "__main__":
    main()
