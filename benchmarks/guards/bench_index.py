"""Indexing the fixture corpus with the hash embedder, and the write path of store.sync.

Run: uv run python benchmarks/bench_index.py [--repeats 5] [--rows 5000] [--schema bench_index]
Target: Schema.create + store.sync of the corpus (430 chunks) into a fresh table under 2 s.
Prints figures only; never asserts. Uses the embedded Postgres (or $RETRIEVAL_DSN) and drops
the chunk table (store.drop when the code has it) in its own schema before every repeat.

Part 2 compares two ways to write the same ~5,000 rows (corpus chunks cycled with suffixed ids,
vectors precomputed so only the write is timed), each into a freshly created table with all
its indexes (HNSW, GIN on the generated tsvector, btree on doc_id):
  copy         store's staging, store._stage (COPY BINARY into a temp table), then the INSERT ...
               SELECT ... ON CONFLICT statement of store._merge (copied below, SET and WHERE alike)
  executemany  cursor.executemany of INSERT ... VALUES ... ON CONFLICT (same SET and WHERE) in one
               transaction; psycopg runs executemany in pipeline mode
Both write only the chunks table, so they compare the client write path alone; whatever else
store._merge does after its INSERT (statistics, postings) is measured by the store._stage +
store._merge row and by store.sync, which run the project's code as it stands.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import time

from _common import CORPUS, drop_chunks, postgres_versions, print_load_end, print_machine, verdict

from retrieval_assets import chunker, pg, store
from retrieval_assets.embed import HashEmbedder
from retrieval_assets.types import Chunk

TARGET_S = 2.0
DIMS = 256

_SET_WHERE = """ON CONFLICT (chunk_id) DO UPDATE SET
  doc_id = EXCLUDED.doc_id, heading_path = EXCLUDED.heading_path,
  start_char = EXCLUDED.start_char, end_char = EXCLUDED.end_char,
  text = EXCLUDED.text, embedding = EXCLUDED.embedding
WHERE (c.doc_id, c.heading_path, c.start_char, c.end_char, c.text)
      IS DISTINCT FROM (EXCLUDED.doc_id, EXCLUDED.heading_path, EXCLUDED.start_char,
                        EXCLUDED.end_char, EXCLUDED.text)
   OR c.embedding IS DISTINCT FROM EXCLUDED.embedding"""
INSERT_SELECT = f"""INSERT INTO chunks AS c (chunk_id, doc_id, heading_path, start_char, end_char, text, embedding)
SELECT chunk_id, doc_id, heading_path, start_char, end_char, text, embedding FROM incoming
{_SET_WHERE}"""
INSERT_VALUES = f"""INSERT INTO chunks AS c (chunk_id, doc_id, heading_path, start_char, end_char, text, embedding)
VALUES (%s, %s, %s, %s, %s, %s, %s)
{_SET_WHERE}"""


def timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def line(label: str, times: list[float], extra: str = "") -> None:
    print(f"  {label:<50} best {min(times):7.3f} s  median {statistics.median(times):7.3f} s  "
          f"(runs: {', '.join(f'{t:.3f}' for t in times)}){extra}")


def write_copy(conn, rows, vectors) -> None:
    with conn.transaction():
        store._stage(conn, rows, vectors, DIMS)
        conn.execute(INSERT_SELECT)


def write_executemany(conn, rows, vectors) -> None:
    params = [(c.chunk_id, c.doc_id, c.heading_path, c.start_char, c.end_char, c.text, vectors[c.chunk_id]) for c in rows]
    with conn.transaction():
        conn.cursor().executemany(INSERT_VALUES, params)


def write_store(conn, rows, vectors) -> None:
    with conn.transaction():
        store._stage(conn, rows, vectors, DIMS)
        store._merge(conn)


def fresh(conn) -> None:
    drop_chunks(conn)
    store.Schema.create(conn, DIMS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--schema", default="bench_index")
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args()

    documents = chunker.load_documents(CORPUS)
    chunks = [c for d in documents for c in chunker.chunk(d)]
    conn = pg.connect(args.dsn, schema=args.schema)
    print_machine({**postgres_versions(conn), "server": pg.mask_dsn(pg.resolve_dsn(args.dsn)), "schema": args.schema})

    # -- part 1: the corpus, fresh table: Schema.create + store.sync --------------------------
    print(f"\n1. corpus: {len(chunks)} chunks of {len(documents)} documents, HashEmbedder({DIMS}) new each repeat, "
          f"table dropped before each repeat")
    total, create, sync, rerun, embed_only = [], [], [], [], []
    report = None
    for _ in range(args.repeats):
        drop_chunks(conn)
        embedder = HashEmbedder(DIMS)  # cold token cache, as a new process would have
        gc.collect()
        t0 = time.perf_counter()
        store.Schema.create(conn, DIMS)
        t1 = time.perf_counter()
        report = store.sync(conn, chunks, embedder)
        t2 = time.perf_counter()
        total.append(t2 - t0)
        create.append(t1 - t0)
        sync.append(t2 - t1)
        rerun.append(timed(lambda: store.sync(conn, chunks, HashEmbedder(DIMS))))
        embed_only.append(timed(lambda: store._embed(HashEmbedder(DIMS), chunks, 64)))
    line("Schema.create + store.sync (fresh table)", total, f"  [< {TARGET_S} s: {verdict(min(total) < TARGET_S)}]")
    line("  of which Schema.create", create)
    line("  of which store.sync", sync)
    line("  embedding alone (store._embed, new embedder)", embed_only)
    line("store.sync re-run, nothing changed", rerun)
    print(f"  rows: {store.count(conn)}; report of the fresh sync: {report}")

    # -- part 2: the write path on ~N rows ----------------------------------------------------
    rows = [
        Chunk(f"{c.chunk_id}~{i // len(chunks)}", c.doc_id, c.heading_path, c.start_char, c.end_char, c.text)
        for i, c in zip(range(args.rows), itertools.cycle(chunks))
    ]
    vectors = store._embed(HashEmbedder(DIMS), rows, 64)
    print(f"\n2. write path: {len(rows)} rows (corpus chunks cycled, ids suffixed ~0..~{(len(rows) - 1) // len(chunks)}), "
          f"vectors precomputed; fresh table with all indexes each repeat")
    names = ("copy", "executemany", "copy rerun", "executemany rerun", "store", "store rerun", "sync")
    results: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(args.repeats):
        for name, fn in (("copy", write_copy), ("executemany", write_executemany), ("store", write_store)):
            fresh(conn)
            results[name].append(timed(lambda: fn(conn, rows, vectors)))
            results[f"{name} rerun"].append(timed(lambda: fn(conn, rows, vectors)))
        fresh(conn)
        results["sync"].append(timed(lambda: store.sync(conn, rows, HashEmbedder(DIMS))))
    n = len(rows)
    line("copy: store._stage + INSERT..SELECT ON CONFLICT", results["copy"], f"  {n / min(results['copy']):,.0f} rows/s")
    line("executemany: INSERT..VALUES ON CONFLICT", results["executemany"], f"  {n / min(results['executemany']):,.0f} rows/s")
    line("copy, re-run (every row conflicts, none written)", results["copy rerun"])
    line("executemany, re-run (idem)", results["executemany rerun"])
    line("store._stage + store._merge (all of its work)", results["store"], f"  {n / min(results['store']):,.0f} rows/s")
    line("store._stage + store._merge, re-run", results["store rerun"])
    line("store.sync, fresh table (embeds + writes)", results["sync"])

    fresh(conn)
    store.sync(conn, chunks, HashEmbedder(DIMS))  # leave the corpus indexed
    conn.close()


if __name__ == "__main__":
    main()
    print_load_end()
