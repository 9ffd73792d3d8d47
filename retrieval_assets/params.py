"""Retrieval parameters and their defaults, defined once.

Contract: ``RetrievalParams`` is frozen; building one with a bad value raises ``ValueError``
naming the field. Every layer (pipeline, evaluation, diagnosis, answers, assets, command line,
benchmarks) takes a ``RetrievalParams`` and reads its defaults from here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

LEXICAL = ("ts_rank_cd", "bm25")  # the lexical lists hybrid search can fuse with vectors
FUSION = ("rrf", "minmax", "zscore")  # reciprocal rank fusion, convex combination of min-max or z-score normalised scores
RERANK_IDF = ("pool", "corpus")  # where the BM25 reranker's document frequencies come from
RERANK_FUSION = ("minmax", "rrf")  # how rerank.blend mixes the reranker's list with the fused one: scores or ranks
EF_SEARCH_MAX = 1000  # pgvector's upper bound for hnsw.ef_search
MAX_QUERY_CHARS = 1000  # a query is cut to its first 1,000 characters ...
MAX_QUERY_TERMS = 64  # ... and its first 64 whitespace-separated terms (the cut is logged)
# ... and a run of more than 10 negations to 10 or 9 of them, its parity kept (``limit_negations``). Each '-'
# that websearch_to_tsquery reads where a word may start is a NOT, and NOT is right-associative: Postgres's
# tsquery parser keeps the pending NOTs of a run on an operator stack of 32 (STACKDEPTH in tsquery.c), beside
# the pending AND and OR, and a longer run fails the whole statement with "tsquery stack too small". Measured
# on Postgres 18.6 (the embedded server, retrieval_assets_tests/test_fuzz_queries.py): 32 NOTs are accepted at
# the start of a query, 31 after a word, 30 after "word or word" (the worst place) and never 31 there. The
# run continues through whitespace and the characters that parser skips there (!&|()<), never through a
# quote (Postgres 18 opens a phrase at any '"'). 10 leaves room for two runs joined by a quote, as an older
# parser that skips an unmatched '"' would read them (20 NOTs, plus the AND and the OR), with 10 to spare;
# NOT NOT x is x, so a cut run means what it meant.
MAX_QUERY_NEGATIONS = 10
PRF_BETA_MAX = 10.0  # Rocchio's feedback weight on the query vector, at most
PRF_TERMS_MAX = 100  # expansion terms of pseudo-relevance feedback: every posting of each is read


@dataclass(frozen=True)
class RetrievalParams:
    k: int = 10  # results returned (and the metrics' cut-off)
    n: int = 50  # candidates taken from each first-stage list and kept in the fused pool
    rrf_k: int = 60  # reciprocal rank fusion: score = sum(weight / (rrf_k + rank))
    weights: tuple[float, float] = (1.0, 1.0)  # fusion weight of the vector list, of the lexical list, each in [0, 1]
    sparse_weight: float = 0.0  # fusion weight of the learned sparse (SPLADE) list, in [0, 1]; 0: no such list
    # query-dependent fusion weight, in [0, 1]: this share of the lexical weight, times 1 - the lexical list's evidence
    # for the query (fusion.lexical_evidence, in [0, 1]), moves to the vector list (fusion.query_weights); 0: fixed weights
    evidence_shift: float = 0.0
    lexical: str = "ts_rank_cd"  # "ts_rank_cd" (the seed's) or "bm25" (inside Postgres)
    fusion: str = "rrf"  # one of FUSION (fusion.fuse)
    rerank: bool = True  # rerank the whole fused pool with the retriever's reranker
    rerank_weight: float = 1.0  # rerank score = w * reranker score + (1 - w) * fused score, both min-max normalised over the pool
    rerank_fusion: str = "minmax"  # one of RERANK_FUSION: "rrf" mixes ranks instead, w / (rrf_k + reranker rank) + (1 - w) / (rrf_k + fused rank)
    rerank_idf: str = "pool"  # the BM25 reranker's idf: from the fused pool (the seed's) or every chunk of the index
    doc_weight: float = 0.0  # document evidence after the rerank (documents.blend), in [0, 1]; 0: none (needs rerank)
    mmr_lambda: float | None = 0.7  # MMR over the reranked pool; None: no MMR
    ef_search: int | None = None  # HNSW candidate list; None: n; clamped to 40..EF_SEARCH_MAX
    statement_timeout_ms: int = 10_000  # every search statement of pipeline.run; 0: no limit
    # pseudo-relevance feedback (off by default: benchmarks/guards/quality.py measures it)
    prf_docs: int = 0  # RM3 expansion of the BM25 list from its first search's top prf_docs chunks (<= n); 0: none
    prf_terms: int = 10  # expansion terms kept from the feedback chunks' relevance model
    prf_weight: float = 0.5  # the relevance model's share of the expanded query, in [0, 1] (0: the query alone)
    prf_beta: float = 0.0  # Rocchio on the query vector: normalise(q + prf_beta * mean of the top prf_docs fused chunks' vectors); 0: none

    def __post_init__(self) -> None:
        for name in ("k", "n", "rrf_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "rrf_k" else 1):
                raise ValueError(f"{name} must be a {'non-negative' if name == 'rrf_k' else 'positive'} integer, got {value!r}")
        if self.n < self.k:
            raise ValueError(f"n must be at least k (the pool holds the results), got k={self.k} n={self.n}")
        weights = tuple(self.weights)
        if len(weights) != 2 or any(not _unit(w) for w in weights) or not any(weights):
            raise ValueError(f"weights must be two numbers within [0, 1] (vector, lexical), not both 0, got {self.weights!r}")
        object.__setattr__(self, "weights", tuple(float(w) for w in weights))
        if not _unit(self.sparse_weight):
            raise ValueError(f"sparse_weight must be a number within [0, 1] (0: no SPLADE list), got {self.sparse_weight!r}")
        if not _unit(self.evidence_shift):
            raise ValueError(f"evidence_shift must be a number within [0, 1] (0: fixed fusion weights), got {self.evidence_shift!r}")
        if self.lexical not in LEXICAL:
            raise ValueError(f"lexical must be one of {', '.join(LEXICAL)}, got {self.lexical!r}")
        if self.fusion not in FUSION:
            raise ValueError(f"fusion must be one of {', '.join(FUSION)}, got {self.fusion!r}")
        if self.rerank_fusion not in RERANK_FUSION:
            raise ValueError(f"rerank_fusion must be one of {', '.join(RERANK_FUSION)}, got {self.rerank_fusion!r}")
        if self.rerank_idf not in RERANK_IDF:
            raise ValueError(f"rerank_idf must be one of {', '.join(RERANK_IDF)}, got {self.rerank_idf!r}")
        if not _unit(self.rerank_weight):
            raise ValueError(f"rerank_weight must be a number within [0, 1] (1: the reranker's score alone), got {self.rerank_weight!r}")
        if not _unit(self.doc_weight):
            raise ValueError(f"doc_weight must be a number within [0, 1] (0: no document evidence), got {self.doc_weight!r}")
        if self.mmr_lambda is not None and not (isinstance(self.mmr_lambda, (int, float)) and 0 <= self.mmr_lambda <= 1):
            raise ValueError(f"mmr_lambda must be within [0, 1] (or None for no MMR), got {self.mmr_lambda!r}")
        if self.ef_search is not None and (not isinstance(self.ef_search, int) or isinstance(self.ef_search, bool) or self.ef_search < 1):
            raise ValueError(f"ef_search must be a positive integer (used within 40..{EF_SEARCH_MAX}), got {self.ef_search!r}")

        if not isinstance(self.statement_timeout_ms, int) or isinstance(self.statement_timeout_ms, bool) or self.statement_timeout_ms < 0:
            raise ValueError(f"statement_timeout_ms must be a non-negative integer (0: no limit), got {self.statement_timeout_ms!r}")
        if not _integer(self.prf_docs) or not 0 <= self.prf_docs <= self.n:
            raise ValueError(f"prf_docs must be an integer within [0, n={self.n}] (0: no feedback), got {self.prf_docs!r}")
        if not _integer(self.prf_terms) or not 1 <= self.prf_terms <= PRF_TERMS_MAX:
            raise ValueError(f"prf_terms must be an integer within [1, {PRF_TERMS_MAX}], got {self.prf_terms!r}")
        if not _unit(self.prf_weight):
            raise ValueError(f"prf_weight must be a number within [0, 1] (0: the query's terms alone), got {self.prf_weight!r}")
        if not isinstance(self.prf_beta, (int, float)) or isinstance(self.prf_beta, bool) or not 0 <= self.prf_beta <= PRF_BETA_MAX:
            raise ValueError(f"prf_beta must be a number within [0, {PRF_BETA_MAX:g}] (0: no vector feedback), got {self.prf_beta!r}")
        if self.prf_docs and self.prf_weight > 0 and self.lexical != "bm25":
            raise ValueError(f"prf_docs expands the bm25 lexical list only (lexical must be bm25 with prf_docs > 0 and "
                             f"prf_weight > 0), got lexical={self.lexical!r}")
        if self.prf_beta and not self.prf_docs:
            raise ValueError(f"prf_beta needs prf_docs > 0 (the fused chunks fed back), got prf_beta={self.prf_beta!r} prf_docs=0")

    def describe(self) -> str:
        """The pipeline in one line: lexical list, fusion and weights, rerank, MMR."""
        fusion = f"RRF (k {self.rrf_k})" if self.fusion == "rrf" else f"{self.fusion} fusion"
        sparse = f" / SPLADE {self.sparse_weight:g}" if self.sparse_weight else ""
        sparse += f", {self.evidence_shift:g} of the lexical weight moved to the vector list as its evidence is weak" if self.evidence_shift else ""
        parts = [f"{self.lexical} list, {fusion}, weights vector {self.weights[0]:g} / lexical {self.weights[1]:g}{sparse}"]
        if self.rerank and self.rerank_weight > 0:
            blend = "" if self.rerank_weight == 1 else (f" blended {self.rerank_weight:g} with the fused score" if self.rerank_fusion == "minmax"
                                                        else f" fused by rank {self.rerank_weight:g} with the fused list")
            parts.append(f"BM25 rerank ({self.rerank_idf} idf){blend}")
        if self.rerank and self.doc_weight > 0:
            parts.append(f"document evidence {self.doc_weight:g}")
        if self.rerank and self.mmr_lambda is not None:
            parts.append(f"MMR {self.mmr_lambda:g}")
        if self.bm25_feedback:
            parts.append(f"RM3 feedback on the lexical list ({self.prf_docs} chunks, {self.prf_terms} terms, weight {self.prf_weight:g})")
        if self.vector_feedback:
            parts.append(f"Rocchio feedback on the query vector ({self.prf_docs} fused chunks, beta {self.prf_beta:g})")
        return " + ".join(parts)

    @property
    def bm25_feedback(self) -> bool:
        """Whether the BM25 list is expanded by pseudo-relevance feedback (RM3)."""
        return self.prf_docs > 0 and self.prf_weight > 0

    @property
    def vector_feedback(self) -> bool:
        """Whether the vector list is searched again with a Rocchio-moved query vector."""
        return self.prf_docs > 0 and self.prf_beta > 0

    def with_(self, **changes) -> RetrievalParams:
        """A copy with ``changes`` applied (and validated)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ValueError(f"unknown retrieval parameter(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unit(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


FIELD_NAMES = frozenset(f.name for f in fields(RetrievalParams))  # what a command line or run config may set by name

SEED = RetrievalParams()  # the seed's pipeline: ts_rank_cd list, RRF 1:1, the reranker's order alone, MMR 0.7
# The default is the pipeline the staged rule chose on every query of Cranfield and the golden set together,
# hash and MiniLM alike, on 2026-12-03 (benchmarks/guards/quality.py; benchmarks/results/quality.md): the BM25
# list, z-score fusion 0.4 / 0.6, the BM25 rerank with corpus idf blended 0.4 with the fused score, and no MMR.
# The rule's later choice with the rank blend and document evidence (results/quality-full-rule.md) trades golden
# for Cranfield in-sample and is not clearly better, so this one stays (docs/quality.md, how the default was chosen).
DEFAULT = SEED.with_(lexical="bm25", fusion="zscore", weights=(0.4, 0.6), rerank_weight=0.4, rerank_idf="corpus",
                     mmr_lambda=None)
# An embedder partition's own default, where the staged rule fitted for that embedder alone beat the joint one held
# out: mpnet's (benchmarks/results/quality-mpnet-own.md; docs/quality.md, "mpnet's own default") is the rule chosen on
# every query of Cranfield and the golden set with mpnet alone. Held out (each fold's choice made without it): Cranfield
# 0.437 (1.14x bm25s), golden 0.739, conceptual 0.585, against the joint rule's 0.436 / 0.737 / 0.388.
EMBEDDER_DEFAULTS = {"mpnet": DEFAULT.with_(fusion="zscore", weights=(0.5, 0.5), evidence_shift=0.75, rerank=False)}
PIPELINES = ("default", "seed")  # the named pipelines assets, command line and benchmarks accept (``named``)


def default_for(embedder: str | None) -> RetrievalParams:
    """The default pipeline of embedder partition ``embedder``: its own (``EMBEDDER_DEFAULTS``) or ``DEFAULT``."""
    return EMBEDDER_DEFAULTS.get(embedder or "", DEFAULT)


def default_name(embedder: str | None) -> str:
    """What ``default_for(embedder)`` is called in a report line."""
    return f"params.EMBEDDER_DEFAULTS[{embedder!r}]" if embedder in EMBEDDER_DEFAULTS else "params.DEFAULT"


def named(name: str, embedder: str | None = None) -> RetrievalParams:
    """The named pipeline's parameters ("default": ``embedder``'s, ``default_for``); ``ValueError`` naming the known
    names otherwise."""
    if name == "default":
        return default_for(embedder)
    if name == "seed":
        return SEED
    raise ValueError(f"unknown pipeline {name!r} (known: {', '.join(PIPELINES)})")


def hnsw_ef_search(n: int, ef_search: int | None = None) -> int:
    """The ``hnsw.ef_search`` a vector search of ``n`` results runs with: ``ef_search`` (None: ``n``) within 40..EF_SEARCH_MAX."""
    return min(max(ef_search or n, 40), EF_SEARCH_MAX)


def limit_query(query: str) -> str:
    """``query`` cut to ``MAX_QUERY_CHARS`` characters and ``MAX_QUERY_TERMS`` terms, its runs of negations
    to ``MAX_QUERY_NEGATIONS`` (``limit_negations``); unchanged when within every limit."""
    cut = query[:MAX_QUERY_CHARS]
    terms = cut.split()
    if len(terms) > MAX_QUERY_TERMS:
        cut = " ".join(terms[:MAX_QUERY_TERMS])
    return limit_negations(cut)


# A run of negations: a '-' where websearch_to_tsquery may read a word (at the start, or after whitespace, NUL,
# one of !&|()< or a quote; after anything else it is part of a word), then every '-', whitespace, NUL and
# !&|()< up to the next word or quote. Python's whitespace holds every character Postgres skips there, in
# any locale (its own: the six ASCII spaces under C.UTF-8), so a run is never shorter than Postgres's.
_SKIPPED = r"\s\x00!&|()<"
_NEGATION_RUN = re.compile(rf'(?<![^{_SKIPPED}"])-[-{_SKIPPED}]*')


def _fewer_negations(run: re.Match) -> str:
    text = run.group()
    extra = text.count("-") - MAX_QUERY_NEGATIONS
    if extra <= 0:
        return text
    parts = text.split("-")  # parts[0] is empty: a run starts with its first '-'
    keep = MAX_QUERY_NEGATIONS - extra % 2  # the run's parity: NOT NOT x is x
    return "-".join(parts[: keep + 1]) + "".join(parts[keep + 1 :])


def limit_negations(query: str) -> str:
    """``query`` with every run of more than ``MAX_QUERY_NEGATIONS`` negations cut to its first
    ``MAX_QUERY_NEGATIONS`` or one fewer, whichever has the run's parity (the skipped characters between
    them kept); unchanged when no run is longer. The bound Postgres's tsquery parser needs (see the constant)."""
    return _NEGATION_RUN.sub(_fewer_negations, query) if "-" in query else query
