"""The retrieval pipeline: one query through both first-stage lists, fusion, rerank and MMR.

Contract: ``run(conn, retriever, query, params)`` embeds the query once, searches the
retriever's schema for the vector and lexical top ``params.n`` (with pseudo-relevance feedback
when ``params.prf_docs`` asks for it: one round trip more, ``hybrid.first_stage``), fuses them (``fusion.fuse``),
reranks the whole fused pool with the retriever's reranker (when ``params.rerank`` and it has
one; blended with the fused score by ``params.rerank_weight``), applies MMR (when
``params.mmr_lambda`` is set) and returns a ``Trace`` of every list, best first, with
the pool's chunks as fetched once. Evaluation, diagnosis, answers, benchmarks and the assets
all call it. User query text never raises: a query longer than ``params.MAX_QUERY_CHARS``
characters or ``MAX_QUERY_TERMS`` terms, or with a run of more than ``MAX_QUERY_NEGATIONS``
negations, is cut (``params.limit_query``, and the cut logged); every search statement
runs under ``params.statement_timeout_ms``, and a timeout raises ``SearchTimeout``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import psycopg
from psycopg import pq
from psycopg.rows import dict_row

from retrieval_assets.index import copies, vector_index

from retrieval_assets.search import dense, fusion, hybrid
from retrieval_assets.index.embed import Embedder
from retrieval_assets.params import (DEFAULT, MAX_QUERY_CHARS, MAX_QUERY_NEGATIONS, MAX_QUERY_TERMS, RetrievalParams, hnsw_ef_search,
                                     limit_query)
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker, Reranker, blend, mmr
from retrieval_assets.index.tables import chunk_of, column_list, statement
from retrieval_assets.types import Chunk, Hit, Ranked


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retriever:
    """What a query is searched with: a partition's schema, its embedder, and a reranker (None: fusion only)."""

    schema: str
    embedder: Embedder
    reranker: Reranker | None = None
    ef_search: int | None = None  # the least hnsw.ef_search the table's graph reaches its recall target at (vector_index.vector_index)
    exact: bool | str = False  # the table was chosen to scan exactly: its narrow copy's vector type ("vector", "halfvec"; copies.exact_copy)


@dataclass(frozen=True)
class Trace:
    """Every list one query passes through: the two first-stage lists, fusion, rerank, MMR."""

    query_vector: np.ndarray = field(repr=False)
    vector: list[Hit]
    text: list[Hit]
    fused: list[Ranked]
    reranked: list[Ranked]
    final: list[Ranked]
    chunks: dict[str, Chunk] = field(default_factory=dict, repr=False)  # the reranked pool, by chunk_id


def retriever(conn: psycopg.Connection, schema: str, embedder: Embedder, params: RetrievalParams = DEFAULT, *,
              reranker: Reranker | None = None) -> Retriever:
    """The retriever ``params`` asks for: ``reranker`` when given, else the BM25 ``LexicalReranker`` with the
    pool's idf or (``params.rerank_idf == "corpus"``) the idf of every chunk in ``schema`` (``corpus_stats``); with the
    ef_search the table's graph was chosen at after its last bulk load (``vector_index.choose_vector_index``), if any, or
    the exact scan of its narrow copy when that was chosen."""
    if reranker is None:
        reranker = LexicalReranker(corpus=corpus_stats(conn, schema) if params.rerank_idf == "corpus" else None)
    chosen = vector_index.vector_index(conn, schema)
    if chosen is not None and chosen.kind == "exact" and (copy := copies.exact_copy_type(conn, schema)):
        return Retriever(schema, embedder, reranker, exact=copy)
    return Retriever(schema, embedder, reranker, chosen.ef_search if chosen is not None and chosen.kind == "hnsw" else None)


_STATS: dict[tuple, tuple[tuple, CorpusStats]] = {}  # (server, database, schema) -> (fingerprint, stats), per process


def corpus_stats(conn: psycopg.Connection, schema: str) -> CorpusStats:
    """The ``CorpusStats`` of every chunk in ``schema``, read once per process and table content: a
    fingerprint computed in Postgres (row count and a sum of text hashes, no text sent) is checked on
    each call, and the texts are read again only when it changed."""
    fingerprint = tuple(conn.execute(statement(schema, "SELECT count(*), coalesce(sum(hashtext(chunk_id || text)), 0) FROM {chunks}")).fetchone())
    key = (conn.info.host, conn.info.port, conn.info.dbname, schema)
    cached = _STATS.get(key)
    if cached is None or cached[0] != fingerprint:
        texts = [t for (t,) in conn.execute(statement(schema, "SELECT text FROM {chunks}"))]
        _STATS[key] = cached = (fingerprint, CorpusStats.from_texts(texts))
    return cached[1]


def fetch(conn: psycopg.Connection, schema: str, chunk_ids: list[str], *, vectors: bool = True) -> dict[str, tuple[Chunk, np.ndarray | None]]:
    """``{chunk_id: (Chunk, embedding)}`` for the ids present in ``schema.chunks`` (embedding None when not ``vectors``)."""
    return _send_fetch(conn, schema, chunk_ids, vectors)()


def _send_fetch(conn: psycopg.Connection, schema: str, chunk_ids: list[str], vectors: bool):
    """Execute ``fetch``'s statement; the function that reads its rows (in pipeline mode, after the caller's sync)."""
    # binary: vectors arrive as float32 bytes, not text to parse
    cur = conn.cursor(binary=True, row_factory=dict_row)
    cur.execute(statement(schema, "SELECT {columns} FROM {chunks} WHERE chunk_id = ANY(%s)",
                          columns=column_list(*(("embedding",) if vectors else ()))), (chunk_ids,))

    def read() -> dict[str, tuple[Chunk, np.ndarray | None]]:
        with cur:
            return {r["chunk_id"]: (chunk_of(r), r["embedding"].to_numpy() if vectors else None) for r in cur.fetchall()}
    return read


class SearchTimeout(RuntimeError):
    """A search statement ran past ``statement_timeout_ms``; the message says which limit."""


@contextmanager
def timeout(conn: psycopg.Connection, ms: int):
    """The block's statements stop after ``ms`` milliseconds (0: no limit), raising ``SearchTimeout``.

    On an idle autocommit connection whose libpq has pipeline mode the block runs in one pipeline:
    the limit is set for the session with the block's first statements and put back to its
    earlier value with its last, so neither costs a round trip (``_session_timeout``). Results of
    statements sent inside can be read after the block. Any other connection gets one
    transaction (a savepoint inside the caller's) and the limit local to the transaction, as before."""
    try:
        if (isinstance(conn, psycopg.Connection) and psycopg.Pipeline.is_supported() and conn.autocommit
                and conn.info.transaction_status == pq.TransactionStatus.IDLE):
            with _session_timeout(conn, ms):
                yield
        else:
            with conn.transaction():
                if ms:
                    conn.execute("SELECT set_config('statement_timeout', %s, true)", (str(ms),))
                yield
    except psycopg.errors.QueryCanceled:
        raise SearchTimeout(f"a search statement ran past statement_timeout_ms={ms} and was cancelled "
                            "(RetrievalParams.statement_timeout_ms; 0 lifts the limit)") from None


_RESTORE = "SELECT set_config('statement_timeout', %s, false)"


@contextmanager
def _session_timeout(conn: psycopg.Connection, ms: int):
    """``timeout``'s pipeline: the session's statement_timeout read and set in the first batch, put back
    in the last one, or (when the block fails) by a statement of its own after it. A first batch that
    failed rolled its setting back with it (a setting is transactional)."""
    before = None
    try:
        with conn.pipeline():
            if ms:
                before = conn.execute("SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, false)",
                                      (str(ms),))
            yield
            if before is not None:
                conn.execute(_RESTORE, (before.fetchone()[0],))
                before = None
    except BaseException:
        if before is not None:
            try:
                row = before.fetchone()
            except psycopg.Error:
                row = None
            if row is not None:
                conn.execute(_RESTORE, (row[0],))
        raise


def first_stage_key(query: str, params: RetrievalParams) -> tuple:
    """What a query's first-stage lists depend on: traces with equal keys can share them (``run``'s
    ``first_stage``). The Rocchio vector list is fed back from the fused lists, so with it the fusion counts too."""
    key = (query, params.n, params.lexical, params.ef_search)
    if params.bm25_feedback:
        key += ("rm3", params.prf_docs, params.prf_terms, params.prf_weight)
    if params.vector_feedback:
        key += ("rocchio", params.prf_docs, params.prf_beta, params.fusion, params.weights, params.rrf_k)
    return key


def run(conn: psycopg.Connection, retriever: Retriever, query: str, params: RetrievalParams = DEFAULT, *,
        first_stage: Trace | None = None, rows: dict[str, tuple[Chunk, np.ndarray]] | None = None) -> Trace:
    """The pipeline for one query, every intermediate list kept (``Trace.final``: the answer, top ``params.k``).

    ``first_stage``: an earlier trace of the same ``first_stage_key`` (query, ``n``, ``lexical``,
    ``ef_search``, feedback) whose first-stage lists and query vector are reused (what-if experiments on the fusion
    weights or the second stage). ``rows``: a caller's cache of ``fetch`` results (read and
    filled), so that repeated runs over the same pool fetch each chunk once.
    """
    limited = limit_query(query)
    if limited != query:
        log.info("query cut from %d to %d characters (limits: %d characters, %d terms, %d negations in a row)", len(query),
                 len(limited), MAX_QUERY_CHARS, MAX_QUERY_TERMS, MAX_QUERY_NEGATIONS)
        query = limited
    if retriever.ef_search and hnsw_ef_search(params.n, params.ef_search) < retriever.ef_search:
        params = params.with_(ef_search=retriever.ef_search)  # the table's floor: below it the graph misses its recall target
    if first_stage is None:
        vector_q = retriever.embedder.embed([query])[0]
    else:
        vector_q, vector, text = first_stage.query_vector, first_stage.vector, first_stage.text
    rows = {} if rows is None else rows
    read_rows = None
    partner = dense.scan_partner(conn, retriever.exact, params.lexical) if first_stage is None else None  # asked before the block opens
    with timeout(conn, params.statement_timeout_ms):
        if first_stage is None:
            vector, text = hybrid.first_stage(conn, retriever.schema, vector_q, query, params, exact=retriever.exact, partner=partner)
        fused = fusion.fuse([vector, text], params)[: params.n]
        if retriever.reranker is None or not params.rerank or not fused:
            return Trace(vector_q, vector, text, fused, fused, fused[: params.k])
        # MMR needs the pool's vectors; without it the fetch leaves them in Postgres
        vectors = params.mmr_lambda is not None
        missing = [r.chunk_id for r in fused if r.chunk_id not in rows or (vectors and rows[r.chunk_id][1] is None)]
        if missing:
            read_rows = _send_fetch(conn, retriever.schema, missing, vectors)  # read after the block: one trip with its last statement
    if read_rows is not None:
        rows.update(read_rows())
    pool = [rows[r.chunk_id][0] for r in fused if r.chunk_id in rows]
    chunks = {c.chunk_id: c for c in pool}
    evidence = {r.chunk_id: r.score for r in fused}
    if params.rerank_weight > 0:
        reranked = blend(retriever.reranker.rerank(query, pool, len(pool)), evidence, params.rerank_weight)
    else:  # the fused order, the pool's positions as ranks
        reranked = [Ranked(c.chunk_id, evidence[c.chunk_id], i, (i,)) for i, c in enumerate(pool, 1)]
    if params.mmr_lambda is None:
        return Trace(vector_q, vector, text, fused, reranked, reranked[: params.k], chunks)
    final = mmr(vector_q, reranked, [rows[r.chunk_id][1] for r in reranked], lam=params.mmr_lambda, top_k=params.k)
    return Trace(vector_q, vector, text, fused, reranked, final, chunks)
