"""Vector search, full-text search and reciprocal rank fusion (seed stage 03).

Contract: every search reads one partition's ``schema`` and returns ``Hit(chunk_id, score,
rank)`` with ranks from 1; none raises on user query text, and a query without words returns
``[]``. ``rrf`` fuses ranked lists by ``sum(weight / (k + rank))`` with ties broken by chunk_id
and keeps each item's rank per list. ``search`` is the first stage of ``pipeline.run``: both
lists, fused, cut at ``params.k``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np
import psycopg
from psycopg import pq

from retrieval_assets.bm25 import as_hits, bm25_search
from retrieval_assets.embed import Embedder
from retrieval_assets.params import DEFAULT, EF_SEARCH_MAX, RetrievalParams, limit_query
from retrieval_assets.tables import statement
from retrieval_assets.tsquery import parse_query
from retrieval_assets.types import Hit, Ranked


def _transaction(conn: psycopg.Connection):
    """A transaction for SET LOCAL-style settings: the caller's when one is open (no savepoint), else a new one."""
    return contextlib.nullcontext() if conn.info.transaction_status != pq.TransactionStatus.IDLE else conn.transaction()


def vector_search(conn: psycopg.Connection, schema: str, vector: np.ndarray, n: int = DEFAULT.n, *,
                  ef_search: int | None = DEFAULT.ef_search) -> list[Hit]:
    """Top ``n`` chunks by cosine distance to ``vector``, scored ``1 - distance``; [] for the zero vector.

    The HNSW candidate list is ``ef_search`` (default ``n``; at least pgvector's default 40, at
    most 1000): raise it above ``n`` to trade latency for recall (benchmarks/results/scale.md).
    """
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be at least 1, got {ef_search}")
    if n < 1 or not np.any(vector):
        return []
    with _transaction(conn):
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(max(ef_search or n, 40), EF_SEARCH_MAX)),))
        if n > EF_SEARCH_MAX:  # pgvector 0.8: keep scanning the graph until n rows pass
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
            conn.execute("SELECT set_config('hnsw.max_scan_tuples', %s, true)", (str(max(20_000, 4 * n)),))
        rows = conn.execute(
            statement(schema, "SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(n)s"),
            {"q": np.asarray(vector, dtype=np.float32), "n": n},
        ).fetchall()
    return as_hits(rows)


def text_search(conn: psycopg.Connection, schema: str, query: str, n: int = DEFAULT.n) -> list[Hit]:
    """Top ``n`` chunks matching any positive term and no negated term, by ts_rank_cd(tsv, q, 32)."""
    positive, negative = parse_query(conn, query)
    if positive is None or n < 1:
        return []
    rows = conn.execute(
        statement(schema, """SELECT chunk_id, ts_rank_cd(tsv, q, 32) AS score
           FROM {chunks}, CAST(%(pos)s AS tsquery) AS q
           WHERE tsv @@ q AND (%(neg)s::tsquery IS NULL OR NOT tsv @@ %(neg)s::tsquery)
           ORDER BY score DESC, chunk_id
           LIMIT %(n)s"""),
        {"pos": positive, "neg": negative, "n": n},
    ).fetchall()
    return as_hits(rows)


LEXICAL = {"ts_rank_cd": text_search, "bm25": bm25_search}  # the keys are params.LEXICAL


def lexical_search(conn: psycopg.Connection, schema: str, query: str, n: int = DEFAULT.n, lexical: str = DEFAULT.lexical) -> list[Hit]:
    """The lexical list by name: ``ts_rank_cd`` (the seed's, the default) or ``bm25``."""
    try:
        search_fn = LEXICAL[lexical]
    except KeyError:
        raise ValueError(f"unknown lexical ranking '{lexical}' (known: {', '.join(LEXICAL)})") from None
    return search_fn(conn, schema, query, n)


def rrf(lists: Sequence[Sequence[Hit]], k: int = DEFAULT.rrf_k, weights: Sequence[float] | None = None) -> list[Ranked]:
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


def first_stage(conn: psycopg.Connection, schema: str, vector: np.ndarray, query: str,
                params: RetrievalParams = DEFAULT) -> tuple[list[Hit], list[Hit]]:
    """The vector and lexical top ``params.n`` of one query (``vector``: the query's embedding)."""
    return (vector_search(conn, schema, vector, params.n, ef_search=params.ef_search),
            lexical_search(conn, schema, query, params.n, params.lexical))


def search(conn: psycopg.Connection, schema: str, embedder: Embedder, query: str, params: RetrievalParams = DEFAULT) -> list[Ranked]:
    """Fuse the vector and lexical top ``params.n`` (RRF, ``params.weights``) and return the first ``params.k``
    (the query cut to ``params.limit_query``)."""
    query = limit_query(query)
    lists = first_stage(conn, schema, embedder.embed([query])[0], query, params)
    return rrf(lists, params.rrf_k, params.weights)[: params.k]
