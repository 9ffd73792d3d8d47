"""Issue 37: the query-dependent fusion weight (params.evidence_shift, fusion.query_weights)."""

import pytest

from retrieval_assets.evaluation import staged_rule
from retrieval_assets.params import DEFAULT, FUSION, RetrievalParams
from retrieval_assets.search import bm25_rank, pipeline
from retrieval_assets.search.fusion import convex, fuse, lexical_evidence, query_weights, rrf
from retrieval_assets.types import Hit, ScoredList


def hits(*ids, ceiling=None):
    found = [Hit(cid, float(len(ids) - i), i + 1) for i, cid in enumerate(ids)]  # the top scores len(ids)
    return found if ceiling is None else ScoredList(found, ceiling)


VECTOR = hits(*"abcdefghij")
WEAK = hits(*"KLMNOPQRST", ceiling=1e9)  # its top matches almost none of the query's idf mass: evidence ~0
HALF = hits(*"abcdeVWXYZ", ceiling=20.0)  # top 10 of a ceiling of 20: evidence 0.5
STRONG = hits(*"abcdefghij", ceiling=10.0)  # top at the ceiling: evidence 1


def test_evidence_is_the_top_score_over_the_lists_ceiling():
    assert lexical_evidence(WEAK) == pytest.approx(0.0, abs=1e-7)
    assert lexical_evidence(HALF) == 0.5
    assert lexical_evidence(STRONG) == 1.0
    assert lexical_evidence(hits("a", "b", ceiling=0.5)) == 1.0  # above the ceiling: at most 1
    evidence = [lexical_evidence(hits("a", ceiling=c)) for c in (0.5, 1.0, 2.0, 4.0, 8.0)]  # top score 1
    assert evidence == sorted(evidence, reverse=True) == [1.0, 1.0, 0.5, 0.25, 0.125]
    # no ceiling (ts_rank_cd's or RM3's list), an empty list or a zero ceiling: full evidence, nothing moves
    assert lexical_evidence(hits(*"abc")) == lexical_evidence([]) == lexical_evidence(ScoredList([], 3.0)) == 1.0
    assert lexical_evidence(hits("a", ceiling=0.0)) == 1.0


def test_bm25_lists_carry_their_ceiling(indexed, schema):
    conn, _, _ = indexed
    found = bm25_rank.bm25_search(conn, schema, "hybrid search fusion", 10)
    assert isinstance(found, ScoredList) and found and 0 < found.ceiling
    one = bm25_rank.bm25_search(conn, schema, "fusion", 10)
    assert lexical_evidence(one) == 1.0 or one[0].score < one.ceiling  # a single term: its top alone decides
    assert bm25_rank.bm25_search(conn, schema, "zzzqqq", 10) == []


def test_weights_move_to_the_vector_list_as_the_evidence_weakens():
    params = DEFAULT.with_(weights=(0.4, 0.6), evidence_shift=1.0)
    by_evidence = [query_weights([VECTOR, lexical], params) for lexical in (WEAK, HALF, STRONG)]  # evidence 0, 0.5, 1
    assert [w[0] for w in by_evidence] == pytest.approx([1.0, 0.7, 0.4])  # the vector weight falls as the evidence grows
    assert [w[1] for w in by_evidence] == pytest.approx([0.0, 0.3, 0.6], abs=1e-6)
    assert all(sum(w) == pytest.approx(1.0) for w in by_evidence)
    half = DEFAULT.with_(weights=(0.4, 0.6), evidence_shift=0.5)
    assert query_weights([VECTOR, WEAK], half) == pytest.approx((0.7, 0.3), abs=1e-6)
    # the SPLADE weight is left alone
    three = DEFAULT.with_(weights=(0.4, 0.6), sparse_weight=0.3, evidence_shift=1.0)
    assert query_weights([VECTOR, WEAK, hits("s")], three) == pytest.approx((1.0, 0.0, 0.3), abs=1e-6)


@pytest.mark.parametrize("method", FUSION)
def test_off_is_exactly_todays_fusion(method):
    for lexical in (WEAK, HALF, STRONG, hits(*"xyz"), []):
        lists = [VECTOR, lexical]
        params = DEFAULT.with_(fusion=method, weights=(0.3, 0.7))
        today = rrf(lists, params.rrf_k, params.weights) if method == "rrf" else convex(lists, method, params.weights)
        assert query_weights(lists, params) == params.weights
        assert fuse(lists, params) == today
    for lexical in (STRONG, hits(*"xyz")):  # full evidence, or no ceiling: the shift changes nothing either
        assert fuse([VECTOR, lexical], DEFAULT.with_(fusion=method, evidence_shift=1.0)) == fuse([VECTOR, lexical], DEFAULT.with_(fusion=method))


def test_weak_evidence_lets_the_vector_list_lead_and_empty_lists_fuse():
    lexical = hits(*"KLMNOPQRSa", ceiling=100.0)
    top = lambda shift: fuse([VECTOR, lexical], DEFAULT.with_(fusion="zscore", weights=(0.4, 0.6), evidence_shift=shift))[0].chunk_id  # noqa: E731
    assert top(0.0) == "K" and top(1.0) == "a"  # "a" leads the vector list and is in the lexical one
    params = DEFAULT.with_(evidence_shift=1.0)
    assert fuse([[], []], params) == []
    assert [r.chunk_id for r in fuse([[], WEAK], params)] == [h.chunk_id for h in WEAK]
    assert [r.chunk_id for r in fuse([VECTOR, ScoredList([], 5.0)], params)] == [h.chunk_id for h in VECTOR]


def test_the_field_is_validated_named_and_offered_by_the_rule():
    for bad in (-0.1, 1.5, True, "0.5", None):
        with pytest.raises(ValueError, match=r"^evidence_shift must be a number within \[0, 1\]"):
            RetrievalParams(evidence_shift=bad)
    assert RetrievalParams().evidence_shift == DEFAULT.evidence_shift == 0.0  # off by default
    assert "moved to the vector list" in DEFAULT.with_(evidence_shift=0.5).describe() and "moved" not in DEFAULT.describe()
    assert "evidence_shift" in staged_rule.FIELDS and staged_rule.evidence_stage in staged_rule.NO_FEEDBACK
    assert staged_rule.evidence_stage not in staged_rule.BEFORE_EVIDENCE
    assert staged_rule.evidence_stage(staged_rule.config_of(DEFAULT)) and not staged_rule.evidence_stage(staged_rule.config_of(DEFAULT.with_(lexical="ts_rank_cd")))
    cfg = staged_rule.config_of(DEFAULT.with_(evidence_shift=0.75))
    assert staged_rule.params_of(cfg, DEFAULT).evidence_shift == 0.75 and "shift=0.75" in staged_rule.describe(cfg)


def test_pipeline_on_postgres_fuses_with_the_query_weights(indexed, schema, golden):
    conn, embedder, _ = indexed
    retriever = pipeline.retriever(conn, schema, embedder, DEFAULT)
    on = DEFAULT.with_(evidence_shift=1.0)
    moved = 0
    for q in golden[:12]:
        plain = pipeline.run(conn, retriever, q.query, DEFAULT)
        shifted = pipeline.run(conn, retriever, q.query, on)
        assert (shifted.vector, shifted.text) == (plain.vector, plain.text)  # the first stage is the same
        weights = query_weights([shifted.vector, shifted.text], on)
        expected = convex([shifted.vector, shifted.text], on.fusion, weights)[: on.n]
        assert [r.chunk_id for r in shifted.fused] == [r.chunk_id for r in expected]
        assert len(shifted.final) == len(plain.final) > 0
        evidence = lexical_evidence(shifted.text)
        assert weights[0] == pytest.approx(DEFAULT.weights[0] + DEFAULT.weights[1] * (1 - evidence))
        moved += evidence < 1 and [r.chunk_id for r in shifted.fused] != [r.chunk_id for r in plain.fused]
        # the same run from the first stage of the plain one (what-if experiments) gives the same lists
        again = pipeline.run(conn, retriever, q.query, on, first_stage=plain)
        assert [r.chunk_id for r in again.final] == [r.chunk_id for r in shifted.final]
    assert moved > 0  # on the fixture, some queries' lists disagree and the shift changes their fusion
