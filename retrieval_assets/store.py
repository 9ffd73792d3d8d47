"""The chunk table: pgvector embeddings beside a generated full-text column (seed stage 02).

Contract: ``Schema.create(conn, dims)`` makes the seed's ``chunks`` table (in the connection's
current schema) with an HNSW cosine index and a GIN index; ``upsert`` writes chunks
idempotently; ``sync`` makes the table equal to a set of chunks in one transaction, re-embedding
only texts the table does not hold yet; ``count`` returns the row count; ``drop`` removes it all.
Beside the table, BM25 postings and corpus statistics over the same 'english' analysis are kept
exact by every write. Every dimension mismatch raises ValueError before anything is written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import sql

from retrieval_assets.embed import Embedder
from retrieval_assets.types import Chunk

log = logging.getLogger(__name__)

BULK_MIN = 5_000  # sync into an empty table loads in bulk from this many chunks (see _bulk; 10k row by row took 32.6 s)
BULK_BATCH = 5_000  # chunks embedded and copied at a time by the bulk load
BUILD_MEMORY = "512MB"  # maintenance_work_mem for the bulk load's index builds (pgvector: the graph should fit)


@dataclass(frozen=True)
class SyncReport:
    inserted: int
    updated: int
    deleted: int
    unchanged: int
    embedded: int  # texts sent to the embedder (new text nowhere in the table)


def table_dims(conn: psycopg.Connection) -> int | None:
    """The dimension of ``chunks.embedding`` in the current schema, or None without a table."""
    row = conn.execute(
        """SELECT a.atttypmod FROM pg_attribute a
           WHERE a.attrelid = to_regclass(quote_ident(current_schema()) || '.chunks') AND a.attname = 'embedding'"""
    ).fetchone()
    return row[0] if row else None


class Schema:
    @staticmethod
    def create(conn: psycopg.Connection, dims: int) -> None:
        """Create the vector extension, ``chunks`` and both indexes if missing."""
        existing = table_dims(conn)
        if existing is not None and existing != dims:
            raise ValueError(f"table chunks already has embedding dimension {existing}, not {dims}")
        with conn.transaction():
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute(
                sql.SQL(
                    """CREATE TABLE IF NOT EXISTS chunks (
                         chunk_id text PRIMARY KEY, doc_id text, heading_path text,
                         start_char int, end_char int, text text,
                         tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
                         embedding vector({}))"""
                ).format(sql.Literal(int(dims)))
            )
            conn.execute("CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw ON chunks USING hnsw (embedding vector_cosine_ops)")
            conn.execute("CREATE INDEX IF NOT EXISTS chunks_tsv_gin ON chunks USING gin (tsv)")
            conn.execute("CREATE INDEX IF NOT EXISTS chunks_doc_id ON chunks (doc_id)")
            _create_postings(conn)


def _missing(conn: psycopg.Connection, table: str) -> bool:
    """True when the current schema has no table ``table``."""
    return conn.execute("SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident(%s)) IS NULL", (table,)).fetchone()[0]


def _create_postings(conn: psycopg.Connection) -> None:
    """BM25 statistics beside ``chunks``, kept exact in the writer's transaction.

    ``chunk_terms`` holds one posting per (lexeme, chunk) with its term frequency and the chunk's
    length; lexemes come from the ``tsv`` column, so stemming and stop words match full-text
    search, and a chunk's length is its number of indexed tokens. ``chunk_lengths`` has one row
    per chunk; statement triggers on it keep ``bm25_stats`` (N, total length) current.
    ``term_df`` holds each lexeme's document frequency, changed by the same statements that add
    or remove postings. Postings have one B-tree, (term, chunk_id): writers remove a chunk's old
    postings through the lexemes of its old tsv before they change it, so chunks must be written
    through ``sync`` or ``upsert``. A table that predates the postings (or ``term_df``) is
    backfilled here.
    """
    fresh = _missing(conn, "chunk_lengths")
    conn.execute("CREATE TABLE IF NOT EXISTS bm25_stats (one bool PRIMARY KEY DEFAULT true CHECK (one), n bigint, total_len bigint)")
    conn.execute("INSERT INTO bm25_stats VALUES (true, 0, 0) ON CONFLICT DO NOTHING")
    conn.execute("CREATE TABLE IF NOT EXISTS chunk_lengths (chunk_id text PRIMARY KEY REFERENCES chunks ON DELETE CASCADE, len int)")
    # byte-order ("C") keys: lexemes and ids need equality, not a language's order, and sorting
    # them for the key compares bytes instead of calling the locale. No foreign key, no chunk_id
    # index: writes go through _add_terms and _drop_terms.
    if _missing(conn, "chunk_terms"):
        conn.execute(
            """CREATE TABLE chunk_terms (
                 term text COLLATE "C", chunk_id text COLLATE "C", tf int, len int,
                 CONSTRAINT chunk_terms_pkey PRIMARY KEY (term, chunk_id))"""
        )
        # queries filter on term only (chunk_id with it, through the key): ANALYZE needs no other
        # column statistics, which shortens it on every sync
        conn.execute("""ALTER TABLE chunk_terms ALTER COLUMN chunk_id SET STATISTICS 0,
                        ALTER COLUMN tf SET STATISTICS 0, ALTER COLUMN len SET STATISTICS 0""")
    no_df = _missing(conn, "term_df")
    conn.execute('CREATE TABLE IF NOT EXISTS term_df (term text COLLATE "C" PRIMARY KEY, df int NOT NULL)')
    if no_df and not fresh:
        _count_terms(conn)
        conn.execute("ANALYZE term_df")
    for op, rows, sign in (("INSERT", "NEW", "+"), ("DELETE", "OLD", "-")):
        conn.execute(
            sql.SQL(
                """CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN
                     UPDATE bm25_stats SET n = n {sign} (SELECT count(*) FROM changed),
                                           total_len = total_len {sign} (SELECT coalesce(sum(len), 0) FROM changed);
                     RETURN NULL;
                   END $$"""
            ).format(fn=sql.Identifier(f"bm25_stats_{op.lower()}"), sign=sql.SQL(sign))
        )
        conn.execute(
            sql.SQL(
                """CREATE OR REPLACE TRIGGER {name} AFTER {op} ON chunk_lengths
                   REFERENCING {rows} TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION {fn}()"""
            ).format(name=sql.Identifier(f"chunk_lengths_{op.lower()}"), op=sql.SQL(op), rows=sql.SQL(rows),
                     fn=sql.Identifier(f"bm25_stats_{op.lower()}"))
        )
    if fresh:  # postings of every chunk, written unindexed and then indexed (the bulk way)
        conn.execute("DELETE FROM chunk_terms")
        _unkey_terms(conn)
        _write_terms(conn, None)
        _index_terms(conn)
        conn.execute("ANALYZE chunk_terms, chunk_lengths, bm25_stats, term_df")


_LENGTHS = """INSERT INTO chunk_lengths (chunk_id, len)
              SELECT c.chunk_id, (SELECT coalesce(sum(cardinality(positions)), 0) FROM unnest(c.tsv)) FROM chunks c"""
_POSTINGS = """SELECT l.lexeme, c.chunk_id, cardinality(l.positions), cl.len
               FROM chunks c JOIN chunk_lengths cl USING (chunk_id), unnest(c.tsv) AS l"""
_BY_ID = " WHERE c.chunk_id = ANY(%(ids)s)"
_KEY_ORDER = ' ORDER BY l.lexeme COLLATE "C", c.chunk_id COLLATE "C"'


def _add_terms(conn: psycopg.Connection, chunk_ids: list[str]) -> None:
    """Write the length, postings and document frequencies of ``chunk_ids``.

    Postings go in key order; ``term_df`` rows are upserted in term order (writers lock them alike).
    The first postings of a table are written without the key, which is then built once (with the
    ANALYZE below, this took the statistics' share of a fresh fixture sync from +60% to about +30%,
    benchmarks/bench_bm25.py).
    """
    if not chunk_ids:
        return
    if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM chunk_terms)").fetchone()[0]:
        _unkey_terms(conn)
        _write_terms(conn, chunk_ids)
        _index_terms(conn)
        return
    params = {"ids": chunk_ids}
    conn.execute(_LENGTHS + _BY_ID, params)
    conn.execute(
        f"""WITH added AS (
              INSERT INTO chunk_terms (term, chunk_id, tf, len)
              {_POSTINGS}{_BY_ID}{_KEY_ORDER}
              RETURNING term)
            INSERT INTO term_df AS d (term, df)
            SELECT term, count(*) FROM added GROUP BY term ORDER BY term
            ON CONFLICT (term) DO UPDATE SET df = d.df + EXCLUDED.df""",
        params,
    )


def _unkey_terms(conn: psycopg.Connection) -> None:
    """Bulk step, on empty postings: drop their key (and any stale document frequencies)."""
    conn.execute("DELETE FROM term_df")
    conn.execute("ALTER TABLE chunk_terms DROP CONSTRAINT chunk_terms_pkey")


def _write_terms(conn: psycopg.Connection, chunk_ids: list[str] | None) -> None:
    """Bulk step: lengths and postings of ``chunk_ids`` (every chunk when None) while
    ``chunk_terms`` has no key; ``_index_terms`` finishes. Each call's postings are stored in
    term order, so a term's postings lie in one run per call, not on a page per chunk (at 100k
    chunks of independent words, BM25 p50 was 39.7 ms with postings in chunk order, 12.0 ms after,
    benchmarks/scale.py --topics 0)."""
    where, params = ("", {}) if chunk_ids is None else (_BY_ID, {"ids": chunk_ids})
    conn.execute(_LENGTHS + where, params)
    conn.execute(f"INSERT INTO chunk_terms (term, chunk_id, tf, len) {_POSTINGS}{where}{_KEY_ORDER}", params)


def _index_terms(conn: psycopg.Connection) -> None:
    """Bulk step: the postings key, built once, and the document frequencies counted from it."""
    conn.execute("ALTER TABLE chunk_terms ADD CONSTRAINT chunk_terms_pkey PRIMARY KEY (term, chunk_id)")
    _count_terms(conn)


def _count_terms(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO term_df SELECT term, count(*) FROM chunk_terms GROUP BY term")


def _drop_terms(conn: psycopg.Connection, chunk_ids: list[str]) -> None:
    """Remove the length, postings and document frequencies of ``chunk_ids``, found through their
    current tsv (primary-key deletes); terms left in no chunk leave ``term_df``."""
    if not chunk_ids:
        return
    cursor = conn.execute(
        """WITH removed AS (
             DELETE FROM chunk_terms t
             USING (SELECT c.chunk_id, l.lexeme FROM chunks c, unnest(c.tsv) AS l WHERE c.chunk_id = ANY(%(ids)s)) old
             WHERE t.term = old.lexeme AND t.chunk_id = old.chunk_id
             RETURNING t.term),
           counted AS (SELECT term, count(*) AS n FROM removed GROUP BY term ORDER BY term)
         UPDATE term_df d SET df = d.df - counted.n FROM counted WHERE d.term = counted.term
         RETURNING d.term, d.df""",
        {"ids": chunk_ids},
    )
    gone = [term for term, df in cursor if df == 0]
    if gone:  # a second statement: a WITH query cannot delete rows its own UPDATE changed
        conn.execute("DELETE FROM term_df WHERE term = ANY(%s) AND df = 0", (gone,))
    conn.execute("DELETE FROM chunk_lengths WHERE chunk_id = ANY(%s)", (chunk_ids,))


def drop(conn: psycopg.Connection) -> None:
    """Drop the chunk table and its BM25 statistics from the current schema."""
    with conn.transaction():
        schema = sql.Identifier(conn.execute("SELECT current_schema()").fetchone()[0])
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {s}.term_df, {s}.chunk_terms, {s}.chunk_lengths, {s}.bm25_stats, {s}.chunks").format(s=schema))


def count(conn: psycopg.Connection) -> int:
    """Rows of ``chunks`` in the current schema (never another schema's through the search_path)."""
    schema = conn.execute("SELECT current_schema()").fetchone()[0]
    return conn.execute(sql.SQL("SELECT count(*) FROM {}.chunks").format(sql.Identifier(schema))).fetchone()[0]


def _check_dims(conn: psycopg.Connection, embedder: Embedder) -> None:
    dims = table_dims(conn)
    if dims is None:
        raise ValueError("table chunks does not exist in this schema; call Schema.create first")
    if dims != embedder.dims:
        raise ValueError(f"embedder {embedder.name} has {embedder.dims} dimensions, table chunks has {dims}")


def _stage(conn: psycopg.Connection, chunks: Sequence[Chunk], vectors: Iterable[np.ndarray | None], dims: int) -> None:
    """COPY chunks into a transaction-local table ``incoming``, ``vectors`` in chunk order (None: NULL)."""
    conn.execute("DROP TABLE IF EXISTS pg_temp.incoming")
    conn.execute(
        sql.SQL(
            """CREATE TEMP TABLE incoming (chunk_id text PRIMARY KEY, doc_id text, heading_path text,
                 start_char int, end_char int, text text, embedding vector({})) ON COMMIT DROP"""
        ).format(sql.Literal(int(dims)))
    )
    _copy(conn, "incoming", chunks, vectors)


def _merge(conn: psycopg.Connection, *, delete_missing: bool = False) -> tuple[int, int, int]:
    """Apply ``incoming`` to ``chunks`` and keep the BM25 postings exact; returns (inserted, updated, deleted).

    NULL vectors are filled from rows of the same text; with ``delete_missing``, chunks absent from
    ``incoming`` are deleted. Only rows that differ are written.
    """
    conn.execute(
        """UPDATE incoming i SET embedding = c.embedding
           FROM chunks c
           WHERE i.embedding IS NULL AND c.text = i.text"""
    )
    retexted = [r[0] for r in conn.execute(
        "SELECT i.chunk_id FROM incoming i JOIN chunks c USING (chunk_id) WHERE c.text IS DISTINCT FROM i.text")]
    new = [r[0] for r in conn.execute(
        "SELECT chunk_id FROM incoming i WHERE NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = i.chunk_id)")]
    missing = [r[0] for r in conn.execute(
        "SELECT chunk_id FROM chunks c WHERE NOT EXISTS (SELECT 1 FROM incoming i WHERE i.chunk_id = c.chunk_id)")] if delete_missing else []
    _drop_terms(conn, retexted + missing)
    deleted = conn.execute("DELETE FROM chunks WHERE chunk_id = ANY(%s)", (missing,)).rowcount if missing else 0
    rows = conn.execute(
        """INSERT INTO chunks AS c (chunk_id, doc_id, heading_path, start_char, end_char, text, embedding)
           SELECT chunk_id, doc_id, heading_path, start_char, end_char, text, embedding FROM incoming
           ON CONFLICT (chunk_id) DO UPDATE SET
             doc_id = EXCLUDED.doc_id, heading_path = EXCLUDED.heading_path,
             start_char = EXCLUDED.start_char, end_char = EXCLUDED.end_char,
             text = EXCLUDED.text, embedding = EXCLUDED.embedding
           WHERE (c.doc_id, c.heading_path, c.start_char, c.end_char, c.text)
                 IS DISTINCT FROM (EXCLUDED.doc_id, EXCLUDED.heading_path, EXCLUDED.start_char,
                                   EXCLUDED.end_char, EXCLUDED.text)
              OR c.embedding IS DISTINCT FROM EXCLUDED.embedding
           RETURNING (xmax = 0) AS inserted"""
    ).fetchall()
    _add_terms(conn, retexted + new)
    inserted = sum(1 for (flag,) in rows if flag)
    if rows or deleted:  # fresh planner statistics: plans (exact scan or HNSW, postings by index) stay stable
        conn.execute("ANALYZE chunks, chunk_terms, chunk_lengths, bm25_stats, term_df")
    return inserted, len(rows) - inserted, deleted


def _vectors(embedder: Embedder, chunks: Sequence[Chunk], wanted: set[str] | None, batch: int) -> Iterator[np.ndarray | None]:
    """Each chunk's vector in order, embedded ``batch`` chunks at a time as the COPY asks for them
    (one batch of vectors is held); None for chunks not in ``wanted`` (every chunk when None)."""
    for i in range(0, len(chunks), batch):
        window = chunks[i : i + batch]
        todo = [c for c in window if wanted is None or c.chunk_id in wanted]
        got = dict(zip((c.chunk_id for c in todo), embedder.embed([c.text for c in todo]))) if todo else {}
        yield from (got.get(c.chunk_id) for c in window)


def _unique(chunks: Iterable[Chunk]) -> list[Chunk]:
    by_id: dict[str, Chunk] = {}
    for c in chunks:
        if c.chunk_id in by_id and by_id[c.chunk_id] != c:
            raise ValueError(f"chunk id {c.chunk_id} appears twice with different content")
        by_id[c.chunk_id] = c
    return list(by_id.values())


def upsert(conn: psycopg.Connection, chunks: Iterable[Chunk], embedder: Embedder, batch: int = 64) -> int:
    """Embed and write chunks (insert or replace by chunk_id); returns rows written."""
    _check_dims(conn, embedder)
    chunks = _unique(chunks)
    with conn.transaction():
        _lock(conn)
        _stage(conn, chunks, _vectors(embedder, chunks, None, batch), embedder.dims)
        inserted, updated, _ = _merge(conn)
    return inserted + updated


_COLUMNS = "chunk_id, doc_id, heading_path, start_char, end_char, text, embedding"
_TYPES = ["text", "text", "text", "int4", "int4", "text", "vector"]


def _copy(conn: psycopg.Connection, table: str, chunks: Sequence[Chunk], vectors) -> None:
    """Binary COPY of chunks with their vectors (``vectors[i]`` belongs to ``chunks[i]``, None for NULL)."""
    query = sql.SQL("COPY {} (" + _COLUMNS + ") FROM STDIN WITH (FORMAT BINARY)").format(sql.Identifier(table))
    with conn.cursor().copy(query) as copy:
        copy.set_types(_TYPES)
        for c, v in zip(chunks, vectors):
            copy.write_row((c.chunk_id, c.doc_id, c.heading_path, c.start_char, c.end_char, c.text, v))


def _bulk(conn: psycopg.Connection, chunks: Sequence[Chunk], embedder: Embedder) -> SyncReport:
    """Load ``chunks`` into the empty table, inside the caller's transaction.

    The HNSW, GIN and postings indexes are dropped; batches of ``BULK_BATCH`` chunks are embedded
    in a worker thread while the previous batch is copied straight into ``chunks`` and its postings
    written (so Python and Postgres work at once and one batch of vectors is held); then the
    postings key is built, document frequencies counted from it, and HNSW and GIN rebuilt from
    their own definitions, with ``maintenance_work_mem`` at ``BUILD_MEMORY``. Phase timings are
    logged at INFO.
    """
    phases: dict[str, float] = {}
    start = time.perf_counter()
    defs = conn.execute(
        """SELECT indexname, indexdef FROM pg_indexes
           WHERE schemaname = current_schema() AND tablename = 'chunks' AND indexname = ANY(%s) ORDER BY indexname""",
        (["chunks_embedding_hnsw", "chunks_tsv_gin"],),
    ).fetchall()
    for name, _ in defs:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    _unkey_terms(conn)
    parts = [chunks[i : i + BULK_BATCH] for i in range(0, len(chunks), BULK_BATCH)]
    with ThreadPoolExecutor(1, thread_name_prefix="embed") as pool:
        pending = pool.submit(embedder.embed, [c.text for c in parts[0]])
        for i, part in enumerate(parts):
            vectors = pending.result()
            if i + 1 < len(parts):
                pending = pool.submit(embedder.embed, [c.text for c in parts[i + 1]])
            _copy(conn, "chunks", part, vectors)
            _write_terms(conn, [c.chunk_id for c in part])
    phases["embed_copy_postings"] = time.perf_counter() - start
    conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", (BUILD_MEMORY,))
    mark = time.perf_counter()
    _index_terms(conn)
    phases["postings_key_and_df"] = time.perf_counter() - mark
    for name, definition in defs:
        mark = time.perf_counter()
        conn.execute(definition)
        phases[name] = time.perf_counter() - mark
    mark = time.perf_counter()
    conn.execute("ANALYZE chunks, chunk_terms, chunk_lengths, bm25_stats, term_df")
    phases["analyze"] = time.perf_counter() - mark
    log.info("bulk load of %d chunks: %s", len(chunks), ", ".join(f"{k} {v:.1f} s" for k, v in phases.items()),
             extra={"phases": phases})
    return SyncReport(inserted=len(chunks), updated=0, deleted=0, unchanged=0, embedded=len(chunks))


def _lock(conn: psycopg.Connection) -> None:
    """Serialise writers of this schema's chunk table until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.sync:' || current_schema()))")


def sync(conn: psycopg.Connection, chunks: Iterable[Chunk], embedder: Embedder, batch: int = 64) -> SyncReport:
    """Make ``chunks`` equal to the given chunks in one transaction (stale rows are deleted).

    An empty table receiving at least ``BULK_MIN`` chunks is loaded in bulk (``_bulk``): same
    rows, postings and indexes, built once instead of row by row.
    """
    _check_dims(conn, embedder)
    chunks = _unique(chunks)
    with conn.transaction():
        _lock(conn)
        known_texts = {text for (text,) in conn.execute("SELECT text FROM chunks")}
        if not known_texts and len(chunks) >= max(BULK_MIN, 1):
            return _bulk(conn, chunks, embedder)
        fresh = {c.chunk_id for c in chunks if c.text not in known_texts}
        _stage(conn, chunks, _vectors(embedder, chunks, fresh, batch), embedder.dims)
        inserted, updated, deleted = _merge(conn, delete_missing=True)
    return SyncReport(
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        unchanged=len(chunks) - inserted - updated,
        embedded=len(fresh),
    )
