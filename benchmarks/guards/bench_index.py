"""Indexing the fixture corpus with the hash embedder, and the write path of store.sync.

Run: uv run python -m benchmarks.guards.bench_index [--repeats 5] [--rows 5000] [--schema bench_index_hash]
Target: store.create + store.sync of the corpus (430 chunks) into a fresh table under 2 s.
Prints figures only; never asserts. Uses the embedded Postgres (or $RETRIEVAL_DSN) and drops
the chunk table (store.drop) in its own schema (default ``bench_index_hash``,
common.bench_schema) before every repeat.

Part 2 compares two ways to write the same ~5,000 rows (corpus chunks cycled with suffixed ids,
vectors precomputed so only the write is timed), each into a freshly created table with all
its indexes (HNSW, GIN on the generated tsvector, btree on doc_id):
  copy         store's staging, store._stage (COPY BINARY into a temp table), then an INSERT ...
               SELECT ... ON CONFLICT statement with the SET and WHERE of store._merge's upsert
  executemany  cursor.executemany of INSERT ... VALUES ... ON CONFLICT (same SET and WHERE) in one
               transaction; psycopg runs executemany in pipeline mode
Both write only the chunks table, so they compare the client write path alone; whatever else
store._merge does around its INSERT (statistics, postings) is measured by the store._stage +
store._merge row and by store.sync, which run the project's code as it stands. The embedding
row embeds the chunks in batches of 64 through Embedder.embed, as store.sync asks for them.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time

import numpy as np
from psycopg import sql

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.index import chunker, store, tables
from retrieval_assets.index.embed import Embedder, HashEmbedder
from retrieval_assets.index.tables import CHUNK_COLUMNS, column_list, statement
from retrieval_assets.types import Chunk

TARGET_S = 2.0
DIMS = 256
BATCH = 64  # store.sync's default batch

_DATA = [sql.Identifier(n) for n in CHUNK_COLUMNS if n != "chunk_id"]
_SET_WHERE = sql.SQL(
    """ON CONFLICT (chunk_id) DO UPDATE SET {assign}
       WHERE ({old}) IS DISTINCT FROM ({new}) OR c.embedding IS DISTINCT FROM EXCLUDED.embedding"""
).format(
    assign=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(c) for c in [*_DATA, sql.Identifier("embedding")]),
    old=sql.SQL(", ").join(sql.SQL("c.{}").format(c) for c in _DATA),
    new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(c) for c in _DATA),
)


def insert_select(schema: str) -> sql.Composed:
    """The upsert of store._merge from the staging table, without its RETURNING."""
    return statement(schema, "INSERT INTO {chunks} AS c ({columns}) SELECT {columns} FROM {incoming} {set_where}",
                     columns=column_list("embedding"), incoming=sql.Identifier("pg_temp", "incoming"), set_where=_SET_WHERE)


def insert_values(schema: str) -> sql.Composed:
    return statement(schema, "INSERT INTO {chunks} AS c ({columns}) VALUES ({slots}) {set_where}",
                     columns=column_list("embedding"), slots=sql.SQL(", ").join([sql.Placeholder()] * (len(CHUNK_COLUMNS) + 1)),
                     set_where=_SET_WHERE)


def embed_all(embedder: Embedder, chunks: list[Chunk], batch: int = BATCH) -> np.ndarray:
    """Every chunk's vector, in chunk order, embedded ``batch`` texts at a time as store.sync does."""
    texts = [c.text for c in chunks]
    return np.concatenate([embedder.embed(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def line(label: str, times: list[float], extra: str = "") -> None:
    print(f"  {label:<50} best {min(times):7.3f} s  median {statistics.median(times):7.3f} s  "
          f"(runs: {', '.join(f'{t:.3f}' for t in times)}){extra}")


def write_copy(conn, schema, rows, vectors) -> None:
    with conn.transaction():
        store._stage(conn, rows, vectors, DIMS)
        conn.execute(insert_select(schema))


def write_executemany(conn, schema, rows, vectors) -> None:
    params = [(*(getattr(c, n) for n in CHUNK_COLUMNS), v) for c, v in zip(rows, vectors)]
    with conn.transaction():
        conn.cursor().executemany(insert_values(schema), params)


def write_store(conn, schema, rows, vectors) -> None:
    with conn.transaction():
        store._stage(conn, rows, vectors, DIMS)
        store._merge(conn, schema)


def fresh(conn, schema) -> None:
    common.drop_chunks(conn, schema)
    store.create(conn, schema, DIMS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--schema", default=common.bench_schema("index"))
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    schema = args.schema

    documents = chunker.load_documents(common.CORPUS)
    chunks = [c for d in documents for c in chunker.chunk(d)]
    conn = pg.connect(args.dsn)
    common.print_machine({**common.postgres_versions(conn), "server": pg.mask_dsn(pg.resolve_dsn(args.dsn)), "schema": schema})

    # -- part 1: the corpus, fresh table: store.create + store.sync ----------------------------
    print(f"\n1. corpus: {len(chunks)} chunks of {len(documents)} documents, HashEmbedder({DIMS}) new each repeat, "
          f"table dropped before each repeat")
    total, create, sync, rerun, embed_only = [], [], [], [], []
    report = None
    for _ in range(args.repeats):
        common.drop_chunks(conn, schema)
        embedder = HashEmbedder(DIMS)  # cold token cache, as a new process would have
        gc.collect()
        t0 = time.perf_counter()
        store.create(conn, schema, DIMS)
        t1 = time.perf_counter()
        report = store.sync(conn, schema, chunks, embedder)
        t2 = time.perf_counter()
        total.append(t2 - t0)
        create.append(t1 - t0)
        sync.append(t2 - t1)
        rerun.append(timed(lambda: store.sync(conn, schema, chunks, HashEmbedder(DIMS))))
        embed_only.append(timed(lambda: embed_all(HashEmbedder(DIMS), chunks)))
    line("store.create + store.sync (fresh table)", total, f"  [< {TARGET_S} s: {common.verdict(min(total) < TARGET_S)}]")
    line("  of which store.create", create)
    line("  of which store.sync", sync)
    line(f"  embedding alone (batches of {BATCH}, new embedder)", embed_only)
    line("store.sync re-run, nothing changed", rerun)
    print(f"  rows: {tables.count(conn, schema)}; report of the fresh sync: {report}")

    # -- part 2: the write path on ~N rows ----------------------------------------------------
    rows = [
        Chunk(f"{c.chunk_id}~{i // len(chunks)}", c.doc_id, c.heading_path, c.start_char, c.end_char, c.text)
        for i, c in zip(range(args.rows), itertools.cycle(chunks))
    ]
    vectors = embed_all(HashEmbedder(DIMS), rows)
    print(f"\n2. write path: {len(rows)} rows (corpus chunks cycled, ids suffixed ~0..~{(len(rows) - 1) // len(chunks)}), "
          f"vectors precomputed; fresh table with all indexes each repeat")
    names = ("copy", "executemany", "copy rerun", "executemany rerun", "store", "store rerun", "sync")
    results: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(args.repeats):
        for name, fn in (("copy", write_copy), ("executemany", write_executemany), ("store", write_store)):
            fresh(conn, schema)
            results[name].append(timed(lambda: fn(conn, schema, rows, vectors)))
            results[f"{name} rerun"].append(timed(lambda: fn(conn, schema, rows, vectors)))
        fresh(conn, schema)
        results["sync"].append(timed(lambda: store.sync(conn, schema, rows, HashEmbedder(DIMS))))
    n = len(rows)
    line("copy: store._stage + INSERT..SELECT ON CONFLICT", results["copy"], f"  {n / min(results['copy']):,.0f} rows/s")
    line("executemany: INSERT..VALUES ON CONFLICT", results["executemany"], f"  {n / min(results['executemany']):,.0f} rows/s")
    line("copy, re-run (every row conflicts, none written)", results["copy rerun"])
    line("executemany, re-run (idem)", results["executemany rerun"])
    line("store._stage + store._merge (all of its work)", results["store"], f"  {n / min(results['store']):,.0f} rows/s")
    line("store._stage + store._merge, re-run", results["store rerun"])
    line("store.sync, fresh table (embeds + writes)", results["sync"])

    fresh(conn, schema)
    store.sync(conn, schema, chunks, HashEmbedder(DIMS))  # leave the corpus indexed
    conn.close()
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
