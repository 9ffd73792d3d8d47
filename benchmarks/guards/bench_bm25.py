"""BM25 inside Postgres: what keeping the statistics costs sync, and how fast the query is.

Run: uv run python -m benchmarks bench_bm25 [--repeats 5] [--skip-cranfield] [--scale-schema bench_scale_100000_hash]
Targets (issue 11): statistics cost sync at most 30% extra time; BM25 query p50 under 10 ms on
Cranfield and under 50 ms at 100k chunks. Prints figures only; never asserts.

Sync overhead: the fixture corpus and Cranfield are synced into a fresh table of the scratch
schema ``bench_bm25_hash`` (common.bench_schema), alternately with the postings maintenance on
and off (bm25.add_terms / bm25.drop_terms, which store calls, replaced by no-ops), median of the
repeats. Query latency: every query once to warm up, then p50/p95 over all of them (``common.per_query``),
warm connection, for bm25_rank.bm25_search and for the seed's ts_rank.text_search (ts_rank_cd).
Lookup cost: a posting read by range scan against a primary-key lookup, and on the scale schema
(kept by ``python -m benchmarks scale --sizes 100000 --keep``) bm25_search latency for
several bm25_rank.LOOKUP_COST values.
"""

from __future__ import annotations

import random
import statistics
import time
from contextlib import contextmanager

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.corpus import datasets
from retrieval_assets.evaluation import benchmark
from retrieval_assets.index import bm25, store, tables
from retrieval_assets.search import bm25_rank, ts_rank
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.tables import statement


@contextmanager
def postings(enabled: bool):
    saved = bm25.add_terms, bm25.drop_terms
    if not enabled:
        bm25.add_terms = lambda conn, schema, ids: None
        bm25.drop_terms = lambda conn, schema, ids: None
    try:
        yield
    finally:
        bm25.add_terms, bm25.drop_terms = saved


def sync_seconds(conn, schema, chunks, embedder, enabled: bool) -> float:
    store.drop(conn, schema)
    store.create(conn, schema, embedder.dims)
    with postings(enabled):
        return common.timed(lambda: store.sync(conn, schema, chunks, embedder))[0]


def overhead(name: str, conn, schema, chunks, repeats: int) -> None:
    embedder = HashEmbedder()
    embedder.embed([c.text for c in chunks])  # warm the token cache: time the write path, not hashing
    times = {True: [], False: []}
    for _ in range(repeats):
        for enabled in (False, True):
            times[enabled].append(sync_seconds(conn, schema, chunks, embedder, enabled))
    on, off = statistics.median(times[True]), statistics.median(times[False])
    print(f"{name}: {len(chunks)} chunks, sync with statistics {on:.3f} s, without {off:.3f} s, overhead {100 * (on / off - 1):.0f}%")


KINDS = (("bm25_search", bm25_rank.bm25_search), ("text_search (ts_rank_cd)", ts_rank.text_search))


def latency(name: str, conn, schema, queries: list[str], kinds=KINDS) -> None:
    for label, search in kinds:
        samples = common.per_query(lambda q, search=search: search(conn, schema, q, 50), queries, 1)
        print(f"{name}: {label:<24} {common.summary_ms(samples)}")


def lookup_cost(name: str, conn, schema) -> None:
    """What bm25_rank.LOOKUP_COST stands for: the lookup of one (term, chunk) pair in its block against
    one posting read in a term's scan of its blocks, both inside one statement as bm25_search runs them."""
    terms = [r[0] for r in conn.execute(statement(schema, "SELECT term FROM {term_df} ORDER BY df DESC LIMIT 20"))]
    pairs = conn.execute(statement(schema, "SELECT p.term, u.cid FROM {postings} p TABLESAMPLE SYSTEM (5), unnest(p.cids) AS u(cid) LIMIT 20000")).fetchall()
    scan, lookup = [], []
    for _ in range(5):
        start = time.perf_counter()
        read = conn.execute(statement(schema, "SELECT count(*) FROM {postings} p, unnest(p.tfs) AS u(tf) WHERE p.term = ANY(%s) AND u.tf > 0"),
                            (terms,)).fetchone()[0]
        scan.append((time.perf_counter() - start) / read)
        start = time.perf_counter()
        conn.execute(
            statement(schema, """SELECT count(*) FROM unnest(%s::text[], %s::int4[]) AS p(term, cid)
               CROSS JOIN LATERAL (SELECT b.tfs[array_position(b.cids, p.cid)] FROM {postings} b
                                   WHERE b.term = p.term AND b.first_cid <= p.cid ORDER BY b.first_cid DESC LIMIT 1) x"""),
            ([t for t, _ in pairs], [c for _, c in pairs]),
        ).fetchone()
        lookup.append((time.perf_counter() - start) / len(pairs))
    s, lk = statistics.median(scan), statistics.median(lookup)
    print(f"{name}: posting read in a range scan {1e6 * s:.2f} us, key lookup {1e6 * lk:.2f} us: one lookup = {lk / s:.1f} postings "
          f"(bm25_rank.LOOKUP_COST is {bm25_rank.LOOKUP_COST})")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=5, schema=common.bench_schema("bm25"))
    parser.add_argument("--scale-schema", default=common.scale_schema(100_000), help="an indexed schema of scale --keep, if present")
    parser.add_argument("--skip-cranfield", action="store_true")
    args = parser.parse_args(argv)
    schema = args.schema
    common.print_machine({"schema": schema})

    _, chunks, golden = common.fixture()
    with pg.connect(args.dsn) as conn:
        overhead("fixture corpus", conn, schema, chunks, args.repeats)
        store.sync(conn, schema, chunks, HashEmbedder())  # the last timed sync kept postings: changes nothing
        latency("fixture corpus", conn, schema, [q.query for q in golden])
        lookup_cost("fixture corpus", conn, schema)

    try:
        cranfield = None if args.skip_cranfield else datasets.load_cranfield()
    except datasets.DatasetError as exc:
        cranfield = None
        print(f"Cranfield skipped: {exc}")
    if cranfield is not None:
        chunks = benchmark.chunk_documents(cranfield.documents)
        with pg.connect(args.dsn) as conn:
            overhead("Cranfield", conn, schema, chunks, args.repeats)
            store.sync(conn, schema, chunks, HashEmbedder())
            latency("Cranfield", conn, schema, list(cranfield.queries.values()))
            store.drop(conn, schema)

    scale = args.scale_schema
    with pg.connect(args.dsn) as conn:
        dims = tables.table_dims(conn, scale)
        if dims is None:
            print(f"scale: schema {scale} has no chunk table; run `python -m benchmarks scale --sizes 100000 --keep` first")
            common.print_load_end()
            return 0
        store.create(conn, scale, dims)  # backfills postings for a table that predates them
        n = tables.count(conn, scale)
        texts = [r[0] for r in conn.execute(statement(scale, "SELECT text FROM {chunks} TABLESAMPLE SYSTEM (1) LIMIT 400"))]
        rng = random.Random(0)
        queries = []
        for text in texts:
            words = [w for w in text.split() if w.isalpha()]
            if len(words) >= 4:
                queries.append(" ".join(rng.sample(words, rng.randint(2, 4))))
        latency(f"scale ({n} chunks)", conn, scale, queries[:200])
        lookup_cost(f"scale ({n} chunks)", conn, scale)
        saved = bm25_rank.LOOKUP_COST
        try:
            for cost in (4, 12, 25, 50):  # the choice between key lookups and reading every posting
                bm25_rank.LOOKUP_COST = cost
                latency(f"scale ({n} chunks), LOOKUP_COST {cost}", conn, scale, queries[:200], kinds=KINDS[:1])
        finally:
            bm25_rank.LOOKUP_COST = saved
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
