"""The ts_rank_cd list on Cranfield, by the branch a query takes, against an older commit.

Run: uv run python -m benchmarks.guards.bench_text [--embedder hash] [--against COMMIT] [--repeats 2] [--n 100]
Indexes Cranfield (as distributed, ``datasets.load_cranfield``) into ``bench_cranfield_<embedder>`` as
``guards/cranfield.py`` does (``store.sync``: a kept table re-embeds nothing), then times
``hybrid.text_search`` for its 225 queries, split by ``hybrid.plain_words``: plain words are summed from
the BM25 postings; phrases (hyphenated words make them) and negations are ranked among the chunks the
postings bound highest, or over every match when that does not settle the list. ``--against COMMIT`` also
checks that COMMIT's ``text_search`` and ``first_stage`` (its hybrid.py, bm25.py and tsquery.py, from ``git show``)
return the same lists for every query, then times both pairwise, the order alternating (bench_search's
``pairwise``), per branch and for the whole first stage (the vector list and ts_rank_cd, ``n`` each).
Prints figures only; never asserts. Targets: none of its own (issue 18's are bench_search's and scale's).
"""

from __future__ import annotations

import argparse

from benchmarks import common
from benchmarks.guards.bench_search import compare, modules_at, pairwise, per_query
from retrieval_assets import benchmark_eval, datasets, hybrid, partitions, pg
from retrieval_assets.params import RetrievalParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", default="hash", help="partition key of the embedder (hash, minilm)")
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD), help="Cranfield folder")
    parser.add_argument("--n", type=int, default=100, help="chunks per list")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--against", metavar="COMMIT", default=None, help="also time COMMIT's lists, pairwise")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)

    schema = partitions.schema_name(args.embedder, "cranfield")
    conn = pg.connect(args.dsn)
    common.print_machine({**common.postgres_versions(conn), "server": pg.mask_dsn(pg.resolve_dsn(args.dsn)), "schema": schema})
    bench = datasets.load_cranfield(args.data)
    embedder = partitions.embedder(args.embedder)
    chunks, report = benchmark_eval.index_benchmark(conn, schema, bench, embedder)
    queries = list(bench.queries.values())
    kinds = {"plain words": [q for q in queries if hybrid.plain_words(conn, q)]}
    kinds["phrases or negations"] = [q for q in queries if q not in set(kinds["plain words"])]
    print(f"\nindex: {len(chunks)} chunks ({report}); {len(queries)} queries: "
          + ", ".join(f"{len(qs)} {kind}" for kind, qs in kinds.items()) + f"; n = {args.n}, x {args.repeats}")

    for kind, qs in kinds.items():
        print(f"{'hybrid.text_search, ' + kind:<46} {common.summary_ms(per_query(lambda q: hybrid.text_search(conn, schema, q, args.n), qs, args.repeats))}")

    if args.against:
        older = modules_at(args.against)["hybrid"]
        params = RetrievalParams(n=args.n, lexical="ts_rank_cd")
        vectors = {q: embedder.embed([q])[0] for q in queries}
        same_text = all(older.text_search(conn, schema, q, args.n) == hybrid.text_search(conn, schema, q, args.n) for q in queries)
        same_first = all(older.first_stage(conn, schema, vectors[q], q, params) == hybrid.first_stage(conn, schema, vectors[q], q, params)
                         for q in queries)
        print(f"\nthis tree vs {args.against}, pairwise; lists identical: text {same_text}, first stage {same_first}; "
              f"load now {common.load_average()}")
        for kind, qs in kinds.items():
            compare(f"text_search, {kind}", *pairwise(lambda q: hybrid.text_search(conn, schema, q, args.n),
                                                      lambda q: older.text_search(conn, schema, q, args.n), qs, args.repeats),
                    args.against, f"this tree/{args.against}", None)
        compare(f"first_stage (ts_rank_cd), all {len(queries)} queries", *pairwise(
            lambda q: hybrid.first_stage(conn, schema, vectors[q], q, params),
            lambda q: older.first_stage(conn, schema, vectors[q], q, params), queries, args.repeats),
            args.against, f"this tree/{args.against}", None)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
