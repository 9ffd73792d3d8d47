"""HNSW build settings at scale: build time and recall@10 against exact search, per variant.

Run on a schema kept by scale.py (``uv run python benchmarks/scale.py --sizes 100000 --keep``):

    uv run python benchmarks/bench_hnsw.py [--schema bench_scale_100000] [--topics 300] [--queries 100]

Each variant drops and rebuilds ``chunks_embedding_hnsw`` inside a transaction that is rolled
back, so the kept index is untouched. Queries are the synthetic corpus' own (synthetic.py, same
--topics as the kept schema); a hit counts when its distance is within the exact 10th distance.
Prints figures only.
"""

from __future__ import annotations

import argparse
import time

import psycopg
from _common import print_load_end, print_machine
from synthetic import Corpus

from retrieval_assets import pg
from retrieval_assets.embed import HashEmbedder

VARIANTS = {  # name: (max_parallel_maintenance_workers, WITH options)
    "m 16, ef_construction 64 (pgvector's defaults), 2 workers": (2, ""),
    "m 16, ef_construction 64, 1 worker": (1, ""),
    "m 32, ef_construction 128, 2 workers": (2, " WITH (m = 32, ef_construction = 128)"),
}
SEARCH = "SELECT embedding <=> %(q)s FROM chunks ORDER BY embedding <=> %(q)s LIMIT 10"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schema", default="bench_scale_100000")
    parser.add_argument("--topics", type=int, default=300, help="as the kept schema was made")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--memory", default="1GB", help="maintenance_work_mem for the builds")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()
    print_machine({"schema": args.schema})
    embedder = HashEmbedder(256)
    with pg.connect(args.dsn, schema=args.schema) as conn:
        print(f"chunks: {conn.execute('SELECT count(*) FROM chunks').fetchone()[0]:,}")
        truth = []
        for query in Corpus(0, topics=args.topics).queries(args.queries):
            vector = embedder.embed([query])[0]
            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                truth.append((vector, conn.execute(SEARCH, {"q": vector}).fetchall()[-1][0]))
        for name, (workers, options) in VARIANTS.items():
            try:
                with conn.transaction():
                    conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (args.memory,))
                    conn.execute("SELECT set_config('max_parallel_maintenance_workers', %s, true)", (str(workers),))
                    conn.execute("DROP INDEX chunks_embedding_hnsw")
                    start = time.perf_counter()
                    conn.execute("CREATE INDEX chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops)" + options)
                    build = time.perf_counter() - start
                    recalls = []
                    for ef in (50, 100, 200):
                        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
                        hits = sum(sum(1 for (d,) in conn.execute(SEARCH, {"q": v}).fetchall() if d <= kth + 1e-6) for v, kth in truth)
                        recalls.append(f"ef_search {ef}: {hits / (10 * len(truth)):.3f}")
                    print(f"{name}: build {build:.1f} s; recall@10 " + ", ".join(recalls), flush=True)
                    raise psycopg.Rollback()
            except psycopg.Rollback:
                pass


if __name__ == "__main__":
    main()
    print_load_end()
