"""The vector list: the top n chunks by cosine distance to a query vector (seed stage 03).

Contract: ``vector_search`` reads one partition's ``schema`` and returns ``Hit(chunk_id, score, rank)``,
scored ``1 - distance``, ranks from 1, [] for the zero vector, by the HNSW graph or an exact scan of
the table's narrow copy, in one snapshot (``snapshot.search``). When the search has a partner session
(``wants_partner``; ``snapshot.Search.beside``), an exact scan is split across the connection and the partner.
``_send_vector`` and ``_send_vector_feedback`` (the Rocchio search) execute their statements inside a search's
block and return the function that reads the hits, for ``hybrid.first_stage``.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections.abc import Callable

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql

from retrieval_assets.search import snapshot
from retrieval_assets.index.tables import statement
from retrieval_assets.params import DEFAULT, EF_SEARCH_MAX, hnsw_ef_search
from retrieval_assets.types import Hit, as_hits


# an exact scan of the narrow copy (copies.exact_copy): the chunk table's distances (a halfvec copy's: within
# half precision of them), ties by chunk_id in code-point order (what a split scan's parts are merged by)
_EXACT = """SELECT chunk_id, 1 - distance FROM (
               SELECT chunk_id, embedding <=> %(q)s AS distance FROM {vectors} ORDER BY distance, chunk_id COLLATE "C" LIMIT %(n)s) AS top"""
# the same scan split across two sessions (a search's partner, snapshot.Search.beside) at a page: each part's
# top n with its distances, merged in Python. Any boundary splits the table exactly; the one used is half the copy's pages as the last split
# measured them (the part above it reports the size), so growth only unbalances the parts until the next search.
# ``{query}``: the query vector's expression (the bound vector, or Rocchio's moved one).
_EXACT_PART = """SELECT top.chunk_id, 1 - top.distance, top.distance, size.pages
    FROM (SELECT pg_relation_size(%(copy)s::regclass) / current_setting('block_size')::int AS pages) AS size
    LEFT JOIN LATERAL (SELECT chunk_id, embedding <=> {query} AS distance FROM {vectors} WHERE ctid {side} %(boundary)s::tid
                       ORDER BY distance, chunk_id COLLATE "C" LIMIT %(n)s) AS top ON true
    ORDER BY top.distance, top.chunk_id COLLATE "C" """  # an empty part gives one row without a chunk: the size still comes
_PAGES: weakref.WeakKeyDictionary[psycopg.Connection, dict[str, int]] = weakref.WeakKeyDictionary()  # conn -> schema -> copy's pages


def _exact_query(vector: np.ndarray, exact: bool | str):
    """The query vector as the exact scan's copy holds vectors (``exact``: True or "vector", or "halfvec"):
    bound in that type, the distance needs no cast per row."""
    vector = np.asarray(vector, dtype=np.float32)
    return HalfVector(vector) if exact == "halfvec" else vector


def wants_partner(exact: bool | str) -> bool:
    """Whether a search borrows a partner session: to split an exact scan. (A graph search used to run on it beside
    the ts_rank_cd list; reading one snapshot, that costs the export's round trip, and it measured 1.4x the
    time of one session on the fixture, benchmarks/guards/bench_search.py, docs/scale.md.)"""
    return bool(exact)


def _on_partner(query: sql.Composed, values: dict) -> Callable[[psycopg.Connection], Callable[[], list[tuple]]]:
    """The partner's work for ``snapshot.Search.beside``: ``query`` with ``values``."""
    return lambda partner: partner.execute(query, values).fetchall


def _send_split(conn: psycopg.Connection, search: snapshot.Search, schema: str, values: dict, n: int,
                query: str = "%(q)s") -> Callable[[], list[Hit]]:
    """Execute the lower part of the split exact scan on ``conn`` while ``search``'s partner scans the upper part
    (``query``: the query vector's expression, ``values`` its parameters); the function that merges both into the
    top ``n``."""
    pages = _PAGES.setdefault(conn, {})
    values = {**values, "n": n, "boundary": f"({pages.get(schema, 0) // 2},0)", "copy": sql.Identifier(schema, "vectors").as_string(conn)}
    template = _EXACT_PART.replace("{query}", query)
    upper = search.beside(_on_partner(statement(schema, template, side=sql.SQL(">=")), values))
    cursor = conn.execute(statement(schema, template, side=sql.SQL("<")), values)

    def read() -> list[Hit]:
        lower, above = cursor.fetchall(), upper()
        pages[schema] = above[0][3]
        parts = ([row for row in rows if row[0] is not None] for rows in (lower, above))
        merged = heapq.merge(*parts, key=lambda row: (row[2], row[0]))  # each part sorted by (distance, chunk_id)
        return as_hits((chunk_id, score) for chunk_id, score, _, _ in itertools.islice(merged, n))
    return read


# a graph (HNSW) search of the chunk table, the distance named once: computed once per row, not again for the score
_GRAPH = """SELECT chunk_id, 1 - distance FROM (
              SELECT chunk_id, embedding <=> %(q)s AS distance FROM {chunks} ORDER BY distance LIMIT %(n)s) AS top"""


def _send_vector(conn: psycopg.Connection, schema: str, vector: np.ndarray, n: int, ef_search: int | None, exact: bool | str = False,
                 search: snapshot.Search | None = None) -> Callable[[], list[Hit]]:
    """Execute ``vector_search``'s statements (inside ``search``'s block); the function that reads its hits. When
    ``search`` has a partner, an exact scan is split with it."""
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be at least 1, got {ef_search}")
    if n < 1 or not np.any(vector):
        return list
    if exact and search is not None and search.partner is not None:
        return _send_split(conn, search, schema, {"q": _exact_query(vector, exact)}, n)
    if exact:
        cursor = conn.execute(statement(schema, _EXACT), {"q": _exact_query(vector, exact), "n": n})
        return lambda: as_hits(cursor.fetchall())
    _hnsw_settings(conn, n, ef_search)
    cursor = conn.execute(statement(schema, _GRAPH), {"q": np.asarray(vector, dtype=np.float32), "n": n})
    return lambda: as_hits(cursor.fetchall())


def _hnsw_settings(conn: psycopg.Connection, n: int, ef_search: int | None) -> None:
    """The transaction-local HNSW settings of a graph search for ``n`` rows (inside a search's block)."""
    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(hnsw_ef_search(n, ef_search)),))
    if n > EF_SEARCH_MAX:  # pgvector 0.8: keep scanning the graph until n rows pass
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
        conn.execute("SELECT set_config('hnsw.max_scan_tuples', %s, true)", (str(max(20_000, 4 * n)),))


def vector_search(conn: psycopg.Connection, schema: str, vector: np.ndarray, n: int = DEFAULT.n, *,
                  ef_search: int | None = DEFAULT.ef_search, exact: bool | str = False) -> list[Hit]:
    """Top ``n`` chunks by cosine distance to ``vector``, scored ``1 - distance``; [] for the zero vector.

    The HNSW candidate list is ``ef_search`` (default ``n``; at least pgvector's default 40, at
    most 1000): raise it above ``n`` to trade latency for recall (benchmarks/results/scale.md).
    The setting is transaction-local and sent with the query, in one round trip (``snapshot.search``).
    ``exact``: scan the table's narrow copy of the embeddings (``copies.exact_copy``, present when
    the table was chosen to scan exactly) instead, ties broken by chunk_id; ``"halfvec"`` when the
    copy holds halfvec (``copies.exact_copy_type``). On a ``pg.connect`` connection with no transaction
    open, that scan is split by pages across it and a partner session (same lists as one statement).
    """
    with snapshot.search(conn, partner=bool(exact)) as search:
        read = _send_vector(conn, schema, vector, n, ef_search, exact, search)
        hits = read() if search.partner is not None else None  # the partner's part is read before the snapshot ends
    return read() if hits is None else hits  # else read after the block: the statement rides with its COMMIT


# the vector list searched again from the query vector moved toward the feedback chunks (Rocchio):
# q + beta * mean(feedback vectors), as pgvector computes it (its cosine distance needs no normalising),
# the mean of the chunk table's float32 vectors; ``{source}``: the chunk table, searched through its
# graph, or the exact scan's narrow copy, ties by chunk_id as ``_EXACT``'s (``{cast}``: to a halfvec copy's
# type, once); the exact scan split like ``_EXACT``'s when a partner is given
_MOVED = "(SELECT (%(q)s::vector + avg(f.embedding) * %(beta)s::vector){cast} FROM {chunks} f WHERE f.chunk_id = ANY(%(fb)s))"
_VECTOR_FEEDBACK = f"""SELECT chunk_id, 1 - distance FROM (
    SELECT chunk_id, embedding <=> {_MOVED} AS distance FROM {{source}} ORDER BY distance{{ties}} LIMIT %(n)s) AS top"""


def _send_vector_feedback(conn: psycopg.Connection, schema: str, vector: np.ndarray, feedback: list[str], beta: float, n: int,
                          ef_search: int | None, exact: bool | str = False,
                          search: snapshot.Search | None = None) -> Callable[[], list[Hit]]:
    """Execute the Rocchio vector search's statements (inside ``search``'s block; split with its partner as
    ``_send_vector``'s); the function that reads its hits."""
    if not exact:
        _hnsw_settings(conn, n, ef_search)
    vector = np.asarray(vector, dtype=np.float32)
    values = {"q": vector, "beta": np.full(vector.shape, beta, dtype=np.float32), "fb": feedback}
    cast = "::halfvec" if exact == "halfvec" else ""
    if exact and search is not None and search.partner is not None:
        return _send_split(conn, search, schema, values, n, _MOVED.replace("{cast}", cast))
    template = (_VECTOR_FEEDBACK.replace("{source}", "{vectors}" if exact else "{chunks}")
                .replace("{ties}", ', chunk_id COLLATE "C"' if exact else "").replace("{cast}", cast))
    cursor = conn.execute(statement(schema, template), {**values, "n": n})
    return lambda: as_hits(cursor.fetchall())
