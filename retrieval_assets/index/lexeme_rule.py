"""How Postgres reads text into lexemes: the one rule for the ``tsv`` column and every query parse.

Contract: ``parsed(expr)`` is the SQL of the text Postgres's ``english`` parser reads for the SQL
text ``expr``: Postgres reads ``lift/drag``, ``docs/setup.md`` and ``os.path`` as one file or host
token (a single lexeme, none of its words searchable), so a ``/`` or ``.`` between a word character
and a letter becomes ``-`` (a hyphenated word: the whole and each part, as ``lift-drag`` is read) and
a ``/`` before a letter elsewhere (``/etc``, ``../x``) a space; numbers (``5.8``, ``1.2.3``) are left as
they are. ``TSVECTOR`` is the ``chunks.tsv`` expression, ``tsquery(param)`` a query's parse.
``migrate`` rewrites the ``tsv`` of a chunk table made under an earlier rule (inside ``store.create``).
"""

from __future__ import annotations

import psycopg

from retrieval_assets.index.tables import exists, statement

_JOINED = "(?<=[[:alnum:]_])[/.](?=[[:alpha:]])"  # a '/' or '.' between a word character and a letter
CONFIG = "english"


def parsed(expr: str) -> str:
    """SQL: the text ``expr`` as the parser is given it (see the contract)."""
    return f"regexp_replace(regexp_replace({expr}, '{_JOINED}', '-', 'g'), '/(?=[[:alpha:]])', ' ', 'g')"


TSVECTOR = f"to_tsvector('{CONFIG}', {parsed('text')})"


def tsquery(param: str) -> str:
    """SQL: ``websearch_to_tsquery`` of the query parameter ``param`` (``%s``, ``%(query)s``) under the same rule."""
    return f"websearch_to_tsquery('{CONFIG}', {parsed(param)})"


_EXPRESSION = """SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
                 JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum AND a.attname = 'tsv'
                 WHERE d.adrelid = to_regclass(format('%%I.%%I', %s::text, 'chunks'))"""


def migrate(conn: psycopg.Connection, schema: str) -> bool:
    """Rewrite ``chunks.tsv`` of ``schema`` when its expression is not ``TSVECTOR``'s rule; True when it did.

    The column is made again (the table is rewritten), its full-text copy and BM25 postings dropped and the
    sync record cleared: ``store.create``, which calls this inside its transaction and lock, then builds the
    copy and the postings again from the new lexemes, and the next sync is a full one (nothing re-embedded).
    """
    row = conn.execute(_EXPRESSION, (schema,)).fetchone()
    if row is None or _JOINED in row[0]:
        return False
    conn.execute(statement(schema, f"ALTER TABLE {{chunks}} DROP COLUMN tsv, ADD COLUMN tsv tsvector GENERATED ALWAYS AS ({TSVECTOR}) STORED"))
    conn.execute(statement(schema, "DROP TABLE IF EXISTS {fulltext}, {postings}"))
    if exists(conn, schema, "synced"):
        conn.execute(statement(schema, "DELETE FROM {synced}"))
    return True
