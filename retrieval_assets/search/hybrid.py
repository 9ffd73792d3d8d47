"""Vector search, full-text search and reciprocal rank fusion (seed stage 03).

Contract: every search reads one partition's ``schema`` and returns ``Hit(chunk_id, score,
rank)`` with ranks from 1; none raises on user query text, and a query without words returns
``[]``. ``rrf`` fuses ranked lists by ``sum(weight / (k + rank))``; ``convex`` by a weighted
sum of each list's scores normalised over the list (min-max or z-score); ``fuse`` picks one by
``params.fusion``. Fused lists break ties by chunk_id and keep each item's rank per list.
``search`` is the first stage of ``pipeline.run``: both lists, fused, cut at ``params.k``.
When no transaction of the caller's is open, an exact scan of a table's narrow copy is split across
the connection and ``pg.partner``, and ``first_stage`` runs a graph search on the partner beside the
``ts_rank_cd`` list, with the lists of one session.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import pq, sql

from retrieval_assets import pg

from retrieval_assets.index import bm25
from retrieval_assets.index.bm25 import as_hits, bm25_search, send_bm25
from retrieval_assets.index.embed import Embedder
from retrieval_assets.params import DEFAULT, EF_SEARCH_MAX, RetrievalParams, hnsw_ef_search, limit_query
from retrieval_assets.index.tables import statement
from retrieval_assets.search.tsquery import PARSED, clean, lexemes_of
from retrieval_assets.types import Hit, Ranked


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
    graph search while ``conn`` runs the ``lexical`` list (``first_stage``; one of ``_BESIDE``). Only when no
    transaction or pipeline of the caller's is open on ``conn`` (the partner sees only what is committed). A
    caller that opens its own block of search statements (``pipeline.timeout``) asks before and passes the
    answer to ``first_stage``."""
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
_TEXT = f"""WITH w AS MATERIALIZED (SELECT websearch_to_tsquery('english', %(query)s)::text AS t),
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
    return conn.execute(f"SELECT {_PLAIN} FROM CAST(websearch_to_tsquery('english', %s) AS text) AS t", (clean(query),)).fetchone()[0]


def text_search(conn: psycopg.Connection, schema: str, query: str, n: int = DEFAULT.n) -> list[Hit]:
    """Top ``n`` chunks matching any positive term and no negated term, by ts_rank_cd(tsv, q, 32).

    The terms are ``tsquery.parse_query``'s, parsed inside the search statement (one round trip);
    plain words are scored from the BM25 postings, and phrases and negations ranked among the chunks
    those bound highest when that settles the list (the same float4 values, ``_TEXT``)."""
    return _send_text(conn, schema, query, n)()


LEXICAL = {"ts_rank_cd": text_search, "bm25": bm25_search}  # the keys are params.LEXICAL
_SEND_LEXICAL = {"ts_rank_cd": _send_text, "bm25": send_bm25}  # the same lists, sent and read in two steps


def _lexical(table: dict, lexical: str):
    """``table``'s entry for the lexical list ``lexical``; ValueError naming the known ones."""
    try:
        return table[lexical]
    except KeyError:
        raise ValueError(f"unknown lexical ranking '{lexical}' (known: {', '.join(LEXICAL)})") from None


def lexical_search(conn: psycopg.Connection, schema: str, query: str, n: int = DEFAULT.n, lexical: str = DEFAULT.lexical) -> list[Hit]:
    """The lexical list by name: ``bm25`` (the default's) or ``ts_rank_cd`` (the seed's)."""
    return _lexical(LEXICAL, lexical)(conn, schema, query, n)


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


def normalise(scores: np.ndarray, method: str) -> np.ndarray:
    """``scores`` mapped to [0, 1] by min-max, or to standard scores by z-score; a constant list maps to 1 (min-max) or 0."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    if method == "minmax":
        spread = scores.max() - scores.min()
        return (scores - scores.min()) / spread if spread > 0 else np.ones_like(scores)
    if method == "zscore":
        std = scores.std()
        return (scores - scores.mean()) / std if std > 0 else np.zeros_like(scores)
    raise ValueError(f"unknown normalisation '{method}' (known: minmax, zscore)")


def convex(lists: Sequence[Sequence[Hit]], method: str = "minmax", weights: Sequence[float] | None = None) -> list[Ranked]:
    """Convex combination: score(d) = sum over lists of weight * normalised score, where a list that lacks
    d contributes its lowest normalised score (0 for min-max): absent counts as worst seen (Bruch et al., TOIS 2023)."""
    weights = weights or [1.0] * len(lists)
    if len(weights) != len(lists):
        raise ValueError(f"{len(weights)} weights for {len(lists)} lists")
    ids = sorted({h.chunk_id for hits in lists for h in hits})
    position = {cid: i for i, cid in enumerate(ids)}
    total = np.zeros(len(ids))
    ranks = np.zeros((len(ids), len(lists)), dtype=np.int64)  # 0: not in that list
    for j, hits in enumerate(lists):
        if not hits:
            continue
        norm = normalise([h.score for h in hits], method)
        column = np.full(len(ids), norm.min())
        rows = np.fromiter((position[h.chunk_id] for h in hits), dtype=np.int64, count=len(hits))
        column[rows] = norm
        ranks[rows, j] = [h.rank for h in hits]
        total += weights[j] * column
    order = np.lexsort((np.arange(len(ids)), -total))  # ids are sorted: ties by chunk_id
    return [Ranked(ids[i], float(total[i]), rank, tuple(int(r) or None for r in ranks[i])) for rank, i in enumerate(order, 1)]


def fuse(lists: Sequence[Sequence[Hit]], params: RetrievalParams = DEFAULT) -> list[Ranked]:
    """The first-stage lists fused by ``params.fusion`` with ``params.weights`` (``rrf`` with ``params.rrf_k``)."""
    if params.fusion == "rrf":
        return rrf(lists, params.rrf_k, params.weights)
    return convex(lists, params.fusion, params.weights)


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


AUTO = object()  # first_stage's partner: scan_partner(conn, exact, params.lexical) when the call starts


def first_stage(conn: psycopg.Connection, schema: str, vector: np.ndarray, query: str,
                params: RetrievalParams = DEFAULT, *, exact: bool | str = False, partner=AUTO) -> tuple[list[Hit], list[Hit]]:
    """The vector and lexical top ``params.n`` of one query (``vector``: the query's embedding).

    Both lists' statements go in one round trip (``_one_trip``): the ef_search setting, the vector
    query and the lexical statement, which parses the query itself. ``ts_rank_cd`` needs no more;
    ``bm25``'s first statement reads the terms' statistics, and its postings take a second trip
    (or more, when max-score pruning widens its lead). Same lists as ``vector_search`` and
    ``lexical_search`` called one after the other (``exact``: as ``vector_search``'s). ``partner``: the
    session that takes half of an exact scan, or the whole graph search while ``conn`` runs the lexical list
    (``_BESIDE``); None for everything on ``conn``, ``AUTO`` to ask ``scan_partner``; its statement runs
    under ``params.statement_timeout_ms``.

    Pseudo-relevance feedback (``params.prf_docs``) costs one trip more, for both of its kinds: the
    BM25 list searched again with RM3's expanded query (``bm25.send_expand``, fed back from its own
    top ``prf_docs``), and the vector list searched again from the query vector moved toward the
    mean vector of the first lists' fused top ``prf_docs`` (Rocchio, ``params.prf_beta``)."""
    send_lexical = _lexical(_SEND_LEXICAL, params.lexical)
    expand = params.bm25_feedback  # RetrievalParams allows it with the bm25 list only
    partner = scan_partner(conn, exact, params.lexical) if partner is AUTO else partner
    with _one_trip(conn):
        read_vector = _send_vector(conn, schema, vector, params.n, params.ef_search, exact, partner, params.statement_timeout_ms)
        read_lexical = bm25.send_query(conn, schema, query, params.n) if expand else send_lexical(conn, schema, query, params.n)
    vector_hits = read_vector()
    lexical_hits, terms = read_lexical() if expand else (read_lexical(), None)
    moved = params.vector_feedback and vector_hits
    if not (moved or (terms is not None and lexical_hits)):
        return vector_hits, lexical_hits
    with _one_trip(conn):
        if moved:
            top = [r.chunk_id for r in fuse([vector_hits, lexical_hits], params)[: params.prf_docs]]
            read_moved = _send_vector_feedback(conn, schema, vector, top, params.prf_beta, params.n, params.ef_search, exact,
                                               partner, params.statement_timeout_ms)
        if terms is not None and lexical_hits:
            read_expanded = bm25.send_expand(conn, schema, terms, lexical_hits[: params.prf_docs], params.n,
                                             terms_kept=params.prf_terms, weight=params.prf_weight)
    if moved:
        vector_hits = read_moved()
    if terms is not None and lexical_hits:
        lexical_hits = read_expanded()
    return vector_hits, lexical_hits


def search(conn: psycopg.Connection, schema: str, embedder: Embedder, query: str, params: RetrievalParams = DEFAULT, *,
           exact: bool | str = False) -> list[Ranked]:
    """Fuse the vector and lexical top ``params.n`` (``fuse``: ``params.fusion``, ``params.weights``) and return the first ``params.k``
    (the query cut to ``params.limit_query``; ``exact`` as ``vector_search``'s)."""
    query = limit_query(query)
    lists = first_stage(conn, schema, embedder.embed([query])[0], query, params, exact=exact)
    return fuse(lists, params)[: params.k]
