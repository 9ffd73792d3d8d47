"""Query latency on the fixture: hybrid.search, pipeline.run, the evaluation, hostile queries, one-statement peers.

Covers hybrid.search and its two halves, the seed's and the default pipelines (pipeline.run), the whole
golden-set evaluation, a 10,000-character query, and the first stage against one-statement RRF peers.

Run: uv run python -m benchmarks bench_search [--repeats 5] [--schema bench_search_hash] [--against COMMIT]
Targets: hybrid.search p50 < 10 ms and p95 < 25 ms; pipeline.run (fused 50; the seed's BM25 rerank and MMR,
or the default's BM25 list, z-score fusion and corpus-idf rerank) p50 < 25 ms;
evaluate.evaluate_pipelines over the 48 golden queries (k=10, n=50) < 3 s; a 10,000-character query
('retrieval ' * 1000, and 10,000 distinct characters) answered or refused within 1 s (issue 17).
Prints figures only; never asserts. Indexes the corpus with the hash partition's embedder
(HashEmbedder(256)) into its own schema (default ``bench_search_hash``, common.bench_schema;
store.sync, so a re-run changes nothing), then times every golden query --repeats times on one
warm connection (one untimed warm-up pass first; the embedder instance is shared, so its token
cache is warm, except where a row says otherwise). The vector_search row includes embedding
the query (vector_search takes a vector; hybrid.search and pipeline.run embed it themselves).
Percentiles interpolate linearly between closest ranks over all repeats x 48 queries. The hostile queries
run through the default pipeline with either lexical list, --repeats times each, no warm-up (a first call
counts too); a refusal is a ``SearchTimeout``.

Peer comparison (issue 18): ``hybrid.first_stage`` and ``hybrid.search`` against ``PEER``, one
SQL statement in the style of pgvector-python's examples/hybrid_search/rrf.py (written here):
two CTEs, the vector top n by ``embedding <=> q`` and the full-text top n by ``ts_rank_cd``,
fused by RRF in SQL, top k. Same table, queries and n, k, rrf_k; the peer runs with the session's
hnsw.ef_search (40; ours sets max(n, 40) = 50) and websearch_to_tsquery as it is (words ANDed;
ours ORs them, so ours reads more text matches). Timed pairwise: each query runs ours and the
peer back to back (the order alternating), so load drift hits both alike; first_stage and the
peer get the query vector precomputed, hybrid.search and "peer + embed" embed it themselves.
The ratio ours/peer is given for p50, p95 and the median of the per-query ratios (target: <= 0.8).
Each peer's share of ``hybrid.search``'s top 10 says which one fuses the same lists (the issue's peer: 94%).
A second peer, ``PEER_OR``, ORs the words as ours does, so that it ranks the same text matches;
the peers read the chunk rows with the seed's GIN index on chunks.tsv (created here for them), while
ours read the narrow ``fulltext`` copy; ``PEER_OR_NARROW`` is the OR peer reading that copy too.
``hybrid.search`` is also timed against both peers on ``SEED_TABLE``, the chunk rows with the
vector in TOAST as the seed stored it (the table the issue's 1.13x to 1.24x were measured on).
The default pipeline's first stage (the BM25 list, z-score fusion) is timed against both peers too:
against the OR peer the two rank the same matches by different functions, so that row says what a
user of the default gets, not the target's like-for-like ratio.
``--against COMMIT`` also times this tree's first stage pairwise against that commit's (its
hybrid, bm25 and tsquery from ``git show``, ``modules_at``, beside this tree's other modules) after checking
that both return the same lists for every query.
"""

from __future__ import annotations

import time

from psycopg import sql

from benchmarks import common
from retrieval_assets.evaluation import evaluate
from retrieval_assets.index import lexeme_rule, tables
from retrieval_assets.search import dense, fusion, hybrid, pipeline, rerank, ts_rank, tsquery
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import DEFAULT, RetrievalParams
from retrieval_assets.index.tables import statement

DIMS = 256
PARAMS = RetrievalParams(k=10, n=50)  # the defaults, stated: fused 50, top 10, BM25 rerank, MMR 0.7

# The peer: one statement, both lists as CTEs ranked by row_number, RRF by a full outer join.
PEER = """
    WITH semantic AS (
        SELECT chunk_id, row_number() OVER (ORDER BY embedding <=> %(q)s) AS rank
        FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(n)s),
    keyword AS (
        SELECT chunk_id, row_number() OVER (ORDER BY ts_rank_cd(tsv, query, 32) DESC, chunk_id) AS rank
        FROM {chunks}, """ + lexeme_rule.tsquery("%(text)s") + """ AS query
        WHERE tsv @@ query ORDER BY ts_rank_cd(tsv, query, 32) DESC, chunk_id LIMIT %(n)s)
    SELECT coalesce(semantic.chunk_id, keyword.chunk_id) AS chunk_id,
           coalesce(1.0 / (%(k)s + semantic.rank), 0.0) + coalesce(1.0 / (%(k)s + keyword.rank), 0.0) AS score
    FROM semantic FULL OUTER JOIN keyword ON semantic.chunk_id = keyword.chunk_id
    ORDER BY score DESC, chunk_id LIMIT %(top)s"""
# The same peer with the query's words ORed, as our lexical lists take them (phrases and negations
# aside): it reads the text matches ours reads, so the ratio shows what is left beside that work.
PEER_OR = PEER.replace(lexeme_rule.tsquery("%(text)s"),
                       f"CAST(replace(plainto_tsquery('{lexeme_rule.CONFIG}', {lexeme_rule.parsed('%(text)s')})::text, ' & ', ' | ') AS tsquery)")
# The OR peer reading our narrow full-text copy (store.create's ``fulltext``) instead of the chunk rows:
# what is left of the difference once both read the same tables.
PEER_OR_NARROW = PEER_OR.replace("FROM {chunks}, CAST", "FROM {fulltext}, CAST")


# The peers on the seed's table as the issue measured them: a copy of the chunk rows with the vector
# type's default storage (pgvector's EXTERNAL: a row of text, tsv and a 1 kB vector goes past 2 kB,
# so the vector moves to TOAST, uncompressed, and each row read fetches it apart), its HNSW and GIN indexes.
SEED_TABLE = "peer_seed_chunks"


def seed_table(conn, schema: str) -> None:
    """(Re)make ``SEED_TABLE`` from ``schema.chunks`` with the seed's storage and indexes."""
    table = sql.Identifier(schema, SEED_TABLE)
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
    conn.execute(statement(schema, "CREATE TABLE {seed} AS SELECT chunk_id, doc_id, text, tsv, embedding FROM {chunks}", seed=table))
    conn.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (embedding vector_cosine_ops)").format(table))
    conn.execute(sql.SQL("CREATE INDEX ON {} USING gin (tsv)").format(table))
    conn.execute(sql.SQL("ANALYZE {}").format(table))


def peer(conn, schema: str, vector, text: str, params: RetrievalParams = PARAMS, template: str = PEER, *, seed: bool = False) -> list:
    """The peer's fused top ``params.k``: ``(chunk_id, score)`` rows (``seed``: on ``SEED_TABLE``)."""
    if seed:
        template = template.replace("{chunks}", "{seed}")
    return conn.execute(statement(schema, template, seed=sql.Identifier(schema, SEED_TABLE)),
                        {"q": vector, "text": text, "n": params.n, "k": params.rrf_k, "top": params.k}).fetchall()


def modules_at(commit: str, names=("tsquery", "bm25", "hybrid")) -> dict:
    """tsquery, bm25 and hybrid as they were at ``commit`` (``common.modules_at``). Each file is found at this
    tree's path (``retrieval_assets/search/hybrid.py``, ``retrieval_assets/index/bm25.py``), else at the flat
    layout's from before the subpackages (``retrieval_assets/hybrid.py``, e.g. at a9c2757), else as the one file
    of that name under retrieval_assets/ at the commit. The older bm25 and hybrid import the older tsquery (the
    query parsing is part of what is timed), and the older hybrid the older bm25_search. Loaded beside this
    tree's modules, which stay as they are."""
    return common.modules_at(commit, names)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=5, schema=common.bench_schema("search"))
    parser.add_argument("--against", metavar="COMMIT", default=None, help="also time the first stage of COMMIT, pairwise")
    args = parser.parse_args(argv)
    schema = args.schema

    _, chunks, golden = common.fixture()
    queries = [q.query for q in golden]
    conn = common.connect(args.dsn, schema)
    embedder = HashEmbedder(DIMS)
    report = common.index(conn, schema, chunks, embedder)
    default = DEFAULT.with_(k=10, n=50)  # the default pipeline: the BM25 list, z-score fusion, the corpus-idf rerank
    retriever, default_retriever = (pipeline.retriever(conn, schema, embedder, p) for p in (PARAMS, default))
    # the peers read the chunk rows as the seed's schema has them, with its GIN index on chunks.tsv (ours
    # moved to the narrow fulltext copy; without it the peers would scan every row)
    conn.execute(statement(schema, "CREATE INDEX IF NOT EXISTS peer_chunks_tsv_gin ON {chunks} USING gin (tsv)"))
    conn.execute(statement(schema, "ANALYZE {chunks}"))
    seed_table(conn, schema)
    print(f"\nindex: {tables.count(conn, schema)} chunks ({report}); {len(queries)} golden queries x {args.repeats} repeats, "
          f"warm connection; {PARAMS}")

    search_label = f"hybrid.search n={PARAMS.n} k={PARAMS.k}"
    pipeline_label = f"pipeline.run, seed (BM25 rerank + MMR) n={PARAMS.n}"
    default_label = f"pipeline.run, default n={default.n}"
    cold_label = "pipeline.run, seed, new HashEmbedder() per call"
    rows = {
        "round trip (SELECT 1)": lambda q: conn.execute("SELECT 1").fetchone(),
        "HashEmbedder.embed([query]) (warm cache)": lambda q: embedder.embed([q]),
        f"embed + dense.vector_search n={PARAMS.n}": lambda q: dense.vector_search(conn, schema, embedder.embed([q])[0], PARAMS.n),
        f"ts_rank.text_search n={PARAMS.n}": lambda q: ts_rank.text_search(conn, schema, q, PARAMS.n),
        "  of which tsquery.parse_query": lambda q: tsquery.parse_query(conn, q),
        search_label: lambda q: hybrid.search(conn, schema, embedder, q, PARAMS),
        pipeline_label: lambda q: pipeline.run(conn, retriever, q, PARAMS).final,
        default_label: lambda q: pipeline.run(conn, default_retriever, q, default).final,
        cold_label: lambda q: pipeline.run(conn, pipeline.Retriever(schema, HashEmbedder(DIMS), retriever.reranker), q, PARAMS).final,
    }
    targets = {search_label: (10, 25), pipeline_label: (25, None), default_label: (25, None), cold_label: (25, None)}
    print()
    for label, fn in rows.items():
        samples = common.per_query(fn, queries, args.repeats)
        note = ""
        if label in targets:
            p50_t, p95_t = targets[label]
            ms = [1000 * s for s in samples]
            note = f"  [p50 < {p50_t} ms: {common.verdict(common.pct(ms, 50) < p50_t)}"
            note += f"; p95 < {p95_t} ms: {common.verdict(common.pct(ms, 95) < p95_t)}]" if p95_t else "]"
        print(f"{label:<46} {common.summary_ms(samples)}{note}")

    # hostile queries (issue 17): answered or refused within 1 s
    hostile = {"'retrieval ' * 1000": "retrieval " * 1000, "10,000 distinct characters": "".join(chr(0x4E00 + i) for i in range(10_000))}
    for params in (default, default.with_(lexical="ts_rank_cd")):
        hostile_retriever = pipeline.retriever(conn, schema, embedder, params)
        for label, query in hostile.items():
            seconds, outcome = [], "answered"
            for _ in range(args.repeats):
                start = time.perf_counter()
                try:
                    pipeline.run(conn, hostile_retriever, query, params)
                except pipeline.SearchTimeout:
                    outcome = "refused (timeout)"
                seconds.append(time.perf_counter() - start)
            print(f"{f'pipeline.run ({params.lexical}), {label}':<46} {common.summary_ms(seconds)}  {outcome}  "
                  f"[< 1000 ms: {common.verdict(max(seconds) < 1)}]")

    def pair(label, ours, theirs, *how):
        common.compare(label, *common.pairwise(ours, theirs, queries, args.repeats), *how)

    # ours against the one-statement peer, pairwise
    vectors = {q: embedder.embed([q])[0] for q in queries}
    print(f"\nours vs peer, pairwise; load now {common.load_average()}")
    # which peer fuses the same lists: the share of hybrid.search's top k it returns (the issue measured 94%)
    ours_top = {q: {r.chunk_id for r in hybrid.search(conn, schema, embedder, q, PARAMS)} for q in queries}
    for template, label in ((PEER, "peer (words ANDed)"), (PEER_OR, "peer, words ORed")):
        shared = [len(ours_top[q] & {row[0] for row in peer(conn, schema, vectors[q], q, template=template)}) / PARAMS.k
                  for q in queries]
        print(f"top {PARAMS.k} in common with hybrid.search, mean over the queries: {label} {sum(shared) / len(shared):.3f}")
    for template, label in ((PEER, "peer (one SQL statement, RRF in SQL)"), (PEER_OR, "peer, words ORed (our matches)"),
                            (PEER_OR_NARROW, "peer ORed, on our fulltext copy")):
        pair(f"hybrid.first_stage ({PARAMS.lexical}) + fuse, top {PARAMS.k}",
             lambda q: fusion.fuse(hybrid.first_stage(conn, schema, vectors[q], q, PARAMS), PARAMS)[: PARAMS.k],
             lambda q, template=template: peer(conn, schema, vectors[q], q, template=template), label)
    pair(f"hybrid.first_stage ({PARAMS.lexical}) alone", lambda q: hybrid.first_stage(conn, schema, vectors[q], q, PARAMS),
         lambda q: peer(conn, schema, vectors[q], q))
    pair("hybrid.search (embeds), vs peer + embed", lambda q: hybrid.search(conn, schema, embedder, q, PARAMS),
         lambda q: peer(conn, schema, embedder.embed([q])[0], q))
    for template, label in ((PEER, "peer + embed on the seed's table (vector in TOAST)"),
                            (PEER_OR, "peer ORed + embed on the seed's table")):
        pair("hybrid.search (embeds), our layout", lambda q: hybrid.search(conn, schema, embedder, q, PARAMS),
             lambda q, template=template: peer(conn, schema, embedder.embed([q])[0], q, template=template, seed=True), label)
    for template, label in ((PEER, "peer (one SQL statement, RRF in SQL)"), (PEER_OR, "peer, words ORed (ts_rank_cd, not BM25)")):
        pair(f"default: first_stage ({default.lexical}) + {default.fusion}",
             lambda q: fusion.fuse(hybrid.first_stage(conn, schema, vectors[q], q, default), default)[: default.k],
             lambda q, template=template: peer(conn, schema, vectors[q], q, template=template), label)

    if args.against:
        older = modules_at(args.against)["hybrid"]
        print(f"\nthis tree vs {args.against}, pairwise; load now {common.load_average()}")
        for params in (PARAMS, default):
            same = all(older.first_stage(conn, schema, vectors[q], q, params) == hybrid.first_stage(conn, schema, vectors[q], q, params)
                       for q in queries)
            pair(f"hybrid.first_stage ({params.lexical}), lists identical: {same}",
                 lambda q, p=params: hybrid.first_stage(conn, schema, vectors[q], q, p),
                 lambda q, p=params: older.first_stage(conn, schema, vectors[q], q, p),
                 f"{args.against} (statement by statement)", f"this tree/{args.against}", None)

    # the whole evaluation, as the eval_run asset runs it
    evaluate.evaluate_pipelines(conn, retriever, golden, PARAMS)  # warm-up
    warm = [common.timed(lambda: evaluate.evaluate_pipelines(conn, retriever, golden, PARAMS)) for _ in range(args.repeats)]
    fresh = pipeline.Retriever(schema, HashEmbedder(DIMS), rerank.LexicalReranker())
    cold = [common.timed(lambda: evaluate.evaluate_pipelines(conn, fresh, golden, PARAMS))[0] for _ in range(args.repeats)]
    walls, ev = [w for w, _, _ in warm], warm[-1][2]
    print(f"\nevaluation.evaluate_pipelines, {len(golden)} queries, k={PARAMS.k} n={PARAMS.n}: {common.runs(walls)}  "
          f"[< 3 s: {common.verdict(min(walls) < 3)}]")
    print(f"  with a new HashEmbedder + LexicalReranker per run: {common.runs(cold)}")
    print(f"  its own per-query latency (last run): p50 {ev.latency_ms['p50']:.2f} ms, p95 {ev.latency_ms['p95']:.2f} ms")
    m = ev.metrics
    print(f"  sanity (quality, not speed): pool recall@{PARAMS.n} {ev.pool_recall:.3f}; MRR hybrid {m['hybrid'].mrr:.3f}, "
          f"rerank {m['rerank'].mrr:.3f}, mmr {m['mmr'].mrr:.3f}; recall@{PARAMS.k} mmr {m['mmr'].recall_at_k:.3f}")
    conn.close()
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
