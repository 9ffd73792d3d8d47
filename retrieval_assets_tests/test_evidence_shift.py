"""Issue 37: the query-dependent fusion weight (params.evidence_shift, fusion.query_weights)."""

import pytest

from retrieval_assets.evaluation import staged_rule
from retrieval_assets.params import DEFAULT, FUSION, RetrievalParams
from retrieval_assets.search import fusion, pipeline
from retrieval_assets.search.fusion import convex, fuse, lexical_evidence, query_weights, rrf
from retrieval_assets.types import Hit


def hits(*ids):
    return [Hit(cid, float(len(ids) - i), i + 1) for i, cid in enumerate(ids)]


VECTOR = hits(*"abcdefghij")
AGREEING = hits(*"abcdefghij")  # the lexical top is the vector top
HALF = hits(*"abcdeVWXYZ")  # half of it
APART = hits(*"KLMNOPQRST")  # none of it


def test_evidence_is_the_share_of_the_lexical_top_the_vector_top_holds():
    assert lexical_evidence(VECTOR, AGREEING) == 1.0
    assert lexical_evidence(VECTOR, HALF) == 0.5
    assert lexical_evidence(VECTOR, APART) == 0.0
    assert lexical_evidence(VECTOR, hits("a", "Z"), top=1) == 1.0
    assert lexical_evidence([], APART) == lexical_evidence(VECTOR, []) == lexical_evidence([], []) == 1.0


def test_weights_move_to_the_vector_list_as_the_evidence_weakens():
    params = DEFAULT.with_(weights=(0.4, 0.6), evidence_shift=1.0)
    by_evidence = [query_weights([VECTOR, lexical], params) for lexical in (APART, HALF, AGREEING)]  # evidence 0, 0.5, 1
    assert [w[0] for w in by_evidence] == pytest.approx([1.0, 0.7, 0.4])  # the vector weight falls as the evidence grows
    assert [w[1] for w in by_evidence] == pytest.approx([0.0, 0.3, 0.6])
    assert all(sum(w) == pytest.approx(1.0) for w in by_evidence)
    half = DEFAULT.with_(weights=(0.4, 0.6), evidence_shift=0.5)
    assert query_weights([VECTOR, APART], half) == pytest.approx((0.7, 0.3))
    # the SPLADE weight is left alone
    three = DEFAULT.with_(weights=(0.4, 0.6), sparse_weight=0.3, evidence_shift=1.0)
    assert query_weights([VECTOR, APART, hits("s")], three) == pytest.approx((1.0, 0.0, 0.3))


@pytest.mark.parametrize("method", FUSION)
def test_off_is_exactly_todays_fusion(method):
    for lexical in (APART, HALF, AGREEING, []):
        lists = [VECTOR, lexical]
        params = DEFAULT.with_(fusion=method, weights=(0.3, 0.7))
        today = rrf(lists, params.rrf_k, params.weights) if method == "rrf" else convex(lists, method, params.weights)
        assert query_weights(lists, params) == params.weights
        assert fuse(lists, params) == today
    # full evidence: the shift changes nothing either
    assert fuse([VECTOR, AGREEING], DEFAULT.with_(fusion=method, evidence_shift=1.0)) == fuse([VECTOR, AGREEING], DEFAULT.with_(fusion=method))


def test_weak_evidence_lets_the_vector_list_lead_and_empty_lists_fuse():
    lexical = hits(*"KLMNOPQRSa")
    top = lambda shift: fuse([VECTOR, lexical], DEFAULT.with_(fusion="zscore", weights=(0.4, 0.6), evidence_shift=shift))[0].chunk_id  # noqa: E731
    assert top(0.0) == "K" and top(1.0) == "a"  # "a" leads the vector list and is in the lexical one
    params = DEFAULT.with_(evidence_shift=1.0)
    assert fuse([[], []], params) == []
    assert [r.chunk_id for r in fuse([[], APART], params)] == [h.chunk_id for h in APART]
    assert [r.chunk_id for r in fuse([VECTOR, []], params)] == [h.chunk_id for h in VECTOR]


def test_the_field_is_validated_named_and_offered_by_the_rule():
    for bad in (-0.1, 1.5, True, "0.5", None):
        with pytest.raises(ValueError, match=r"^evidence_shift must be a number within \[0, 1\]"):
            RetrievalParams(evidence_shift=bad)
    assert RetrievalParams().evidence_shift == DEFAULT.evidence_shift == 0.0  # off by default
    assert "moved to the vector list" in DEFAULT.with_(evidence_shift=0.5).describe() and "moved" not in DEFAULT.describe()
    assert "evidence_shift" in staged_rule.FIELDS and staged_rule.evidence_stage in staged_rule.NO_FEEDBACK
    assert staged_rule.evidence_stage not in staged_rule.BEFORE_EVIDENCE
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
        evidence = lexical_evidence(shifted.vector, shifted.text)
        assert weights[0] == pytest.approx(DEFAULT.weights[0] + DEFAULT.weights[1] * (1 - evidence))
        moved += evidence < 1 and [r.chunk_id for r in shifted.fused] != [r.chunk_id for r in plain.fused]
        # the same run from the first stage of the plain one (what-if experiments) gives the same lists
        again = pipeline.run(conn, retriever, q.query, on, first_stage=plain)
        assert [r.chunk_id for r in again.final] == [r.chunk_id for r in shifted.final]
    assert moved > 0  # on the fixture, some queries' lists disagree and the shift changes their fusion
    assert fusion.EVIDENCE_TOP == 10
