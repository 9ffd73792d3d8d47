"""Pseudo-relevance feedback: weighted BM25 (exact against bm25s term by term), RM3 expansion of the
BM25 list against a numpy reference, Rocchio on the query vector, the parameters' errors, and
the lists with feedback off left exactly as they were."""

import bm25s
import numpy as np
import pytest

from retrieval_assets.index import copies, store

from retrieval_assets.search import bm25_rank, dense, fusion, hybrid, pipeline
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import DEFAULT, PRF_TERMS_MAX, SEED, RetrievalParams
from retrieval_assets.types import Hit, Ranked
from retrieval_assets_tests.test_bm25 import lexeme_tokens, make, scratch  # noqa: F401 (fixture)
from retrieval_assets_tests.test_hybrid import HOSTILE
from retrieval_assets_tests.test_round_trips import trips

PRF = DEFAULT.with_(prf_docs=10, prf_terms=10, prf_weight=0.5)


class Reference:
    """BM25 as bm25s computes it over the chunks' own lexemes, one term at a time (so that any
    weighting of the terms can be summed in numpy), and RM3 from the same token lists."""

    def __init__(self, conn, schema):
        self.ids, self.tokens = lexeme_tokens(conn, schema)
        self.peer = bm25s.BM25(k1=1.2, b=0.75, method="lucene", dtype="float64")
        self.peer.index(self.tokens, show_progress=False)
        self.vocabulary = sorted({t for toks in self.tokens for t in toks})
        self._per_term: dict[str, np.ndarray] = {}

    def term(self, t: str) -> np.ndarray:
        if t not in self._per_term:
            self._per_term[t] = self.peer.get_scores([t]) if t in self.vocabulary else np.zeros(len(self.ids))
        return self._per_term[t]

    def weighted(self, weights: dict[str, float]) -> np.ndarray:
        return sum((w * self.term(t) for t, w in weights.items()), np.zeros(len(self.ids)))

    def top(self, scores: np.ndarray, n: int) -> list[tuple[str, float]]:
        order = sorted((i for i in range(len(self.ids)) if scores[i] > 0), key=lambda i: (-scores[i], self.ids[i]))[:n]
        return [(self.ids[i], float(scores[i])) for i in order]

    def rm3(self, query_terms: list[str], feedback: list[Hit], kept: int, lam: float) -> dict[str, float]:
        """weight(t) = (1 - lam) [t in query] + lam |Q| P(t|R), P(t|R) over the top ``kept`` terms."""
        fb_scores = np.array([h.score for h in feedback])
        doc_weight = fb_scores / fb_scores.sum()
        relevance: dict[str, float] = {}
        for w, h in zip(doc_weight, feedback):
            toks = self.tokens[self.ids.index(h.chunk_id)]
            terms, counts = np.unique(toks, return_counts=True)
            for t, c in zip(terms, counts):
                relevance[t] = relevance.get(t, 0.0) + w * c / len(toks)
        chosen = sorted(relevance, key=lambda t: (-relevance[t], t))[:kept]
        total = sum(relevance[t] for t in chosen)
        weights = {t: (1 - lam) for t in query_terms}
        for t in chosen:
            weights[t] = weights.get(t, 0.0) + lam * len(query_terms) * relevance[t] / total
        return weights


@pytest.fixture(scope="module")
def reference(indexed, schema):
    conn, _, _ = indexed
    return Reference(conn, schema)


def assert_hits(got, expected, label):
    """``got`` (Hits) holds ``expected``'s (chunk_id, score) pairs in order, scores within 1e-9."""
    assert [h.chunk_id for h in got] == [cid for cid, _ in expected], label
    assert [h.score for h in got] == pytest.approx([score for _, score in expected], abs=1e-9), label


def query_terms(conn, schema, query):
    _, found = bm25_rank.send_query(conn, schema, query, 50)()
    return [] if found is None else found["terms"]


@pytest.mark.parametrize("cost", [0, None])
def test_weighted_search_equals_bm25s_term_by_term(indexed, schema, golden, reference, cost, monkeypatch):
    """Random weights on each golden query's terms plus a few other lexemes; the lead path forced
    (cost 0) and bm25_search's own choice: the exact weighted top n, scores included."""
    conn, _, _ = indexed
    if cost is not None:
        monkeypatch.setattr(bm25_rank, "LOOKUP_COST", cost)
    rng = np.random.default_rng(0)
    compared = 0
    for q in golden:
        terms = query_terms(conn, schema, q.query) + list(rng.choice(reference.vocabulary, 3))
        weights = {t: float(w) for t, w in zip(terms, rng.uniform(0, 2, len(terms)))}
        weights[terms[-1]] = 0.0  # a zero weight drops the term
        for n in (3, 50):
            hits = bm25_rank.weighted_search(conn, schema, weights, n)
            expected = reference.top(reference.weighted(weights), n)
            assert_hits(hits, expected, (q.query_id, n))
            compared += len(hits)
    assert compared > 1000


def test_weights_of_one_give_bm25_search_exactly(indexed, schema, golden):
    conn, _, _ = indexed
    for q in golden:
        terms = query_terms(conn, schema, q.query)
        if not terms or "-" in q.query:  # a negated term excludes in bm25_search only
            continue
        assert bm25_rank.weighted_search(conn, schema, {t: 1.0 for t in terms}, 50) == bm25_rank.bm25_search(conn, schema, q.query, 50)


def test_weighted_search_refuses_bad_weights_and_finds_nothing_for_no_terms(indexed, schema):
    conn, _, _ = indexed
    for bad in (-1.0, float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="term weights must be finite numbers >= 0"):
            bm25_rank.weighted_search(conn, schema, {"rank": bad}, 10)
    assert bm25_rank.weighted_search(conn, schema, {}, 10) == []
    assert bm25_rank.weighted_search(conn, schema, {"rank": 0.0}, 10) == []
    assert bm25_rank.weighted_search(conn, schema, {"zzzunknownzzz": 1.0}, 10) == []


@pytest.mark.parametrize(("docs", "kept", "lam"), [(10, 10, 0.5), (3, 25, 0.8), (20, 5, 0.2), (1, 1, 1.0)])
def test_rm3_expansion_equals_a_numpy_reference(indexed, schema, golden, reference, docs, kept, lam):
    conn, _, _ = indexed
    compared = 0
    for q in golden:
        if "-" in q.query:
            continue
        first, found = bm25_rank.send_query(conn, schema, q.query, 50)()
        if not first:
            continue
        got = bm25_rank.expanded_search(conn, schema, q.query, 50, docs=docs, terms=kept, weight=lam)
        weights = reference.rm3(found["terms"], first[:docs], kept, lam)
        expected = reference.top(reference.weighted(weights), 50)
        assert_hits(got, expected, q.query_id)
        compared += len(got)
    assert compared > 500


def test_rm3_weight_zero_is_the_first_search(indexed, schema, golden):
    conn, _, _ = indexed
    for q in golden:
        plain = bm25_rank.bm25_search(conn, schema, q.query, 50)
        got = bm25_rank.expanded_search(conn, schema, q.query, 50, docs=10, terms=10, weight=0.0)
        assert_hits(got, [(h.chunk_id, h.score) for h in plain], q.query_id)


def test_rm3_on_a_tiny_corpus_brings_in_the_co_occurring_term(scratch):  # noqa: F811 (the fixture)
    """'apple' is written beside 'orchard' in every chunk about apples: the expanded query finds
    the chunk about orchards that never says apple, which the first search cannot see."""
    conn, schema = scratch
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    texts = ["apple orchard harvest in autumn", "the apple orchard has old trees", "apple orchard pruning",
             "orchard trees need pruning and care", "granite rock climbing", "river boats and harbours",
             "a quiet harbour town", "climbing gear for rock faces"]
    store.sync(conn, schema, make("d", texts), HashEmbedder())
    plain = bm25_rank.bm25_search(conn, schema, "apple", 10)
    assert {h.chunk_id for h in plain} == {"d#000", "d#001", "d#002"}
    _, found = bm25_rank.send_query(conn, schema, "apple", 10)()
    weights = Reference(conn, schema).rm3(found["terms"], plain, 3, 0.5)
    assert max((t for t in weights if t != "appl"), key=weights.get) == "orchard"
    expanded = bm25_rank.expanded_search(conn, schema, "apple", 10, docs=3, terms=3, weight=0.5)
    assert "d#003" in {h.chunk_id for h in expanded}
    assert {h.chunk_id for h in expanded[:3]} == {"d#000", "d#001", "d#002"}
    # through the pipeline's first stage, the hash embedder's list beside it
    params = RetrievalParams(lexical="bm25", n=10, k=5, prf_docs=3, prf_terms=3)
    vector_hits, lexical_hits = hybrid.first_stage(conn, schema, HashEmbedder().embed(["apple"])[0], "apple", params)
    assert lexical_hits == expanded
    assert vector_hits == dense.vector_search(conn, schema, HashEmbedder().embed(["apple"])[0], 10)
    store.drop(conn, schema)


def test_feedback_off_leaves_the_lists_as_they_were(indexed, schema, golden):
    conn, embedder, _ = indexed
    for params in (DEFAULT, SEED, DEFAULT.with_(prf_terms=3, prf_weight=0.9), DEFAULT.with_(prf_docs=5, prf_weight=0.0)):
        assert not params.bm25_feedback and not params.vector_feedback
        for query in [q.query for q in golden[:12]] + HOSTILE + [""]:
            vector = embedder.embed([query])[0]
            got = hybrid.first_stage(conn, schema, vector, query, params)
            assert got == (dense.vector_search(conn, schema, vector, params.n, ef_search=params.ef_search),
                           hybrid.lexical_search(conn, schema, query, params.n, params.lexical)), query


def test_feedback_in_the_first_stage_and_the_pipeline(indexed, schema, golden):
    conn, embedder, _ = indexed
    retriever = pipeline.retriever(conn, schema, embedder, PRF)
    for q in golden[:12]:
        vector = embedder.embed([q.query])[0]
        vector_hits, lexical_hits = hybrid.first_stage(conn, schema, vector, q.query, PRF)
        assert vector_hits == dense.vector_search(conn, schema, vector, PRF.n)
        assert lexical_hits == bm25_rank.expanded_search(conn, schema, q.query, PRF.n, docs=10, terms=10, weight=0.5)
        trace = pipeline.run(conn, retriever, q.query, PRF)
        assert trace.text == lexical_hits and len(trace.final) == PRF.k


@pytest.mark.parametrize("exact", [False, True, "halfvec"])
def test_rocchio_moves_the_query_vector_toward_the_fused_top(indexed, schema, golden, exact):
    """The vector list searched again from q + beta * mean(vectors of the fused top prf_docs), equal
    to the exact cosine ranking of that vector in numpy (430 chunks: the planner scans them all);
    the same through the exact scan's narrow copy (``copies.exact_copy``), in float32 or (up to half
    precision) in halfvec."""
    conn, embedder, chunks = indexed
    if exact:
        with conn.transaction():
            copies.exact_copy(conn, schema, half=exact == "halfvec")
    try:
        _rocchio_case(conn, embedder, chunks, schema, golden, exact)
    finally:
        with conn.transaction():
            copies.drop_exact_copy(conn, schema)


def _rocchio_case(conn, embedder, chunks, schema, golden, exact):
    ids = [c.chunk_id for c in chunks]
    vectors = {i: v for i, v in zip(ids, embedder.embed([c.text for c in chunks]))}
    matrix = np.array([vectors[i] for i in ids], dtype=np.float64)
    params = RetrievalParams(lexical="bm25", fusion="zscore", weights=(0.4, 0.6), prf_docs=5, prf_weight=0.0, prf_beta=0.7)
    assert params.vector_feedback and not params.bm25_feedback
    for q in golden[:12]:
        vector = embedder.embed([q.query])[0]
        first = hybrid.first_stage(conn, schema, vector, q.query, params.with_(prf_docs=0, prf_beta=0.0), exact=exact)
        top = [r.chunk_id for r in fusion.fuse(list(first), params)[:5]]
        moved = vector + 0.7 * np.mean([vectors[i] for i in top], axis=0)
        cosine = matrix @ moved / np.linalg.norm(matrix, axis=1) / np.linalg.norm(moved)
        got, lexical_hits = hybrid.first_stage(conn, schema, vector, q.query, params, exact=exact)
        assert lexical_hits == first[1]
        if exact:  # both trips split across a partner session (pg.lend_partner): the lists of one statement each
            dense._PAGES.get(conn, {}).pop(schema, None)
            assert hybrid.first_stage(conn, schema, vector, q.query, params, exact=exact, partner=True)[0] == got
            assert dense._PAGES[conn][schema] > 0
            assert hybrid.first_stage(conn, schema, vector, q.query, params, exact=exact, partner=None)[0] == got
        tolerance = 2e-3 if exact == "halfvec" else 1e-5
        assert [h.score for h in got] == pytest.approx(sorted(cosine, reverse=True)[: params.n], abs=tolerance)
        assert [h.score for h in got] == pytest.approx([cosine[ids.index(h.chunk_id)] for h in got], abs=tolerance)


@pytest.mark.parametrize("query", HOSTILE + ["", "the of and", "-rank", "   "])
def test_queries_without_words_return_nothing_and_hostile_text_never_raises_with_feedback(indexed, schema, query):
    conn, embedder, _ = indexed
    params = PRF.with_(prf_beta=0.5)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    trace = pipeline.run(conn, retriever, query, params)
    assert all(isinstance(r, Ranked) for r in trace.final)
    assert isinstance(hybrid.search(conn, schema, embedder, query, params), list)
    if query.strip() in ("", "the of and", "-rank"):
        assert bm25_rank.expanded_search(conn, schema, query, 50) == []
        assert hybrid.first_stage(conn, schema, embedder.embed([query])[0], query, params)[1] == []
    if not query.strip():
        assert trace.final == [] and hybrid.search(conn, schema, embedder, query, params) == []


@pytest.mark.parametrize(("change", "message"), [
    ({"prf_docs": -1}, r"prf_docs must be an integer within \[0, n=50\]"),
    ({"prf_docs": 51}, r"prf_docs must be an integer within \[0, n=50\]"),
    ({"prf_docs": 2.5}, r"prf_docs must be an integer within \[0, n=50\]"),
    ({"prf_docs": True}, r"prf_docs must be an integer within \[0, n=50\]"),
    ({"prf_terms": 0}, rf"prf_terms must be an integer within \[1, {PRF_TERMS_MAX}\]"),
    ({"prf_terms": PRF_TERMS_MAX + 1}, rf"prf_terms must be an integer within \[1, {PRF_TERMS_MAX}\]"),
    ({"prf_terms": "10"}, rf"prf_terms must be an integer within \[1, {PRF_TERMS_MAX}\]"),
    ({"prf_weight": -0.1}, r"prf_weight must be a number within \[0, 1\]"),
    ({"prf_weight": 1.5}, r"prf_weight must be a number within \[0, 1\]"),
    ({"prf_weight": None}, r"prf_weight must be a number within \[0, 1\]"),
    ({"prf_beta": -1.0}, r"prf_beta must be a number within \[0, 10\]"),
    ({"prf_beta": 11}, r"prf_beta must be a number within \[0, 10\]"),
    ({"prf_beta": 0.5}, r"prf_beta needs prf_docs > 0"),
    ({"prf_docs": 5, "lexical": "ts_rank_cd"}, r"prf_docs expands the bm25 lexical list only"),
])
def test_bad_feedback_values_are_errors_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        DEFAULT.with_(**change)


def test_feedback_costs_one_round_trip_and_none_when_off(indexed, schema, golden, tmp_path, monkeypatch):
    conn, embedder, _ = indexed
    monkeypatch.setattr(conn, "prepare_threshold", None)
    both = PRF.with_(prf_beta=0.5)
    for q in golden[:8]:
        vector = embedder.embed([q.query])[0]
        hybrid.first_stage(conn, schema, vector, q.query, both)  # types looked up once
        off = trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, DEFAULT))
        assert trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, DEFAULT.with_(prf_terms=20))) == off
        # the first search's own trips (2, or more when pruning widens its lead) and one more
        first = trips(conn, tmp_path, lambda: bm25_rank.bm25_search(conn, schema, q.query, 50))
        for params in (PRF, both, PRF.with_(prf_weight=0.0, prf_beta=0.5)):
            assert trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, params)) == first + 1, q.query


def test_describe_names_the_feedback():
    assert "RM3 feedback" in PRF.describe() and "Rocchio" not in PRF.describe()
    assert "Rocchio feedback on the query vector (10 fused chunks, beta 0.5)" in PRF.with_(prf_beta=0.5).describe()
    assert "feedback" not in DEFAULT.describe()



def test_shared_first_stages_keep_feedback_apart(indexed, schema, golden):
    """evaluate_pipelines' cache (diagnose's fusion-weight what-ifs) shares first-stage lists only
    between settings that give the same ones: with Rocchio the vector list follows the fusion weights."""
    from retrieval_assets.evaluation.evaluate import evaluate_pipelines

    conn, embedder, _ = indexed
    retriever = pipeline.retriever(conn, schema, embedder, PRF)
    cache: dict = {}
    for params in (DEFAULT, PRF, PRF.with_(prf_terms=20), PRF.with_(prf_beta=1.0),
                   PRF.with_(prf_beta=1.0, weights=(0.9, 0.1)), PRF.with_(prf_beta=1.0, fusion="rrf")):
        shared = evaluate_pipelines(conn, retriever, golden[:10], params, first_stage_cache=cache)
        alone = evaluate_pipelines(conn, retriever, golden[:10], params)
        assert [q.ranked for q in shared.queries] == [q.ranked for q in alone.queries], params.describe()
    assert pipeline.first_stage_key("q", PRF) != pipeline.first_stage_key("q", DEFAULT)
    assert pipeline.first_stage_key("q", PRF.with_(weights=(0.9, 0.1))) == pipeline.first_stage_key("q", PRF)
    assert pipeline.first_stage_key("q", PRF.with_(prf_beta=1.0, weights=(0.9, 0.1))) != pipeline.first_stage_key("q", PRF.with_(prf_beta=1.0))
