"""The narrow copies of ``chunks`` that searches scan instead of the chunk rows with their text, tsvector and vector.

Contract: ``mirror(conn, schema, copy, column)`` makes statement triggers on ``chunks`` that keep
``copy``'s (chunk_id, ``column``) rows equal to the chunks' non-NULL ones; ``unmirror`` drops them.
Two copies are kept that way: ``fulltext`` (chunk_id, tsv) always (``store.create``), which the
ts_rank_cd list and negated terms read through its GIN index, and ``vectors`` (chunk_id, embedding)
while the exact scan is the table's choice (100k hash chunks: vector search p50 44 ms against
111 ms, benchmarks/results/scale.md). ``exact_copy`` fills ``vectors`` (float32, or halfvec with
``half``) and mirrors it, ``drop_exact_copy`` removes it, ``has_exact_copy`` and
``exact_copy_type`` say whether it is there and in which type. All inside the caller's transaction.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from retrieval_assets.index.tables import embedding_column, exists, statement, table_dims

_MIRROR_UPSERT = """INSERT INTO {copy} (chunk_id, {column})
                     SELECT chunk_id, {column} FROM changed WHERE {column} IS NOT NULL
                     ON CONFLICT (chunk_id) DO UPDATE SET {column} = EXCLUDED.{column};"""
_MIRROR_BODY = {
    "insert": ("NEW", _MIRROR_UPSERT),
    "update": ("NEW", _MIRROR_UPSERT + " DELETE FROM {copy} v USING changed c WHERE v.chunk_id = c.chunk_id AND c.{column} IS NULL;"),
    "delete": ("OLD", "DELETE FROM {copy} v USING changed c WHERE v.chunk_id = c.chunk_id;"),
}


def mirror(conn: psycopg.Connection, schema: str, copy: str, column: str) -> None:
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


def unmirror(conn: psycopg.Connection, schema: str, copy: str) -> None:
    """Drop ``mirror``'s triggers for ``copy``."""
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
    mirror(conn, schema, "vectors", "embedding")
    conn.execute(statement(schema, "ANALYZE {vectors}"))


def drop_exact_copy(conn: psycopg.Connection, schema: str) -> None:
    """Remove ``vectors`` and its triggers (a table searched through its graph, or about to be bulk loaded)."""
    if has_exact_copy(conn, schema):
        unmirror(conn, schema, "vectors")
        conn.execute(statement(schema, "DROP TABLE {vectors}"))


def has_exact_copy(conn: psycopg.Connection, schema: str) -> bool:
    """True when ``schema`` holds the exact scan's ``vectors`` table."""
    return exists(conn, schema, "vectors")


def exact_copy_type(conn: psycopg.Connection, schema: str) -> str | None:
    """The vector type the exact scan's copy holds (``vector`` or ``halfvec``), None without a copy."""
    column = embedding_column(conn, schema, "vectors")
    return column[0] if column else None
