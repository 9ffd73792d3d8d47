"""The vector list: the top n chunks by cosine distance to a query vector (seed stage 03).

Contract: ``vector_search`` reads one partition's ``schema`` and returns ``Hit(chunk_id, score, rank)``,
scored ``1 - distance``, ranks from 1, [] for the zero vector, by the HNSW graph or an exact scan of
the table's narrow copy. When no transaction of the caller's is open, an exact scan is split across
the connection and ``pg.partner``, and ``scan_partner`` hands that partner a whole graph search to run
beside the ``ts_rank_cd`` list (``hybrid.first_stage``). ``_one_trip`` sends a search's statements in
one round trip; ``_send_vector`` and ``_send_vector_feedback`` (the Rocchio search) execute theirs and
return the function that reads the hits, for ``hybrid.first_stage``.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import pq, sql

from retrieval_assets import pg
from retrieval_assets.index.tables import statement
from retrieval_assets.params import DEFAULT, EF_SEARCH_MAX, hnsw_ef_search
from retrieval_assets.types import Hit, as_hits


def _transaction(conn: psycopg.Connection):
    """A transaction for SET LOCAL-style settings: the caller's when one is open (no savepoint), else a new one."""
    return contextlib.nullcontext() if conn.info.transaction_status != pq.TransactionStatus.IDLE else conn.transaction()


@contextlib.contextmanager
def _one_trip(conn: psycopg.Connection):
    """The statements executed inside run in one transaction and, on a psycopg connection whose
    libpq has pipeline mode, are sent together and answered in one round trip (their cursors are
    read after the block). In autocommit with no transaction open, the statements before the
    pipeline's one Sync form one implicit transaction, so set_config(..., true) holds for the
    statements after it and ends with them, as in the ``_transaction`` it replaces; a connection
    without autocommit and no transaction open still gets BEGIN and COMMIT of their own. Inside a
    pipeline of the caller's, the statements join its current batch (a nested pipeline would sync)."""
    if not (isinstance(conn, psycopg.Connection) and psycopg.Pipeline.is_supported()):
        with _transaction(conn):
            yield
        return
    if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:  # the caller's pipeline (pipeline.timeout): join its batch
        yield
        return
    idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
    with conn.transaction() if idle and not conn.autocommit else contextlib.nullcontext(), conn.pipeline():
        yield


# an exact scan of the narrow copy (copies.exact_copy): the chunk table's distances (a halfvec copy's: within
# half precision of them), ties by chunk_id in code-point order (what a split scan's parts are merged by)
_EXACT = """SELECT chunk_id, 1 - distance FROM (
               SELECT chunk_id, embedding <=> %(q)s AS distance FROM {vectors} ORDER BY distance, chunk_id COLLATE "C" LIMIT %(n)s) AS top"""
# the same scan split across two sessions (pg.partner) at a page: each part's top n with its distances, merged
# in Python. Any boundary splits the table exactly; the one used is half the copy's pages as the last split
# measured them (the part above it reports the size), so growth only unbalances the parts until the next search.
# ``{query}``: the query vector's expression (the bound vector, or Rocchio's moved one).
_EXACT_PART = """SELECT top.chunk_id, 1 - top.distance, top.distance, size.pages
    FROM (SELECT pg_relation_size(%(copy)s::regclass) / current_setting('block_size')::int AS pages) AS size
    LEFT JOIN LATERAL (SELECT chunk_id, embedding <=> {query} AS distance FROM {vectors} WHERE ctid {side} %(boundary)s::tid
                       ORDER BY distance, chunk_id COLLATE "C" LIMIT %(n)s) AS top ON true
    ORDER BY top.distance, top.chunk_id COLLATE "C" """  # an empty part gives one row without a chunk: the size still comes
_SCANS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="partner")  # runs the partners' statements
_PAGES: weakref.WeakKeyDictionary[psycopg.Connection, dict[str, int]] = weakref.WeakKeyDictionary()  # conn -> schema -> copy's pages


def _exact_query(vector: np.ndarray, exact: bool | str):
    """The query vector as the exact scan's copy holds vectors (``exact``: True or "vector", or "halfvec"):
    bound in that type, the distance needs no cast per row."""
    vector = np.asarray(vector, dtype=np.float32)
    return HalfVector(vector) if exact == "halfvec" else vector


# the lexical lists a graph search runs beside, on the partner: ts_rank_cd's one statement is most of the first
# stage (first_stage 0.89x one session's time on the fixture, benchmarks/guards/bench_search.py; since the list is
# summed or bounded from the postings 0.86 to 1.04x there, and 0.71x on Cranfield with MiniLM,
# benchmarks/guards/bench_text.py); BM25's first trip is a short read of term statistics that the graph search rides along with (1.06x beside it)
_BESIDE = frozenset({"ts_rank_cd"})


def scan_partner(conn: psycopg.Connection, exact: bool | str, lexical: str | None = None) -> psycopg.Connection | None:
    """``pg.partner(conn)`` when part of a vector search can run on it now: half of an exact scan, or the whole
    graph search while ``conn`` runs the ``lexical`` list (``hybrid.first_stage``; one of ``_BESIDE``). Only when no
    transaction or pipeline of the caller's is open on ``conn`` (the partner sees only what is committed). A
    caller that opens its own block of search statements (``pipeline.timeout``) asks before and passes the
    answer to ``hybrid.first_stage``."""
    if not (exact or lexical in _BESIDE) or conn.info.transaction_status != pq.TransactionStatus.IDLE \
            or conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:
        return None
    return pg.partner(conn)


def _partner_part(partner: psycopg.Connection, query: sql.Composed, values: dict, timeout_ms: int,
                  settings: Callable[[psycopg.Connection], None] | None = None) -> list[tuple]:
    """The partner's statement (a split scan's part, or the whole graph search) under ``timeout_ms`` (0: none)
    as the caller's statements are, after ``settings`` (transaction-local ones); one trip."""
    with partner.pipeline():
        partner.execute("SELECT set_config('statement_timeout', %s, false)", (str(timeout_ms),))
        if settings is not None:
            settings(partner)
        cursor = partner.execute(query, values)
    return cursor.fetchall()


def _send_split(conn: psycopg.Connection, partner: psycopg.Connection, schema: str, values: dict, n: int, timeout_ms: int,
                query: str = "%(q)s") -> Callable[[], list[Hit]]:
    """Execute the lower part of the split exact scan on ``conn`` (inside ``_one_trip``) while ``partner`` scans
    the upper part in a thread (``query``: the query vector's expression, ``values`` its parameters); the
    function that merges both into the top ``n``."""
    pages = _PAGES.setdefault(conn, {})
    values = {**values, "n": n, "boundary": f"({pages.get(schema, 0) // 2},0)", "copy": sql.Identifier(schema, "vectors").as_string(conn)}
    template = _EXACT_PART.replace("{query}", query)
    upper = _SCANS.submit(_partner_part, partner, statement(schema, template, side=sql.SQL(">=")), values, timeout_ms)
    cursor = conn.execute(statement(schema, template, side=sql.SQL("<")), values)

    def read() -> list[Hit]:
        lower, above = cursor.fetchall(), upper.result()
        pages[schema] = above[0][3]
        parts = ([row for row in rows if row[0] is not None] for rows in (lower, above))
        merged = heapq.merge(*parts, key=lambda row: (row[2], row[0]))  # each part sorted by (distance, chunk_id)
        return as_hits((chunk_id, score) for chunk_id, score, _, _ in itertools.islice(merged, n))
    return read


# a graph (HNSW) search of the chunk table, the distance named once: computed once per row, not again for the score
_GRAPH = """SELECT chunk_id, 1 - distance FROM (
              SELECT chunk_id, embedding <=> %(q)s AS distance FROM {chunks} ORDER BY distance LIMIT %(n)s) AS top"""


def _send_vector(conn: psycopg.Connection, schema: str, vector: np.ndarray, n: int, ef_search: int | None, exact: bool | str = False,
                 partner: psycopg.Connection | None = None, timeout_ms: int = 0) -> Callable[[], list[Hit]]:
    """Execute ``vector_search``'s statements (inside ``_one_trip``); the function that reads its hits. With
    ``partner`` (``scan_partner``), an exact scan is split with it and a graph search runs on it whole, the
    partner's statement under ``timeout_ms``."""
    if ef_search is not None and ef_search < 1:
        raise ValueError(f"ef_search must be at least 1, got {ef_search}")
    if n < 1 or not np.any(vector):
        return list
    if exact and partner is not None:
        return _send_split(conn, partner, schema, {"q": _exact_query(vector, exact)}, n, timeout_ms)
    if exact:
        cursor = conn.execute(statement(schema, _EXACT), {"q": _exact_query(vector, exact), "n": n})
        return lambda: as_hits(cursor.fetchall())
    values = {"q": np.asarray(vector, dtype=np.float32), "n": n}
    if partner is not None:  # the whole graph search on the partner, in a thread, while conn runs the lexical list
        rows = _SCANS.submit(_partner_part, partner, statement(schema, _GRAPH), values, timeout_ms,
                             lambda session: _hnsw_settings(session, n, ef_search))
        return lambda: as_hits(rows.result())
    _hnsw_settings(conn, n, ef_search)
    cursor = conn.execute(statement(schema, _GRAPH), values)
    return lambda: as_hits(cursor.fetchall())


def _hnsw_settings(conn: psycopg.Connection, n: int, ef_search: int | None) -> None:
    """The transaction-local HNSW settings of a graph search for ``n`` rows (inside ``_one_trip``)."""
    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(hnsw_ef_search(n, ef_search)),))
    if n > EF_SEARCH_MAX:  # pgvector 0.8: keep scanning the graph until n rows pass
        conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', true)")
        conn.execute("SELECT set_config('hnsw.max_scan_tuples', %s, true)", (str(max(20_000, 4 * n)),))


def vector_search(conn: psycopg.Connection, schema: str, vector: np.ndarray, n: int = DEFAULT.n, *,
                  ef_search: int | None = DEFAULT.ef_search, exact: bool | str = False) -> list[Hit]:
    """Top ``n`` chunks by cosine distance to ``vector``, scored ``1 - distance``; [] for the zero vector.

    The HNSW candidate list is ``ef_search`` (default ``n``; at least pgvector's default 40, at
    most 1000): raise it above ``n`` to trade latency for recall (benchmarks/results/scale.md).
    The setting is transaction-local and sent with the query, in one round trip (``_one_trip``).
    ``exact``: scan the table's narrow copy of the embeddings (``copies.exact_copy``, present when
    the table was chosen to scan exactly) instead, ties broken by chunk_id; ``"halfvec"`` when the
    copy holds halfvec (``copies.exact_copy_type``). On a ``pg.connect`` connection with no transaction
    open, that scan is split by pages across it and ``pg.partner`` (same lists as one statement).
    """
    partner = scan_partner(conn, exact)
    with _one_trip(conn):
        read = _send_vector(conn, schema, vector, n, ef_search, exact, partner)
    return read()


# the vector list searched again from the query vector moved toward the feedback chunks (Rocchio):
# q + beta * mean(feedback vectors), as pgvector computes it (its cosine distance needs no normalising),
# the mean of the chunk table's float32 vectors; ``{source}``: the chunk table, searched through its
# graph, or the exact scan's narrow copy, ties by chunk_id as ``_EXACT``'s (``{cast}``: to a halfvec copy's
# type, once); the exact scan split like ``_EXACT``'s when a partner is given
_MOVED = "(SELECT (%(q)s::vector + avg(f.embedding) * %(beta)s::vector){cast} FROM {chunks} f WHERE f.chunk_id = ANY(%(fb)s))"
_VECTOR_FEEDBACK = f"""SELECT chunk_id, 1 - distance FROM (
    SELECT chunk_id, embedding <=> {_MOVED} AS distance FROM {{source}} ORDER BY distance{{ties}} LIMIT %(n)s) AS top"""


def _send_vector_feedback(conn: psycopg.Connection, schema: str, vector: np.ndarray, feedback: list[str], beta: float, n: int,
                          ef_search: int | None, exact: bool | str = False, partner: psycopg.Connection | None = None,
                          timeout_ms: int = 0) -> Callable[[], list[Hit]]:
    """Execute the Rocchio vector search's statements (inside ``_one_trip``; split with ``partner`` as
    ``_send_vector``'s); the function that reads its hits."""
    if not exact:
        _hnsw_settings(conn, n, ef_search)
    vector = np.asarray(vector, dtype=np.float32)
    values = {"q": vector, "beta": np.full(vector.shape, beta, dtype=np.float32), "fb": feedback}
    cast = "::halfvec" if exact == "halfvec" else ""
    if exact and partner is not None:
        return _send_split(conn, partner, schema, values, n, timeout_ms, _MOVED.replace("{cast}", cast))
    template = (_VECTOR_FEEDBACK.replace("{source}", "{vectors}" if exact else "{chunks}")
                .replace("{ties}", ', chunk_id COLLATE "C"' if exact else "").replace("{cast}", cast))
    cursor = conn.execute(statement(schema, template), {**values, "n": n})
    return lambda: as_hits(cursor.fetchall())
