"""The staged rule's candidates and the scorer it is fitted with, shared by the product and the benchmarks.

Contract: a stage is a function ``current config -> candidate configs`` (``crossval.choose``). ``NO_FEEDBACK`` is
the rule ``params.DEFAULT`` came from: ``first_stages`` (lexical list x fusion x vector weight, no rerank, no MMR),
then ``evidence_stage`` (the query-dependent fusion weight, ``params.evidence_shift``; ``BEFORE_EVIDENCE`` is the rule
without it), then ``rerank_stage`` (the BM25 rerank: pool's or corpus idf, blended by score or by rank, weight 0.1..1), then
``mmr_stage``. ``config_of(params)`` and ``params_of(config, base)`` convert between a config and
``RetrievalParams`` over ``FIELDS``; ``describe`` names a config in one line. ``Scorer`` gives per-query nDCG@k
of any config on one indexed setting, each query's first-stage lists searched once and the pool's rows fetched once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from retrieval_assets.evaluation import benchmark, crossval
from retrieval_assets.evaluation.metrics import ndcg_at_k, recall_at_k
from retrieval_assets.index.splade import SpladeEncoder
from retrieval_assets.params import FUSION, LEXICAL, RERANK_FUSION, RERANK_IDF, RetrievalParams, limit_query
from retrieval_assets.search import bm25_rank, pipeline
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker

ALPHAS = tuple(round(a, 1) for a in np.linspace(0, 1, 11))
BASE = crossval.config(rerank=False, mmr_lambda=None)
# the parameters the rule chooses among (the benchmarks' feedback stages add prf_*)
FIELDS = ("lexical", "fusion", "weights", "rerank", "rerank_weight", "rerank_fusion", "rerank_idf", "mmr_lambda", "sparse_weight",
          "evidence_shift", "doc_weight")
SHIFTS = (0.25, 0.5, 0.75, 1.0)  # evidence_stage's shares of the lexical weight that may move to the vector list


def first_stages(_current: crossval.Config) -> list[crossval.Config]:
    return [crossval.merged(BASE, crossval.config(lexical=lex, fusion=f, weights=(a, round(1 - a, 1))))
            for lex in LEXICAL for f in FUSION for a in ALPHAS]


def evidence_stage(current: crossval.Config) -> list[crossval.Config]:
    """The query-dependent fusion weight, for the bm25 list (the one with a ceiling, ``fusion.lexical_evidence``)."""
    return [crossval.config(evidence_shift=s) for s in SHIFTS] if dict(current).get("lexical") == "bm25" else []


def rerank_stage(_current: crossval.Config, fusions=RERANK_FUSION) -> list[crossval.Config]:
    return [crossval.config(rerank=True, rerank_weight=w, rerank_idf=idf, rerank_fusion=f) for f in fusions for idf in RERANK_IDF
            for w in ALPHAS[1:]]


def _second_stage(current: crossval.Config) -> dict:
    """What a stage after the rerank adds to ``current``: the rerank switched on at weight 0 (the fused order) if off."""
    return {} if dict(current).get("rerank") else {"rerank": True, "rerank_weight": 0.0}


def document_stage(current: crossval.Config) -> list[crossval.Config]:
    """Document evidence after the rerank (``documents.blend``), weight 0.1..1; the rerank switched on at weight 0 if off."""
    return [crossval.config(doc_weight=w, **_second_stage(current)) for w in ALPHAS[1:]]


def mmr_stage(current: crossval.Config) -> list[crossval.Config]:
    return [crossval.config(mmr_lambda=lam, **_second_stage(current)) for lam in (0.5, 0.7, 0.9)]


NO_FEEDBACK = (first_stages, evidence_stage, rerank_stage, document_stage, mmr_stage)  # the rule, without the feedback stages
BEFORE_EVIDENCE = (first_stages, rerank_stage, document_stage, mmr_stage)  # the rule without evidence_shift's stage
BEFORE_DOCUMENTS = (first_stages, evidence_stage, rerank_stage, mmr_stage)  # the rule without doc_weight's stage


def config_of(params: RetrievalParams) -> crossval.Config:
    """``params`` as a config over ``FIELDS``."""
    return crossval.config(**{f: getattr(params, f) for f in FIELDS})


def params_of(cfg: crossval.Config, base: RetrievalParams) -> RetrievalParams:
    """``base`` with ``cfg`` applied (validated)."""
    return base.with_(**dict(cfg))


def describe(cfg: crossval.Config) -> str:
    v = dict(cfg)
    parts = [f"{v['lexical']} {v['fusion']} w_vec={v['weights'][0]:g}"]
    if v.get("sparse_weight"):
        parts[0] += f" w_splade={v['sparse_weight']:g}"
    if v.get("evidence_shift"):
        parts[0] += f" shift={v['evidence_shift']:g}"
    if v.get("rerank") and v.get("rerank_weight", 1.0) > 0:
        parts.append(f"rerank({v.get('rerank_idf', 'pool')} idf{', by rank' if v.get('rerank_fusion') == 'rrf' else ''}) w={v['rerank_weight']:g}")
    if v.get("rerank") and v.get("doc_weight"):
        parts.append(f"doc evidence w={v['doc_weight']:g}")
    if v.get("prf_docs") and v.get("prf_weight", 0.5) > 0:
        parts.append(f"RM3({v['prf_docs']} docs, {v.get('prf_terms', 10)} terms, w={v.get('prf_weight', 0.5):g})")
    if v.get("prf_docs") and v.get("prf_beta"):
        parts.append(f"Rocchio({v['prf_docs']} docs, beta={v['prf_beta']:g})")
    if v.get("mmr_lambda") is not None:
        parts.append(f"MMR {v['mmr_lambda']:g}")
    return " + ".join(parts)


class Scorer:
    """Per-query nDCG@k of a config over one indexed setting: first-stage lists and pool rows fetched once.

    ``search``: the index's own retriever (``pipeline.retriever``), whose vector-search choice (ef_search, exact
    scan) the scored runs keep; None: the HNSW graph as built. ``chunk_doc``: score documents (a document at its
    best chunk) instead of chunks."""

    def __init__(self, conn, schema: str, embedder, chunks, queries: list[str], relevant: list[set[str]], base: RetrievalParams,
                 *, splade: SpladeEncoder | None = None, chunk_doc: dict[str, str] | None = None, k: int = 10, depth: int = 100,
                 search: pipeline.Retriever | None = None):
        self.conn, self.schema, self.embedder, self.queries, self.relevant = conn, schema, embedder, queries, relevant
        self.base, self.chunk_doc, self.k, self.depth = base, chunk_doc, k, depth
        stats = CorpusStats.from_texts([c.text for c in chunks])
        # splade: the encoder whose vectors were synced into the schema's splade table (None: no SPLADE list)
        template = search or pipeline.Retriever(schema, embedder)
        self.retrievers = {idf: dataclasses.replace(template, reranker=reranker, corpus_idf=False, sparse=splade)
                           for idf, reranker in (("corpus", LexicalReranker(corpus=stats)), ("pool", LexicalReranker()))}
        self.traces: dict[tuple, pipeline.Trace] = {}  # by pipeline.first_stage_key
        self.rows: dict = {}

    def ranked(self, cfg: crossval.Config, i: int) -> list[str]:
        params = self.base.with_(**dict(cfg))
        key = pipeline.first_stage_key(self.queries[i], params)  # what the first-stage lists depend on
        if params.bm25_feedback and not params.vector_feedback and key not in self.traces:
            # RM3 alone changes only the BM25 list: the vector list and query vector of the run without
            # feedback, the BM25 list as hybrid.first_stage computes it (test_prf checks they are equal)
            plain_params = params.with_(prf_docs=0)
            plain = self.traces.get(pipeline.first_stage_key(self.queries[i], plain_params)) or self.trace(i, plain_params)
            expanded = bm25_rank.expanded_search(self.conn, self.schema, limit_query(self.queries[i]), params.n, docs=params.prf_docs,
                                                 terms=params.prf_terms, weight=params.prf_weight)
            self.traces[key] = pipeline.Trace(plain.query_vector, plain.vector, expanded, [], [], [])
        trace = pipeline.run(self.conn, self.retrievers[params.rerank_idf], self.queries[i], params,
                             first_stage=self.traces.get(key), rows=self.rows)
        self.traces.setdefault(key, trace)
        ids = [r.chunk_id for r in trace.final]
        return benchmark.to_documents(ids, self.chunk_doc, self.depth) if self.chunk_doc else ids

    def trace(self, i: int, params: RetrievalParams) -> pipeline.Trace:
        """The run of query ``i`` without feedback, kept as the first stage of every later run."""
        trace = pipeline.run(self.conn, self.retrievers[params.rerank_idf], self.queries[i], params, rows=self.rows)
        self.traces[pipeline.first_stage_key(self.queries[i], params)] = trace
        return trace

    def ndcg(self, cfg: crossval.Config) -> np.ndarray:
        return np.array([ndcg_at_k(self.ranked(cfg, i), rel, self.k) for i, rel in enumerate(self.relevant)])

    def recall(self, cfg: crossval.Config, depth: int) -> np.ndarray:
        return np.array([recall_at_k(self.ranked(cfg, i), rel, depth) for i, rel in enumerate(self.relevant)])
