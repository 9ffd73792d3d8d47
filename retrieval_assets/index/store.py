"""The chunk table: pgvector embeddings beside a generated full-text column (seed stage 02).

Contract: every function names the partition's ``schema``; nothing is read through the
search_path. ``create(conn, schema, dims)`` makes the schema and the seed's ``chunks`` table
with an HNSW cosine index and a GIN index, and the BM25 postings beside it (``bm25``);
``upsert`` writes chunks idempotently; ``sync`` makes the table equal to a set of chunks in one
transaction (a single COPY into a staging table and one merge, under the writers' lock),
re-embedding only texts the table does not hold yet, and returns at once when the table still
holds what the last sync wrote for the same chunks and embedder (``synced``, cleared by any other
write); ``count`` returns the row count; ``drop``
removes it all. The BM25 postings are kept exact by every write. Every dimension mismatch raises
ValueError before anything is written. After a bulk load the vector search is chosen for the
table by measured recall (``choose_vector_index``: HNSW at the least ef_search of ``EF_LADDER``
that reaches ``RECALL_TARGET``, else an exact scan) and recorded in its ``vector_index`` table;
an exact scan reads ``vectors``, a narrow copy of the embeddings that triggers keep equal to
``chunks`` (``exact_copy``), in halfvec when its scan keeps ``HALF_RECALL`` against float32.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import pq, sql

from retrieval_assets import pg

from retrieval_assets.index import bm25
from retrieval_assets.index.embed import Embedder
from retrieval_assets.params import DEFAULT, hnsw_ef_search
from retrieval_assets.progress import Progress
from retrieval_assets.index.tables import CHUNK_COLUMNS, TABLES, column_list, exists, statement
from retrieval_assets.types import Chunk

log = logging.getLogger(__name__)

BULK_MIN = 5_000  # sync into an empty table loads in bulk from this many chunks (see _bulk; 10k row by row took 32.6 s)
BULK_BATCH = 5_000  # chunks embedded and copied at a time by the bulk load
BUILD_MEMORY = "512MB"  # maintenance_work_mem for the bulk load's index builds (pgvector: the graph should fit)
_INCOMING = sql.Identifier("pg_temp", "incoming")  # sync's staging table, dropped at commit
RECALL_TARGET = 0.95  # recall@10 against exact search the HNSW index must keep, checked after each bulk load
RECALL_SAMPLE = 50  # the table's own chunks whose words make that check's queries
QUERY_WORDS = 4  # words of a chunk in one such query
PROBE_ROWS = 20_000  # a bulk load of twice this many rows first checks a graph over this many (choose_vector_index)
HALF_RECALL = 0.99  # recall@10 against float32 exact search a halfvec copy must keep to be the exact scan's copy
EF_LADDER = (None, 100, 200, 400)  # the hnsw.ef_search values tried, cheapest first (None: the pipeline's, for DEFAULT.n)
_WORD = re.compile(r"[^\W\d_][\w'-]*")
_HNSW = "CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw ON {chunks} USING hnsw (embedding vector_cosine_ops)"


@dataclass(frozen=True)
class SyncReport:
    inserted: int
    updated: int
    deleted: int
    unchanged: int
    embedded: int  # texts sent to the embedder (new text nowhere in the table)


@dataclass(frozen=True)
class VectorIndex:
    """How ``chunks`` is searched by vector, as chosen after its last bulk load (``choose_vector_index``)."""

    kind: str  # "hnsw" (the graph index) or "exact" (no vector index: every search scans the table)
    recall: float | None  # the HNSW index's recall@10 against exact search when it was checked
    sample: int  # the queries (words of the table's own chunks)
    ef_search: int  # hnsw: the least ef_search searches use (the first of EF_LADDER that reached the target); exact: the top one tried
    reason: str


def _embedding_column(conn: psycopg.Connection, schema: str, table: str) -> tuple[str, int] | None:
    """(type name, dimension) of ``schema.table.embedding``, or None without that table."""
    return conn.execute(
        """SELECT format_type(a.atttypid, NULL), a.atttypmod FROM pg_attribute a
           JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace s ON s.oid = c.relnamespace
           WHERE s.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped""",
        (schema, table),
    ).fetchone()


def table_dims(conn: psycopg.Connection, schema: str) -> int | None:
    """The dimension of ``schema.chunks.embedding``, or None without a table."""
    column = _embedding_column(conn, schema, "chunks")
    return column[1] if column else None


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
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(statement(
            schema,
            """CREATE TABLE IF NOT EXISTS {chunks} ({columns},
                 tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED,
                 embedding vector({dims}), PRIMARY KEY (chunk_id))""",
            columns=_column_defs(), dims=sql.Literal(int(dims))))
        if existing is None:  # a new table: the embedding inline, not in TOAST (exact scans 2.2x faster, bench_storage)
            conn.execute(statement(schema, "ALTER TABLE {chunks} ALTER COLUMN embedding SET STORAGE PLAIN"))
        conn.execute(statement(schema, """CREATE TABLE IF NOT EXISTS {vector_index} (
                                            kind text NOT NULL CHECK (kind IN ('hnsw', 'exact')), recall float8,
                                            sample int4 NOT NULL, ef_search int4 NOT NULL, reason text NOT NULL,
                                            checked_at timestamptz NOT NULL DEFAULT now())"""))
        chosen = vector_index(conn, schema)
        if chosen is None or chosen.kind == "hnsw":  # a table chosen to scan exactly gets no graph back
            conn.execute(statement(schema, _HNSW))
        elif not has_exact_copy(conn, schema):  # chosen before the narrow copy existed
            exact_copy(conn, schema)
        fulltext = not exists(conn, schema, "fulltext")
        conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {fulltext} (chunk_id text PRIMARY KEY, tsv tsvector NOT NULL)"))
        _mirror(conn, schema, "fulltext", "tsv")
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


def count(conn: psycopg.Connection, schema: str) -> int:
    """Rows of ``schema.chunks``."""
    return conn.execute(statement(schema, "SELECT count(*) FROM {chunks}")).fetchone()[0]


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


def _check_dims(conn: psycopg.Connection, schema: str, embedder: Embedder) -> None:
    dims = table_dims(conn, schema)
    if dims is None:
        raise ValueError(f"table {schema}.chunks does not exist; call store.create first")
    if dims != embedder.dims:
        raise ValueError(f"embedder {embedder.name} has {embedder.dims} dimensions, table {schema}.chunks has {dims}")


def _copy(conn: psycopg.Connection, table: sql.Identifier, chunks: Sequence[Chunk], vectors) -> None:
    """Binary COPY of chunks with their vectors (``vectors[i]`` belongs to ``chunks[i]``, None for NULL)."""
    query = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(table, column_list("embedding"))
    with conn.cursor().copy(query) as copy:
        copy.set_types([*CHUNK_COLUMNS.values(), "vector"])
        for c, v in zip(chunks, vectors):
            copy.write_row((*(getattr(c, name) for name in CHUNK_COLUMNS), v))


def _stage(conn: psycopg.Connection, chunks: Sequence[Chunk], vectors: Iterable[np.ndarray | None], dims: int) -> None:
    """COPY chunks into the transaction-local table ``incoming``, ``vectors`` in chunk order (None: NULL)."""
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(_INCOMING))
    conn.execute(sql.SQL("CREATE TEMP TABLE {} ({}, embedding vector({}), PRIMARY KEY (chunk_id)) ON COMMIT DROP").format(
        _INCOMING, _column_defs(), sql.Literal(int(dims))))
    _copy(conn, _INCOMING, chunks, vectors)


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
    _check_dims(conn, schema, embedder)
    chunks = _unique(chunks)
    with conn.transaction():
        _lock(conn, schema)
        _stage(conn, chunks, _vectors(embedder, chunks, None, batch), embedder.dims)
        inserted, updated, _ = _merge(conn, schema)
    return inserted + updated


def _bulk(conn: psycopg.Connection, schema: str, chunks: Sequence[Chunk], embedder: Embedder,
          tick: Callable[[int], None] = lambda done: None, recall_target: float | None = RECALL_TARGET) -> SyncReport:
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
        defs = sorted([*defs, ("chunks_embedding_hnsw", statement(schema, _HNSW).as_string(conn))])
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
            _copy(conn, sql.Identifier(schema, "chunks"), part, vectors)
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
    return SyncReport(inserted=len(chunks), updated=0, deleted=0, unchanged=0, embedded=len(chunks))


def sync(conn: psycopg.Connection, schema: str, chunks: Iterable[Chunk], embedder: Embedder, batch: int = 64, *,
         progress: Callable[[str], object] | None = None, allow_shrink: bool = False,
         recall_target: float | None = RECALL_TARGET) -> SyncReport:
    """Make ``schema.chunks`` equal to the given chunks in one transaction (stale rows are deleted).

    An empty table receiving at least ``BULK_MIN`` chunks is loaded in bulk (``_bulk``): same
    rows, postings and indexes, built once instead of row by row. ``progress`` gets a line at
    most every 10 s while chunks are embedded. A sync that would delete more than half of a
    non-empty index raises ``ShrinkError`` (nothing changed) unless ``allow_shrink``; a chunk
    too large for a Postgres tsvector raises ``ChunkTooLargeError`` naming it. After a bulk load
    the HNSW index is checked against exact search and kept only when its recall@10 reaches
    ``recall_target`` (``choose_vector_index``; None: not checked, HNSW kept), and after the commit the
    loaded tables are vacuumed (``_vacuum_loaded``). When the table
    still holds what the last sync wrote for the same chunks (every field, in the same order) and
    embedder, nothing is read or written: a trigger clears that record at any other write to
    ``chunks`` (upsert, SQL of anyone's), so the shortcut never hides a change.
    """
    check_recall_target(recall_target)
    _check_dims(conn, schema, embedder)
    chunks = _unique(chunks)
    _check_sizes(chunks)
    tick = Progress(progress, len(chunks), f"{schema}: chunks through the embedder")
    fingerprint = _fingerprint(chunks, embedder)
    with conn.transaction():
        _lock(conn, schema)
        if conn.execute(statement(schema, "SELECT fingerprint FROM {synced}")).fetchone() == (fingerprint,):
            return SyncReport(inserted=0, updated=0, deleted=0, unchanged=len(chunks), embedded=0)  # nothing written since
        report, bulk = _sync(conn, schema, chunks, embedder, batch, tick, allow_shrink, recall_target)
        conn.execute(statement(schema, """INSERT INTO {synced} (fingerprint) VALUES (%s)
                                          ON CONFLICT (one) DO UPDATE SET fingerprint = EXCLUDED.fingerprint"""), (fingerprint,))
    if bulk:
        _vacuum_loaded(conn, schema)
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
        return _bulk(conn, schema, chunks, embedder, tick, recall_target), True
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


# what a bulk load fills, vacuumed after its commit (``_vacuum_loaded``)
_LOADED = ("chunks", "fulltext", "postings", "chunk_lengths", "term_df", "vectors")


def _vacuum_loaded(conn: psycopg.Connection, schema: str) -> None:
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


def check_recall_target(target: float | None) -> None:
    """ValueError unless ``target`` is None or a number within [0, 1] (``sync``'s and ``choose_vector_index``'s)."""
    if target is not None and not (isinstance(target, (int, float)) and 0.0 <= target <= 1.0):
        raise ValueError(f"recall_target must be a number within [0, 1] or None, got {target!r}")


def vector_index(conn: psycopg.Connection, schema: str) -> VectorIndex | None:
    """The vector search chosen for ``schema.chunks`` at its last check, or None (never checked, or a
    table made before the check existed)."""
    if not exists(conn, schema, "vector_index"):
        return None
    row = conn.execute(statement(schema, """SELECT kind, recall, sample, ef_search, reason FROM {vector_index}
                                           ORDER BY checked_at DESC LIMIT 1""")).fetchone()
    return VectorIndex(*row) if row else None


def query_words(text: str, words: int = QUERY_WORDS) -> str:
    """``words`` words spread evenly over ``text`` (all of them when it has fewer): a keyword query made of a chunk."""
    found = _WORD.findall(text)
    if len(found) <= words:
        return " ".join(found)
    return " ".join(found[round(i * (len(found) - 1) / (words - 1))] for i in range(words))


def vector_recall(conn: psycopg.Connection, schema: str, embedder: Embedder, *, sample: int = RECALL_SAMPLE, k: int = 10,
                  ef_search: int | None = DEFAULT.ef_search) -> tuple[float, int]:
    """(recall@k, queries) of the vector search as the pipeline runs it (``hnsw.ef_search`` for a pool of
    ``DEFAULT.n``, or ``ef_search``; the planner free to pick the index) against exact search. The
    queries are made of the table's own chunks: ``query_words`` of ``sample`` chunks in a fixed
    order (by hash of chunk_id), embedded by ``embedder``; short, like users' queries (a chunk's
    whole vector as the query is easier: recall 0.97 against 0.69 for keyword queries on 5,000 hash
    vectors, benchmarks/guards/bench_vector_index.py). A result counts when its distance is within
    the exact k-th distance (equal vectors are not misses). Exact search runs in numpy over the
    table, streamed in batches.
    """
    ef = hnsw_ef_search(DEFAULT.n, ef_search)
    recalls, truth = _ladder_recall(conn, schema, embedder, sample, k, [ef])
    return recalls[ef], _queries(truth)


def _ladder_recall(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, k: int,
                   efs: Sequence[int]) -> tuple[dict[int, float], tuple | None]:
    """``vector_recall`` at each of ``efs`` (the exact lists computed once): ({ef: recall}, the
    ``_exact_truth`` they were judged against, for a later check of the same table)."""
    with conn.transaction():  # the settings are local to it; the scan's server-side cursor needs one
        truth = _exact_truth(conn, schema, embedder, sample, k)
        if truth is None:
            return {ef: 1.0 for ef in efs}, None
        search = statement(schema, "SELECT embedding FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(k)s")
        recalls = {}
        for ef in efs:
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
            recalls[ef] = _recall(conn, search, truth, k)
    return recalls, truth


def _queries(truth: tuple | None) -> int:
    """How many queries an ``_exact_truth`` holds (0 for None: none had a vector)."""
    return 0 if truth is None else len(truth[0])


def _exact_truth(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, k: int):
    """(query vectors, unit query vectors in float64, the k smallest exact distances of each, how many
    each has) for ``sample`` keyword queries of the table's chunks; None when no query has a vector.
    Exact search runs in numpy over ``chunks``, streamed in batches (inside the caller's transaction)."""
    texts = [t for (t,) in conn.execute(statement(schema, """SELECT text FROM {chunks} WHERE embedding IS NOT NULL
                                                           ORDER BY hashtext(chunk_id), chunk_id LIMIT %s"""), (sample,))]
    queries = [q for q in (query_words(t) for t in texts) if q]
    vectors = np.asarray(embedder.embed(queries), dtype=np.float32) if queries else np.zeros((0, 1), np.float32)
    vectors = vectors[np.linalg.norm(vectors, axis=1) > 0]  # words the embedder maps to zero search nothing
    if not len(vectors):
        return None
    unit = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    best = np.full((len(unit), k), np.inf)  # the k smallest exact distances per query
    with conn.cursor(name="vector_recall_scan", binary=True) as scan:
        scan.itersize = 10_000
        scan.execute(statement(schema, "SELECT embedding FROM {chunks} WHERE embedding IS NOT NULL"))
        while batch := scan.fetchmany(10_000):
            rows = np.stack([r[0].to_numpy() for r in batch]).astype(np.float64)
            distances = 1.0 - unit @ rows.T / np.maximum(np.linalg.norm(rows, axis=1), 1e-12)  # (queries, batch)
            best = np.sort(np.concatenate([best, distances], axis=1), axis=1)[:, :k]
    return vectors, unit, best, np.isfinite(best).sum(axis=1)  # neighbours per query: k, or every row of a smaller table


def _recall(conn: psycopg.Connection, search: sql.Composable, truth, k: int, bind: Callable = lambda v: v) -> float:
    """Recall@k of ``search`` (its rows: the found chunks' float32 embeddings) against ``_exact_truth``:
    a found row counts when its distance, in float64 like the exact ones, is within the exact k-th."""
    vectors, unit, best, available = truth
    hits = 0
    with conn.cursor(binary=True) as cur:
        for j, vector in enumerate(vectors):
            found = np.stack([r[0].to_numpy() for r in cur.execute(search, {"q": bind(vector), "k": k}).fetchall()]).astype(np.float64)
            distances = 1.0 - found @ unit[j] / np.maximum(np.linalg.norm(found, axis=1), 1e-12)
            hits += int(np.sum(distances <= best[j, available[j] - 1] + 1e-9))
    return hits / int(available.sum())


def choose_vector_index(conn: psycopg.Connection, schema: str, embedder: Embedder, target: float = RECALL_TARGET, *,
                        sample: int = RECALL_SAMPLE, phases: dict[str, float] | None = None) -> VectorIndex:
    """The first of ``EF_LADDER`` at which an HNSW index on ``schema.chunks`` reaches ``target`` recall@10
    (``vector_recall``); when none does, the graph is dropped and every vector search scans the table
    exactly (recall 1 at the cost of a scan). The chosen ef_search is the least that searches of the
    table use (``pipeline.retriever`` reads it). A table of at least ``2 * PROBE_ROWS`` rows without a
    graph is probed first: a graph over ``PROBE_ROWS`` of its rows (a temporary table) at the
    ladder's top; when that misses the target the full graph is not built, since a graph's recall
    at a fixed ef_search only falls as it grows. The choice is recorded in ``vector_index``
    (``create`` then builds no graph for an exact table) and logged with its reason; ``phases`` gets
    the seconds of the probe, the build and the check. Run inside a transaction.
    """
    check_recall_target(target)
    phases = {} if phases is None else phases
    ladder = sorted({hnsw_ef_search(DEFAULT.n, ef) for ef in EF_LADDER})
    about = f"{{queries}} queries of {QUERY_WORDS} words from the table's chunks"
    rows = count(conn, schema)
    if rows >= 2 * PROBE_ROWS and not _has_graph(conn, schema):
        mark = time.perf_counter()
        recall, queries = _probe(conn, schema, embedder, sample, ladder[-1])
        phases["vector_index_probe"] = time.perf_counter() - mark
        if recall < target:
            return _record(conn, schema, VectorIndex(
                "exact", recall, queries, ladder[-1],
                f"HNSW recall@10 {recall:.3f} at ef_search {ladder[-1]} on a graph of {PROBE_ROWS:,} of the table's {rows:,} rows, "
                f"{about.format(queries=queries)}: below {target}, and lower still at full size; no graph built, vector "
                "search scans the table exactly"), phases, embedder, sample)
    mark = time.perf_counter()
    conn.execute(statement(schema, _HNSW))
    phases["chunks_embedding_hnsw"] = time.perf_counter() - mark
    mark = time.perf_counter()
    recalls, truth = _ladder_recall(conn, schema, embedder, sample, 10, ladder)
    queries = _queries(truth)
    phases["vector_index_check"] = time.perf_counter() - mark
    measured = ", ".join(f"{recalls[ef]:.3f} at ef_search {ef}" for ef in ladder)
    measured = f"HNSW recall@10 against exact search {measured} ({about.format(queries=queries)})"
    for ef in ladder:
        if recalls[ef] >= target:
            return _record(conn, schema, VectorIndex("hnsw", recalls[ef], queries, ef,
                                                     f"{measured}: HNSW kept, searched at ef_search {ef} or more (target {target})"))
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "chunks_embedding_hnsw")))
    return _record(conn, schema, VectorIndex("exact", recalls[ladder[-1]], queries, ladder[-1],
                                             f"{measured}: below {target} throughout, HNSW dropped; vector search scans the table exactly"),
                   phases, embedder, sample, truth)  # the same table's truth: the copy's check reuses it


# The narrow copies that searches scan instead of the chunk rows with their text, tsvector and
# vector: ``vectors`` (chunk_id, embedding) while the exact scan is the table's choice (100k hash
# chunks: vector search p50 44 ms against 111 ms, benchmarks/results/scale.md), and ``fulltext``
# (chunk_id, tsv) always, which the ts_rank_cd list and negated terms read through its GIN index.
# Statement triggers on chunks keep each equal to it.
_MIRROR_UPSERT = """INSERT INTO {copy} (chunk_id, {column})
                     SELECT chunk_id, {column} FROM changed WHERE {column} IS NOT NULL
                     ON CONFLICT (chunk_id) DO UPDATE SET {column} = EXCLUDED.{column};"""
_MIRROR_BODY = {
    "insert": ("NEW", _MIRROR_UPSERT),
    "update": ("NEW", _MIRROR_UPSERT + " DELETE FROM {copy} v USING changed c WHERE v.chunk_id = c.chunk_id AND c.{column} IS NULL;"),
    "delete": ("OLD", "DELETE FROM {copy} v USING changed c WHERE v.chunk_id = c.chunk_id;"),
}


def _mirror(conn: psycopg.Connection, schema: str, copy: str, column: str) -> None:
    """Statement triggers on ``chunks`` (``<copy>_insert``, ``_update``, ``_delete``) that keep ``copy``'s
    (chunk_id, ``column``) rows equal to the chunks' non-NULL ones."""
    names = {"copy": sql.Identifier(schema, copy), "column": sql.Identifier(column)}
    for op, (rows, body) in _MIRROR_BODY.items():
        fn = sql.Identifier(schema, f"{copy}_{op}")
        conn.execute(statement(schema, "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                               + body + " RETURN NULL; END $$", fn=fn, **names))
        conn.execute(statement(schema, """CREATE OR REPLACE TRIGGER {name} AFTER {op} ON {chunks}
                                          REFERENCING {rows} TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION {fn}()""",
                               name=sql.Identifier(f"{copy}_{op}"), op=sql.SQL(op.upper()), rows=sql.SQL(rows), fn=fn))


def _unmirror(conn: psycopg.Connection, schema: str, copy: str) -> None:
    for op in _MIRROR_BODY:
        conn.execute(statement(schema, "DROP TRIGGER IF EXISTS {name} ON {chunks}", name=sql.Identifier(f"{copy}_{op}")))


def exact_copy(conn: psycopg.Connection, schema: str, *, half: bool = False) -> None:
    """Fill ``vectors`` from ``chunks`` and keep it equal through triggers (inside the caller's transaction;
    idempotent): what every vector search of a table chosen to scan exactly reads. ``half``: the
    copy holds halfvec (half the bytes a scan reads; the chunk table keeps float32)."""
    dims, kind = table_dims(conn, schema), "halfvec" if half else "vector"
    if exact_copy_type(conn, schema) not in (None, kind):
        drop_exact_copy(conn, schema)
    conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {vectors} (chunk_id text PRIMARY KEY, embedding {kind}({dims}) NOT NULL)",
                           kind=sql.SQL(kind), dims=sql.Literal(int(dims))))
    conn.execute(statement(schema, "ALTER TABLE {vectors} ALTER COLUMN embedding SET STORAGE PLAIN"))
    conn.execute(statement(schema, "TRUNCATE {vectors}"))
    conn.execute(statement(schema, "INSERT INTO {vectors} SELECT chunk_id, embedding FROM {chunks} WHERE embedding IS NOT NULL"))
    _mirror(conn, schema, "vectors", "embedding")
    conn.execute(statement(schema, "ANALYZE {vectors}"))


# the chunks an exact scan of the halfvec copy returns, with their float32 embeddings (for _recall)
_HALF_SEARCH = """SELECT c.embedding FROM (SELECT chunk_id FROM {vectors} ORDER BY embedding <=> %(q)s, chunk_id LIMIT %(k)s) AS top
                  JOIN {chunks} c USING (chunk_id)"""


def _exact_copy_checked(conn: psycopg.Connection, schema: str, choice: VectorIndex, embedder: Embedder | None,
                        sample: int, truth: tuple | None = None) -> VectorIndex:
    """Make the exact scan's copy: in halfvec when the scan of it keeps ``HALF_RECALL`` recall@10 against
    float32 exact search on the recall check's queries (``truth``: their ``_exact_truth`` on this table
    when the caller has it), else in float32; ``choice`` with the reason told."""
    if embedder is None:
        exact_copy(conn, schema)
        return choice
    exact_copy(conn, schema, half=True)
    with conn.transaction():  # the truth's server-side cursor needs one
        if truth is None:
            truth = _exact_truth(conn, schema, embedder, sample, 10)
        recall = 1.0 if truth is None else _recall(conn, statement(schema, _HALF_SEARCH), truth, 10, HalfVector)
    if recall >= HALF_RECALL:
        return replace(choice, reason=f"{choice.reason}; its copy holds halfvec (recall@10 {recall:.3f} against float32 exact "
                                      f"search, target {HALF_RECALL})")
    exact_copy(conn, schema)
    return replace(choice, reason=f"{choice.reason}; its copy holds float32 (halfvec's recall@10 {recall:.3f} is below {HALF_RECALL})")


def drop_exact_copy(conn: psycopg.Connection, schema: str) -> None:
    """Remove ``vectors`` and its triggers (a table searched through its graph, or about to be bulk loaded)."""
    if has_exact_copy(conn, schema):
        _unmirror(conn, schema, "vectors")
        conn.execute(statement(schema, "DROP TABLE {vectors}"))


def has_exact_copy(conn: psycopg.Connection, schema: str) -> bool:
    """True when ``schema`` holds the exact scan's ``vectors`` table."""
    return exists(conn, schema, "vectors")


def exact_copy_type(conn: psycopg.Connection, schema: str) -> str | None:
    """The vector type the exact scan's copy holds (``vector`` or ``halfvec``), None without a copy."""
    column = _embedding_column(conn, schema, "vectors")
    return column[0] if column else None


def _has_graph(conn: psycopg.Connection, schema: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = %s AND indexname = 'chunks_embedding_hnsw')",
                        (schema,)).fetchone()[0]


def _probe(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, ef_search: int) -> tuple[float, int]:
    """``vector_recall`` at ``ef_search`` of a graph over ``PROBE_ROWS`` rows of the table (by hash of
    chunk_id), built in a temporary table ``pg_temp.chunks`` that is dropped afterwards."""
    probe = "pg_temp"
    conn.execute(statement(probe, "DROP TABLE IF EXISTS {chunks}"))
    conn.execute(sql.SQL("CREATE TEMP TABLE chunks AS SELECT chunk_id, text, embedding FROM {} ORDER BY hashtext(chunk_id), chunk_id LIMIT {}")
                 .format(sql.Identifier(schema, "chunks"), sql.Literal(PROBE_ROWS)))
    conn.execute(statement(probe, _HNSW))
    conn.execute(statement(probe, "ANALYZE {chunks}"))
    try:
        return vector_recall(conn, probe, embedder, sample=sample, ef_search=ef_search)
    finally:
        conn.execute(statement(probe, "DROP TABLE {chunks}"))


def _record(conn: psycopg.Connection, schema: str, choice: VectorIndex, phases: dict[str, float] | None = None,
            embedder: Embedder | None = None, sample: int = RECALL_SAMPLE, truth: tuple | None = None) -> VectorIndex:
    """Record ``choice``; for an exact scan, make its narrow copy first (in halfvec when ``embedder``'s
    queries show it keeps ``HALF_RECALL``, ``_exact_copy_checked``; without an embedder, in float32)."""
    if choice.kind == "exact":
        mark = time.perf_counter()
        choice = _exact_copy_checked(conn, schema, choice, embedder, sample, truth)
        if phases is not None:
            phases["exact_copy"] = time.perf_counter() - mark
    (log.info if choice.kind == "hnsw" else log.warning)("%s: %s", schema, choice.reason)
    if choice.kind != "exact":
        drop_exact_copy(conn, schema)
    conn.execute(statement(schema, "DELETE FROM {vector_index}"))
    conn.execute(statement(schema, "INSERT INTO {vector_index} (kind, recall, sample, ef_search, reason) VALUES (%s, %s, %s, %s, %s)"),
                 (choice.kind, choice.recall, choice.sample, choice.ef_search, choice.reason))
    return choice
