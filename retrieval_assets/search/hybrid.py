"""Hybrid search (seed stage 03): the vector and lexical lists of one query, sent together and fused.

Contract: ``first_stage`` returns the vector list (``dense.vector_search``'s) and the lexical list
(``lexical_search``'s: ``ts_rank.text_search`` or ``bm25_rank.bm25_search``) of one query, the same
lists as those searches one after the other, their statements sent together and reading one snapshot
(``snapshot.search``); with pseudo-relevance feedback when ``params`` asks for it. ``search`` is the first
stage of ``pipeline.run``: both lists, fused (``fusion.fuse``), cut at ``params.k``. Every list reads one
partition's ``schema``; none raises on user query text, and a query without words returns ``[]``.
"""

from __future__ import annotations

import numpy as np
import psycopg

from retrieval_assets.index.embed import Embedder, embed_queries
from retrieval_assets.params import DEFAULT, RetrievalParams, limit_query
from retrieval_assets.search import bm25_rank, snapshot
from retrieval_assets.search.bm25_rank import bm25_search, send_bm25
from retrieval_assets.search.dense import _send_vector, _send_vector_feedback, wants_partner
from retrieval_assets.search.fusion import fuse
from retrieval_assets.search.ts_rank import _send_text, text_search
from retrieval_assets.types import Hit, Ranked


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


AUTO = object()  # first_stage's partner: a partner session when it helps (dense.wants_partner)


def first_stage(conn: psycopg.Connection, schema: str, vector: np.ndarray, query: str,
                params: RetrievalParams = DEFAULT, *, exact: bool | str = False, partner=AUTO) -> tuple[list[Hit], list[Hit]]:
    """The vector and lexical top ``params.n`` of one query (``vector``: the query's embedding).

    Both lists' statements go in one round trip, in one snapshot (``snapshot.search``, with its statement
    timeout ``params.statement_timeout_ms``; inside ``pipeline.run``'s block, in that one): the ef_search
    setting, the vector query and the lexical statement, which parses the query itself. ``ts_rank_cd`` needs no
    more; ``bm25``'s first statement reads the terms' statistics, and its postings take a second trip (or more,
    when max-score pruning widens its lead), and then the COMMIT that ends the snapshot one more. Same lists as
    ``dense.vector_search`` and ``lexical_search`` called one after the other (``exact``: as
    ``dense.vector_search``'s). ``partner``: ``AUTO`` borrows a partner session when it helps
    (``dense.wants_partner``): it takes half of an exact scan, the snapshot exported to it first (one round trip
    more); False or None keeps everything on ``conn``.

    Pseudo-relevance feedback (``params.prf_docs``) costs one trip more, for both of its kinds: the
    BM25 list searched again with RM3's expanded query (``bm25_rank.send_expand``, fed back from its own
    top ``prf_docs``), and the vector list searched again from the query vector moved toward the
    mean vector of the first lists' fused top ``prf_docs`` (Rocchio, ``params.prf_beta``)."""
    send_lexical = _lexical(_SEND_LEXICAL, params.lexical)
    expand = params.bm25_feedback  # RetrievalParams allows it with the bm25 list only
    wanted = wants_partner(exact) if partner is AUTO else bool(partner)
    with snapshot.search(conn, params.statement_timeout_ms, partner=wanted) as search:
        read_vector = _send_vector(conn, schema, vector, params.n, params.ef_search, exact, search)
        read_lexical = bm25_rank.send_query(conn, schema, query, params.n) if expand else send_lexical(conn, schema, query, params.n)
        if search.partner is not None or params.lexical != "ts_rank_cd" or params.vector_feedback:  # reads that send more
            vector_hits = read_vector()
            lexical_hits, terms = read_lexical() if expand else (read_lexical(), None)
            return _feedback(conn, schema, vector, params, exact, search, vector_hits, lexical_hits, terms)
    return read_vector(), read_lexical()  # read after the block: its statements ride with its COMMIT, one trip


def _feedback(conn: psycopg.Connection, schema: str, vector: np.ndarray, params: RetrievalParams, exact: bool | str,
              search: snapshot.Search, vector_hits: list[Hit], lexical_hits: list[Hit], terms: dict | None) -> tuple[list[Hit], list[Hit]]:
    """``first_stage``'s second trip, when ``params`` asks for feedback and the first lists found something."""
    moved = params.vector_feedback and vector_hits
    if not (moved or (terms is not None and lexical_hits)):
        return vector_hits, lexical_hits
    if moved:
        top = [r.chunk_id for r in fuse([vector_hits, lexical_hits], params)[: params.prf_docs]]
        read_moved = _send_vector_feedback(conn, schema, vector, top, params.prf_beta, params.n, params.ef_search, exact, search)
    if terms is not None and lexical_hits:
        read_expanded = bm25_rank.send_expand(conn, schema, terms, lexical_hits[: params.prf_docs], params.n,
                                              terms_kept=params.prf_terms, weight=params.prf_weight)
    if moved:
        vector_hits = read_moved()
    if terms is not None and lexical_hits:
        lexical_hits = read_expanded()
    return vector_hits, lexical_hits


def search(conn: psycopg.Connection, schema: str, embedder: Embedder, query: str, params: RetrievalParams = DEFAULT, *,
           exact: bool | str = False) -> list[Ranked]:
    """Fuse the vector and lexical top ``params.n`` (``fuse``: ``params.fusion``, ``params.weights``) and return the first ``params.k``
    (the query cut to ``params.limit_query``; ``exact`` as ``dense.vector_search``'s)."""
    query = limit_query(query)
    lists = first_stage(conn, schema, embed_queries(embedder, [query])[0], query, params, exact=exact)
    return fuse(lists, params)[: params.k]
