"""Evaluation on external benchmarks: our pipelines and a bm25s peer as document rankers.

Contract: a ranker is ``query text -> ranked doc ids``; ``pipeline_rankers`` gives ours (vector,
the lexical list, hybrid RRF, + BM25 rerank, + MMR) for either lexical list over a chunk
table, mapping chunk hits to documents by first occurrence (a document ranks where its best
chunk ranks); ``bm25s_ranker`` is the peer baseline; ``evaluate_rankers`` scores any dict of
rankers with ``metrics.ndcg_at_k``, ``metrics.recall_at_k`` and ``metrics.mrr`` (MRR over the
whole list, i.e. to ``depth``); ``trec_eval_check`` recomputes the same numbers with pytrec_eval.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psycopg

from retrieval_assets.index import chunker, store

from retrieval_assets.search import pipeline
from retrieval_assets.corpus.datasets import Benchmark
from retrieval_assets.index.embed import Embedder
from retrieval_assets.evaluation.metrics import mrr, ndcg_at_k, recall_at_k
from retrieval_assets.params import LEXICAL, SEED, RetrievalParams
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker
from retrieval_assets.types import Chunk, Document

Ranker = Callable[[str], Sequence[str]]

# Cranfield's pipeline: the seed's, with 300 chunks from each first-stage list and in the fused rerank pool, all returned
CRANFIELD = SEED.with_(k=300, n=300)


def chunk_documents(documents: Sequence[Document], *, max_chars: int = 1200, overlap: int = 1) -> list[Chunk]:
    return [c for d in documents for c in chunker.chunk(d, max_chars=max_chars, overlap=overlap)]


def index_benchmark(conn: psycopg.Connection, schema: str, bench: Benchmark, embedder: Embedder, *, max_chars: int = 1200,
                    overlap: int = 1) -> tuple[list[Chunk], store.SyncReport]:
    """Chunk and ``store.sync`` the benchmark's documents into ``schema``.

    Returns ``(chunks, sync report)``. Re-running re-embeds nothing that is stored.
    """
    chunks = chunk_documents(bench.documents, max_chars=max_chars, overlap=overlap)
    store.create(conn, schema, embedder.dims)
    report = store.sync(conn, schema, chunks, embedder)
    return chunks, report


def to_documents(chunk_ids: Iterable[str], chunk_doc: Mapping[str, str], depth: int) -> list[str]:
    """Chunk ranking -> document ranking: each document at its first (best) chunk, up to ``depth``."""
    out: list[str] = []
    seen: set[str] = set()
    for cid in chunk_ids:
        doc = chunk_doc.get(cid)
        if doc is not None and doc not in seen:
            seen.add(doc)
            out.append(doc)
            if len(out) == depth:
                break
    return out


def pipeline_names(lexical: str = "ts_rank_cd", *, vector: bool = True) -> list[str]:
    """The ranker names ``pipeline_rankers`` returns, in order."""
    hybrid_name = f"hybrid({lexical})"
    return [*(["vector"] if vector else []), lexical, hybrid_name, f"{hybrid_name} + rerank", f"{hybrid_name} + rerank + MMR"]


def pipeline_rankers(conn: psycopg.Connection, schema: str, embedder: Embedder, chunks: Sequence[Chunk], *,
                     params: RetrievalParams = CRANFIELD, corpus_idf: bool | None = None, depth: int = 100,
                     vector: bool = True) -> dict[str, Ranker]:
    """Our rankers for one lexical list (``params.lexical``), all read from one ``pipeline.run`` per query (cached).

    Names (``pipeline_names``): ``vector``, the lexical list alone (``ts_rank_cd`` or ``bm25``,
    i.e. ``hybrid.lexical_search``), ``hybrid(<lexical>)`` (RRF of the two), ``+ rerank`` (the
    BM25 ``LexicalReranker`` over the whole fused pool) and ``+ rerank + MMR`` (over the whole
    reranked pool). The reranker's idf comes from the pool, or from every chunk with
    ``corpus_idf`` (default: only with ``lexical="bm25"``, the pairing ``eval_run`` uses).
    ``params.n`` chunks are taken from each first-stage list and from the fused pool (``params.k``
    should equal it); every list is then mapped to documents and cut at ``depth``.
    """
    chunk_doc = {c.chunk_id: c.doc_id for c in chunks}
    use_corpus = params.lexical == "bm25" if corpus_idf is None else corpus_idf
    stats = CorpusStats.from_texts([c.text for c in chunks]) if use_corpus else None
    retriever = pipeline.retriever(conn, schema, embedder, params, reranker=LexicalReranker(corpus=stats))

    @functools.lru_cache(maxsize=1)
    def traced(query: str) -> pipeline.Trace:
        return pipeline.run(conn, retriever, query, params)

    def ranker(stage: str) -> Ranker:
        return lambda query: to_documents((h.chunk_id for h in getattr(traced(query), stage)), chunk_doc, depth)

    stages = [*(["vector"] if vector else []), "text", "fused", "reranked", "final"]
    return dict(zip(pipeline_names(params.lexical, vector=vector), map(ranker, stages)))


def our_rankers(conn: psycopg.Connection, schema: str, embedder: Embedder, chunks: Sequence[Chunk], *,
                params: RetrievalParams = CRANFIELD, lexicals: Sequence[str] = LEXICAL, depth: int = 100) -> dict[str, Ranker]:
    """``pipeline_rankers`` for every lexical list (``vector`` once)."""
    out: dict[str, Ranker] = {}
    for i, lexical in enumerate(lexicals):
        out.update(pipeline_rankers(conn, schema, embedder, chunks, params=params.with_(lexical=lexical), depth=depth, vector=i == 0))
    return out


def params_ranker(conn: psycopg.Connection, schema: str, embedder: Embedder, chunks: Sequence[Chunk], params: RetrievalParams, *,
                  depth: int = 100) -> Ranker:
    """The final list of ``pipeline.run`` under ``params`` (its reranker from ``pipeline.retriever``), as documents."""
    chunk_doc = {c.chunk_id: c.doc_id for c in chunks}
    retriever = pipeline.retriever(conn, schema, embedder, params)
    return lambda query: to_documents((r.chunk_id for r in pipeline.run(conn, retriever, query, params).final), chunk_doc, depth)


def bm25s_ranker(documents: Sequence[Document], *, k1: float = 1.2, b: float = 0.75, depth: int = 100) -> Ranker:
    """The peer baseline: bm25s (Lucene BM25) with English stop words and PyStemmer's English stemmer."""
    try:
        import bm25s
        import Stemmer
    except ImportError as exc:
        raise RuntimeError(f"the bm25s peer needs bm25s and PyStemmer (dev dependencies: `uv sync`): {exc}") from exc
    stemmer = Stemmer.Stemmer("english")
    ids = [d.doc_id for d in documents]
    tokens = bm25s.tokenize([d.text for d in documents], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(tokens, show_progress=False)
    vocab = model.vocab_dict
    limit = min(depth, len(ids))

    def rank(query: str) -> list[str]:
        q = bm25s.tokenize([query], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)[0]
        if not any(t in vocab for t in q) or limit == 0:
            return []
        found, scores = model.retrieve([q], k=limit, show_progress=False, n_threads=1)
        return [ids[i] for i, s in zip(found[0], scores[0]) if s > 0]

    return rank


@dataclass(frozen=True)
class RankerScores:
    name: str
    queries: int
    ndcg: float  # nDCG@k, binary gains
    recall: float  # recall@depth
    mrr: float  # reciprocal rank over the whole list (to depth)
    seconds: float  # wall time of all its queries (a shared trace is charged to the first ranker)
    runs: dict[str, list[str]] = field(repr=False, default_factory=dict)
    per_query: dict[str, tuple[float, float, float]] = field(repr=False, default_factory=dict)


def evaluate_rankers(bench: Benchmark, rankers: Mapping[str, Ranker], *, k: int = 10, depth: int = 100,
                     progress: Callable[[str], None] | None = None) -> dict[str, RankerScores]:
    """Score every ranker on every query with a relevant document (binary relevance)."""
    rel = bench.relevant()
    qids = [q for q in bench.queries if q in rel]
    runs: dict[str, dict[str, list[str]]] = {name: {} for name in rankers}
    seconds = dict.fromkeys(rankers, 0.0)
    for i, qid in enumerate(qids, 1):
        for name, fn in rankers.items():
            start = time.perf_counter()
            runs[name][qid] = list(fn(bench.queries[qid]))[:depth]
            seconds[name] += time.perf_counter() - start
        if progress and (i % 25 == 0 or i == len(qids)):
            progress(f"{i}/{len(qids)} queries")
    out = {}
    for name in rankers:
        per_query = {
            qid: (ndcg_at_k(ranked, rel[qid], k), recall_at_k(ranked, rel[qid], depth), mrr(ranked, rel[qid]))
            for qid, ranked in runs[name].items()
        }
        mean = lambda i: sum(v[i] for v in per_query.values()) / len(per_query) if per_query else 0.0  # noqa: E731
        out[name] = RankerScores(name, len(per_query), mean(0), mean(1), mean(2), seconds[name], runs[name], per_query)
    return out


def trec_eval_check(bench: Benchmark, scores: Mapping[str, RankerScores], *, k: int = 10, depth: int = 100) -> dict[str, float]:
    """Largest per-query difference, per ranker, between our metrics and pytrec_eval's
    ``ndcg_cut_k``, ``recall_depth`` and ``recip_rank`` on the same runs and binary qrels."""
    import pytrec_eval

    rel = bench.relevant()
    qrels = {qid: {d: int(g > 0) for d, g in bench.qrels[qid].items()} for qid in rel}
    measures = {f"ndcg_cut_{k}", f"recall_{depth}", "recip_rank"}
    out = {}
    for name, s in scores.items():
        # strictly decreasing scores so trec_eval keeps our order (it sorts by score, then doc id)
        run = {qid: {d: float(len(ranked) - i) for i, d in enumerate(ranked)} for qid, ranked in s.runs.items() if ranked}
        theirs = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
        worst = 0.0
        for qid, ours in s.per_query.items():
            t = theirs.get(qid, {})  # trec_eval leaves out queries with an empty run: all zero
            expected = (t.get(f"ndcg_cut_{k}", 0.0), t.get(f"recall_{depth}", 0.0), t.get("recip_rank", 0.0))
            worst = max(worst, *(abs(a - b) for a, b in zip(ours, expected)))
        out[name] = worst
    return out


def markdown_table(rows: Sequence[tuple[str, RankerScores]], *, k: int = 10, depth: int = 100) -> str:
    """``| embedder | ranker | queries | nDCG@k | recall@depth | MRR | seconds |`` rows."""
    lines = [f"| embedder | ranker | queries | nDCG@{k} | recall@{depth} | MRR | seconds |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, s in rows:
        lines.append(f"| {label} | {s.name} | {s.queries} | {s.ndcg:.3f} | {s.recall:.3f} | {s.mrr:.3f} | {s.seconds:.1f} |")
    return "\n".join(lines)
