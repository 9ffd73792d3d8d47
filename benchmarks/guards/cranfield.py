"""Cranfield 1400: our pipelines against a bm25s peer, on data nobody here wrote.

Run (from the project root; the data is read in place, never copied into the repository):

    uv run python -m benchmarks cranfield                       # hash and minilm, ~5 min on 2 cores
    uv run python -m benchmarks cranfield --embedders hash      # seconds
    uv run python -m benchmarks cranfield --data /path/to/cranfield --out -

Each embedder's chunk table lives in a scratch schema (``bench_cranfield_<embedder>``, the
``cranfield`` role of ``partitions.schema_name``, after ``--schema-prefix``) of the
embedded Postgres (or ``$RETRIEVAL_DSN``); ``store.sync`` re-embeds nothing already stored, so
a re-run skips the embedding. Documents are title + abstract, cut by our chunker; a document
ranks where its best chunk ranks. Metrics: nDCG@10, recall@100 and MRR (over the whole list,
to depth 100), binary relevance (cranqrel codes 1..4), from ``retrieval_assets.evaluation.metrics`` through
``retrieval_assets.evaluation.benchmark`` and cross-checked per query against pytrec_eval. The bm25s peer (k1=1.2, b=0.75, English stop
words, PyStemmer English) is computed in the same run over the same document texts.
Writes the table to benchmarks/results/cranfield.md (``--out``).
"""

from __future__ import annotations

import datetime as dt
import sys
import time

from benchmarks import common
from retrieval_assets import partitions, pg
from retrieval_assets.corpus import datasets
from retrieval_assets.evaluation import benchmark
from retrieval_assets.params import DEFAULT
from retrieval_assets.index.embed import embed_queries
from retrieval_assets.index.tables import statement

DEFAULT_DATA = datasets.DEFAULT_CRANFIELD  # $CRANFIELD_DIR, else ../shared/benchmarks/cranfield
DEFAULT_OUT = common.RESULTS / "cranfield.md"
TOLERANCE = 1e-9


def paired_difference(ours: benchmark.RankerScores, peer: benchmark.RankerScores) -> tuple[float, float, float, int, int]:
    """nDCG@k of ``ours`` minus the peer's, paired by query (``common.paired_difference``)."""
    qids = sorted(ours.per_query)
    return common.paired_difference([ours.per_query[q][0] for q in qids], [peer.per_query[q][0] for q in qids])


def hnsw_recall(conn, schema: str, embedder, queries: list[str], efs=(40, 50, 100)) -> dict[int, float]:
    """recall@10 of the HNSW index (forced) against exact search, per ef_search; a hit is within the exact 10th distance."""
    vectors = embed_queries(embedder, queries)
    search = statement(schema, common.NEAREST)
    exact = [common.exact_nearest(conn, schema, v)[-1][1] for v in vectors]
    out = {}
    for ef in efs:
        total = 0.0
        for v, kth in zip(vectors, exact):
            with conn.transaction():
                conn.execute("SET LOCAL enable_seqscan = off")
                conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                got = conn.execute(search, {"q": v, "k": 10}, prepare=False).fetchall()  # planned under these settings
            total += sum(1 for _, d in got if d <= kth + 1e-6) / 10
        out[ef] = total / len(vectors)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help=f"Cranfield folder (default {DEFAULT_DATA})")
    parser.add_argument("--embedders", nargs="+", default=["hash", "minilm"], help="partitions, or wheel models (index.wheel_models)")
    parser.add_argument("--k", type=int, default=10, help="nDCG cut-off")
    parser.add_argument("--depth", type=int, default=100, help="documents per ranked list (recall cut-off)")
    parser.add_argument("--n", type=int, default=benchmark.CRANFIELD.n, help="chunks per first-stage list and in the fused pool")
    parser.add_argument("--mmr-lambda", type=float, default=benchmark.CRANFIELD.mmr_lambda)
    parser.add_argument("--schema-prefix", default=None, help="before each scratch schema name bench_cranfield_<embedder> "
                        "(default: none, 'stripped_' with --strip-title)")
    parser.add_argument("--strip-title", action="store_true", help="drop the abstract's repeat of the title (the text is "
                        "otherwise as distributed, what standard baselines index)")
    parser.add_argument("--fresh", action="store_true", help="drop each scratch table first (re-embeds everything)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown report path ('-': print only)")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.schema_prefix is None:
        args.schema_prefix = "stripped_" if args.strip_title else ""

    try:
        bench = datasets.load_cranfield(args.data, strip_title=args.strip_title)
    except datasets.DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    judged = bench.relevant()
    log(f"cranfield: {len(bench.documents)} documents, {len(bench.queries)} queries, "
        f"{sum(map(len, judged.values()))} relevant judgements over {len(judged)} queries")

    started = time.perf_counter()
    rows: list[tuple[str, benchmark.RankerScores]] = []
    params = benchmark.CRANFIELD.with_(k=args.n, n=args.n, mmr_lambda=args.mmr_lambda)
    notes: list[str] = []
    checks: dict[str, float] = {}

    start = time.perf_counter()
    peer = {"bm25s": benchmark.bm25s_ranker(bench.documents, k1=1.2, b=0.75, depth=args.depth)}
    peer_index_s = time.perf_counter() - start
    peer_scores = benchmark.evaluate_rankers(bench, peer, k=args.k, depth=args.depth)
    rows.append(("peer", peer_scores["bm25s"]))
    checks.update({f"peer/{name}": diff for name, diff in benchmark.trec_eval_check(bench, peer_scores, k=args.k, depth=args.depth).items()})
    notes.append(f"peer bm25s: indexed {len(bench.documents)} documents in {peer_index_s:.2f} s")
    log(notes[-1])

    for key in args.embedders:
        embedder = common.embedder(key)
        schema = partitions.schema_name(key, "cranfield", prefix=args.schema_prefix)
        if args.fresh:
            common.drop_schema(args.dsn, schema)
        with pg.connect(args.dsn) as conn:
            start = time.perf_counter()
            chunks, report = benchmark.index_benchmark(conn, schema, bench, embedder)
            index_s = time.perf_counter() - start
            notes.append(f"{key} ({embedder.name}): {len(chunks)} chunks from {len({c.doc_id for c in chunks})} documents "
                         f"in schema {schema}; sync {index_s:.1f} s ({report.embedded} texts embedded, {report.unchanged} unchanged)")
            log(notes[-1])
            rankers = benchmark.our_rankers(conn, schema, embedder, chunks, params=params, depth=args.depth)
            for name, params_ in (("default pipeline", DEFAULT), ("default pipeline, no rerank", DEFAULT.with_(rerank=False))):
                rankers[name] = benchmark.params_ranker(conn, schema, embedder, chunks, params_.with_(k=args.n, n=args.n), depth=args.depth)
            scores = benchmark.evaluate_rankers(bench, rankers, k=args.k, depth=args.depth, progress=lambda m, key=key: log(f"  {key}: {m}"))
            recall = hnsw_recall(conn, schema, embedder, list(bench.queries.values()))
            notes.append(f"{key}: HNSW recall@10 against exact search on the {len(bench.queries)} queries (index forced): "
                         + ", ".join(f"ef_search {ef}: {r:.3f}" for ef, r in recall.items()))
            log(notes[-1])
        rows.extend((key, s) for s in scores.values())
        checks.update({f"{key}/{name}": diff for name, diff in benchmark.trec_eval_check(bench, scores, k=args.k, depth=args.depth).items()})

    paired = {(label, s.name): paired_difference(s, rows[0][1]) for label, s in rows[1:]}
    table = "\n".join([
        f"| embedder | ranker | nDCG@{args.k} | recall@{args.depth} | MRR | nDCG@{args.k} minus peer [95% CI] | seconds |",
        "|---|---|---:|---:|---:|---:|---:|",
        *(f"| {label} | {s.name} | {s.ndcg:.3f} | {s.recall:.3f} | {s.mrr:.3f} | "
          + ("" if label == "peer" else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*paired[label, s.name][:3]))
          + f" | {s.seconds:.1f} |" for label, s in rows),
    ])
    worst = max(checks.values())
    best = max((r for r in rows if r[0] != "peer"), key=lambda r: r[1].ndcg)
    peer_row = rows[0][1]
    mean, lo, hi, wins, losses = paired_difference(best[1], peer_row)
    verdict = ("beats the peer" if lo > 0 else "does NOT beat the peer" if hi < 0
               else "is level with the peer: the interval straddles zero")
    command = ("uv run python -m benchmarks cranfield" + (f" --embedders {' '.join(args.embedders)}" if args.embedders != ["hash", "minilm"] else "")
               + (" --strip-title" if args.strip_title else ""))
    text = "\n".join([
        "# Cranfield 1400: our pipelines against a BM25 peer",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {common.host_line()}; "
        f"total run {time.perf_counter() - started:.0f} s; code {common.code_version()}.",
        f"Reproduce: `{command}` (data read in place from `../shared/benchmarks/cranfield`; `--data` for another folder).",
        "",
        f"{len(bench.documents)} documents (title + abstract, "
        + ("the abstract's repeat of the title removed" if args.strip_title else "as distributed: the abstract repeats the title")
        + f"), {len(judged)} queries, "
        f"{sum(map(len, judged.values()))} relevant judgements (cranqrel codes 1..4; the -1 lines are not relevant), binary relevance; "
        f"every ranker is scored on all {len(judged)} queries. The CI column: paired per-query difference, 10,000 bootstrap resamples. "
        f"nDCG@{args.k}; recall@{args.depth}; MRR = reciprocal rank of the first relevant document in the whole list "
        f"(to depth {args.depth}, not cut at {args.k}).",
        "",
        table,
        "",
        "Rankers: `vector` = pgvector cosine search (`dense.vector_search`); `ts_rank_cd` = the seed's full-text list (`ts_rank.text_search`); `bm25` = BM25 "
        "inside Postgres over the chunks (`bm25_rank.bm25_search`); `hybrid(x)` = RRF of vector and x; `default pipeline` = "
        f"`params.DEFAULT` ({DEFAULT.describe()}), chosen by cross-validation in benchmarks/results/quality.md (`, no rerank`: "
        "the same without its rerank stage); `+ rerank` = the BM25 "
        "`LexicalReranker` over the whole fused pool (idf from the pool with ts_rank_cd, from every chunk with bm25, the "
        "pairing `eval_run` uses); `+ MMR` = MMR (lambda "
        f"{args.mmr_lambda}) over the whole reranked pool; `bm25s` = the peer (k1 1.2, b 0.75, English stop words, "
        f"PyStemmer English) over whole documents. Each first-stage list and the fused pool hold {args.n} chunks; a "
        f"document ranks at its best chunk; the first {args.depth} documents are scored. `seconds`: wall time of the "
        "ranker's 225 queries; our rankers of one lexical list share one trace per query, charged to the first of them.",
        "",
        f"Best of ours on nDCG@{args.k}: {best[0]} `{best[1].name}` {best[1].ndcg:.3f} against the peer's {peer_row.ndcg:.3f}: "
        f"paired difference {mean:+.3f} (95% bootstrap interval {lo:+.3f} to {hi:+.3f}; better on {wins} queries, worse on "
        f"{losses}), so it {verdict}.",
        f"Cross-check against pytrec_eval (ndcg_cut_{args.k}, recall_{args.depth}, recip_rank), largest per-query difference "
        f"over all rankers: {worst:.1e}" + (" (agree)" if worst <= TOLERANCE else " (DISAGREE)") + ".",
        "",
        *[f"- {n}" for n in notes],
        "",
    ])
    common.write_report(text, args.out)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
