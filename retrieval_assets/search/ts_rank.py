"""The ``ts_rank_cd`` list (the seed's lexical list), summed or bounded from the BM25 postings.

Contract: ``text_search`` returns the top n chunks of one partition's ``schema`` that match any
positive term of the query and no negated term, by ``ts_rank_cd(tsv, q, 32)``, as ``Hit``s ranked
from 1, ties by chunk_id; it never raises on user query text, and a query without words returns
``[]``. ``plain_words`` says which queries are scored from the postings alone; ``_send_text``
executes the one statement and returns the function that reads it, for ``hybrid.first_stage``.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from retrieval_assets.index import lexeme_rule
from retrieval_assets.index.tables import statement
from retrieval_assets.params import DEFAULT
from retrieval_assets.search.tsquery import PARSED, clean, lexemes_of
from retrieval_assets.types import Hit, as_hits


# ts_rank_cd of the positive terms, negated terms excluded, the query parsed in the same statement
# (the casts in a CTE of their own: made once, not for every row); over the narrow ``fulltext`` copy
# (store.create), whose rows hold only the tsv: at 100k chunks p50 / p95 10-11 / 71-84 ms against
# 22-25 / 220-244 ms reading the chunk rows (a bitmap heap scan of every matching row).
# A query of plain words (no phrase, negation, weight or prefix in its websearch_to_tsquery: ``plain``) is
# scored from the BM25 postings instead, without reading a tsv, its lexemes read off that tsquery. The
# store's tsv carries no weights, so every position weighs 0.1 (D); with the words ORed each matched
# position is a cover of its own (one lexeme satisfies the query), so ts_rank_cd(tsv, q, 32) = W / (W + 1)
# with W = 0.1 x the chunk's positions of the query's lexemes = 0.1 x the sum of their tf. Postgres adds
# the weight cover by cover in double precision, which rounds to the same float4 as
# ``tf * 0.1::float4::float8`` for every count up to 70,000 (a count is at most the tsv's positions).
# Fixture p50 0.63 against 1.19 ms (benchmarks/guards/bench_search.py), 100k chunks 0.61 to 0.64x
# (benchmarks/guards/bench_text.py --scale).
# Other queries (phrases, from hyphenated words too, and negations) are bounded by the same postings:
# each cover adds at most 0.1 and begins at a distinct position of a lexeme that can begin one (a plain
# term, or a phrase's first word: PARSED's ``starts``), so W <= 0.1 x ``c``, those lexemes' tf summed.
# ts_rank_cd itself runs on the chunks of the n highest ``c`` only (``cand``); when the n-th exact score
# beats every other chunk's bound (``settled``), that is the list, else every matching chunk is ranked.
# Worth it where matches outnumber n by ``_SPREAD``: Cranfield's phrase queries 0.31x p50 and 0.20x p95 at
# n = 100, 80-word passages of the fixture 0.31x and 0.90x at n = 50 (benchmarks/guards/bench_text.py). The
# lists are the same at any spread; 0 to 8 gave Cranfield the same speed, and on 430 chunks 4 cost least.
# test_hybrid checks every branch against ts_rank_cd itself.
_SPREAD = 4


def _tf_sums(lexemes: str, where: str = "") -> str:
    """SQL for rows (cid, tf): each chunk's tf summed over ``lexemes`` (SQL for rows ``term``), from the postings."""
    return (f"SELECT x.cid, sum(x.tf) AS tf FROM ({lexemes}) s JOIN {{postings}} po ON po.term = s.term, "
            f"unnest(po.cids, po.tfs) AS x(cid, tf) {where} GROUP BY x.cid")


_PLAIN = "t !~ '[<!]' AND t !~ ''':'"  # of a query's websearch_to_tsquery text t: no phrase, negation, weight or prefix
_TEXT = f"""WITH w AS MATERIALIZED (SELECT {lexeme_rule.tsquery('%(query)s')}::text AS t),
         kind AS MATERIALIZED (SELECT {_PLAIN} AS plain, t !~ ''':' AS bounded FROM w),
         {PARSED},
         p AS MATERIALIZED (SELECT pos::tsquery AS q, neg::tsquery AS nq FROM parsed WHERE pos IS NOT NULL),
         c AS MATERIALIZED ({_tf_sums(lexemes_of("parsed", "parsed.starts"))}),
         cut AS MATERIALIZED (SELECT min(tf) AS m FROM (SELECT tf FROM c ORDER BY tf DESC LIMIT %(n)s) top),
         cand AS MATERIALIZED (SELECT cl.chunk_id, ts_rank_cd(f.tsv, p.q, 32) AS score
                               FROM c, cut, p, {{chunk_lengths}} cl, {{fulltext}} f
                               WHERE c.tf >= cut.m AND cl.cid = c.cid AND f.chunk_id = cl.chunk_id
                                 AND f.tsv @@ p.q AND (p.nq IS NULL OR NOT f.tsv @@ p.nq)
                               ORDER BY score DESC, cl.chunk_id LIMIT %(n)s),
         settled AS MATERIALIZED (
             SELECT (SELECT bounded FROM kind) AND (SELECT count(*) FROM c) > %(spread)s * %(n)s
                    AND (e.mx IS NULL OR ((SELECT count(*) FROM cand) = %(n)s
                                          AND (SELECT min(score) FROM cand) >= 0.1 * e.mx / (0.1 * e.mx + 1) + 1e-6)) AS ok
             FROM (SELECT max(c.tf) AS mx FROM c, cut WHERE c.tf < cut.m) e)
    (SELECT cl.chunk_id, (c.tf * 0.1::float4::float8 / (c.tf * 0.1::float4::float8 + 1))::float4 AS score
     FROM ({_tf_sums(lexemes_of("w", "w.t"), "WHERE (SELECT plain FROM kind)")}) c
     JOIN {{chunk_lengths}} cl ON cl.cid = c.cid
     ORDER BY score DESC, cl.chunk_id LIMIT %(n)s)
    UNION ALL
    (SELECT chunk_id, score FROM cand WHERE NOT (SELECT plain FROM kind) AND (SELECT ok FROM settled))
    UNION ALL
    (SELECT chunk_id, ts_rank_cd(tsv, p.q, 32) AS score
     FROM p, {{fulltext}}
     WHERE NOT (SELECT plain FROM kind) AND NOT (SELECT ok FROM settled) AND tsv @@ p.q AND (p.nq IS NULL OR NOT tsv @@ p.nq)
     ORDER BY score DESC, chunk_id
     LIMIT %(n)s)"""


def _send_text(conn: psycopg.Connection, schema: str, query: str, n: int) -> Callable[[], list[Hit]]:
    """Execute ``text_search``'s one statement; the function that reads its hits."""
    if n < 1:
        return list
    cursor = conn.execute(statement(schema, _TEXT), {"query": clean(query), "n": n, "spread": _SPREAD})
    return lambda: as_hits(cursor.fetchall())


def plain_words(conn: psycopg.Connection, query: str) -> bool:
    """Whether ``text_search`` scores ``query`` from the postings alone (plain words: no phrase or negation)."""
    return conn.execute(f"SELECT {_PLAIN} FROM CAST({lexeme_rule.tsquery('%s')} AS text) AS t", (clean(query),)).fetchone()[0]


def text_search(conn: psycopg.Connection, schema: str, query: str, n: int = DEFAULT.n) -> list[Hit]:
    """Top ``n`` chunks matching any positive term and no negated term, by ts_rank_cd(tsv, q, 32).

    The terms are ``tsquery.parse_query``'s, parsed inside the search statement (one round trip);
    plain words are scored from the BM25 postings, and phrases and negations ranked among the chunks
    those bound highest when that settles the list (the same float4 values, ``_TEXT``)."""
    return _send_text(conn, schema, query, n)()
