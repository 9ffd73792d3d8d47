"""Document evidence in the second stage (search.documents, params.doc_weight) and the rule's tie-break toward the
committed default (crossval.choose's prior)."""

from __future__ import annotations

import numpy as np
import pytest

from retrieval_assets.evaluation import crossval, staged_rule
from retrieval_assets.params import DEFAULT, RetrievalParams
from retrieval_assets.search import documents, pipeline
from retrieval_assets.types import Chunk, Hit, Ranked


def pool(items):
    """``(chunk_id, doc_id, fused score, lexical score or None)`` best first: the ranked pool, its chunks, the lexical list."""
    ranked = [Ranked(cid, score, rank, (rank,)) for rank, (cid, _, score, _) in enumerate(items, 1)]
    chunks = {cid: Chunk(cid, doc, "", 0, 1, "t") for cid, doc, _, _ in items}
    lexical = sorted(((cid, lex) for cid, _, _, lex in items if lex is not None), key=lambda p: -p[1])
    return ranked, chunks, [Hit(cid, s, r) for r, (cid, s) in enumerate(lexical, 1)]


def test_weight_zero_is_the_order_as_it_was():
    ranked, chunks, lexical = pool([("a1", "A", 0.9, 2.0), ("b1", "B", 0.8, 1.5), ("b2", "B", 0.1, 1.5)])
    assert documents.blend(ranked, chunks, lexical, 0.0) == ranked
    assert documents.blend([], {}, lexical, 0.5) == []


def test_a_document_matching_in_more_chunks_rises():
    ranked, chunks, lexical = pool([("a1", "A", 0.9, 2.0), ("b1", "B", 0.8, 1.5), ("c1", "C", 0.5, None), ("b2", "B", 0.1, 1.5)])
    assert documents.evidence(ranked, chunks, lexical).tolist() == [2.0, 3.0, 0.0, 3.0]  # B: 1.5 + 1.5, C outside the list
    out = documents.blend(ranked, chunks, lexical, 0.5)
    # b1: 0.5 * 0.875 + 0.5 * 1 beats a1: 0.5 * 1 + 0.5 * 2 / 3; b2 (0 + 0.5) passes c1 (0.5 * 0.5 + 0)
    assert [r.chunk_id for r in out] == ["b1", "a1", "b2", "c1"] and [r.rank for r in out] == [1, 2, 3, 4]
    assert out[0].score == pytest.approx(0.5 * 0.7 / 0.8 + 0.5) and out[0].ranks == (2,)
    assert [r.chunk_id for r in documents.blend(ranked, chunks, lexical, 1.0)] == ["b1", "b2", "a1", "c1"]  # evidence alone, ties in order


def test_ties_keep_the_order_they_came_in():
    ranked, chunks, lexical = pool([(f"c{i}", f"D{i}", 1.0, 1.0) for i in range(5)])
    assert [r.chunk_id for r in documents.blend(ranked, chunks, lexical, 0.4)] == [f"c{i}" for i in range(5)]
    ranked, chunks, lexical = pool([("x", "D", 0.5, None), ("y", "D", 0.5, None)])  # no lexical evidence at all
    assert [r.chunk_id for r in documents.blend(ranked, chunks, lexical, 0.7)] == ["x", "y"]


def test_doc_weight_is_validated_and_described():
    for bad in (-0.1, 1.5, True, "0.3", None):
        with pytest.raises(ValueError, match=r"doc_weight must be a number within \[0, 1\]"):
            RetrievalParams(doc_weight=bad)
    assert DEFAULT.doc_weight == 0 and "document evidence" not in DEFAULT.describe()
    assert "document evidence 0.3" in DEFAULT.with_(doc_weight=0.3).describe()
    cfg = staged_rule.config_of(DEFAULT.with_(doc_weight=0.3))
    assert "doc evidence w=0.3" in staged_rule.describe(cfg) and staged_rule.params_of(cfg, DEFAULT).doc_weight == 0.3


def test_the_document_stage_offers_every_weight_and_switches_the_rerank_on():
    off = staged_rule.document_stage(crossval.config(rerank=False))
    assert [dict(c)["doc_weight"] for c in off] == list(staged_rule.ALPHAS[1:]) and all(dict(c)["rerank_weight"] == 0 for c in off)
    assert "rerank_weight" not in dict(staged_rule.document_stage(crossval.config(rerank=True))[0])


def test_pipeline_applies_the_blend_after_the_rerank(indexed, schema):
    conn, embedder, _ = indexed
    retriever = pipeline.retriever(conn, schema, embedder, DEFAULT)
    for query in ("how is the HNSW graph built", "reciprocal rank fusion of lexical and vector lists"):
        plain = pipeline.run(conn, retriever, query, DEFAULT)
        on = pipeline.run(conn, retriever, query, DEFAULT.with_(doc_weight=0.5))
        expected = documents.blend(plain.reranked, plain.chunks, plain.text, 0.5)
        assert on.reranked == expected and on.final == expected[: DEFAULT.k] and on.fused == plain.fused
        assert {chunk.doc_id for chunk in on.chunks.values()} and len(on.final) == DEFAULT.k
    # with MMR the blended pool is what MMR reorders; without the rerank the field has nothing to act on
    off = pipeline.run(conn, retriever, "graph", DEFAULT.with_(rerank=False, doc_weight=0.5))
    assert off.final == pipeline.run(conn, retriever, "graph", DEFAULT.with_(rerank=False)).final


A, B, C = crossval.config(x=1), crossval.config(x=2), crossval.config(x=3)


def test_the_rule_keeps_the_committed_default_unless_clearly_beaten():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.3, 0.7, 60)
    noise = rng.normal(0, 0.1, 60)
    table = {A: base, B: base + noise - noise.mean() + 0.005, C: base + 0.05}  # B: 0.005 better on average, noisy; C: clearly
    s = crossval.Setting("d", "e", lambda cfg: np.asarray(table[cfg], dtype=float))
    train = {"d": np.arange(60)}
    assert crossval.choose([s], (lambda _: [A, B],), train) == B  # without the prior: the higher mean
    assert crossval.choose([s], (lambda _: [A, B],), train, prior=A) == A  # within its noise: the default stays
    assert crossval.choose([s], (lambda _: [A, B, C],), train, prior=A) == C
    assert not crossval.clearly_better([s], B, A, train) and crossval.clearly_better([s], C, A, train)
    held = crossval.cross_validate([s], (lambda _: [A, B],), {"d": crossval.folds(60, 3)}, {"d": 60}, prior=A)["e"]
    assert held.picks == (A, A, A)
