"""Where the embedding lives: TOAST (Postgres's default EXTENDED) against inline (STORAGE PLAIN).

Run: uv run python -m benchmarks.guards.bench_storage [--chunks 10000] [--queries 50]
Issue 18: the 1 KB hash embedding (256 float32) sits out of line in TOAST, so each row read
fetches it separately. Two tables of the same synthetic chunks (retrieval_assets/corpus/synthetic.py,
hash embedder), one with the column as EXTENDED and one as PLAIN, then, alternating per query:
the HNSW vector query (top 50), the rerank fetch of 50 rows with their embeddings
(``pipeline.fetch``), and an exact scan (top 10, index scans off). Prints medians; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import common


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args(argv)
    import numpy as np
    from psycopg import sql

    from retrieval_assets import pg

    from retrieval_assets.index import store

    from retrieval_assets.search import pipeline
    from retrieval_assets.index.embed import HashEmbedder
    from retrieval_assets.corpus.synthetic import Corpus
    from retrieval_assets.index.tables import statement

    common.print_machine()
    embedder = HashEmbedder(256)
    corpus = Corpus(0)
    chunks = list(corpus.chunks(args.chunks))
    queries = corpus.queries(args.queries)
    schemas = {"EXTENDED": common.bench_schema("storage_ext"), "PLAIN": common.bench_schema("storage_plain")}
    times: dict[str, dict[str, list[float]]] = {s: {"vector": [], "fetch": [], "exact": []} for s in schemas}
    with pg.connect() as conn:
        for storage, schema in schemas.items():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            store.create(conn, schema, embedder.dims)
            conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN embedding SET STORAGE {}").format(
                sql.Identifier(schema, "chunks"), sql.SQL(storage)))
            start = time.perf_counter()
            store.sync(conn, schema, chunks, embedder)
            toast = conn.execute("SELECT pg_size_pretty(pg_relation_size(reltoastrelid)) FROM pg_class WHERE oid = %s::regclass",
                                 (f'"{schema}".chunks',)).fetchone()[0]
            print(f"{storage:<9} {schema}: {len(chunks)} chunks loaded in {time.perf_counter() - start:.1f} s, TOAST {toast}")
        for query in queries:
            vector = np.asarray(embedder.embed([query])[0], dtype=np.float32)
            for storage, schema in schemas.items():
                t = time.perf_counter()
                ids = [r[0] for r in conn.execute(statement(schema, "SELECT chunk_id FROM {chunks} ORDER BY embedding <=> %s LIMIT 50"), (vector,))]
                times[storage]["vector"].append(time.perf_counter() - t)
                t = time.perf_counter()
                pipeline.fetch(conn, schema, ids)
                times[storage]["fetch"].append(time.perf_counter() - t)
                with conn.transaction():
                    conn.execute("SELECT set_config('enable_indexscan', 'off', true)")
                    t = time.perf_counter()
                    conn.execute(statement(schema, "SELECT chunk_id FROM {chunks} ORDER BY embedding <=> %s LIMIT 10"), (vector,)).fetchall()
                    times[storage]["exact"].append(time.perf_counter() - t)
        for schema in schemas.values():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    for what in ("vector", "fetch", "exact"):
        ext, plain = (1000 * statistics.median(times[s][what]) for s in schemas)
        print(f"{what:<7} median EXTENDED {ext:7.2f} ms   PLAIN {plain:7.2f} ms   PLAIN/EXTENDED {plain / ext:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
