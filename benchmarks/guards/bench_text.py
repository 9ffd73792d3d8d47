"""The ts_rank_cd list on Cranfield (or a kept synthetic table), by the branch a query takes, against an older commit.

Run: uv run python -m benchmarks bench_text [--embedder hash] [--against COMMIT] [--repeats 2] [--n 100]
     uv run python -m benchmarks bench_text --scale 100000 [--topics 300] --n 50 --repeats 3 --against COMMIT
     uv run python -m benchmarks bench_text --passages --n 50 --repeats 3 --against COMMIT
Indexes Cranfield (as distributed, ``datasets.load_cranfield``) into ``bench_cranfield_<embedder>`` as
``cranfield`` does (``store.sync``: a kept table re-embeds nothing); with ``--scale SIZE``, reads
instead the table ``scale --sizes SIZE --topics T --keep`` left (``common.scale_schema``, hash
vectors) with the 200 queries scale.py searches it with (``synthetic.Corpus(0, topics=T).queries(200)``);
with ``--passages``, the fixture corpus as bench_search indexes it, queried with the first 80 words of every
ninth chunk (48 long queries, most holding a hyphenated word).
Then times ``ts_rank.text_search`` for the queries, split by ``ts_rank.plain_words``: plain words are summed from
the BM25 postings; phrases (hyphenated words make them) and negations are ranked among the chunks the
postings bound highest, or over every match when that does not settle the list. ``--against COMMIT`` also
checks that COMMIT's ``text_search`` and ``first_stage`` (its hybrid, bm25 and tsquery, ``bench_search.modules_at``)
return the same lists for every query, then times both pairwise, the order alternating (``common.pairwise``),
per branch and for the whole first stage (the vector list, by the search the table was chosen to use,
``pipeline.retriever``, and ts_rank_cd, ``n`` each). The first stage is also timed against itself with
both lists on the connection (``partner=None``): on a table scanned exactly the partner takes half the scan.
Prints figures only; never asserts. Targets: none of its own (issue 18's are bench_search's and scale's).
"""

from __future__ import annotations

from benchmarks import common
from benchmarks.guards.bench_search import modules_at
from retrieval_assets import partitions
from retrieval_assets.corpus import datasets, synthetic
from retrieval_assets.evaluation import benchmark
from retrieval_assets.index import tables
from retrieval_assets.search import hybrid, pipeline, ts_rank
from retrieval_assets.params import RetrievalParams
from retrieval_assets.index.tables import exists


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=2)
    parser.add_argument("--embedder", default="hash", help="partition key of the embedder (hash, minilm)")
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD), help="Cranfield folder")
    parser.add_argument("--n", type=int, default=100, help="chunks per list")
    parser.add_argument("--against", metavar="COMMIT", default=None, help="also time COMMIT's lists, pairwise")
    parser.add_argument("--scale", type=int, default=None, metavar="SIZE", help="the kept scale.py table of SIZE chunks instead")
    parser.add_argument("--topics", type=int, default=300, help="with --scale: the topics it was generated with (0: independent words)")
    parser.add_argument("--passages", action="store_true", help="the fixture, queried with 80-word passages of its chunks, instead")
    args = parser.parse_args(argv)

    schema = (common.scale_schema(args.scale) if args.scale else common.bench_schema("search") if args.passages
              else partitions.schema_name(args.embedder, "cranfield"))
    conn = common.connect(args.dsn, schema)
    embedder = partitions.embedder("hash" if args.scale or args.passages else args.embedder)
    if args.scale:
        if not exists(conn, schema, "chunks"):
            parser.error(f"no table {schema}: run `uv run python -m benchmarks scale --sizes {args.scale} "
                         f"--topics {args.topics} --keep` first")
        queries = synthetic.Corpus(0, topics=args.topics).queries(200)
        report = f"{tables.count(conn, schema)} chunks kept by scale.py, topics {args.topics}"
    elif args.passages:
        _, chunks, _ = common.fixture()
        report = f"{len(chunks)} fixture chunks ({common.index(conn, schema, chunks, embedder)})"
        queries = [" ".join(c.text.split()[:80]) for c in chunks[::9]]
    else:
        bench = datasets.load_cranfield(args.data)
        chunks, sync = benchmark.index_benchmark(conn, schema, bench, embedder)
        queries = list(bench.queries.values())
        report = f"{len(chunks)} chunks ({sync})"
    kinds = {"plain words": [q for q in queries if ts_rank.plain_words(conn, q)]}
    kinds["phrases or negations"] = [q for q in queries if q not in set(kinds["plain words"])]
    print(f"\nindex: {report}; {len(queries)} queries: "
          + ", ".join(f"{len(qs)} {kind}" for kind, qs in kinds.items()) + f"; n = {args.n}, x {args.repeats}")
    kinds = {kind: qs for kind, qs in kinds.items() if qs}

    for kind, qs in kinds.items():
        samples = common.per_query(lambda q: ts_rank.text_search(conn, schema, q, args.n), qs, args.repeats)
        print(f"{'ts_rank.text_search, ' + kind:<46} {common.summary_ms(samples)}")

    chosen = pipeline.retriever(conn, schema, embedder)  # the vector search the table was chosen to use
    params = RetrievalParams(n=args.n, lexical="ts_rank_cd", ef_search=chosen.ef_search)
    stage = {"exact": chosen.exact}
    vectors = {q: embedder.embed([q])[0] for q in queries}
    print(f"\nthe first stage with a partner session when it helps ({'an exact scan split' if chosen.exact else 'none for a graph: a control'}), "
          f"pairwise; load now {common.load_average()}")
    common.compare(f"first_stage (ts_rank_cd), all {len(queries)} queries", *common.pairwise(
        lambda q: hybrid.first_stage(conn, schema, vectors[q], q, params, **stage),
        lambda q: hybrid.first_stage(conn, schema, vectors[q], q, params, **stage, partner=None), queries, args.repeats),
        "both lists on the connection", "with/without", None)

    if args.against:
        older = modules_at(args.against)["hybrid"]
        same_text = all(older.text_search(conn, schema, q, args.n) == ts_rank.text_search(conn, schema, q, args.n) for q in queries)
        same_first = all(older.first_stage(conn, schema, vectors[q], q, params, **stage)
                         == hybrid.first_stage(conn, schema, vectors[q], q, params, **stage)
                         for q in queries)
        print(f"\nthis tree vs {args.against}, pairwise; lists identical: text {same_text}, first stage {same_first}; "
              f"load now {common.load_average()}")
        for kind, qs in kinds.items():
            common.compare(f"text_search, {kind}", *common.pairwise(lambda q: ts_rank.text_search(conn, schema, q, args.n),
                                                                    lambda q: older.text_search(conn, schema, q, args.n),
                                                                    qs, args.repeats),
                           args.against, f"this tree/{args.against}", None)
        common.compare(f"first_stage (ts_rank_cd), all {len(queries)} queries", *common.pairwise(
            lambda q: hybrid.first_stage(conn, schema, vectors[q], q, params, **stage),
            lambda q: older.first_stage(conn, schema, vectors[q], q, params, **stage), queries, args.repeats),
            args.against, f"this tree/{args.against}", None)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
