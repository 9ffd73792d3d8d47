"""BM25 inside Postgres: the postings beside ``chunks``, their writes, and ``bm25_search``.

Contract: ``create`` makes ``chunk_lengths`` (one row per chunk: its length and its chunk number
``cid``), ``postings`` (per lexeme, blocks of at most ``BLOCK`` postings: chunk numbers, term
frequencies and chunk lengths as arrays), ``term_df`` (document frequency per lexeme) and
``bm25_stats`` (N and total length, kept by statement triggers on ``chunk_lengths``) in a
partition's schema, backfilling a table that predates them. Lexemes come from the ``tsv`` column,
so stemming and stop words match full-text search, and a chunk's length is its number of indexed
tokens. ``store`` keeps them exact by calling ``add_terms`` after it writes chunks and
``drop_terms`` before it changes or deletes them (postings are found through the old tsv).
``bm25_search`` returns exact top-n ``Hit`` lists and never raises on query text;
``weighted_search`` does the same for lexemes with weights (each term's contribution times its
weight), and ``send_expand`` / ``expanded_search`` search a query expanded by RM3
pseudo-relevance feedback from a first search's top chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import psycopg
from psycopg import sql

from retrieval_assets.index.tables import exists, statement
from retrieval_assets.search.tsquery import LEXEMES, PARSED, clean
from retrieval_assets.types import Hit


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
                  THEN (SELECT coalesce(sum(cardinality(d.lexemes)), 0) FROM ts_debug('english', c.text) d)
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


# --- search ------------------------------------------------------------------------------------

_TERM_SCORE = "q.idf * u.tf / (u.tf + %(k1)s * (1 - %(b)s + %(b)s * u.len / %(avgdl)s))"
_QUERY_TERMS = "q AS (SELECT * FROM unnest(%(terms)s::text[], %(idfs)s::float8[]) AS q(term, idf))"
# the chunks a negated term excludes (through the GIN index; none, unread, when nothing is negated)
_NEGATED = """neg AS MATERIALIZED (SELECT cl.cid FROM {fulltext} c JOIN {chunk_lengths} cl USING (chunk_id)
                  WHERE %(neg)s::tsquery IS NOT NULL AND c.tsv @@ %(neg)s::tsquery)"""
# the top n of ``scored`` (cid, score) with every chunk tied at the n-th score, then named and
# cut at n with ties broken by chunk_id (chunk numbers follow insertion, not ids)
_TOP = """, top AS (SELECT cid, score FROM scored ORDER BY score DESC FETCH FIRST %(n)s ROWS WITH TIES)
    SELECT cl.chunk_id, top.score FROM top JOIN {chunk_lengths} cl USING (cid)
    ORDER BY top.score DESC, cl.chunk_id
    LIMIT %(n)s"""

# every posting of every query term, summed per chunk
_ALL = f"""
    WITH {_QUERY_TERMS}, {_NEGATED},
         scored AS (SELECT u.cid, sum({_TERM_SCORE}) AS score
                    FROM {{postings}} p JOIN q USING (term), unnest(p.cids, p.tfs, p.lens) AS u(cid, tf, len)
                    WHERE u.cid NOT IN (SELECT cid FROM neg)
                    GROUP BY u.cid){_TOP}"""

# the chunks holding a lead term, each scored over every query term by one block lookup per term
# (the block with the greatest first cid at or below the chunk's)
_LEAD = f"""
    WITH {_QUERY_TERMS}, {_NEGATED},
         cand AS MATERIALIZED (SELECT DISTINCT u.cid FROM {{postings}} p, unnest(p.cids) AS u(cid)
                               WHERE p.term = ANY(%(lead)s) AND u.cid NOT IN (SELECT cid FROM neg)),
         scored AS (SELECT cand.cid, s.score FROM cand CROSS JOIN LATERAL (
             SELECT sum({_TERM_SCORE}) AS score
             FROM q CROSS JOIN LATERAL (
                 SELECT b.tfs[i.at] AS tf, b.lens[i.at] AS len
                 FROM (SELECT cids, tfs, lens FROM {{postings}} x WHERE x.term = q.term AND x.first_cid <= cand.cid
                       ORDER BY x.first_cid DESC LIMIT 1) b,
                      LATERAL (SELECT array_position(b.cids, cand.cid) AS at) i) u) s){_TOP}"""

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
    read = send_query(conn, schema, query, n, k1=k1, b=b)
    return lambda: read()[0]


def send_query(conn: psycopg.Connection, schema: str, query: str, n: int = 50, *, k1: float = 1.2,
               b: float = 0.75) -> Callable[[], tuple[list[Hit], dict | None]]:
    """``send_bm25`` whose read also returns the query's terms as searched (None without any),
    which ``send_expand`` takes."""
    if n < 1:
        return lambda: ([], None)
    cursor = conn.execute(statement(schema, _STATS), {"query": clean(query)})

    def read() -> tuple[list[Hit], dict | None]:
        terms = _terms(cursor.fetchall())
        return ([], None) if terms is None else (_top(conn, schema, terms, n, k1, b), terms)
    return read


def weighted_search(conn: psycopg.Connection, schema: str, terms: Mapping[str, float], n: int = 50, *,
                    k1: float = 1.2, b: float = 0.75) -> list[Hit]:
    """Top ``n`` chunks of ``schema`` for weighted lexemes: each term's BM25 contribution (as in
    ``bm25_search``) times its weight, ties by chunk_id; exact, with the same max-score pruning
    (a term's bound is its weight times its idf). ``terms``: lexemes as the ``tsv`` column holds
    them, to weights >= 0 (a zero weight drops the term). All weights 1: ``bm25_search``'s list
    for a query of those lexemes, score for score."""
    weights = {str(t): w for t, w in terms.items()}
    bad = {t: w for t, w in weights.items()
           if isinstance(w, bool) or not isinstance(w, (int, float, np.floating)) or not np.isfinite(w) or w < 0}
    if bad:
        raise ValueError(f"weighted_search: term weights must be finite numbers >= 0, got {bad!r}")
    kept = sorted(t for t, w in weights.items() if w > 0)
    if n < 1 or not kept:
        return []
    rows = conn.execute(statement(schema, _TERM_STATS), {"terms": kept}).fetchall()
    query = _terms([(None, *r) for r in rows], weights)
    return [] if query is None else _top(conn, schema, query, n, k1, b)


# the corpus size and mean length, and the document frequencies of the lexemes %(terms)s, rarest first
_TERM_STATS = """SELECT s.n::float8, greatest(s.total_len, 1)::float8 / greatest(s.n, 1), d.term, d.df
    FROM {bm25_stats} s JOIN {term_df} d ON d.term = ANY(%(terms)s::text[]) AND d.df > 0
    ORDER BY d.df, d.term"""


def _terms(rows: list, weights: Mapping[str, float] | None = None) -> dict | None:
    """A query's terms from ``_STATS``-shaped rows (negated part, N, mean length, term, df; rarest
    first): the statement parameters of ``_LEAD`` and ``_ALL`` plus ``dfs``; None without terms.
    With ``weights`` (term -> weight), each term's idf is multiplied by its weight."""
    if not rows:
        return None
    negative, total, avgdl = rows[0][0], rows[0][1], rows[0][2]
    terms = [r[3] for r in rows]  # rarest first
    dfs = np.array([r[4] for r in rows], dtype=np.float64)
    idfs = np.log1p((total - dfs + 0.5) / (dfs + 0.5))
    plain = idfs
    if weights is not None:
        idfs = idfs * np.array([float(weights[t]) for t in terms])
    return {"terms": terms, "idfs": idfs.tolist(), "plain": plain.tolist(), "dfs": dfs, "neg": negative, "total": total,
            "avgdl": avgdl}


def _top(conn: psycopg.Connection, schema: str, query: dict, n: int, k1: float, b: float) -> list[Hit]:
    """The top ``n`` for ``_terms``'s ``query``: the lead or every posting (see ``bm25_search``)."""
    terms, idfs, dfs = query["terms"], np.array(query["idfs"]), query["dfs"]
    params = {"terms": terms, "idfs": query["idfs"], "neg": query["neg"], "n": n, "k1": float(k1), "b": float(b),
              "avgdl": query["avgdl"]}
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


# RM3 (Lavrenko and Croft's relevance model, interpolated with the query as in Abdul-Jaleel et
# al., UMass at TREC 2004), estimated from the feedback chunks' own term frequencies (their tsv,
# from the narrow ``fulltext`` copy, as the postings were) and searched at once, in one statement:
#   P(w|D) = tf(w, D) / |D|, each feedback chunk D weighted by its first-search score over their sum;
#   P(w|R) = sum over D of weight(D) P(w|D), its top %(m)s terms kept and renormalised;
#   weight(t) = (1 - lam) [t in the query] + lam |Q| P(t|R)   (|Q| P(t|Q) = 1 for a query term, so
#   lam = 0 is the first search), each weight multiplying its term's BM25 contribution.
# Query terms bring their idfs (as the first search computed them); an expansion term's is computed here.
_EXPAND = f"""
    WITH fb AS MATERIALIZED (SELECT f.chunk_id, f.score / sum(f.score) OVER () AS w
                             FROM unnest(%(fb)s::text[], %(fb_scores)s::float8[]) AS f(chunk_id, score)),
         rel AS MATERIALIZED (SELECT l.lexeme AS term,
                                     sum(fb.w * cardinality(l.positions)::float8 / greatest(cl.len, 1)) AS p
                              FROM fb JOIN {{fulltext}} c USING (chunk_id) JOIN {{chunk_lengths}} cl USING (chunk_id),
                                   unnest(c.tsv) AS l
                              GROUP BY l.lexeme ORDER BY p DESC, l.lexeme COLLATE "C" LIMIT %(m)s),
         model AS (SELECT term, o.idf, (1 - %(lam)s::float8) * (o.term IS NOT NULL)::int
                                       + %(lam)s::float8 * %(nq)s * coalesce(r.p / (SELECT sum(p) FROM rel), 0) AS weight
                   FROM unnest(%(terms)s::text[], %(plain)s::float8[]) AS o(term, idf) FULL JOIN rel r USING (term)),
         q AS (SELECT m.term, m.weight * coalesce(m.idf, ln(1 + (%(total)s::float8 - d.df + 0.5) / (d.df + 0.5))) AS idf
               FROM model m JOIN {{term_df}} d ON d.term = m.term COLLATE "C" AND d.df > 0
               WHERE m.weight > 0),
         {_NEGATED},
         scored AS (SELECT u.cid, sum({_TERM_SCORE}) AS score
                    FROM {{postings}} p JOIN q USING (term), unnest(p.cids, p.tfs, p.lens) AS u(cid, tf, len)
                    WHERE u.cid NOT IN (SELECT cid FROM neg)
                    GROUP BY u.cid){_TOP}"""


def send_expand(conn: psycopg.Connection, schema: str, query: dict, feedback: list[Hit], n: int, *, terms_kept: int = 10,
                weight: float = 0.5, k1: float = 1.2, b: float = 0.75) -> Callable[[], list[Hit]]:
    """RM3 pseudo-relevance feedback: send the search for the top ``n`` of ``query`` (``send_query``'s
    terms) expanded by the ``terms_kept`` terms most probable in the relevance model of the
    ``feedback`` chunks (a first search's top), interpolated with weight ``weight`` (``_EXPAND``);
    the function that reads its hits. One statement; every posting of the expanded query's terms
    is read (no pruning), and negated terms exclude as in the first search."""
    if n < 1 or not feedback:
        return list
    params = {"fb": [h.chunk_id for h in feedback], "fb_scores": [h.score for h in feedback], "m": int(terms_kept),
              "lam": float(weight), "nq": len(query["terms"]), "terms": query["terms"], "plain": query["plain"],
              "total": query["total"], "neg": query["neg"], "n": n, "k1": float(k1), "b": float(b), "avgdl": query["avgdl"]}
    cursor = conn.execute(statement(schema, _EXPAND), params)
    return lambda: as_hits(cursor.fetchall())


def expanded_search(conn: psycopg.Connection, schema: str, query: str, n: int = 50, *, docs: int = 10, terms: int = 10,
                    weight: float = 0.5, k1: float = 1.2, b: float = 0.75) -> list[Hit]:
    """``bm25_search``, then RM3 feedback from its top ``docs`` chunks (``send_expand``); [] when the
    first search finds nothing."""
    hits, found = send_query(conn, schema, query, n, k1=k1, b=b)()
    if found is None or not hits or docs < 1:
        return hits
    return send_expand(conn, schema, found, hits[:docs], n, terms_kept=terms, weight=weight, k1=k1, b=b)()
