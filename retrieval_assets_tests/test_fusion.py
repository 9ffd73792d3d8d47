"""Issue 19: convex fusion, the rerank blend, named pipelines and cross-validated choice."""

import numpy as np
import pytest

from retrieval_assets.evaluation import crossval

from retrieval_assets.search import pipeline
from retrieval_assets.search.fusion import convex, fuse, normalise, rrf
from retrieval_assets.params import DEFAULT, PIPELINES, SEED, RetrievalParams, default_for, named
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker, blend
from retrieval_assets.types import Hit, Ranked


def hits(*pairs):
    return [Hit(cid, score, rank) for rank, (cid, score) in enumerate(pairs, 1)]


VECTOR = hits(("a", 0.9), ("b", 0.5), ("c", 0.1))
LEXICAL = hits(("c", 12.0), ("d", 6.0), ("a", 2.0))


def test_minmax_fusion_by_hand():
    fused = convex([VECTOR, LEXICAL], "minmax", (0.5, 0.5))
    # vector: a 1, b 0.5, c 0; lexical: c 1, d 0.4, a 0; absent = 0
    expected = {"a": 0.5, "b": 0.25, "c": 0.5, "d": 0.2}
    assert {r.chunk_id: pytest.approx(r.score) for r in fused} == expected
    assert [r.chunk_id for r in fused] == ["a", "c", "b", "d"]  # a and c tie: by chunk_id
    assert [r.rank for r in fused] == [1, 2, 3, 4]
    ranks = {r.chunk_id: r.ranks for r in fused}
    assert ranks == {"a": (1, 3), "b": (2, None), "c": (3, 1), "d": (None, 2)}
    # the weights decide: all on the vector list gives its order, absent chunks last
    assert [r.chunk_id for r in convex([VECTOR, LEXICAL], "minmax", (1.0, 0.0))][:3] == ["a", "b", "c"]


def test_zscore_fusion_absent_counts_as_the_lists_lowest():
    fused = {r.chunk_id: r.score for r in convex([VECTOR, LEXICAL], "zscore", (1.0, 1.0))}
    v = (np.array([0.9, 0.5, 0.1]) - 0.5) / np.std([0.9, 0.5, 0.1])
    t = (np.array([12.0, 6.0, 2.0]) - np.mean([12.0, 6.0, 2.0])) / np.std([12.0, 6.0, 2.0])
    assert fused["b"] == pytest.approx(v[1] + t.min())
    assert fused["d"] == pytest.approx(v.min() + t[1])
    assert fused["a"] == pytest.approx(v[0] + t[2])


def test_fusion_edge_cases():
    assert convex([[], []], "minmax") == []
    one = convex([hits(("x", 3.0)), []], "minmax", (0.3, 0.7))  # a constant list normalises to 1
    assert [(r.chunk_id, r.score, r.ranks) for r in one] == [("x", pytest.approx(0.3), (1, None))]
    assert [r.chunk_id for r in convex([hits(("b", 1.0), ("a", 1.0)), []], "zscore")] == ["a", "b"]
    with pytest.raises(ValueError, match="2 weights for 1 lists"):
        convex([VECTOR], "minmax", (0.5, 0.5))
    with pytest.raises(ValueError, match="unknown normalisation 'max'"):
        normalise(np.array([1.0]), "max")
    # fuse dispatches on params.fusion; RRF is scale-free in its weights
    assert fuse([VECTOR, LEXICAL], DEFAULT.with_(fusion="rrf")) == rrf([VECTOR, LEXICAL], 60, DEFAULT.weights)
    half = [r.chunk_id for r in fuse([VECTOR, LEXICAL], DEFAULT.with_(fusion="rrf", weights=(0.5, 0.5)))]
    assert half == [r.chunk_id for r in rrf([VECTOR, LEXICAL], 60, (1.0, 1.0))]
    assert fuse([VECTOR, LEXICAL], DEFAULT.with_(fusion="zscore", weights=(0.2, 0.8))) == \
        convex([VECTOR, LEXICAL], "zscore", (0.2, 0.8))


def test_blend_keeps_the_reranker_at_one_the_fused_order_at_zero():
    reranked = [Ranked("c", 9.0, 1, (3,)), Ranked("b", 5.0, 2, (2,)), Ranked("a", 1.0, 3, (1,))]
    fused = {"a": 1.0, "b": 0.6, "c": 0.0}
    assert blend(reranked, fused, 1.0) == reranked
    assert [r.chunk_id for r in blend(reranked, fused, 0.0)] == ["a", "b", "c"]
    mixed = blend(reranked, fused, 0.5)  # a 0.5, b 0.55, c 0.5: b first, then a (better fused) before c
    assert [(r.chunk_id, round(r.score, 3)) for r in mixed] == [("b", 0.55), ("a", 0.5), ("c", 0.5)]
    assert [r.rank for r in mixed] == [1, 2, 3] and mixed[0].ranks == (2,)
    assert blend([], {}, 0.5) == []


def test_named_pipelines_and_bad_values():
    assert named("seed") == SEED and named("default") == DEFAULT and set(PIPELINES) == {"default", "seed"} and named("default", "mpnet") == default_for("mpnet")
    assert SEED == RetrievalParams() and SEED.rerank_weight == 1 and SEED.rerank_idf == "pool"
    for bad in ("best", "", None, 3):
        with pytest.raises(ValueError, match=r"unknown pipeline .* \(known: default, seed\)"):
            named(bad)
    assert "MMR 0.7" in SEED.describe() and "ts_rank_cd list" in SEED.describe()
    with pytest.raises(ValueError, match=r"rerank_idf must be one of pool, corpus, got 'global'"):
        RetrievalParams(rerank_idf="global")


def test_pipeline_blend_rows_cache_and_corpus_idf(indexed, schema):
    conn, embedder, chunks = indexed
    query = "how is the HNSW graph built"
    seed = pipeline.retriever(conn, schema, embedder, SEED)
    assert seed.reranker.corpus is None
    corpus = pipeline.retriever(conn, schema, embedder, SEED.with_(rerank_idf="corpus"))
    assert corpus.reranker.corpus == CorpusStats.from_texts([c.text for c in chunks])
    rows: dict = {}
    pure = pipeline.run(conn, seed, query, SEED.with_(mmr_lambda=None), rows=rows)
    assert set(rows) == {r.chunk_id for r in pure.fused}
    # weight 0: the fused order; weight 1: the reranker's; the rows are not fetched again
    fetched = dict(rows)
    none = pipeline.run(conn, seed, query, SEED.with_(mmr_lambda=None, rerank_weight=0.0), first_stage=pure, rows=rows)
    assert [r.chunk_id for r in none.reranked] == [r.chunk_id for r in pure.fused] and rows == fetched
    scores = LexicalReranker().scores(query, [pure.chunks[r.chunk_id].text for r in pure.fused])
    assert [r.chunk_id for r in pure.reranked] == [pure.fused[i].chunk_id for i in np.argsort(-scores, kind="stable")]
    half = pipeline.run(conn, seed, query, SEED.with_(mmr_lambda=None, rerank_weight=0.5), first_stage=pure, rows=rows)
    expected = blend(pure.reranked, {r.chunk_id: r.score for r in pure.fused}, 0.5)
    assert half.reranked == expected and half.final == expected[:10]
    # a query with no words still returns nothing, whatever the fusion
    for fusion in ("rrf", "minmax", "zscore"):
        assert pipeline.run(conn, seed, "?!", SEED.with_(fusion=fusion, lexical="bm25")).text == []


def test_folds_cover_every_query_once():
    parts = crossval.folds(10, 3, seed=1)
    assert sorted(np.concatenate(parts).tolist()) == list(range(10)) and [len(p) for p in parts] == [4, 3, 3]
    loo = crossval.folds(4, 4)  # leave-one-out: one query per fold
    assert all(len(p) == 1 for p in loo) and sorted(int(p[0]) for p in loo) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="k must be within"):
        crossval.folds(3, 5)
    lo, hi = crossval.bootstrap_interval(np.array([0.0, 1.0] * 50))
    assert lo < 0.5 < hi and hi - lo < 0.25


def _setting(dataset, table):
    """A setting whose per-query scores are a fixed table {config: scores}."""
    return crossval.Setting(dataset, "e", lambda cfg: np.asarray(table[cfg], dtype=float))


A, B = crossval.config(x=1), crossval.config(x=2)
PLUS = crossval.merged(A, crossval.config(y=1))


def test_choose_keeps_a_later_stage_only_when_it_helps_every_dataset():
    stages = (lambda _: [A, B], lambda current: [crossval.config(y=1)])
    one = _setting("one", {A: [1, 1, 1], B: [0, 0, 0], PLUS: [2, 2, 2]})
    two = _setting("two", {A: [1, 1], B: [0, 0], PLUS: [0.5, 0.5]})
    train = {"one": np.arange(3), "two": np.arange(2)}
    assert crossval.choose([one], stages, {"one": np.arange(3)}) == PLUS  # helps the only dataset
    assert crossval.choose([one, two], stages, train) == A  # helps one, hurts the other: dropped
    # the stage's best overall (y=1) hurts dataset two; the smaller y=2 helps both and is kept
    small = crossval.merged(A, crossval.config(y=2))
    one._cache.clear(), two._cache.clear()
    one.score_fn = lambda cfg: np.asarray({A: [1, 1, 1], B: [0, 0, 0], PLUS: [3, 3, 3], small: [1.2, 1.2, 1.2]}[cfg], dtype=float)
    two.score_fn = lambda cfg: np.asarray({A: [1, 1], B: [0, 0], PLUS: [0.5, 0.5], small: [1.1, 1.1]}[cfg], dtype=float)
    both = (stages[0], lambda current: [crossval.config(y=1), crossval.config(y=2)])
    assert crossval.choose([one, two], both, train) == small


def test_choose_by_setting_never_trades_one_embedders_loss_for_anothers_gain():
    stages = (lambda _: [A, B], lambda current: [crossval.config(y=1)])
    strong = crossval.Setting("one", "strong", lambda cfg: np.asarray({A: [1, 1], B: [0, 0], PLUS: [0.9, 0.9]}[cfg], dtype=float))
    weak = crossval.Setting("one", "weak", lambda cfg: np.asarray({A: [0.2, 0.2], B: [0, 0], PLUS: [0.5, 0.5]}[cfg], dtype=float))
    train = {"one": np.arange(2)}
    assert crossval.choose([strong, weak], stages, train) == PLUS  # the dataset's mean rises
    assert crossval.choose([strong, weak], stages, train, every="setting") == A  # but it lowers the strong embedder
    with pytest.raises(ValueError, match="every must be 'setting' or 'dataset'"):
        crossval.choose([strong], stages, train, every="embedder")


def test_cross_validation_scores_each_fold_with_what_its_training_chose():
    # config A is best on queries 0-1, B on 2-3: each fold's choice comes from the other queries only
    table = {A: [1.0, 1.0, 0.0, 0.0], B: [0.0, 0.0, 0.9, 0.9]}
    s = _setting("d", table)
    fold_sets = {"d": [np.array([0, 1]), np.array([2, 3])]}
    held = crossval.cross_validate([s], (lambda _: [A, B],), fold_sets, {"d": 4})["e"]
    assert held.picks == (B, A)  # fold 1 trains on 2-3 (B), fold 2 on 0-1 (A)
    assert held.scores.tolist() == [0.0, 0.0, 0.0, 0.0] and held.mean == 0.0  # the in-sample best would say 0.95
    with pytest.raises(ValueError, match="held_out must name one of the datasets"):
        crossval.cross_validate([s, _setting("f", table)], (lambda _: [A],), fold_sets, {"d": 4, "f": 4})


def test_calibrate_takes_a_corpus_own_rule_only_when_its_own_held_out_folds_show_it_better():
    stages = (lambda _: [A, B],)
    n = 40
    better = _setting("d", {A: [0.5] * n, B: [0.6] * n})
    assert crossval.calibrate(better, stages, A, np.arange(n)) == B  # better on every inner held-out fold
    assert crossval.calibrate(better, stages, A, np.arange(15)) == A  # too few queries: the default, untried
    # higher on average (0.55) but better on half the queries and worse on the other half: no interval above 0
    mixed = _setting("d", {A: [0.5] * n, B: [1.0, 0.1] * (n // 2)})
    assert crossval.calibrate(mixed, stages, A, np.arange(n)) == A
    # only the corpus's own queries count: B wins on queries 0-19 and overall, and loses on 20-39
    split = _setting("d", {A: [0.5] * n, B: [0.9] * 20 + [0.3] * 20})
    assert crossval.calibrate(split, stages, A, np.arange(20, n)) == A
    assert crossval.calibrate(split, stages, A, np.arange(20)) == B


def test_corpus_stats_are_read_once_per_table_content(indexed, schema):
    import dataclasses

    from retrieval_assets.index import store

    conn, embedder, chunks = indexed
    small = schema + "_stats"
    store.drop(conn, small)
    store.create(conn, small, embedder.dims)
    try:
        store.sync(conn, small, chunks[:3], embedder)
        first = pipeline.corpus_stats(conn, small)
        assert first == CorpusStats.from_texts([c.text for c in chunks[:3]])
        assert pipeline.corpus_stats(conn, small) is first  # unchanged table: the cached stats
        edited = [dataclasses.replace(chunks[0], text=chunks[0].text + " zebra"), *chunks[1:3]]
        store.sync(conn, small, edited, embedder)
        again = pipeline.corpus_stats(conn, small)
        assert again is not first and again == CorpusStats.from_texts([c.text for c in edited]) and again.df["zebra"] == 1
        # a schema of the same content elsewhere is its own entry; the module's schema is unaffected
        assert pipeline.corpus_stats(conn, schema) == CorpusStats.from_texts([c.text for c in chunks])
    finally:
        store.drop(conn, small)
