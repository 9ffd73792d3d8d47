"""Stage 03: vector search, full-text search, RRF and fused recall on the golden set."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from retrieval_assets.corpus import golden as golden_set
from retrieval_assets import pg
from retrieval_assets.evaluation import metrics
from retrieval_assets.index import lexeme_rule, store
from retrieval_assets.search import dense, fusion, hybrid, ts_rank, tsquery
from retrieval_assets.params import RetrievalParams
from retrieval_assets.index.tables import statement
from retrieval_assets.types import Chunk, Hit

HOSTILE = [
    '"exact phrase" -term OR x',
    "'",
    '"unbalanced quote',
    "&|!<->():*'\\",
    "'; DROP TABLE chunks; --",
    "rank\x00fusion",
    "x" * 10_000,
    "reciprocal 🙂 rank 融合 fusion поиск",
    "hnsw.ef_search = 40 AND 1=1",
    "!!! :* <-> rank",
]


def test_vector_scores_are_one_minus_cosine_distance(indexed, schema):
    conn, embedder, chunks = indexed
    by_id = {c.chunk_id: c for c in chunks}
    query = "how does reciprocal rank fusion merge two ranked lists"
    hits = dense.vector_search(conn, schema, embedder.embed([query])[0], n=20)
    assert [h.rank for h in hits] == list(range(1, 21))
    qv = embedder.embed([query])[0]
    vecs = embedder.embed([by_id[h.chunk_id].text for h in hits])
    for h, v in zip(hits, vecs):
        assert h.score == pytest.approx(float(v @ qv / np.linalg.norm(v) / np.linalg.norm(qv)), abs=1e-5)
    assert all(a.score >= b.score - 1e-6 for a, b in zip(hits, hits[1:]))


def test_vector_search_raises_ef_search_to_n(indexed, schema):
    conn, embedder, chunks = indexed
    assert len(dense.vector_search(conn, schema, embedder.embed(["postgres index"])[0], n=200)) == 200
    # the setting is transaction-local: the session default is untouched
    assert conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "40"


class Spy:
    """A connection that notes every statement and its parameters."""

    def __init__(self, conn):
        self.conn, self.calls = conn, []

    def execute(self, query, params=None):
        self.calls.append((query, params))
        return self.conn.execute(query, params)

    def transaction(self):
        return self.conn.transaction()

    @property
    def info(self):
        return self.conn.info


@pytest.mark.parametrize(("n", "ef_search", "applied"), [(10, None, "40"), (60, None, "60"), (10, 400, "400"), (10, 5000, "1000")])
def test_ef_search_can_be_raised_above_n(indexed, schema, n, ef_search, applied):
    conn, embedder, _ = indexed
    spy = Spy(conn)
    vector = embedder.embed(["postgres index"])[0]
    hits = dense.vector_search(spy, schema, vector, n=n, ef_search=ef_search)
    assert len(hits) == n
    assert [p for q, p in spy.calls if isinstance(q, str) and "hnsw.ef_search" in q] == [(applied,)]
    with pytest.raises(ValueError, match="ef_search must be at least 1, got 0"):
        dense.vector_search(conn, schema, vector, n=n, ef_search=0)
    with pytest.raises(ValueError, match="ef_search must be a positive integer"):
        RetrievalParams(ef_search=0)


def test_text_search_ranks_by_ts_rank_cd_with_chunk_id_ties(indexed, schema):
    conn, _, _ = indexed
    hits = ts_rank.text_search(conn, schema, "BM25 saturation", n=50)
    expected = conn.execute(statement(
        schema,
        """SELECT chunk_id, ts_rank_cd(tsv, to_tsquery('english', 'bm25 | saturation'), 32) AS s FROM {chunks}
           WHERE tsv @@ to_tsquery('english', 'bm25 | saturation') ORDER BY s DESC, chunk_id LIMIT 50""")
    ).fetchall()
    assert [(h.chunk_id, h.rank) for h in hits] == [(cid, i) for i, (cid, _) in enumerate(expected, 1)]
    assert [h.score for h in hits] == pytest.approx([s for _, s in expected])


def test_text_search_ors_words_instead_of_anding_them(indexed, schema):
    conn, _, _ = indexed
    hits = ts_rank.text_search(conn, schema, "saturation zzzunknownword", n=50)
    assert hits, "websearch_to_tsquery would AND the words and find nothing"


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise_and_keep_vector_results(indexed, schema, query):
    conn, embedder, _ = indexed
    fused = hybrid.search(conn, schema, embedder, query, RetrievalParams(n=50, k=10))
    ts_rank.text_search(conn, schema, query)
    if any(ch.isalnum() for ch in query):
        assert fused, query


@pytest.mark.parametrize("query", ["", "-", "   ", "!!!", "'\"", "-\"\""])
def test_queries_without_words_return_nothing_everywhere(indexed, schema, query):
    conn, embedder, _ = indexed
    assert dense.vector_search(conn, schema, embedder.embed([query])[0]) == []
    assert ts_rank.text_search(conn, schema, query) == []
    assert hybrid.search(conn, schema, embedder, query) == []


def test_negated_word_and_phrase_exclude_every_chunk_containing_them(indexed, schema):
    conn, _, chunks = indexed
    by_id = {c.chunk_id: c for c in chunks}
    plain = ts_rank.text_search(conn, schema, "rank fusion", n=200)
    assert any("reciprocal" in by_id[h.chunk_id].text.lower() for h in plain)
    without = ts_rank.text_search(conn, schema, "rank fusion -reciprocal", n=200)
    assert without and all("reciprocal" not in by_id[h.chunk_id].text.lower() for h in without)
    assert any("rank fusion" in by_id[h.chunk_id].text.lower() for h in plain)
    no_phrase = ts_rank.text_search(conn, schema, 'ranking -"rank fusion"', n=200)
    assert no_phrase
    for h in no_phrase:
        tsv = conn.execute(statement(schema, "SELECT tsv @@ phraseto_tsquery('english', 'rank fusion') FROM {chunks} WHERE chunk_id = %s"),
                           (h.chunk_id,)).fetchone()[0]
        assert not tsv


def ranked_by_ts_rank_cd(conn, schema, pos, neg, n):
    """The top ``n`` chunk rows matching the tsquery text ``pos`` and not ``neg``, by Postgres's ts_rank_cd (the reference)."""
    return conn.execute(statement(schema, """SELECT chunk_id, ts_rank_cd(tsv, %(pos)s::tsquery, 32) AS s FROM {chunks}
        WHERE tsv @@ %(pos)s::tsquery AND (%(neg)s::tsquery IS NULL OR NOT tsv @@ %(neg)s::tsquery)
        ORDER BY s DESC, chunk_id LIMIT %(n)s"""), {"pos": pos, "neg": neg, "n": n}).fetchall()


def ts_rank_cd_list(conn, schema, query, n):
    """``query``'s ts_rank_cd list, its terms parsed by ``tsquery.parse_query``, ranked by ``ranked_by_ts_rank_cd``."""
    pos, neg = tsquery.parse_query(conn, query)
    return [] if pos is None else ranked_by_ts_rank_cd(conn, schema, pos, neg, n)


def test_text_search_gives_ts_rank_cd_exactly_for_plain_words_and_phrases(indexed, schema, golden):
    """Plain words are scored from the postings, phrases and negations by ts_rank_cd; both give Postgres's
    ts_rank_cd list (ids, order and float4 scores), ties by chunk_id, at every n."""
    conn, _, _ = indexed
    queries = [q.query for q in golden] + HOSTILE + ["rank fusion -reciprocal", 'ranking -"rank fusion"', "rank rank RANKING ranked"]
    assert {ts_rank.plain_words(conn, q) for q in queries} == {True, False}
    for query in queries:
        for n in (1, 3, 10, 50, 200):
            expected = ts_rank_cd_list(conn, schema, query, n)
            assert [(h.chunk_id, h.score, h.rank) for h in ts_rank.text_search(conn, schema, query, n)] == [
                (cid, s, i) for i, (cid, s) in enumerate(expected, 1)], (query, n)



def test_a_repeated_term_is_searched_once_with_the_same_scores(indexed, schema, golden):
    """ts_rank_cd merges a repeated operand's positions: the list of the query's terms, each kept once, is the
    list of every term as written (ranked by ts_rank_cd itself over the chunk rows)."""
    conn, _, _ = indexed
    queries = ["re-ranking " * 4 + "cross-encoder re-ranking", "rank fusion " * 3 + '"rank fusion" -reciprocal -reciprocal',
               *(q.query + " " + q.query for q in golden[:12])]
    for query in queries:
        text = conn.execute(f"SELECT {lexeme_rule.tsquery('%s')}::text", (query,)).fetchone()[0]
        terms = tsquery._split_top_level(text)
        assert len(set(terms)) < len(terms), query
        pos = " | ".join(f"( {t} )" for t in terms if not t.startswith("!"))
        neg = " | ".join(f"( {t[1:].strip()} )" for t in terms if t.startswith("!")) or None
        expected = ranked_by_ts_rank_cd(conn, schema, pos, neg, 50)
        assert [(h.chunk_id, h.score) for h in ts_rank.text_search(conn, schema, query, 50)] == expected, query

def test_plain_words_are_scored_without_reading_a_tsv(indexed, schema):
    """With the narrow tsv copy emptied (inside a transaction, rolled back) a plain query still finds its
    chunks, from the postings; a phrase or a negation needs the tsv and finds nothing."""
    conn, _, _ = indexed
    before = ts_rank.text_search(conn, schema, "reciprocal rank fusion", 20)
    assert before and ts_rank.plain_words(conn, "reciprocal rank fusion") and not ts_rank.plain_words(conn, '"rank fusion"')
    with conn.transaction(force_rollback=True):
        conn.execute(statement(schema, "DELETE FROM {fulltext}"))
        assert ts_rank.text_search(conn, schema, "reciprocal rank fusion", 20) == before
        assert ts_rank.text_search(conn, schema, '"rank fusion"', 20) == []
        assert ts_rank.text_search(conn, schema, "rank -reciprocal", 20) == []


def test_phrase_queries_rank_only_the_chunks_their_postings_bound_high(indexed, schema):
    """A phrase query (a hyphenated word) at a small n ranks only the chunks whose postings could score
    highest: a chunk whose tsv copy is made to match (inside a transaction, rolled back) while its postings
    hold none of the query's words is not read. At an n near the number of matches every matching chunk is
    ranked, and it comes first (it ties the best and sorts first)."""
    conn, _, _ = indexed
    query = "cross-encoder reranking"
    assert not ts_rank.plain_words(conn, query)
    best = ts_rank.text_search(conn, schema, query, 3)
    assert best
    stranger = conn.execute(statement(schema, """SELECT chunk_id FROM {fulltext}
        WHERE NOT tsv @@ to_tsquery('english', 'cross | encod | rerank | cross-encod') ORDER BY chunk_id LIMIT 1""")).fetchone()[0]
    assert stranger < best[0].chunk_id
    with conn.transaction(force_rollback=True):
        conn.execute(statement(schema, "UPDATE {fulltext} SET tsv = (SELECT tsv FROM {fulltext} WHERE chunk_id = %s) WHERE chunk_id = %s"),
                     (best[0].chunk_id, stranger))
        assert ts_rank.text_search(conn, schema, query, 3) == best
        assert ts_rank.text_search(conn, schema, query, 400)[0].chunk_id == stranger


def test_postings_scores_match_ts_rank_cd_where_a_tsvector_caps_positions(indexed, pg_dsn, schema):
    """A word past a tsvector's 255 positions per lexeme, a chunk past its 16,383rd position (later words
    share that position), hyphenated words and repeated query words: the postings' scores are still
    ts_rank_cd's, and the float4 formula agrees with Postgres for every count up to 3,000 covers."""
    _, embedder, _ = indexed
    name = schema + "_caps"
    texts = ["ranking " * 300 + "fusion",
             " ".join(f"w{i % 5000} ranking" for i in range(9000)) + " fusion tail-end",
             "cross-encoder re-ranking of a ranked list, ranking again",
             "fusion fusion fusion"]
    chunks = [Chunk(f"caps#{i}", "caps", "", 0, len(t), t) for i, t in enumerate(texts)]
    with pg.connect(pg_dsn) as conn:
        try:
            store.create(conn, name, embedder.dims)
            store.sync(conn, name, chunks, embedder)
            for query in ("ranking", "fusion ranking", "ranking ranking fusion", "tail end w17 w4999", "rank cross encoder",
                          "cross-encoder ranking", "fusion -tail"):
                expected = ts_rank_cd_list(conn, name, query, 10)
                assert expected, query
                assert [(h.chunk_id, h.score) for h in ts_rank.text_search(conn, name, query, 10)] == expected, query
            # W / (W + 1) as float4 from count x 0.1, against ts_rank_cd of a tsvector with that many positions
            mismatched = conn.execute("""
                SELECT count(*) FROM generate_series(1, 3000) AS c,
                     LATERAL (SELECT string_agg('w' || (i / 250) || ':' || (i % 250 + 1), ' ')::tsvector AS tsv,
                                     string_agg(DISTINCT 'w' || (i / 250), ' | ')::tsquery AS q
                              FROM generate_series(0, c - 1) AS i) d
                WHERE ts_rank_cd(d.tsv, d.q, 32) <> (c * 0.1::float4::float8 / (c * 0.1::float4::float8 + 1))::float4""").fetchone()[0]
            assert mismatched == 0
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def test_query_with_only_negations_returns_nothing(indexed, schema):
    conn, embedder, _ = indexed
    assert ts_rank.text_search(conn, schema, "-fusion -rank") == []


def _hits(ids):
    return [Hit(cid, 1.0, i) for i, cid in enumerate(ids, 1)]


def test_rrf_formula_ranks_and_tie_break():
    fused = fusion.rrf([_hits(["a", "b", "c"]), _hits(["c", "b", "d"])], k=60)
    score = {r.chunk_id: r.score for r in fused}
    assert score["b"] == pytest.approx(2 / 62)
    assert score["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert score["a"] == pytest.approx(1 / 61) and score["d"] == pytest.approx(1 / 63)
    assert [r.chunk_id for r in fused] == ["c", "b", "a", "d"]
    assert fused[0].ranks == (3, 1) and fused[2].ranks == (1, None) and fused[3].ranks == (None, 3)
    assert [r.rank for r in fused] == [1, 2, 3, 4]
    tie = fusion.rrf([_hits(["y"]), _hits(["x"])])
    assert [r.chunk_id for r in tie] == ["x", "y"]


def test_rrf_ignores_raw_scores():
    huge = [Hit(f"h{i}", 1e9 - i, i) for i in range(1, 31)]
    tiny = [Hit("first", 0.001, 1)]
    fused = fusion.rrf([tiny, huge])
    assert fused[0].chunk_id == "first"
    assert [r.chunk_id for r in fused].index("first") < [r.chunk_id for r in fused].index("h30")


def test_thirtieth_in_both_lists_beats_first_in_one():
    filler_a = [f"a{i}" for i in range(29)] + ["both"]
    filler_b = [f"b{i}" for i in range(29)] + ["both"]
    fused = fusion.rrf([_hits(filler_a), _hits(filler_b)] + [_hits(["solo"])])
    score = {r.chunk_id: r.score for r in fused}
    assert score["both"] == pytest.approx(2 / 90) and score["solo"] == pytest.approx(1 / 61)
    ids = [r.chunk_id for r in fused]
    assert ids.index("both") < ids.index("solo")


@pytest.mark.parametrize("query_id", ["q35", "q41"])
def test_lexical_golden_query_found_by_full_text_missed_by_vectors(indexed, schema, golden, query_id):
    conn, embedder, chunks = indexed
    q = next(g for g in golden if g.query_id == query_id)
    assert q.kind == "lexical"
    rel = golden_set.relevant(chunks, q)
    text_ids = [h.chunk_id for h in ts_rank.text_search(conn, schema, q.query, 10)]
    vector_ids = [h.chunk_id for h in dense.vector_search(conn, schema, embedder.embed([q.query])[0], 10)]
    assert rel & set(text_ids)
    assert not rel & set(vector_ids)


def test_fused_recall_at_10_beats_each_side(indexed, schema, golden):
    conn, embedder, chunks = indexed
    recall = {"vector": [], "text": [], "fused": []}
    params = RetrievalParams(n=50, k=10)
    for q in golden:
        rel = golden_set.relevant(chunks, q)
        vector = embedder.embed([q.query])[0]
        recall["vector"].append(metrics.recall_at_k([h.chunk_id for h in dense.vector_search(conn, schema, vector, 50)], rel, 10))
        recall["text"].append(metrics.recall_at_k([h.chunk_id for h in ts_rank.text_search(conn, schema, q.query, 50)], rel, 10))
        recall["fused"].append(metrics.recall_at_k([r.chunk_id for r in hybrid.search(conn, schema, embedder, q.query, params)], rel, 10))
    mean = {k: sum(v) / len(v) for k, v in recall.items()}
    assert mean["fused"] >= mean["vector"] and mean["fused"] >= mean["text"]
    assert mean["fused"] > min(mean["vector"], mean["text"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.text(max_size=200))
def test_search_never_raises_on_random_text(indexed, schema, query):
    conn, embedder, _ = indexed
    results = hybrid.search(conn, schema, embedder, query)
    assert len(results) <= 10



WORDS = ["rank", "fusion", "reciprocal", "ranking", "BM25", "cross-encoder", "re-rank", "the", "vector", "o'clock",
         "ef_search", "k=60", "RET-658", "zzzunknown", "поиск", "融合"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS) | st.text(alphabet="ab-'\":* !|&()<>", max_size=6), max_size=8),
       n=st.sampled_from([1, 5, 50]))
def test_text_search_equals_ts_rank_cd_on_random_queries(indexed, schema, words, n):
    """Whichever branch a query takes (plain words from the postings, or ts_rank_cd), the list is ts_rank_cd's."""
    conn, _, _ = indexed
    query = " ".join(words)
    expected = ts_rank_cd_list(conn, schema, query, n)
    assert [(h.chunk_id, h.score) for h in ts_rank.text_search(conn, schema, query, n)] == expected, query
