"""Stage 04: BM25 over the candidates, MMR, and the rerank pipeline on the golden set."""

import math

import numpy as np
import pytest

from retrieval_assets.search import hybrid, pipeline
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.evaluation.evaluate import evaluate_pipelines
from retrieval_assets.params import RetrievalParams
from retrieval_assets.search.pipeline import Retriever
from retrieval_assets.search.rerank import LexicalReranker, mmr
from retrieval_assets.types import Chunk, Ranked


def chunks_of(*texts):
    return [Chunk(f"c{i}", "d", "", 0, len(t), t) for i, t in enumerate(texts)]


def test_bm25_matches_hand_computed_scores():
    # N = 3, lengths 2, 3, 1 (avg 2); query terms c (df 1) and a (df 2)
    idf_c = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    idf_a = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    k1, b = 1.2, 0.75
    norm = lambda length: k1 * (1 - b + b * length / 2)  # noqa: E731
    expected = [
        idf_a * 1 * (k1 + 1) / (1 + norm(2)),
        idf_a * 1 * (k1 + 1) / (1 + norm(3)) + idf_c * 2 * (k1 + 1) / (2 + norm(3)),
        0.0,
    ]
    got = LexicalReranker().scores("C a c", ["a b", "A c c", "d"])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert expected[1] == pytest.approx(1.572561, abs=1e-6)
    ranked = LexicalReranker().rerank("C a c", chunks_of("a b", "A c c", "d"), top_k=3)
    assert [r.chunk_id for r in ranked] == ["c1", "c0", "c2"] and [r.rank for r in ranked] == [1, 2, 3]
    assert ranked[0].ranks == (2,)


def test_rare_term_outranks_common_term():
    texts = ["postgres index tuning", "postgres vacuum", "postgres replication", "postgres hnsw graph"]
    ranked = LexicalReranker().rerank("postgres hnsw", chunks_of(*texts), top_k=4)
    assert ranked[0].chunk_id == "c3"


def test_ties_keep_input_order_and_empty_inputs():
    ranked = LexicalReranker().rerank("zebra", chunks_of("a", "b", "c"), top_k=3)
    assert [r.chunk_id for r in ranked] == ["c0", "c1", "c2"]
    assert LexicalReranker().rerank("", chunks_of("a"), top_k=1)[0].score == 0.0
    assert LexicalReranker().rerank("x", [], top_k=5) == []


P1 = "Reciprocal rank fusion adds one over sixty plus the rank for every list that holds a chunk."
P2 = "Because only positions matter, the raw scores of the two retrievers never need calibrating."
P3 = "The constant sixty damps the advantage of the very first positions."
P4 = "A weighted variant multiplies each list's contribution by a tuned factor."
P5 = "Cross-encoders read the query and the passage together and cost far more per pair."


def test_mmr_drops_a_near_duplicate_that_pure_relevance_keeps():
    candidates = [Ranked("first", 3.0, 1, (1,)), Ranked("near-dup", 2.9, 2, (2,)), Ranked("other", 2.6, 3, (3,))]
    texts = [f"{P1}\n\n{P2}\n\n{P3}", f"{P1}\n\n{P2}\n\n{P4}", P5]
    e = HashEmbedder()
    vectors = e.embed(texts)
    query_vec = e.embed(["rank fusion"])[0]
    diverse = mmr(query_vec, candidates, vectors, lam=0.7, top_k=2)
    assert [r.chunk_id for r in diverse] == ["first", "other"]
    assert [r.score for r in diverse] == [3.0, 2.6] and [r.rank for r in diverse] == [1, 2]
    pure = mmr(query_vec, candidates, vectors, lam=1.0, top_k=2)
    assert [r.chunk_id for r in pure] == ["first", "near-dup"]


def test_mmr_relevance_scaling_and_cosine_fallback():
    vectors = np.eye(3)
    # all scores equal: relevance is the cosine to the query vector
    equal = [Ranked(f"c{i}", 5.0, i + 1, (i + 1,)) for i in range(3)]
    assert mmr(np.array([0.0, 0.0, 1.0]), equal, vectors, lam=0.7, top_k=1)[0].chunk_id == "c2"
    # negative scores: min-max scaling; the best stays first
    negative = [Ranked("a", -1.0, 1, (1,)), Ranked("b", -5.0, 2, (2,)), Ranked("c", -3.0, 3, (3,))]
    assert [r.chunk_id for r in mmr(np.ones(3), negative, vectors, lam=1.0, top_k=3)] == ["a", "c", "b"]
    # ties go to the earlier candidate
    assert mmr(np.ones(3), equal, np.ones((3, 3)), lam=0.7, top_k=1)[0].chunk_id == "c0"
    assert mmr(np.ones(3), [], np.zeros((0, 3)), top_k=3) == []


def test_fetch_returns_chunks_and_embeddings(indexed, schema):
    conn, embedder, chunks = indexed
    got = pipeline.fetch(conn, schema, [chunks[0].chunk_id, chunks[5].chunk_id, "missing#000"])
    assert set(got) == {chunks[0].chunk_id, chunks[5].chunk_id}
    chunk, vec = got[chunks[5].chunk_id]
    assert chunk == chunks[5]
    np.testing.assert_allclose(vec, embedder.embed([chunks[5].text])[0], atol=1e-6)


def test_pipeline_stays_in_the_fused_pool_with_a_stable_prefix(indexed, schema):
    conn, embedder, _ = indexed
    retriever = Retriever(schema, embedder, LexicalReranker())
    for query in ["how is the HNSW graph built", "what did Benedek see on the plate", "  "]:
        pool = {r.chunk_id for r in hybrid.search(conn, schema, embedder, query, RetrievalParams(n=50, k=50))}
        ten = pipeline.run(conn, retriever, query, RetrievalParams(n=50, k=10)).final
        five = pipeline.run(conn, retriever, query, RetrievalParams(n=50, k=5)).final
        assert {r.chunk_id for r in ten} <= pool
        assert [r.chunk_id for r in five] == [r.chunk_id for r in ten][:5]
        assert [r.rank for r in ten] == list(range(1, len(ten) + 1))


class CountingEmbedder:
    """A HashEmbedder that records every batch it is asked to embed."""

    def __init__(self):
        self.inner = HashEmbedder()
        self.dims, self.name = self.inner.dims, self.inner.name
        self.calls: list[list[str]] = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return self.inner.embed(texts)


def test_pipeline_run_embeds_the_query_exactly_once(indexed, schema):
    conn, embedder, _ = indexed
    counting = CountingEmbedder()
    query = "how is the HNSW graph built"
    params = RetrievalParams(n=50, k=10, mmr_lambda=0.7)
    trace = pipeline.run(conn, Retriever(schema, counting, LexicalReranker()), query, params)
    # vector search, rerank and MMR all run on one embedding of the query; chunk vectors come from the table
    assert counting.calls == [[query]]
    assert trace.final and len(trace.reranked) > len(trace.final)
    np.testing.assert_array_equal(trace.query_vector, embedder.embed([query])[0])
    assert set(trace.chunks) == {r.chunk_id for r in trace.reranked}
    # the same result as the uncounted embedder
    plain = pipeline.run(conn, Retriever(schema, embedder, LexicalReranker()), query, params)
    assert [r.chunk_id for r in trace.final] == [r.chunk_id for r in plain.final]
    # an earlier trace's first stage is reused: no embedding at all
    again = pipeline.run(conn, Retriever(schema, counting, LexicalReranker()), query, params.with_(weights=(0.5, 1.0)),
                         first_stage=trace)
    assert counting.calls == [[query]]
    assert again.vector == trace.vector and again.text == trace.text


def test_reranking_raises_mrr_and_mmr_keeps_it_above_hybrid(indexed, schema, golden):
    conn, embedder, _ = indexed
    # with no reranker the "mmr" list is the fused top k
    hybrid_only = evaluate_pipelines(conn, Retriever(schema, embedder, None), golden).metrics["mmr"]
    reranked = evaluate_pipelines(conn, Retriever(schema, embedder, LexicalReranker()), golden,
                                  RetrievalParams(mmr_lambda=None)).metrics["mmr"]
    with_mmr = evaluate_pipelines(conn, Retriever(schema, embedder, LexicalReranker()), golden,
                                  RetrievalParams(mmr_lambda=0.7)).metrics["mmr"]
    assert reranked.mrr > hybrid_only.mrr
    assert with_mmr.mrr >= hybrid_only.mrr
