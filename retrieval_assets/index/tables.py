"""The tables of a partition's schema and the columns of ``chunks``: one owner for both.

Contract: ``CHUNK_COLUMNS`` lists the stored columns of a ``types.Chunk`` with their Postgres
types, in field order; every statement names its tables through ``statement(schema, ...)``,
which qualifies each ``{table}`` placeholder with the schema (``sql.Identifier(schema, name)``),
so nothing is ever resolved through the search_path. Chunks go in through ``copy_chunks`` (one
binary COPY) and come out through ``chunk_of``; ``exists``, ``embedding_column`` and
``table_dims`` read the catalogue (False or None where the table is missing), ``count`` the rows
of ``chunks``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import psycopg
from psycopg import sql

from retrieval_assets.types import Chunk

_PG_TYPES = {"str": "text", "int": "int4"}  # Chunk's annotations (strings under postponed evaluation)

# Postgres type of each Chunk field, in field order.
CHUNK_COLUMNS: dict[str, str] = {f.name: _PG_TYPES[str(f.type)] for f in fields(Chunk)}

# Every table a partition's schema holds: the chunks and the BM25 statistics kept beside them;
# vector_index: the one row saying which vector search the table got after its last bulk load (vector_index.choose_vector_index);
# vectors: (chunk_id, embedding) alone, in float32 or halfvec, kept by triggers on chunks while that choice is an exact scan (copies.exact_copy);
# synced: the fingerprint of the chunks the last sync made the table equal to, with the oids of the tables it wrote
#   (repair.record), cleared by any later write (store.sync);
# fulltext: (chunk_id, tsv) of every chunk with the GIN index, kept by triggers on chunks, what full-text matching reads.
# splade: (chunk_id, md5 of its text, SPLADE sparsevec) of the learned sparse list, written by search.sparse.sync.
TABLES = ("chunks", "chunk_lengths", "postings", "term_df", "bm25_stats", "vector_index", "vectors", "synced", "fulltext", "splade")


def column_list(*extra: str, prefix: str = "") -> sql.Composed:
    """``chunk_id, doc_id, ...`` (the Chunk columns, then ``extra``), each column ``prefix.``-qualified."""
    names = [*CHUNK_COLUMNS, *extra]
    return sql.SQL(", ").join(sql.Identifier(prefix, n) if prefix else sql.Identifier(n) for n in names)


def statement(schema: str, template: str, **extra: sql.Composable) -> sql.Composed:
    """``template`` with ``{chunks}``, ``{postings}``, ... qualified by ``schema``, and ``extra`` filled in."""
    return sql.SQL(template).format(**{t: sql.Identifier(schema, t) for t in TABLES}, **extra)


def exists(conn: psycopg.Connection, schema: str, table: str) -> bool:
    """True when ``schema`` holds the table ``table`` (one of ``TABLES``)."""
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]


def chunk_of(row: dict) -> Chunk:
    """A ``Chunk`` from a row read with ``psycopg.rows.dict_row``, field by field."""
    return Chunk(**{name: row[name] for name in CHUNK_COLUMNS})


def copy_chunks(conn: psycopg.Connection, table: sql.Identifier, chunks: Sequence[Chunk], vectors) -> None:
    """Binary COPY of chunks with their vectors (``vectors[i]`` belongs to ``chunks[i]``, None for NULL)."""
    query = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT BINARY)").format(table, column_list("embedding"))
    with conn.cursor().copy(query) as copy:
        copy.set_types([*CHUNK_COLUMNS.values(), "vector"])
        for c, v in zip(chunks, vectors):
            copy.write_row((*(getattr(c, name) for name in CHUNK_COLUMNS), v))


def embedding_column(conn: psycopg.Connection, schema: str, table: str) -> tuple[str, int] | None:
    """(type name, dimension) of ``schema.table.embedding``, or None without that table."""
    return conn.execute(
        """SELECT format_type(a.atttypid, NULL), a.atttypmod FROM pg_attribute a
           JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace s ON s.oid = c.relnamespace
           WHERE s.nspname = %s AND c.relname = %s AND a.attname = 'embedding' AND NOT a.attisdropped""",
        (schema, table),
    ).fetchone()


def table_dims(conn: psycopg.Connection, schema: str) -> int | None:
    """The dimension of ``schema.chunks.embedding``, or None without a table."""
    column = embedding_column(conn, schema, "chunks")
    return column[1] if column else None


def count(conn: psycopg.Connection, schema: str) -> int:
    """Rows of ``schema.chunks``."""
    return conn.execute(statement(schema, "SELECT count(*) FROM {chunks}")).fetchone()[0]
