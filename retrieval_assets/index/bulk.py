"""The bulk load: an empty chunk table filled in one pass, its indexes built once afterwards.

Contract: ``load`` fills the empty ``schema.chunks`` inside the caller's transaction and lock
(``store.sync`` calls it from ``store.BULK_MIN`` chunks): the same rows, postings and indexes as
the staged merge writes, with the indexes dropped during the copy and built once after it, then
the vector search chosen by measured recall (``vector_index.choose_vector_index``) unless
``recall_target`` is None. Its phase timings are logged at INFO, in ``extra={"phases": ...}``
too. ``vacuum_loaded`` vacuums the tables it filled, after the commit, on an autocommit
connection with no transaction open (else it leaves them to autovacuum).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import psycopg
from psycopg import pq, sql

from retrieval_assets.index import bm25
from retrieval_assets.index.copies import drop_exact_copy
from retrieval_assets.index.embed import Embedder
from retrieval_assets.index.tables import copy_chunks, statement
from retrieval_assets.index.vector_index import HNSW, RECALL_TARGET, choose_vector_index
from retrieval_assets.types import Chunk

log = logging.getLogger(__name__)

BULK_BATCH = 5_000  # chunks embedded and copied at a time by the bulk load
BUILD_MEMORY = "512MB"  # maintenance_work_mem for the bulk load's index builds (pgvector: the graph should fit)


def load(conn: psycopg.Connection, schema: str, chunks: Sequence[Chunk], embedder: Embedder,
         tick: Callable[[int], None] = lambda done: None, recall_target: float | None = RECALL_TARGET) -> None:
    """Load ``chunks`` into the empty table, inside the caller's transaction.

    The HNSW, GIN and postings indexes are dropped; batches of ``BULK_BATCH`` chunks are embedded
    in a worker thread while the previous batch is copied straight into ``chunks`` and its postings
    written (so Python and Postgres work at once and one batch of vectors is held); then the
    postings key is built, document frequencies counted from it, and HNSW and GIN rebuilt from
    their own definitions, with ``maintenance_work_mem`` at ``BUILD_MEMORY``; then, unless
    ``recall_target`` is None, the vector search is chosen (``choose_vector_index``). Phase
    timings are logged at INFO.
    """
    phases: dict[str, float] = {}
    start = time.perf_counter()
    defs = conn.execute(
        """SELECT indexname, indexdef FROM pg_indexes
           WHERE schemaname = %s AND tablename IN ('chunks', 'fulltext') AND indexname = ANY(%s) ORDER BY indexname""",
        (schema, ["chunks_embedding_hnsw", "fulltext_tsv_gin"]),
    ).fetchall()
    for name, _ in defs:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))
    if "chunks_embedding_hnsw" not in dict(defs):  # an earlier load chose exact search: this load is checked afresh
        defs = sorted([*defs, ("chunks_embedding_hnsw", statement(schema, HNSW).as_string(conn))])
    drop_exact_copy(conn, schema)  # chosen again below; its triggers would copy every batch
    bm25.unkey_terms(conn, schema)
    parts = [chunks[i : i + BULK_BATCH] for i in range(0, len(chunks), BULK_BATCH)]
    with ThreadPoolExecutor(1, thread_name_prefix="embed") as pool:
        pending = pool.submit(embedder.embed, [c.text for c in parts[0]])
        for i, part in enumerate(parts):
            tick(i * BULK_BATCH)
            vectors = pending.result()
            if i + 1 < len(parts):
                pending = pool.submit(embedder.embed, [c.text for c in parts[i + 1]])
            copy_chunks(conn, sql.Identifier(schema, "chunks"), part, vectors)
            bm25.write_terms(conn, schema, [c.chunk_id for c in part])
    phases["embed_copy_postings"] = time.perf_counter() - start
    conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (BUILD_MEMORY,))
    mark = time.perf_counter()
    bm25.index_terms(conn, schema)
    phases["postings_key_and_df"] = time.perf_counter() - mark
    for name, definition in defs:  # pg_indexes qualifies the table by its schema
        if name == "chunks_embedding_hnsw" and recall_target is not None:
            continue  # built, or not, by choose_vector_index below
        mark = time.perf_counter()
        conn.execute(sql.SQL(definition))
        phases[name] = time.perf_counter() - mark
    mark = time.perf_counter()
    bm25.analyze(conn, schema)
    phases["analyze"] = time.perf_counter() - mark
    if recall_target is not None:
        choose_vector_index(conn, schema, embedder, recall_target, phases=phases)
    log.info("bulk load of %d chunks: %s", len(chunks), ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()),
             extra={"phases": phases})


# what a bulk load fills, vacuumed after its commit (``vacuum_loaded``)
_LOADED = ("chunks", "fulltext", "postings", "chunk_lengths", "term_df", "vectors")


def vacuum_loaded(conn: psycopg.Connection, schema: str) -> None:
    """VACUUM the tables a bulk load just filled, so that every page is marked all-visible: scans then skip
    the per-row visibility check, the first searches set no hint bits, and autovacuum finds nothing to do
    while they run (its time: benchmarks/results/scale.md). Left to autovacuum when ``conn`` is not autocommit
    or has a transaction open (VACUUM cannot run inside one)."""
    if not conn.autocommit or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return
    start = time.perf_counter()
    present = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename = ANY(%s) "
                                          "ORDER BY tablename", (schema, list(_LOADED))).fetchall()]
    conn.execute(sql.SQL("VACUUM {}").format(sql.SQL(", ").join(sql.Identifier(schema, t) for t in present)))
    seconds = time.perf_counter() - start
    log.info("%s: vacuumed %s after the bulk load in %.1f s", schema, ", ".join(present), seconds, extra={"phases": {"vacuum": seconds}})
