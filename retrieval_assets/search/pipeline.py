"""The retrieval pipeline: one query through both first-stage lists, fusion, rerank and MMR.

Contract: ``run(conn, retriever, query, params)`` embeds the query once, searches the
retriever's schema for the vector and lexical top ``params.n`` (with pseudo-relevance feedback
when ``params.prf_docs`` asks for it: one round trip more, ``hybrid.first_stage``), fuses them (``fusion.fuse``),
reranks the whole fused pool with the retriever's reranker (when ``params.rerank`` and it has
one; blended with the fused score by ``params.rerank_weight``), applies MMR (when
``params.mmr_lambda`` is set) and returns a ``Trace`` of every list, best first, with
the pool's chunks as fetched once. Evaluation, diagnosis, answers, benchmarks and the assets
all call it. Every statement of a run reads one snapshot (``snapshot.search``), the pool's fetch and the
corpus statistics of a corpus-idf rerank (``corpus_stats``, cached per index version) included: a sync
committing meanwhile is seen wholly or not at all. User query text never raises: a query longer than
``params.MAX_QUERY_CHARS`` characters or ``MAX_QUERY_TERMS`` terms, or with a run of more than
``MAX_QUERY_NEGATIONS`` negations, is cut (``params.limit_query``, and the cut logged); every search
statement runs under ``params.statement_timeout_ms``, and a timeout raises ``SearchTimeout`` (a lost
connection ``pg.ConnectError``), with nothing left running on either session.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import numpy as np
import psycopg
from psycopg.rows import dict_row

from retrieval_assets.index import copies, vector_index

from retrieval_assets.search import dense, documents, fusion, hybrid, snapshot, sparse as splade_list
from retrieval_assets.index.splade import SpladeEncoder
from retrieval_assets.index.embed import Embedder, embed_queries
from retrieval_assets.params import (DEFAULT, MAX_QUERY_CHARS, MAX_QUERY_NEGATIONS, MAX_QUERY_TERMS, RetrievalParams, hnsw_ef_search,
                                     limit_query)
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker, Reranker, blend, mmr
from retrieval_assets.index.tables import chunk_of, column_list, statement
from retrieval_assets.search.snapshot import SearchTimeout
from retrieval_assets.types import Chunk, Hit, Ranked

__all__ = ["Retriever", "SearchTimeout", "Trace", "corpus_stats", "fetch", "first_stage_key", "index_version", "retriever", "run"]


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retriever:
    """What a query is searched with: a partition's schema, its embedder, and a reranker (None: fusion only)."""

    schema: str
    embedder: Embedder
    reranker: Reranker | None = None
    ef_search: int | None = None  # the least hnsw.ef_search the table's graph reaches its recall target at (vector_index.vector_index)
    exact: bool | str = False  # the table was chosen to scan exactly: its narrow copy's vector type ("vector", "halfvec"; copies.exact_copy)
    corpus_idf: bool = False  # the LexicalReranker's corpus statistics are the schema's: each run reads them in its snapshot
    sparse: SpladeEncoder | None = None  # the SPLADE encoder of the learned sparse list (params.sparse_weight); None: no such list


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
    sparse: list[Hit] | None = None  # the SPLADE list, when params.sparse_weight asked for one (and the retriever has it)


def retriever(conn: psycopg.Connection, schema: str, embedder: Embedder, params: RetrievalParams = DEFAULT, *,
              reranker: Reranker | None = None, sparse: SpladeEncoder | None = None) -> Retriever:
    """The retriever ``params`` asks for: ``reranker`` when given, else the BM25 ``LexicalReranker`` with the
    pool's idf or (``params.rerank_idf == "corpus"``) the idf of every chunk in ``schema`` (``corpus_stats``); with the
    ef_search the table's graph was chosen at after its last bulk load (``vector_index.choose_vector_index``), if any, or
    the exact scan of its narrow copy when that was chosen."""
    live = reranker is None and params.rerank_idf == "corpus"
    if reranker is None:
        reranker = LexicalReranker(corpus=corpus_stats(conn, schema) if live else None)
    chosen = vector_index.vector_index(conn, schema)
    if chosen is not None and chosen.kind == "exact" and (copy := copies.exact_copy_type(conn, schema)):
        return Retriever(schema, embedder, reranker, exact=copy, corpus_idf=live, sparse=sparse)
    return Retriever(schema, embedder, reranker, chosen.ef_search if chosen is not None and chosen.kind == "hnsw" else None,
                     corpus_idf=live, sparse=sparse)


# The index's version, read in a search's snapshot: the bm25_stats row is rewritten by every store write that
# changes chunk texts (its triggers), and the synced row holds the last sync's fingerprint (cleared by any
# other write to chunks). Equal versions: equal texts, so equal CorpusStats.
_VERSION = "SELECT s.xmin::text, s.n, s.total_len, (SELECT fingerprint FROM {synced}) FROM {bm25_stats} s"
_STATS: dict[tuple, dict[tuple, CorpusStats]] = {}  # (server, database, schema) -> {version: stats}, per process
_STATS_KEPT = 4  # versions kept per schema (readers of a moment before and after a sync, at least)
_STATS_LOCK = threading.Lock()


def index_version(conn: psycopg.Connection, schema: str) -> tuple:
    """The index's version (``_VERSION``; one row, no text sent): equal versions hold equal chunk texts."""
    return tuple(conn.execute(statement(schema, _VERSION)).fetchone() or ())


def corpus_stats(conn: psycopg.Connection, schema: str) -> CorpusStats:
    """The ``CorpusStats`` of every chunk in ``schema`` as one snapshot holds them, read once per process and
    index version (``_VERSION``: one row, no text sent); the texts are read again only for a new version."""
    with snapshot.search(conn):
        return _stats_of(conn, schema, conn.execute(statement(schema, _VERSION)).fetchone())


def _stats_of(conn: psycopg.Connection, schema: str, version: tuple | None) -> CorpusStats:
    """``corpus_stats`` for the ``_VERSION`` row ``version``, read inside the caller's snapshot."""
    key, version = (conn.info.host, conn.info.port, conn.info.dbname, schema), tuple(version or ())
    with _STATS_LOCK:
        stats = _STATS.setdefault(key, {}).get(version)
    if stats is None or not version:
        stats = CorpusStats.from_texts([t for (t,) in conn.execute(statement(schema, "SELECT text FROM {chunks}"))])
        with _STATS_LOCK:  # searches in other threads read and fill it too
            known = _STATS[key]
            while len(known) >= _STATS_KEPT:
                known.pop(next(iter(known)))
            known[version] = stats
    return stats


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


def first_stage_key(query: str, params: RetrievalParams) -> tuple:
    """What a query's first-stage lists depend on: traces with equal keys can share them (``run``'s
    ``first_stage``). The Rocchio vector list is fed back from the fused lists, so with it the fusion counts too."""
    key = (query, params.n, params.lexical, params.ef_search)
    if params.bm25_feedback:
        key += ("rm3", params.prf_docs, params.prf_terms, params.prf_weight)
    if params.vector_feedback:
        key += ("rocchio", params.prf_docs, params.prf_beta, params.fusion, params.weights, params.rrf_k, params.evidence_shift)
    if params.sparse_weight:
        key += ("splade",)
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
        vector_q = embed_queries(retriever.embedder, [query])[0]
    else:
        vector_q, vector, text = first_stage.query_vector, first_stage.vector, first_stage.text
    rows = {} if rows is None else rows
    read_rows = None
    wanted = first_stage is None and dense.wants_partner(retriever.exact)
    with snapshot.search(conn, params.statement_timeout_ms, partner=wanted):
        rerank = retriever.reranker is not None and params.rerank
        version = (conn.execute(statement(retriever.schema, _VERSION))
                   if rerank and retriever.corpus_idf and isinstance(retriever.reranker, LexicalReranker) else None)
        if first_stage is None:
            vector, text = hybrid.first_stage(conn, retriever.schema, vector_q, query, params, exact=retriever.exact)
        sparse = _sparse_list(conn, retriever, query, params, first_stage)
        fused = fusion.fuse([vector, text, *([sparse] if sparse is not None else [])], params)[: params.n]
        if not rerank or not fused:
            return Trace(vector_q, vector, text, fused, fused, fused[: params.k], sparse=sparse)
        reranker = retriever.reranker
        if version is not None:  # the corpus statistics of this snapshot
            reranker = LexicalReranker(reranker.k1, reranker.b, corpus=_stats_of(conn, retriever.schema, version.fetchone()))
        # MMR needs the pool's vectors; without it the fetch leaves them in Postgres
        vectors = params.mmr_lambda is not None
        missing = [r.chunk_id for r in fused if r.chunk_id not in rows or (vectors and rows[r.chunk_id][1] is None)]
        if missing:
            read_rows = _send_fetch(conn, retriever.schema, missing, vectors)  # read after the block: one trip with its COMMIT
    if read_rows is not None:
        rows.update(read_rows())
    pool = [rows[r.chunk_id][0] for r in fused if r.chunk_id in rows]
    chunks = {c.chunk_id: c for c in pool}
    evidence = {r.chunk_id: r.score for r in fused}
    if params.rerank_weight > 0:
        reranked = blend(reranker.rerank(query, pool, len(pool)), evidence, params.rerank_weight, params.rerank_fusion, params.rrf_k)
    else:  # the fused order, the pool's positions as ranks
        reranked = [Ranked(c.chunk_id, evidence[c.chunk_id], i, (i,)) for i, c in enumerate(pool, 1)]
    reranked = documents.blend(reranked, chunks, text, params.doc_weight)
    if params.mmr_lambda is None:
        return Trace(vector_q, vector, text, fused, reranked, reranked[: params.k], chunks, sparse)
    final = mmr(vector_q, reranked, [rows[r.chunk_id][1] for r in reranked], lam=params.mmr_lambda, top_k=params.k)
    return Trace(vector_q, vector, text, fused, reranked, final, chunks, sparse)


def _sparse_list(conn: psycopg.Connection, retriever: Retriever, query: str, params: RetrievalParams,
                 first_stage: Trace | None) -> list[Hit] | None:
    """The SPLADE list of ``run`` (None when ``params.sparse_weight`` is 0 or the retriever has no encoder):
    ``first_stage``'s when it has one, else searched in the caller's snapshot."""
    if not params.sparse_weight or retriever.sparse is None:
        return None
    if first_stage is not None and first_stage.sparse is not None:
        return first_stage.sparse
    encoder = retriever.sparse
    return splade_list.search(conn, retriever.schema, encoder.encode([query])[0], encoder.dims, params.n)
