"""HNSW build settings at scale: build time and recall@10 against exact search, per variant.

Run on a schema kept by scale (``uv run python -m benchmarks.guards.scale --sizes 100000 --keep``):

    uv run python -m benchmarks.guards.bench_hnsw [--schema bench_scale_100000_hash] [--topics 300] [--queries 100]

Each variant drops and rebuilds ``chunks_embedding_hnsw`` inside a transaction that is rolled
back, so the kept index is untouched. Queries are the synthetic corpus' own
(retrieval_assets.corpus.synthetic, same --topics as the kept schema); a hit counts when its distance is
within the exact 10th distance. Prints figures only.
"""

from __future__ import annotations

import argparse
import time

import psycopg
from psycopg import sql

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.index import tables
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.corpus.synthetic import Corpus
from retrieval_assets.index.tables import statement

VARIANTS = {  # name: (max_parallel_maintenance_workers, WITH options)
    "m 16, ef_construction 64 (pgvector's defaults), 2 workers": (2, ""),
    "m 16, ef_construction 64, 1 worker": (1, ""),
    "m 32, ef_construction 128, 2 workers": (2, " WITH (m = 32, ef_construction = 128)"),
}
SEARCH = "SELECT embedding <=> %(q)s FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT 10"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema", default=common.scale_schema(100_000))
    parser.add_argument("--topics", type=int, default=300, help="as the kept schema was made")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--memory", default="1GB", help="maintenance_work_mem for the builds")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    schema = args.schema
    common.print_machine({"schema": schema})
    embedder = HashEmbedder(256)
    search = statement(schema, SEARCH)
    with pg.connect(args.dsn) as conn:
        if tables.table_dims(conn, schema) is None:
            print(f"schema {schema} has no chunk table; run `python -m benchmarks.guards.scale --sizes 100000 --keep` first")
            return 1
        print(f"chunks: {tables.count(conn, schema):,}")
        truth = []
        for query in Corpus(0, topics=args.topics).queries(args.queries):
            vector = embedder.embed([query])[0]
            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                truth.append((vector, conn.execute(search, {"q": vector}).fetchall()[-1][0]))
        for name, (workers, options) in VARIANTS.items():
            try:
                with conn.transaction():
                    conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (args.memory,))
                    conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, true)", (str(workers),))
                    # IF EXISTS: a kept 100k hash schema has no graph (vector_index.choose_vector_index chose an exact scan)
                    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(schema, "chunks_embedding_hnsw")))
                    start = time.perf_counter()
                    conn.execute(statement(schema, "CREATE INDEX chunks_embedding_hnsw ON {chunks} USING hnsw (embedding vector_cosine_ops)"
                                           + options))
                    build = time.perf_counter() - start
                    recalls = []
                    for ef in (50, 100, 200):
                        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                        hits = sum(sum(1 for (d,) in conn.execute(search, {"q": v}).fetchall() if d <= kth + 1e-6) for v, kth in truth)
                        recalls.append(f"ef_search {ef}: {hits / (10 * len(truth)):.3f}")
                    print(f"{name}: build {build:.1f} s; recall@10 " + ", ".join(recalls), flush=True)
                    raise psycopg.Rollback()
            except psycopg.Rollback:
                pass
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
