"""BM25 inside Postgres: the postings beside ``chunks``, their writes, and ``bm25_search``.

Contract: ``create`` makes ``chunk_lengths`` (one row per chunk), ``chunk_terms`` (one posting
per (lexeme, chunk) with its term frequency and the chunk's length), ``term_df`` (document
frequency per lexeme) and ``bm25_stats`` (N and total length, kept by statement triggers on
``chunk_lengths``) in a partition's schema, backfilling a table that predates them. Lexemes come
from the ``tsv`` column, so stemming and stop words match full-text search, and a chunk's length
is its number of indexed tokens. ``store`` keeps them exact by calling ``add_terms`` after it
writes chunks and ``drop_terms`` before it changes or deletes them (postings are found through
the old tsv). ``bm25_search`` returns exact top-n ``Hit`` lists and never raises on query text.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import psycopg
from psycopg import sql

from retrieval_assets.tables import statement
from retrieval_assets.tsquery import LEXEMES, PARSED, clean
from retrieval_assets.types import Hit


def _missing(conn: psycopg.Connection, schema: str, table: str) -> bool:
    """True when ``schema`` has no table ``table``."""
    return conn.execute(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s)", (schema, table)
    ).fetchone()[0]


def _create_triggers(conn: psycopg.Connection, schema: str) -> None:
    """Statement triggers on ``chunk_lengths`` that keep ``bm25_stats`` (N, total length) current."""
    for op, rows, sign in (("INSERT", "NEW", "+"), ("DELETE", "OLD", "-")):
        fn = sql.Identifier(schema, f"bm25_stats_{op.lower()}")
        conn.execute(statement(
            schema,
            """CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                 UPDATE {bm25_stats} SET n = n {sign} (SELECT count(*) FROM changed),
                                         total_len = total_len {sign} (SELECT coalesce(sum(len), 0) FROM changed);
                 RETURN NULL;
               END $$""",
            fn=fn, sign=sql.SQL(sign)))
        conn.execute(statement(
            schema,
            """CREATE OR REPLACE TRIGGER {name} AFTER {op} ON {chunk_lengths}
               REFERENCING {rows} TABLE AS changed FOR EACH STATEMENT EXECUTE FUNCTION {fn}()""",
            name=sql.Identifier(f"chunk_lengths_{op.lower()}"), op=sql.SQL(op), rows=sql.SQL(rows), fn=fn))


def create(conn: psycopg.Connection, schema: str) -> None:
    """The postings tables beside ``schema``'s ``chunks`` (inside the caller's transaction), backfilled if new."""
    fresh = _missing(conn, schema, "chunk_lengths")
    conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {bm25_stats} (one bool PRIMARY KEY DEFAULT true CHECK (one), n bigint, total_len bigint)"))
    conn.execute(statement(schema, "INSERT INTO {bm25_stats} VALUES (true, 0, 0) ON CONFLICT DO NOTHING"))
    conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {chunk_lengths} (chunk_id text PRIMARY KEY REFERENCES {chunks} ON DELETE CASCADE, len int)"))
    # byte-order ("C") keys: lexemes and ids need equality, not a language's order, and sorting
    # them for the key compares bytes instead of calling the locale. No foreign key, no chunk_id
    # index: writes go through add_terms and drop_terms.
    if _missing(conn, schema, "chunk_terms"):
        conn.execute(statement(schema, """CREATE TABLE {chunk_terms} (
                 term text COLLATE "C", chunk_id text COLLATE "C", tf int, len int,
                 CONSTRAINT chunk_terms_pkey PRIMARY KEY (term, chunk_id))"""))
        # queries filter on term only (chunk_id with it, through the key): ANALYZE needs no other
        # column statistics, which shortens it on every sync
        conn.execute(statement(schema, """ALTER TABLE {chunk_terms} ALTER COLUMN chunk_id SET STATISTICS 0,
                        ALTER COLUMN tf SET STATISTICS 0, ALTER COLUMN len SET STATISTICS 0"""))
    no_df = _missing(conn, schema, "term_df")
    conn.execute(statement(schema, 'CREATE TABLE IF NOT EXISTS {term_df} (term text COLLATE "C" PRIMARY KEY, df int NOT NULL)'))
    if no_df and not fresh:
        _count_terms(conn, schema)
        conn.execute(statement(schema, "ANALYZE {term_df}"))
    _create_triggers(conn, schema)
    if fresh:  # postings of every chunk, written unindexed and then indexed (the bulk way)
        conn.execute(statement(schema, "DELETE FROM {chunk_terms}"))
        unkey_terms(conn, schema)
        write_terms(conn, schema, None)
        index_terms(conn, schema)
        analyze(conn, schema, chunks=False)


def analyze(conn: psycopg.Connection, schema: str, *, chunks: bool = True) -> None:
    """Fresh planner statistics for the postings (and ``chunks``): plans stay stable after writes."""
    conn.execute(statement(schema, ("ANALYZE {chunks}, " if chunks else "ANALYZE ") + "{chunk_terms}, {chunk_lengths}, {bm25_stats}, {term_df}"))


# A chunk's length: its indexed tokens, counted from the tsv's positions. A tsvector keeps at most
# 255 positions per lexeme and none past 16383, so for a chunk that reaches either cap the
# positions undercount; its length is then counted token by token with ts_debug (same parser and
# dictionaries), which is exact for any size and only paid by such chunks.
_LENGTHS = """INSERT INTO {chunk_lengths} (chunk_id, len)
              SELECT c.chunk_id, CASE WHEN s.capped
                  THEN (SELECT coalesce(sum(cardinality(d.lexemes)), 0) FROM ts_debug('english', c.text) d)
                  ELSE s.len END
              FROM {chunks} c, LATERAL (
                  SELECT coalesce(sum(cardinality(l.positions)), 0) AS len,
                         coalesce(bool_or(cardinality(l.positions) >= 255 OR l.positions[cardinality(l.positions)] >= 16383), false) AS capped
                  FROM unnest(c.tsv) AS l) s"""
_POSTINGS = """SELECT l.lexeme, c.chunk_id, cardinality(l.positions), cl.len
               FROM {chunks} c JOIN {chunk_lengths} cl USING (chunk_id), unnest(c.tsv) AS l"""
_BY_ID = " WHERE c.chunk_id = ANY(%(ids)s)"
_KEY_ORDER = ' ORDER BY l.lexeme COLLATE "C", c.chunk_id COLLATE "C"'


def add_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str]) -> None:
    """Write the length, postings and document frequencies of ``chunk_ids`` (already in ``chunks``).

    Postings go in key order; ``term_df`` rows are upserted in term order (writers lock them alike).
    The first postings of a table are written without the key, which is then built once (with the
    ANALYZE after it, this took the statistics' share of a fresh fixture sync from +60% to about
    +30%, benchmarks/guards/bench_bm25.py).
    """
    if not chunk_ids:
        return
    if conn.execute(statement(schema, "SELECT NOT EXISTS (SELECT 1 FROM {chunk_terms})")).fetchone()[0]:
        unkey_terms(conn, schema)
        write_terms(conn, schema, chunk_ids)
        index_terms(conn, schema)
        return
    params = {"ids": chunk_ids}
    conn.execute(statement(schema, _LENGTHS + _BY_ID), params)
    conn.execute(statement(schema, f"""WITH added AS (
              INSERT INTO {{chunk_terms}} (term, chunk_id, tf, len)
              {_POSTINGS}{_BY_ID}{_KEY_ORDER}
              RETURNING term)
            INSERT INTO {{term_df}} AS d (term, df)
            SELECT term, count(*) FROM added GROUP BY term ORDER BY term
            ON CONFLICT (term) DO UPDATE SET df = d.df + EXCLUDED.df"""), params)


def unkey_terms(conn: psycopg.Connection, schema: str) -> None:
    """Bulk step, on empty postings: drop their key (and any stale document frequencies)."""
    conn.execute(statement(schema, "DELETE FROM {term_df}"))
    conn.execute(statement(schema, "ALTER TABLE {chunk_terms} DROP CONSTRAINT chunk_terms_pkey"))


def write_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str] | None) -> None:
    """Bulk step: lengths and postings of ``chunk_ids`` (every chunk when None) while
    ``chunk_terms`` has no key; ``index_terms`` finishes. Each call's postings are stored in
    term order, so a term's postings lie in one run per call, not on a page per chunk (at 100k
    chunks of independent words, BM25 p50 was 39.7 ms with postings in chunk order, 12.0 ms after,
    benchmarks/guards/scale.py --topics 0)."""
    where, params = ("", {}) if chunk_ids is None else (_BY_ID, {"ids": chunk_ids})
    conn.execute(statement(schema, _LENGTHS + where), params)
    conn.execute(statement(schema, f"INSERT INTO {{chunk_terms}} (term, chunk_id, tf, len) {_POSTINGS}{where}{_KEY_ORDER}"), params)


def index_terms(conn: psycopg.Connection, schema: str) -> None:
    """Bulk step: the postings key, built once, and the document frequencies counted from it."""
    conn.execute(statement(schema, "ALTER TABLE {chunk_terms} ADD CONSTRAINT chunk_terms_pkey PRIMARY KEY (term, chunk_id)"))
    _count_terms(conn, schema)


def _count_terms(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(statement(schema, "INSERT INTO {term_df} SELECT term, count(*) FROM {chunk_terms} GROUP BY term"))


def drop_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str]) -> None:
    """Remove the length, postings and document frequencies of ``chunk_ids``, found through their
    current tsv (primary-key deletes); terms left in no chunk leave ``term_df``."""
    if not chunk_ids:
        return
    cursor = conn.execute(statement(schema, """WITH removed AS (
             DELETE FROM {chunk_terms} t
             USING (SELECT c.chunk_id, l.lexeme FROM {chunks} c, unnest(c.tsv) AS l WHERE c.chunk_id = ANY(%(ids)s)) old
             WHERE t.term = old.lexeme AND t.chunk_id = old.chunk_id
             RETURNING t.term),
           counted AS (SELECT term, count(*) AS n FROM removed GROUP BY term ORDER BY term)
         UPDATE {term_df} d SET df = d.df - counted.n FROM counted WHERE d.term = counted.term
         RETURNING d.term, d.df"""), {"ids": chunk_ids})
    gone = [term for term, df in cursor if df == 0]
    if gone:  # a second statement: a WITH query cannot delete rows its own UPDATE changed
        conn.execute(statement(schema, "DELETE FROM {term_df} WHERE term = ANY(%s) AND df = 0"), (gone,))
    conn.execute(statement(schema, "DELETE FROM {chunk_lengths} WHERE chunk_id = ANY(%s)"), (chunk_ids,))


# --- search ------------------------------------------------------------------------------------

_TERM_SCORE = "q.idf * t.tf / (t.tf + %(k1)s * (1 - %(b)s + %(b)s * t.len / %(avgdl)s))"
_NOT_NEGATED = "(%(neg)s::tsquery IS NULL OR NOT EXISTS (SELECT 1 FROM {{chunks}} c WHERE c.chunk_id = {id} AND c.tsv @@ %(neg)s::tsquery))"
_QUERY_TERMS = "q AS (SELECT * FROM unnest(%(terms)s::text[], %(idfs)s::float8[]) AS q(term, idf))"

# every posting of every query term, summed per chunk
_ALL = f"""
    WITH {_QUERY_TERMS}
    SELECT t.chunk_id, sum({_TERM_SCORE}) AS score
    FROM {{chunk_terms}} t JOIN q USING (term)
    WHERE {_NOT_NEGATED.format(id="t.chunk_id")}
    GROUP BY t.chunk_id
    ORDER BY score DESC, t.chunk_id
    LIMIT %(n)s"""

# the chunks holding a lead term, each scored over every query term by primary-key lookups
_LEAD = f"""
    WITH {_QUERY_TERMS},
         cand AS MATERIALIZED (SELECT DISTINCT chunk_id FROM {{chunk_terms}} WHERE term = ANY(%(lead)s))
    SELECT cand.chunk_id, s.score
    FROM cand CROSS JOIN LATERAL (
        SELECT sum({_TERM_SCORE}) AS score FROM {{chunk_terms}} t JOIN q USING (term)
        WHERE t.chunk_id = cand.chunk_id AND t.term = ANY(%(terms)s)) s
    WHERE {_NOT_NEGATED.format(id="cand.chunk_id")}
    ORDER BY s.score DESC, cand.chunk_id
    LIMIT %(n)s"""

# the query parsed (tsquery.PARSED) and its terms' document frequencies, rarest first, with the
# corpus size and mean length on every row (no rows: no positive term is in the corpus)
_STATS = f"""
    WITH {PARSED},
         terms AS ({LEXEMES})
    SELECT p.neg, s.n::float8, greatest(s.total_len, 1)::float8 / greatest(s.n, 1), d.term, d.df
    FROM parsed p, {{bm25_stats}} s JOIN {{term_df}} d ON d.term = ANY(ARRAY(SELECT term FROM terms)) AND d.df > 0
    ORDER BY d.df, d.term"""

# A primary-key lookup costs as much as reading this many postings in a term's scan: bench_bm25.py
# measured 12.5 (fixture) and 49 (100k chunks); its sweep at 100k gave BM25 p50 7.7 / 5.3 / 5.7 / 5.9 ms
# for 4 / 12 / 25 / 50.
LOOKUP_COST = 12


def as_hits(rows) -> list[Hit]:
    """``(chunk_id, score)`` rows, best first, as ranked ``Hit``s (ranks from 1)."""
    return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(rows, 1)]


def bm25_search(conn: psycopg.Connection, schema: str, query: str, n: int = 50, *, k1: float = 1.2, b: float = 0.75) -> list[Hit]:
    """Top ``n`` chunks of ``schema`` by BM25 over corpus-level statistics, ties by chunk_id.

    Query terms are the distinct lexemes of the positive terms of ``parse_query`` (phrases count
    as their words); negated terms exclude as in ``hybrid.text_search``. Lucene's BM25, as bm25s
    computes it: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` times
    ``tf / (tf + k1 (1 - b + b L / avgL))`` (the classic ``k1 + 1`` numerator only scales every
    score). Only chunks holding a term are read.

    Exact top-n with max-score pruning: a term adds less than its idf to any chunk, so once the
    chunks holding the rarest terms (the lead) are scored in full, a chunk holding none of them
    scores below the idf sum of the other terms; when the n-th lead score reaches that bound the
    answer is final, without reading the long postings of frequent terms. Otherwise the lead
    grows, and when lookups would cost more than reading every posting, every posting is read.
    """
    return send_bm25(conn, schema, query, n, k1=k1, b=b)()


def send_bm25(conn: psycopg.Connection, schema: str, query: str, n: int = 50, *, k1: float = 1.2,
              b: float = 0.75) -> Callable[[], list[Hit]]:
    """``bm25_search`` in two steps: send its first statement (the query parsed, the corpus size
    and the query terms' document frequencies), and return the function that reads it and runs
    the rest. In pipeline mode the first statement waits for the caller's sync."""
    if n < 1:
        return list
    cursor = conn.execute(statement(schema, _STATS), {"query": clean(query)})
    return lambda: _finish(conn, schema, cursor.fetchall(), n, k1, b)


def _finish(conn: psycopg.Connection, schema: str, rows: list, n: int, k1: float, b: float) -> list[Hit]:
    """The top ``n`` from ``_STATS``'s rows: idfs, then the lead or every posting (see ``bm25_search``)."""
    if not rows:
        return []
    negative, total, avgdl = rows[0][0], rows[0][1], rows[0][2]
    terms = [r[3] for r in rows]  # rarest first
    dfs = np.array([r[4] for r in rows], dtype=np.float64)
    idfs = np.log1p((total - dfs + 0.5) / (dfs + 0.5))
    params = {"terms": terms, "idfs": idfs.tolist(), "neg": negative, "n": n, "k1": float(k1), "b": float(b), "avgdl": avgdl}
    bound_rest = np.concatenate([np.cumsum(idfs[::-1])[::-1][1:], [0.0]])  # idf sum of the terms after each lead
    lead = int(np.searchsorted(np.cumsum(dfs), n)) + 1  # enough postings for n candidates, if they were distinct
    while lead < len(terms) and np.sum(dfs[:lead]) * len(terms) * LOOKUP_COST < np.sum(dfs):
        found = conn.execute(statement(schema, _LEAD), {**params, "lead": terms[:lead]}).fetchall()
        if len(found) == n and found[-1][1] >= bound_rest[lead - 1]:
            return as_hits(found)
        # the n-th score only grows with the lead: skip to the first lead whose bound it reaches
        reached = int(np.argmax(bound_rest <= found[-1][1])) + 1 if len(found) == n else 0
        lead = max(lead + 1, reached)
    return as_hits(conn.execute(statement(schema, _ALL), params).fetchall())
