"""Vector search, full-text search and reciprocal rank fusion (seed stage 03).

Contract: every search returns ``Hit(chunk_id, score, rank)`` with ranks from 1 and never
raises on user query text; a query without words returns ``[]``. ``rrf`` fuses ranked lists by
``sum(1 / (k + rank))`` with ties broken by chunk_id and keeps each item's rank per list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import psycopg

from retrieval_assets.embed import Embedder
from retrieval_assets.types import Hit, Ranked

EF_SEARCH_MAX = 1000  # pgvector's upper bound for hnsw.ef_search


def _clean(query: str) -> str:
    """Postgres text cannot hold NUL; everything else is passed through as a parameter."""
    return query.replace("\x00", " ")


def vector_search(conn: psycopg.Connection, embedder: Embedder, query: str, n: int = 50, *, ef_search: int | None = None) -> list[Hit]:
    """Top ``n`` chunks by cosine distance, scored ``1 - distance``.

    The HNSW candidate list is ``ef_search`` (default ``n``; at least pgvector's default 40, at
    most 1000): raise it above ``n`` to trade latency for recall (benchmarks/results/scale.md).
    """
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be at least 1, got {ef_search}")
    vector = embedder.embed([query])[0]
    if n < 1 or not np.any(vector):
        return []
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(max(ef_search or n, 40), EF_SEARCH_MAX)),))
        if n > EF_SEARCH_MAX:  # pgvector 0.8: keep scanning the graph until n rows pass
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            conn.execute("SELECT set_config('hnsw.max_scan_tuples', %s, true)", (str(max(20_000, 4 * n)),))
        rows = conn.execute(
            "SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM chunks ORDER BY embedding <=> %(q)s LIMIT %(n)s",
            {"q": vector, "n": n},
        ).fetchall()
    return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(rows, 1)]


def _split_top_level(tsquery: str) -> list[str]:
    """Split the text form of a tsquery at the ``&`` and ``|`` outside quotes and parentheses."""
    parts, depth, quoted, current = [], 0, False, []
    i = 0
    while i < len(tsquery):
        ch = tsquery[i]
        if quoted:
            current.append(ch)
            if ch == "'":
                if tsquery[i + 1 : i + 2] == "'":  # a doubled quote inside a lexeme
                    current.append("'")
                    i += 1
                else:
                    quoted = False
        elif ch == "'":
            quoted = True
            current.append(ch)
        elif ch in "()":
            depth += 1 if ch == "(" else -1
            current.append(ch)
        elif ch in "&|" and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def parse_query(conn: psycopg.Connection, query: str) -> tuple[str | None, str | None]:
    """(positive terms ORed, negated terms ORed) as tsquery text, from websearch_to_tsquery."""
    text = conn.execute("SELECT websearch_to_tsquery('english', %s)::text", (_clean(query),)).fetchone()[0]
    positive, negative = [], []
    for term in _split_top_level(text):
        if term.startswith("!"):
            negative.append(term[1:].strip())
        else:
            positive.append(term)
    join = lambda terms: " | ".join(f"( {t} )" for t in terms) or None  # noqa: E731
    return join(positive), join(negative)


def text_search(conn: psycopg.Connection, query: str, n: int = 50) -> list[Hit]:
    """Top ``n`` chunks matching any positive term and no negated term, by ts_rank_cd(tsv, q, 32)."""
    positive, negative = parse_query(conn, query)
    if positive is None or n < 1:
        return []
    rows = conn.execute(
        """SELECT chunk_id, ts_rank_cd(tsv, q, 32) AS score
           FROM chunks, CAST(%(pos)s AS tsquery) AS q
           WHERE tsv @@ q AND (%(neg)s::tsquery IS NULL OR NOT tsv @@ %(neg)s::tsquery)
           ORDER BY score DESC, chunk_id
           LIMIT %(n)s""",
        {"pos": positive, "neg": negative, "n": n},
    ).fetchall()
    return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(rows, 1)]


_LEXEME = re.compile(r"'((?:[^']|'')*)'")


_BM25_TERM = "q.idf * t.tf / (t.tf + %(k1)s * (1 - %(b)s + %(b)s * t.len / %(avgdl)s))"
_NOT_NEGATED = "(%(neg)s::tsquery IS NULL OR NOT EXISTS (SELECT 1 FROM chunks c WHERE c.chunk_id = {id} AND c.tsv @@ %(neg)s::tsquery))"

_QUERY_TERMS = "q AS (SELECT * FROM unnest(%(terms)s::text[], %(idfs)s::float8[]) AS q(term, idf))"

# every posting of every query term, summed per chunk
_BM25_ALL = f"""
    WITH {_QUERY_TERMS}
    SELECT t.chunk_id, sum({_BM25_TERM}) AS score
    FROM chunk_terms t JOIN q USING (term)
    WHERE {_NOT_NEGATED.format(id="t.chunk_id")}
    GROUP BY t.chunk_id
    ORDER BY score DESC, t.chunk_id
    LIMIT %(n)s"""

# the chunks holding a lead term, each scored over every query term by primary-key lookups
_BM25_LEAD = f"""
    WITH {_QUERY_TERMS},
         cand AS MATERIALIZED (SELECT DISTINCT chunk_id FROM chunk_terms WHERE term = ANY(%(lead)s))
    SELECT cand.chunk_id, s.score
    FROM cand CROSS JOIN LATERAL (
        SELECT sum({_BM25_TERM}) AS score FROM chunk_terms t JOIN q USING (term)
        WHERE t.chunk_id = cand.chunk_id AND t.term = ANY(%(terms)s)) s
    WHERE {_NOT_NEGATED.format(id="cand.chunk_id")}
    ORDER BY s.score DESC, cand.chunk_id
    LIMIT %(n)s"""

# A primary-key lookup costs as much as reading this many postings in a term's scan: bench_bm25.py
# measured 12.5 (fixture) and 49 (100k chunks); its sweep at 100k gave BM25 p50 7.7 / 5.3 / 5.7 / 5.9 ms
# for 4 / 12 / 25 / 50.
LOOKUP_COST = 12


def bm25_search(conn: psycopg.Connection, query: str, n: int = 50, *, k1: float = 1.2, b: float = 0.75) -> list[Hit]:
    """Top ``n`` chunks by BM25 over corpus-level statistics (``store``'s postings), ties by chunk_id.

    Query terms are the distinct lexemes of the positive terms of ``parse_query`` (phrases count
    as their words); negated terms exclude as in ``text_search``. Lucene's BM25, as bm25s computes
    it: ``idf = ln(1 + (N - df + 0.5) / (df + 0.5))`` times ``tf / (tf + k1 (1 - b + b L / avgL))``
    (the classic ``k1 + 1`` numerator only scales every score). Only chunks holding a term are read.

    Exact top-n with max-score pruning: a term adds less than its idf to any chunk, so once the
    chunks holding the rarest terms (the lead) are scored in full, a chunk holding none of them
    scores below the idf sum of the other terms; when the n-th lead score reaches that bound the
    answer is final, without reading the long postings of frequent terms. Otherwise the lead
    grows, and when lookups would cost more than reading every posting, every posting is read.
    """
    positive, negative = parse_query(conn, query)
    if positive is None or n < 1:
        return []
    terms = sorted({m.replace("''", "'") for m in _LEXEME.findall(positive)})
    rows = conn.execute(
        """SELECT s.n::float8, greatest(s.total_len, 1)::float8 / greatest(s.n, 1), d.term, d.df
           FROM bm25_stats s JOIN term_df d ON d.term = ANY(%s) AND d.df > 0
           ORDER BY d.df, d.term""",
        (terms,),
    ).fetchall()
    if not rows:
        return []
    total, avgdl = rows[0][0], rows[0][1]
    terms = [r[2] for r in rows]  # rarest first
    dfs = np.array([r[3] for r in rows], dtype=np.float64)
    idfs = np.log1p((total - dfs + 0.5) / (dfs + 0.5))
    params = {"terms": terms, "idfs": idfs.tolist(), "neg": negative, "n": n, "k1": float(k1), "b": float(b), "avgdl": avgdl}
    bound_rest = np.concatenate([np.cumsum(idfs[::-1])[::-1][1:], [0.0]])  # idf sum of the terms after each lead
    lead = int(np.searchsorted(np.cumsum(dfs), n)) + 1  # enough postings for n candidates, if they were distinct
    while lead < len(terms) and np.sum(dfs[:lead]) * len(terms) * LOOKUP_COST < np.sum(dfs):
        found = conn.execute(_BM25_LEAD, {**params, "lead": terms[:lead]}).fetchall()
        if len(found) == n and found[-1][1] >= bound_rest[lead - 1]:
            return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(found, 1)]
        # the n-th score only grows with the lead: skip to the first lead whose bound it reaches
        reached = int(np.argmax(bound_rest <= found[-1][1])) + 1 if len(found) == n else 0
        lead = max(lead + 1, reached)
    found = conn.execute(_BM25_ALL, params).fetchall()
    return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(found, 1)]


LEXICAL = {"ts_rank_cd": text_search, "bm25": bm25_search}


def rrf(lists: Sequence[Sequence[Hit]], k: int = 60, weights: Sequence[float] | None = None) -> list[Ranked]:
    """Reciprocal rank fusion: score(d) = sum over lists holding d of weight / (k + rank)."""
    weights = weights or [1.0] * len(lists)
    if len(weights) != len(lists):
        raise ValueError(f"{len(weights)} weights for {len(lists)} lists")
    scores: dict[str, float] = {}
    ranks: dict[str, list[int | None]] = {}
    for i, hits in enumerate(lists):
        for hit in hits:
            scores[hit.chunk_id] = scores.get(hit.chunk_id, 0.0) + weights[i] / (k + hit.rank)
            ranks.setdefault(hit.chunk_id, [None] * len(lists))[i] = hit.rank
    order = sorted(scores, key=lambda cid: (-scores[cid], cid))
    return [Ranked(cid, scores[cid], rank, tuple(ranks[cid])) for rank, cid in enumerate(order, 1)]


def lexical_search(conn: psycopg.Connection, query: str, n: int = 50, lexical: str = "ts_rank_cd") -> list[Hit]:
    """The lexical list by name: ``ts_rank_cd`` (the seed's, the default) or ``bm25``."""
    try:
        return LEXICAL[lexical](conn, query, n)
    except KeyError:
        raise ValueError(f"unknown lexical ranking '{lexical}' (known: {', '.join(LEXICAL)})") from None


def search(
    conn: psycopg.Connection,
    embedder: Embedder,
    query: str,
    n: int = 50,
    top_k: int = 10,
    *,
    lexical: str = "ts_rank_cd",
    weights: tuple[float, float] | None = None,
    ef_search: int | None = None,
) -> list[Ranked]:
    """Fuse the vector and lexical top ``n`` (optionally weighted) and return the first ``top_k``."""
    lists = [vector_search(conn, embedder, query, n, ef_search=ef_search), lexical_search(conn, query, n, lexical)]
    return rrf(lists, weights=weights)[:top_k]
