"""The BM25 postings beside ``chunks``, kept in step with it (``search.bm25_rank`` ranks with them).

Contract: ``create`` makes ``chunk_lengths`` (one row per chunk: its length and its chunk number
``cid``), ``postings`` (per lexeme, blocks of at most ``BLOCK`` postings: chunk numbers, term
frequencies and chunk lengths as arrays), ``term_df`` (document frequency per lexeme) and
``bm25_stats`` (N and total length, kept by statement triggers on ``chunk_lengths``) in a
partition's schema, backfilling a table that predates them. Lexemes come from the ``tsv`` column,
so stemming and stop words match full-text search, and a chunk's length is its number of indexed
tokens. ``store`` keeps them exact by calling ``add_terms`` after it writes chunks and
``drop_terms`` before it changes or deletes them (postings are found through the old tsv).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from retrieval_assets.index import lexeme_rule
from retrieval_assets.index.tables import exists, statement


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


# Postings per term in blocks of at most BLOCK chunks, ascending by chunk number (cid, from
# chunk_lengths), each block keyed by its first cid: three arrays (cid int4, tf int2, length int4)
# cost 10 bytes a posting instead of a ~110-byte row and key entry per (term, chunk). A term's
# blocks cover disjoint cid ranges, so the block holding a cid is the one with the greatest
# first_cid at or below it. 128 postings keep a block's row under the 2 kB at which Postgres
# would compress it into TOAST.
BLOCK = 128


def create(conn: psycopg.Connection, schema: str) -> None:
    """The postings tables beside ``schema``'s ``chunks`` (inside the caller's transaction), backfilled if new.

    A schema from before block postings (a ``chunk_terms`` table of one row per posting, lengths
    without chunk numbers) has its statistics dropped and written again from ``chunks``.
    """
    fresh = not exists(conn, schema, "postings")
    if fresh:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}, {}").format(
            sql.Identifier(schema, "chunk_terms"), sql.Identifier(schema, "chunk_lengths"), sql.Identifier(schema, "term_df")))
        conn.execute(statement(schema, "DROP TABLE IF EXISTS {bm25_stats}"))
    conn.execute(statement(schema, "CREATE TABLE IF NOT EXISTS {bm25_stats} (one bool PRIMARY KEY DEFAULT true CHECK (one), n bigint, total_len bigint)"))
    conn.execute(statement(schema, "INSERT INTO {bm25_stats} VALUES (true, 0, 0) ON CONFLICT DO NOTHING"))
    conn.execute(statement(schema, """CREATE TABLE IF NOT EXISTS {chunk_lengths} (
             chunk_id text PRIMARY KEY REFERENCES {chunks} ON DELETE CASCADE,
             cid int4 GENERATED ALWAYS AS IDENTITY UNIQUE, len int4 NOT NULL)"""))
    # byte-order ("C") keys: lexemes need equality, not a language's order, and sorting them for
    # the key compares bytes instead of calling the locale. Writes go through add_terms and drop_terms.
    if fresh:
        conn.execute(statement(schema, """CREATE TABLE {postings} (
                 term text COLLATE "C", first_cid int4, cids int4[] NOT NULL, tfs int2[] NOT NULL, lens int4[] NOT NULL,
                 CONSTRAINT postings_pkey PRIMARY KEY (term, first_cid))"""))
        # queries filter on term (first_cid with it, through the key): ANALYZE needs no other
        # column statistics, which shortens it on every sync
        conn.execute(statement(schema, """ALTER TABLE {postings} ALTER COLUMN first_cid SET STATISTICS 0,
                        ALTER COLUMN cids SET STATISTICS 0, ALTER COLUMN tfs SET STATISTICS 0, ALTER COLUMN lens SET STATISTICS 0"""))
    no_df = not exists(conn, schema, "term_df")
    conn.execute(statement(schema, 'CREATE TABLE IF NOT EXISTS {term_df} (term text COLLATE "C" PRIMARY KEY, df int NOT NULL)'))
    if no_df and not fresh:
        _count_terms(conn, schema)
        conn.execute(statement(schema, "ANALYZE {term_df}"))
    _create_triggers(conn, schema)
    if fresh:  # postings of every chunk, written unindexed and then indexed (the bulk way)
        unkey_terms(conn, schema)
        write_terms(conn, schema, None)
        index_terms(conn, schema)
        analyze(conn, schema, chunks=False)


def analyze(conn: psycopg.Connection, schema: str, *, chunks: bool = True) -> None:
    """Fresh planner statistics for the postings (and ``chunks``): plans stay stable after writes."""
    conn.execute(statement(schema, ("ANALYZE {chunks}, " if chunks else "ANALYZE ") + "{postings}, {chunk_lengths}, {bm25_stats}, {term_df}"))


# A chunk's length: its indexed tokens, counted from the tsv's positions. A tsvector keeps at most
# 255 positions per lexeme and none past 16383, so for a chunk that reaches either cap the
# positions undercount; its length is then counted token by token with ts_debug (same parser and
# dictionaries), which is exact for any size and only paid by such chunks.
_LENGTHS = """INSERT INTO {chunk_lengths} (chunk_id, len)
              SELECT c.chunk_id, CASE WHEN s.capped
                  THEN (SELECT coalesce(sum(cardinality(d.lexemes)), 0) FROM ts_debug('""" + lexeme_rule.CONFIG + "', " + lexeme_rule.parsed("c.text") + """) d)
                  ELSE s.len END
              FROM {chunks} c, LATERAL (
                  SELECT coalesce(sum(cardinality(l.positions)), 0) AS len,
                         coalesce(bool_or(cardinality(l.positions) >= 255 OR l.positions[cardinality(l.positions)] >= 16383), false) AS capped
                  FROM unnest(c.tsv) AS l) s"""
# (term, cid, tf, len) of chunks, from their tsv (a tsvector keeps at most 255 positions, so tf fits int2)
_POSTINGS = """SELECT l.lexeme AS term, cl.cid, cardinality(l.positions)::int2 AS tf, cl.len
               FROM {chunks} c JOIN {chunk_lengths} cl USING (chunk_id), unnest(c.tsv) AS l"""
_BY_ID = " WHERE c.chunk_id = ANY(%(ids)s)"
# postings rows (term, cid, tf, len; any order) grouped into blocks of {block} per term, in key order
_BLOCKS = """INSERT INTO {postings} (term, first_cid, cids, tfs, lens)
             SELECT term, min(cid), array_agg(cid ORDER BY cid), array_agg(tf ORDER BY cid), array_agg(len ORDER BY cid)
             FROM (SELECT term, cid, tf, len, (row_number() OVER (PARTITION BY term ORDER BY cid) - 1) / {block} AS k
                   FROM {rows} r) numbered
             GROUP BY term, k ORDER BY term, min(cid)"""


def _blocks(rows: str) -> str:
    """``_BLOCKS`` over the CTE or subquery ``rows``, at today's ``BLOCK``."""
    return _BLOCKS.replace("{rows}", rows).replace("{block}", str(int(BLOCK)))


def add_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str]) -> None:
    """Write the length, postings and document frequencies of ``chunk_ids`` (already in ``chunks``).

    New chunks get the highest chunk numbers, so their postings go after a term's last block:
    a last block with room is taken out and written again with them. ``term_df`` rows are
    upserted in term order (writers lock them alike). The first postings of a table are written
    without the key, which is then built once (with the ANALYZE after it, this took the
    statistics' share of a fresh fixture sync from +60% to about +30%, benchmarks/guards/bench_bm25.py).
    """
    if not chunk_ids:
        return
    if conn.execute(statement(schema, "SELECT NOT EXISTS (SELECT 1 FROM {postings})")).fetchone()[0]:
        unkey_terms(conn, schema)
        write_terms(conn, schema, chunk_ids)
        index_terms(conn, schema)
        return
    params = {"ids": chunk_ids}
    conn.execute(statement(schema, _LENGTHS + _BY_ID), params)
    conn.execute(statement(schema, f"""WITH new AS MATERIALIZED ({_POSTINGS}{_BY_ID}),
            tail AS (DELETE FROM {{postings}} p
                     USING (SELECT DISTINCT term FROM new) t CROSS JOIN LATERAL (
                         SELECT b.first_cid FROM {{postings}} b WHERE b.term = t.term ORDER BY b.first_cid DESC LIMIT 1) last
                     WHERE p.term = t.term AND p.first_cid = last.first_cid AND cardinality(p.cids) < {int(BLOCK)}
                     RETURNING p.term, p.cids, p.tfs, p.lens),
            merged AS (SELECT t.term, u.cid, u.tf, u.len FROM tail t, unnest(t.cids, t.tfs, t.lens) AS u(cid, tf, len)
                       UNION ALL SELECT term, cid, tf, len FROM new),
            written AS ({_blocks("merged")})
            INSERT INTO {{term_df}} AS d (term, df)
            SELECT term, count(*) FROM new GROUP BY term ORDER BY term
            ON CONFLICT (term) DO UPDATE SET df = d.df + EXCLUDED.df"""), params)


def unkey_terms(conn: psycopg.Connection, schema: str) -> None:
    """Bulk step, on empty postings: drop their key (and any stale document frequencies)."""
    conn.execute(statement(schema, "DELETE FROM {term_df}"))
    conn.execute(statement(schema, "ALTER TABLE {postings} DROP CONSTRAINT postings_pkey"))


def write_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str] | None) -> None:
    """Bulk step: lengths and postings of ``chunk_ids`` (every chunk when None) while
    ``postings`` has no key; ``index_terms`` finishes. Each call numbers its chunks after every
    earlier call's and writes blocks of its own, in term order, so a term's postings lie in one
    run per call (a block may end short where a call ends)."""
    where, params = ("", {}) if chunk_ids is None else (_BY_ID, {"ids": chunk_ids})
    conn.execute(statement(schema, _LENGTHS + where), params)
    conn.execute(statement(schema, _blocks(f"({_POSTINGS}{where})")), params)


def index_terms(conn: psycopg.Connection, schema: str) -> None:
    """Bulk step: the postings key, built once, and the document frequencies counted from it."""
    conn.execute(statement(schema, "ALTER TABLE {postings} ADD CONSTRAINT postings_pkey PRIMARY KEY (term, first_cid)"))
    _count_terms(conn, schema)


def _count_terms(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(statement(schema, "INSERT INTO {term_df} SELECT term, sum(cardinality(cids)) FROM {postings} GROUP BY term"))


def drop_terms(conn: psycopg.Connection, schema: str, chunk_ids: list[str]) -> None:
    """Remove the length, postings and document frequencies of ``chunk_ids``, found through their
    current tsv: each block holding one of them is written again without it, keyed by its new
    first cid (an emptied block goes; blocks are not merged, so ranges stay disjoint); terms left
    in no chunk leave ``term_df``."""
    if not chunk_ids:
        return
    cursor = conn.execute(statement(schema, """WITH old AS MATERIALIZED (
               SELECT l.lexeme AS term, cl.cid FROM {chunks} c JOIN {chunk_lengths} cl USING (chunk_id), unnest(c.tsv) AS l
               WHERE c.chunk_id = ANY(%(ids)s)),
           hit AS (SELECT DISTINCT o.term, b.first_cid FROM old o CROSS JOIN LATERAL (
               SELECT p.first_cid FROM {postings} p WHERE p.term = o.term AND p.first_cid <= o.cid
               ORDER BY p.first_cid DESC LIMIT 1) b),
           gone AS (DELETE FROM {postings} p USING hit h WHERE p.term = h.term AND p.first_cid = h.first_cid
                    RETURNING p.term, p.first_cid, p.cids, p.tfs, p.lens),
           written AS (INSERT INTO {postings} (term, first_cid, cids, tfs, lens)
                    SELECT g.term, min(u.cid), array_agg(u.cid ORDER BY u.cid), array_agg(u.tf ORDER BY u.cid), array_agg(u.len ORDER BY u.cid)
                    FROM gone g, unnest(g.cids, g.tfs, g.lens) AS u(cid, tf, len)
                    WHERE NOT EXISTS (SELECT 1 FROM old o WHERE o.term = g.term AND o.cid = u.cid)
                    GROUP BY g.term, g.first_cid ORDER BY g.term, min(u.cid)),
           counted AS (SELECT term, count(*) AS n FROM old GROUP BY term ORDER BY term)
         UPDATE {term_df} d SET df = d.df - counted.n FROM counted WHERE d.term = counted.term
         RETURNING d.term, d.df"""), {"ids": chunk_ids})
    gone = [term for term, df in cursor if df == 0]
    if gone:  # a second statement: a WITH query cannot delete rows its own UPDATE changed
        conn.execute(statement(schema, "DELETE FROM {term_df} WHERE term = ANY(%s) AND df = 0"), (gone,))
    conn.execute(statement(schema, "DELETE FROM {chunk_lengths} WHERE chunk_id = ANY(%s)"), (chunk_ids,))
