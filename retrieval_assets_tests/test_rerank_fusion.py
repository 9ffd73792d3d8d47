"""The rerank that adds evidence: the reranker's list mixed with the fused list by rank or by score (rerank.blend)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_assets.params import DEFAULT, RERANK_FUSION, RetrievalParams
from retrieval_assets.search.fusion import fuse
from retrieval_assets.search.rerank import blend, competition_ranks
from retrieval_assets.types import Hit, Ranked

scores = st.lists(st.integers(0, 6).map(float), min_size=1, max_size=12)  # small integers: ties are common
weights = st.sampled_from([0.0, 0.1, 0.3, 0.5, 0.7, 0.9])


def pool(rerank_scores, fused_scores):
    """The reranker's list (best first) and the first stage's fused score per chunk, chunk i at fused position i."""
    ids = [f"c{i}" for i in range(len(rerank_scores))]
    order = sorted(range(len(ids)), key=lambda i: (-rerank_scores[i], i))
    return [Ranked(ids[i], rerank_scores[i], r, (i + 1,)) for r, i in enumerate(order, 1)], dict(zip(ids, fused_scores))


def test_competition_ranks_share_the_best_rank():
    assert list(competition_ranks([3.0, 5.0, 3.0, 1.0])) == [2, 1, 2, 4]
    assert list(competition_ranks([2.0, 2.0])) == [1, 1] and len(competition_ranks([])) == 0


def test_rank_fusion_by_hand():
    reranked = [Ranked("c", 9.0, 1, (3,)), Ranked("b", 5.0, 2, (2,)), Ranked("a", 1.0, 3, (1,))]
    fused = {"a": 1.0, "b": 0.6, "c": 0.0}
    mixed = blend(reranked, fused, 0.5, "rrf", rrf_k=60)  # a 0.5/63 + 0.5/61, b 0.5/62 + 0.5/62, c 0.5/61 + 0.5/63
    assert [r.chunk_id for r in mixed] == ["a", "c", "b"]  # a ties c on score: the fused order decides
    assert mixed[2].score == pytest.approx(1 / 62) and mixed[0].score == pytest.approx(0.5 / 61 + 0.5 / 63)
    assert [r.chunk_id for r in blend(reranked, fused, 0.9, "rrf", rrf_k=0)] == ["c", "b", "a"]
    with pytest.raises(ValueError, match="unknown rerank fusion 'mean'"):
        blend(reranked, fused, 0.5, "mean")


@settings(max_examples=300, deadline=None)
@given(st.data(), scores, weights, st.sampled_from(RERANK_FUSION))
def test_blend_properties(data, fused_scores, weight, method):
    n = len(fused_scores)
    fused_scores = sorted(fused_scores, reverse=True)  # chunk i is at fused position i
    rerank_scores = data.draw(st.lists(st.integers(0, 6).map(float), min_size=n, max_size=n))
    reranked, fused = pool(rerank_scores, fused_scores)
    out = blend(reranked, fused, weight, method)
    assert sorted(r.chunk_id for r in out) == sorted(fused) and [r.rank for r in out] == list(range(1, n + 1))
    # a reranker that ties everything leaves the fused order as it was: the first stage's first stays first
    tied, _ = pool([1.0] * n, fused_scores)
    assert [r.chunk_id for r in blend(tied, fused, weight, method)] == [f"c{i}" for i in range(n)]
    # a chunk first on both lists stays first
    if rerank_scores[0] == max(rerank_scores) and weight > 0:
        assert out[0].chunk_id == "c0"
    # monotone: raising one chunk's reranker score never moves it down
    j = data.draw(st.integers(0, n - 1))
    raised = list(rerank_scores)
    raised[j] += data.draw(st.integers(1, 4))
    before = [r.chunk_id for r in out].index(f"c{j}")
    after = [r.chunk_id for r in blend(pool(raised, fused_scores)[0], fused, weight, method)].index(f"c{j}")
    assert after <= before


def test_weight_zero_is_the_fused_order_weight_one_the_reranker():
    reranked, fused = pool([0.0, 3.0, 1.0, 2.0], [4.0, 3.0, 2.0, 1.0])
    for method in RERANK_FUSION:
        assert [r.chunk_id for r in blend(reranked, fused, 0.0, method)] == ["c0", "c1", "c2", "c3"]
        assert blend(reranked, fused, 1.0, method) == reranked


def test_parameters_name_the_bad_value():
    with pytest.raises(ValueError, match=r"rerank_fusion must be one of minmax, rrf, got 'rank'"):
        RetrievalParams(rerank_fusion="rank")
    for bad in (-0.1, 1.5, True, "0.5"):
        with pytest.raises(ValueError, match=r"sparse_weight must be a number within \[0, 1\]"):
            RetrievalParams(sparse_weight=bad)
    assert "fused by rank 0.3" in DEFAULT.with_(rerank_fusion="rrf", rerank_weight=0.3).describe()
    assert "SPLADE 0.2" in DEFAULT.with_(sparse_weight=0.2).describe() and "SPLADE" not in DEFAULT.describe()


def test_three_lists_fuse_with_the_sparse_weight():
    vector, lexical, learned = ([Hit(c, s, r) for r, (c, s) in enumerate(lst, 1)] for lst in
                                ([("a", 0.9), ("b", 0.5)], [("b", 3.0), ("c", 1.0)], [("c", 2.0), ("d", 1.0)]))
    two = fuse([vector, lexical], DEFAULT.with_(fusion="rrf", weights=(1.0, 1.0)))
    assert all(len(r.ranks) == 2 for r in two)
    three = fuse([vector, lexical, learned], DEFAULT.with_(fusion="rrf", weights=(1.0, 1.0), sparse_weight=1.0))
    assert [r.chunk_id for r in three][:2] == ["b", "c"] and dict((r.chunk_id, r.ranks) for r in three)["d"] == (None, None, 2)
