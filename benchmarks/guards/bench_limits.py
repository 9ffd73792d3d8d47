"""Hostile queries answered or refused in time: the 10,000-character query of issue 17.

Run: uv run python -m benchmarks.guards.bench_limits [--repeats 5]
Target (issue 17): a 10,000-character query ('retrieval ' * 1000, and 10,000 distinct
characters) answered or refused within 1 s on the fixture's hash index, with the default
ts_rank_cd list and with BM25. Prints the wall time per call (median and max); asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from psycopg import sql

    from retrieval_assets import pg

    from retrieval_assets.index import chunker, store

    from retrieval_assets.search import pipeline
    from retrieval_assets.index.embed import HashEmbedder
    from retrieval_assets.params import DEFAULT
    from retrieval_assets.search.rerank import LexicalReranker

    common.print_machine()
    schema = common.bench_schema("limits")
    embedder = HashEmbedder()
    chunks = [c for d in chunker.load_documents(common.CORPUS) for c in chunker.chunk(d)]
    queries = {"'retrieval ' * 1000": "retrieval " * 1000, "10,000 distinct characters": "".join(chr(0x4E00 + i) for i in range(10_000)),
               "a normal query": "how does bm25 saturate term frequency"}
    with pg.connect() as conn:
        store.create(conn, schema, embedder.dims)
        store.sync(conn, schema, chunks, embedder)
        retriever = pipeline.Retriever(schema, embedder, LexicalReranker())
        for lexical in ("ts_rank_cd", "bm25"):
            for label, query in queries.items():
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    try:
                        pipeline.run(conn, retriever, query, DEFAULT.with_(lexical=lexical))
                        outcome = "answered"
                    except pipeline.SearchTimeout:
                        outcome = "refused (timeout)"
                    times.append(time.perf_counter() - start)
                print(f"{lexical:<10} {label:<28} {outcome:<18} median {1000 * statistics.median(times):7.1f} ms  max {1000 * max(times):7.1f} ms")
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    print("target: every call within 1000 ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
