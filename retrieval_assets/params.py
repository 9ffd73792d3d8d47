"""Retrieval parameters and their defaults, defined once.

Contract: ``RetrievalParams`` is frozen; building one with a bad value raises ``ValueError``
naming the field. Every layer (pipeline, evaluation, diagnosis, answers, assets, command line,
benchmarks) takes a ``RetrievalParams`` and reads its defaults from here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

LEXICAL = ("ts_rank_cd", "bm25")  # the lexical lists hybrid search can fuse with vectors
EF_SEARCH_MAX = 1000  # pgvector's upper bound for hnsw.ef_search
MAX_QUERY_CHARS = 1000  # a query is cut to its first 1,000 characters ...
MAX_QUERY_TERMS = 64  # ... and its first 64 whitespace-separated terms (the cut is logged)


@dataclass(frozen=True)
class RetrievalParams:
    k: int = 10  # results returned (and the metrics' cut-off)
    n: int = 50  # candidates taken from each first-stage list and kept in the fused pool
    rrf_k: int = 60  # reciprocal rank fusion: score = sum(weight / (rrf_k + rank))
    weights: tuple[float, float] = (1.0, 1.0)  # RRF weight of the vector list, of the lexical list
    lexical: str = "ts_rank_cd"  # "ts_rank_cd" (the seed's) or "bm25" (inside Postgres)
    rerank: bool = True  # rerank the whole fused pool with the retriever's reranker
    mmr_lambda: float | None = 0.7  # MMR over the reranked pool; None: no MMR
    ef_search: int | None = None  # HNSW candidate list; None: n; clamped to 40..EF_SEARCH_MAX
    statement_timeout_ms: int = 10_000  # every search statement of pipeline.run; 0: no limit

    def __post_init__(self) -> None:
        for name in ("k", "n", "rrf_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "rrf_k" else 1):
                raise ValueError(f"{name} must be a {'non-negative' if name == 'rrf_k' else 'positive'} integer, got {value!r}")
        if self.n < self.k:
            raise ValueError(f"n must be at least k (the pool holds the results), got k={self.k} n={self.n}")
        weights = tuple(self.weights)
        if len(weights) != 2 or any(not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 for w in weights):
            raise ValueError(f"weights must be two non-negative numbers (vector, lexical), got {self.weights!r}")
        object.__setattr__(self, "weights", tuple(float(w) for w in weights))
        if self.lexical not in LEXICAL:
            raise ValueError(f"lexical must be one of {', '.join(LEXICAL)}, got {self.lexical!r}")
        if self.mmr_lambda is not None and not (isinstance(self.mmr_lambda, (int, float)) and 0 <= self.mmr_lambda <= 1):
            raise ValueError(f"mmr_lambda must be within [0, 1] (or None for no MMR), got {self.mmr_lambda!r}")
        if self.ef_search is not None and (not isinstance(self.ef_search, int) or isinstance(self.ef_search, bool) or self.ef_search < 1):
            raise ValueError(f"ef_search must be a positive integer (used within 40..{EF_SEARCH_MAX}), got {self.ef_search!r}")

        if not isinstance(self.statement_timeout_ms, int) or isinstance(self.statement_timeout_ms, bool) or self.statement_timeout_ms < 0:
            raise ValueError(f"statement_timeout_ms must be a non-negative integer (0: no limit), got {self.statement_timeout_ms!r}")

    def with_(self, **changes) -> RetrievalParams:
        """A copy with ``changes`` applied (and validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown retrieval parameter(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


DEFAULT = RetrievalParams()


def limit_query(query: str) -> str:
    """``query`` cut to ``MAX_QUERY_CHARS`` characters and ``MAX_QUERY_TERMS`` terms (unchanged when shorter)."""
    cut = query[:MAX_QUERY_CHARS]
    terms = cut.split()
    if len(terms) > MAX_QUERY_TERMS:
        cut = " ".join(terms[:MAX_QUERY_TERMS])
    return cut
