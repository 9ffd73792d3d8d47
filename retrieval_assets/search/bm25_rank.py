"""BM25 ranking inside Postgres, over the postings and statistics ``index.bm25`` keeps.

Contract: ``bm25_search`` returns exact top-n ``Hit`` lists of one partition's ``schema`` and never
raises on query text; ``weighted_search`` does the same for lexemes with weights (each term's
contribution times its weight), and ``send_expand`` / ``expanded_search`` search a query expanded
by RM3 pseudo-relevance feedback from a first search's top chunks. ``send_bm25`` and
``send_query`` are ``bm25_search`` in two steps, for ``hybrid.first_stage``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import psycopg

from retrieval_assets.index.tables import statement
from retrieval_assets.search import snapshot
from retrieval_assets.search.tsquery import LEXEMES, PARSED, clean
from retrieval_assets.types import Hit, ScoredList, as_hits


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


def bm25_search(conn: psycopg.Connection, schema: str, query: str, n: int = 50, *, k1: float = 1.2, b: float = 0.75) -> list[Hit]:
    """Top ``n`` chunks of ``schema`` by BM25 over corpus-level statistics, ties by chunk_id.

    Query terms are the distinct lexemes of the positive terms of ``parse_query`` (phrases count
    as their words); negated terms exclude as in ``ts_rank.text_search``. Lucene's BM25, as bm25s
    computes it: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` times
    ``tf / (tf + k1 (1 - b + b L / avgL))`` (the classic ``k1 + 1`` numerator only scales every
    score). Only chunks holding a term are read.

    Exact top-n with max-score pruning: a term adds less than its idf to any chunk, so once the
    chunks holding the rarest terms (the lead) are scored in full, a chunk holding none of them
    scores below the idf sum of the other terms; when the n-th lead score reaches that bound the
    answer is final, without reading the long postings of frequent terms. Otherwise the lead
    grows, and when lookups would cost more than reading every posting, every posting is read.
    The statements read one snapshot (``snapshot.search``): a sync committing meanwhile is not half seen.
    """
    with snapshot.search(conn):
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
    with snapshot.search(conn):  # the statistics and the postings of one state
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


def _top(conn: psycopg.Connection, schema: str, query: dict, n: int, k1: float, b: float) -> ScoredList:
    """The top ``n`` for ``_terms``'s ``query``: the lead or every posting (see ``bm25_search``), with its ``ceiling``:
    the score of a chunk of average length holding each term once, the (weighted) idf sum over 1 + k1."""
    terms, idfs, dfs = query["terms"], np.array(query["idfs"]), query["dfs"]
    ceiling = float(idfs.sum()) / (1.0 + k1)
    params = {"terms": terms, "idfs": query["idfs"], "neg": query["neg"], "n": n, "k1": float(k1), "b": float(b),
              "avgdl": query["avgdl"]}
    bound_rest = np.concatenate([np.cumsum(idfs[::-1])[::-1][1:], [0.0]])  # idf sum of the terms after each lead
    lead = int(np.searchsorted(np.cumsum(dfs), n)) + 1  # enough postings for n candidates, if they were distinct
    while lead < len(terms) and np.sum(dfs[:lead]) * len(terms) * LOOKUP_COST < np.sum(dfs):
        found = conn.execute(statement(schema, _LEAD), {**params, "lead": terms[:lead]}).fetchall()
        if len(found) == n and found[-1][1] >= bound_rest[lead - 1]:
            return ScoredList(as_hits(found), ceiling)
        # the n-th score only grows with the lead: skip to the first lead whose bound it reaches
        reached = int(np.argmax(bound_rest <= found[-1][1])) + 1 if len(found) == n else 0
        lead = max(lead + 1, reached)
    return ScoredList(as_hits(conn.execute(statement(schema, _ALL), params).fetchall()), ceiling)


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
    """``bm25_search``, then RM3 feedback from its top ``docs`` chunks (``send_expand``), in one snapshot; [] when
    the first search finds nothing."""
    with snapshot.search(conn):
        hits, found = send_query(conn, schema, query, n, k1=k1, b=b)()
        if found is None or not hits or docs < 1:
            return hits
        return send_expand(conn, schema, found, hits[:docs], n, terms_kept=terms, weight=weight, k1=k1, b=b)()
