"""The chunk table: pgvector embeddings beside a generated full-text column (seed stage 02).

Contract: every function names the partition's ``schema``; nothing is read through the
search_path. ``create(conn, schema, dims)`` makes the schema and the seed's ``chunks`` table
with an HNSW cosine index (left out once the table was chosen to scan exactly: ``vector_index``),
its narrow ``fulltext`` copy with a GIN index (``copies``) and the BM25 postings (``bm25``), the ``tsv``
column under ``lexeme_rule`` (a table of an earlier rule is rewritten, nothing re-embedded);
``upsert`` writes chunks idempotently; ``sync`` makes the table equal to a set of chunks in one
transaction (a single COPY into a staging table and one merge, under the writers' lock; an empty
table receiving ``BULK_MIN`` chunks or more is loaded by ``bulk.load`` instead), re-embedding
only texts the table does not hold yet, and returns at once when the table still holds what the
last sync wrote for the same chunks and embedder (``synced``, cleared by any other write), and
repairs an index that lost a table first (``repair``; so does ``create``);
``chunk_ids`` returns the ids; ``drop`` removes it all. The BM25 postings are kept exact by every
write. Every dimension mismatch raises ValueError before anything is written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import psycopg
from psycopg import sql

from retrieval_assets import pg

from retrieval_assets.index import bm25, bulk, lexeme_rule, repair
from retrieval_assets.index.copies import exact_copy, has_exact_copy, mirror
from retrieval_assets.index.embed import Embedder
from retrieval_assets.index.vector_index import HNSW, RECALL_TARGET, check_recall_target, vector_index
from retrieval_assets.progress import Progress
from retrieval_assets.index.tables import CHUNK_COLUMNS, TABLES, column_list, copy_chunks, exists, statement, table_dims
from retrieval_assets.types import Chunk

BULK_MIN = 5_000  # sync into an empty table loads in bulk from this many chunks (see bulk.load; 10k row by row took 32.6 s)
_INCOMING = sql.Identifier("pg_temp", "incoming")  # sync's staging table, dropped at commit


@dataclass(frozen=True)
class SyncReport:
    inserted: int
    updated: int
    deleted: int
    unchanged: int
    embedded: int  # texts sent to the embedder (new text nowhere in the table)


def _column_defs() -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in CHUNK_COLUMNS.items())


def create(conn: psycopg.Connection, schema: str, dims: int) -> None:
    """Create the schema, ``chunks``, its indexes and the BM25 postings if missing (under the
    schema's sync lock, so concurrent calls and syncs never race on DDL)."""
    pg.ensure_extension(conn)
    existing = table_dims(conn, schema)
    if existing is not None and existing != dims:
        raise ValueError(f"table {schema}.chunks already has embedding dimension {existing}, not {dims}")
    with conn.transaction():
        _lock(conn, schema)  # the sync's lock: concurrent creators and writers of one schema queue here
        pg.ensure_schema(conn, schema)
        repair.clear(conn, schema)  # a table missing or replaced: what depends on it goes, built again below
        conn.execute(statement(
            schema,
            """CREATE TABLE IF NOT EXISTS {chunks} ({columns},
                 tsv tsvector GENERATED ALWAYS AS ({tsv}) STORED,
                 embedding vector({dims}), PRIMARY KEY (chunk_id))""",
            columns=_column_defs(), tsv=sql.SQL(lexeme_rule.TSVECTOR), dims=sql.Literal(int(dims))))
        lexeme_rule.migrate(conn, schema)  # a table from before today's rule
        if existing is None:  # a new table: the embedding inline, not in TOAST (exact scans 2.2x faster, bench_storage)
            conn.execute(statement(schema, "ALTER TABLE {chunks} ALTER COLUMN embedding SET STORAGE PLAIN"))
        conn.execute(statement(schema, """CREATE TABLE IF NOT EXISTS {vector_index} (
                                            kind text NOT NULL CHECK (kind IN ('hnsw', 'exact')), recall float8,
                                            sample int4 NOT NULL, ef_search int4 NOT NULL, reason text NOT NULL,
                                            checked_at timestamptz NOT NULL DEFAULT now())"""))
        chosen = vector_index(conn, schema)
        if chosen is None or chosen.kind == "hnsw":  # a table chosen to scan exactly gets no graph back
            conn.execute(statement(schema, HNSW))
        elif not has_exact_copy(conn, schema):  # chosen before the narrow copy existed
            exact_copy(conn, schema)
        fulltext = not exists(conn, schema, "fulltext")
        conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {fulltext} (chunk_id text PRIMARY KEY, tsv tsvector NOT NULL)"))
        mirror(conn, schema, "fulltext", "tsv")
        if fulltext:  # new, or a table from before the copy: its GIN moves there
            conn.execute(statement(schema, "INSERT INTO {fulltext} SELECT chunk_id, tsv FROM {chunks} WHERE tsv IS NOT NULL"))
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(schema, "chunks_tsv_gin")))
        conn.execute(statement(schema, "CREATE INDEX IF NOT EXISTS fulltext_tsv_gin ON {fulltext} USING gin (tsv)"))
        conn.execute(statement(schema, "CREATE INDEX IF NOT EXISTS chunks_doc_id ON {chunks} (doc_id)"))
        conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {synced} (one bool PRIMARY KEY DEFAULT true CHECK (one), fingerprint text NOT NULL)"))
        clear = sql.Identifier(schema, "synced_clear")
        conn.execute(statement(schema, "CREATE OR REPLACE FUNCTION {clear}() RETURNS trigger LANGUAGE plpgsql AS $$ "
                               "BEGIN DELETE FROM {synced}; RETURN NULL; END $$", clear=clear))
        conn.execute(statement(schema, """CREATE OR REPLACE TRIGGER synced_clear AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON {chunks}
                                          FOR EACH STATEMENT EXECUTE FUNCTION {clear}()""", clear=clear))
        bm25.create(conn, schema)


def drop(conn: psycopg.Connection, schema: str) -> None:
    """Drop the chunk table and its BM25 statistics from ``schema`` (the schema itself stays)."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.SQL(", ").join(sql.Identifier(schema, t) for t in reversed(TABLES))))


def chunk_ids(conn: psycopg.Connection, schema: str) -> set[str]:
    """The chunk ids in ``schema.chunks``."""
    return {r[0] for r in conn.execute(statement(schema, "SELECT chunk_id FROM {chunks}"))}


class ShrinkError(ValueError):
    """A sync would delete most of an index; the message says how many rows."""


class ChunkTooLargeError(ValueError):
    """A chunk whose text cannot fit a Postgres tsvector; the message names it."""


TSVECTOR_LIMIT = 1_048_575  # bytes a Postgres tsvector holds; a chunk's text at most this size always fits


def _check_sizes(chunks: Sequence[Chunk]) -> None:
    for c in chunks:
        size = len(c.text.encode("utf-8"))
        if size > TSVECTOR_LIMIT:
            raise ChunkTooLargeError(f"chunk {c.chunk_id} of document {c.doc_id} is {size} bytes, above the {TSVECTOR_LIMIT} bytes a "
                             "Postgres tsvector can hold: split that text (blank lines or headings), nothing was synced")


def _check_dims(schema: str, dims: int | None, embedder: Embedder) -> None:
    if dims is None:
        raise ValueError(f"table {schema}.chunks does not exist; call store.create first")
    if dims != embedder.dims:
        raise ValueError(f"embedder {embedder.name} has {embedder.dims} dimensions, table {schema}.chunks has {dims}")


def _stage(conn: psycopg.Connection, chunks: Sequence[Chunk], vectors: Iterable[np.ndarray | None], dims: int) -> None:
    """COPY chunks into the transaction-local table ``incoming``, ``vectors`` in chunk order (None: NULL)."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_INCOMING))
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}, embedding vector({}), PRIMARY KEY (chunk_id)) ON COMMIT DROP").format(
        _INCOMING, _column_defs(), sql.Literal(int(dims))))
    copy_chunks(conn, _INCOMING, chunks, vectors)


_DATA = [name for name in CHUNK_COLUMNS if name != "chunk_id"]  # what an upsert compares and replaces


def _merge(conn: psycopg.Connection, schema: str, *, delete_missing: bool = False) -> tuple[int, int, int]:
    """Apply ``incoming`` to ``chunks`` and keep the BM25 postings exact; returns (inserted, updated, deleted).

    NULL vectors are filled from rows of the same text; with ``delete_missing``, chunks absent from
    ``incoming`` are deleted. Only rows that differ are written.
    """
    q = lambda template, **extra: statement(schema, template, incoming=_INCOMING, **extra)  # noqa: E731
    conn.execute(q("UPDATE {incoming} i SET embedding = c.embedding FROM {chunks} c WHERE i.embedding IS NULL AND c.text = i.text"))
    retexted = [r[0] for r in conn.execute(q(
        "SELECT i.chunk_id FROM {incoming} i JOIN {chunks} c USING (chunk_id) WHERE c.text IS DISTINCT FROM i.text"))]
    new = [r[0] for r in conn.execute(q(
        "SELECT chunk_id FROM {incoming} i WHERE NOT EXISTS (SELECT 1 FROM {chunks} c WHERE c.chunk_id = i.chunk_id)"))]
    missing = [r[0] for r in conn.execute(q(
        "SELECT chunk_id FROM {chunks} c WHERE NOT EXISTS (SELECT 1 FROM {incoming} i WHERE i.chunk_id = c.chunk_id)"))] if delete_missing else []
    bm25.drop_terms(conn, schema, retexted + missing)
    deleted = conn.execute(q("DELETE FROM {chunks} WHERE chunk_id = ANY(%s)"), (missing,)).rowcount if missing else 0
    data = [sql.Identifier(n) for n in _DATA]
    rows = conn.execute(q(
        """INSERT INTO {chunks} AS c ({columns}) SELECT {columns} FROM {incoming}
           ON CONFLICT (chunk_id) DO UPDATE SET {assign}
           WHERE ({old}) IS DISTINCT FROM ({new}) OR c.embedding IS DISTINCT FROM EXCLUDED.embedding
           RETURNING (xmax = 0) AS inserted""",
        columns=column_list("embedding"),
        assign=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(c) for c in [*data, sql.Identifier("embedding")]),
        old=sql.SQL(", ").join(sql.SQL("c.{}").format(c) for c in data),
        new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(c) for c in data),
    )).fetchall()
    bm25.add_terms(conn, schema, retexted + new)
    inserted = sum(1 for (flag,) in rows if flag)
    if rows or deleted:  # fresh planner statistics: plans (exact scan or HNSW, postings by index) stay stable
        bm25.analyze(conn, schema)
    return inserted, len(rows) - inserted, deleted


def _vectors(embedder: Embedder, chunks: Sequence[Chunk], wanted: set[str] | None, batch: int,
             tick: Callable[[int], None] = lambda done: None) -> Iterator[np.ndarray | None]:
    """Each chunk's vector in order, embedded ``batch`` chunks at a time as the COPY asks for them
    (one batch of vectors is held); None for chunks not in ``wanted`` (every chunk when None)."""
    for i in range(0, len(chunks), batch):
        tick(i)
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


def _lock(conn: psycopg.Connection, schema: str) -> None:
    """Serialise writers of ``schema``'s chunk table until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.sync:' || %s))", (schema,))


def upsert(conn: psycopg.Connection, schema: str, chunks: Iterable[Chunk], embedder: Embedder, batch: int = 64) -> int:
    """Embed and write chunks (insert or replace by chunk_id); returns rows written."""
    _check_dims(schema, table_dims(conn, schema), embedder)
    chunks = _unique(chunks)
    with conn.transaction():
        _lock(conn, schema)
        _stage(conn, chunks, _vectors(embedder, chunks, None, batch), embedder.dims)
        inserted, updated, _ = _merge(conn, schema)
    return inserted + updated


def sync(conn: psycopg.Connection, schema: str, chunks: Iterable[Chunk], embedder: Embedder, batch: int = 64, *,
         progress: Callable[[str], object] | None = None, allow_shrink: bool = False,
         recall_target: float | None = RECALL_TARGET) -> SyncReport:
    """Make ``schema.chunks`` equal to the given chunks in one transaction (stale rows are deleted).

    An empty table receiving at least ``BULK_MIN`` chunks is loaded in bulk (``bulk.load``): same
    rows, postings and indexes, built once instead of row by row. ``progress`` gets a line at
    most every 10 s while chunks are embedded. A sync that would delete more than half of a
    non-empty index raises ``ShrinkError`` (nothing changed) unless ``allow_shrink``; a chunk
    too large for a Postgres tsvector raises ``ChunkTooLargeError`` naming it. After a bulk load
    the HNSW index is checked against exact search and kept only when its recall@10 reaches
    ``recall_target`` (``vector_index.choose_vector_index``; None: not checked, HNSW kept), and after the commit
    the loaded tables are vacuumed (``bulk.vacuum_loaded``). When the table
    still holds what the last sync wrote for the same chunks (every field, in the same order) and
    embedder, nothing is read or written: a trigger clears that record at any other write to
    ``chunks`` (upsert, SQL of anyone's), so the shortcut never hides a change. An index with a
    table missing, or replaced since that record, is built again first (``repair``, logged) and synced in full.
    """
    check_recall_target(recall_target)
    chunks = _unique(chunks)
    _check_sizes(chunks)
    tick = Progress(progress, len(chunks), f"{schema}: chunks through the embedder")
    fingerprint = _fingerprint(chunks, embedder)
    with conn.transaction():
        _lock(conn, schema)
        health = repair.inspect(conn, schema)
        if health.dims is not None or not health.missing:  # (a missing chunks of an index is repaired below)
            _check_dims(schema, health.dims, embedder)  # no index at all, or another dimension: ValueError
        stored = repair.stored(conn, schema, health)
        if health.missing or health.replaced(stored):  # a table missing or replaced: built again, synced in full below
            create(conn, schema, embedder.dims)
        elif stored == repair.record(fingerprint, health):
            return SyncReport(inserted=0, updated=0, deleted=0, unchanged=len(chunks), embedded=0)  # nothing written since
        report, loaded = _sync(conn, schema, chunks, embedder, batch, tick, allow_shrink, recall_target)
        conn.execute(statement(schema, """INSERT INTO {synced} (fingerprint) VALUES (%s)
                                          ON CONFLICT (one) DO UPDATE SET fingerprint = EXCLUDED.fingerprint"""),
                     (repair.record(fingerprint, repair.inspect(conn, schema)),))
    if loaded:
        bulk.vacuum_loaded(conn, schema)
    return report


def _fingerprint(chunks: Sequence[Chunk], embedder: Embedder) -> str:
    """A hash of the embedder and of every field of every chunk, in order (each value length-prefixed)."""
    digest = hashlib.sha256()
    for value in (embedder.name, embedder.dims, *(getattr(c, name) for c in chunks for name in CHUNK_COLUMNS)):
        text = str(value)
        digest.update(f"{len(text)}:{text}".encode())
    return digest.hexdigest()


def _sync(conn: psycopg.Connection, schema: str, chunks: list[Chunk], embedder: Embedder, batch: int,
          tick: Callable[[int], None], allow_shrink: bool, recall_target: float | None) -> tuple[SyncReport, bool]:
    """``sync``'s writes, inside its transaction and lock; the report, and whether it was a bulk load."""
    known = dict(conn.execute(statement(schema, "SELECT chunk_id, text FROM {chunks}")).fetchall())
    doomed = len(known.keys() - {c.chunk_id for c in chunks})
    if known and doomed * 2 > len(known) and not allow_shrink:
        raise ShrinkError(f"{schema}: this sync would delete {doomed} of the index's {len(known)} chunks (the corpus has "
                          f"{len(chunks)}); nothing changed. If the corpus really shrank, sync with allow_shrink=True "
                          "(asset config chunk_index: allow_shrink: true)")
    known_texts = set(known.values())
    if not known_texts and len(chunks) >= max(BULK_MIN, 1):
        bulk.load(conn, schema, chunks, embedder, tick, recall_target)
        return SyncReport(inserted=len(chunks), updated=0, deleted=0, unchanged=0, embedded=len(chunks)), True
    fresh = {c.chunk_id for c in chunks if c.text not in known_texts}
    _stage(conn, chunks, _vectors(embedder, chunks, fresh, batch, tick), embedder.dims)
    inserted, updated, deleted = _merge(conn, schema, delete_missing=True)
    return SyncReport(
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        unchanged=len(chunks) - inserted - updated,
        embedded=len(fresh),
    ), False
