"""BM25 inside Postgres: scores equal bm25s on the same tokens, statistics stay exact through sync."""

from collections import Counter

import bm25s
import numpy as np
import pytest

from psycopg import sql

from retrieval_assets import pg

from retrieval_assets.index import bm25, store

from retrieval_assets.search import bm25_rank, dense, fusion, hybrid, tsquery
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import RetrievalParams
from retrieval_assets.search.rerank import CorpusStats, LexicalReranker
from retrieval_assets.index.tables import statement
from retrieval_assets.types import Chunk, Hit, Ranked
from retrieval_assets_tests.test_hybrid import HOSTILE, Spy


def lexeme_tokens(conn, schema):
    """Every chunk's tsvector expanded into its token list (each lexeme once per position)."""
    rows = conn.execute(statement(
        schema,
        """SELECT chunk_id, coalesce(array_agg(lexeme ORDER BY lexeme) FILTER (WHERE lexeme IS NOT NULL), '{{}}'),
                  coalesce(array_agg(cardinality(positions) ORDER BY lexeme) FILTER (WHERE lexeme IS NOT NULL), '{{}}')
           FROM {chunks} LEFT JOIN LATERAL unnest(tsv) ON true GROUP BY chunk_id ORDER BY chunk_id""")
    ).fetchall()
    return [r[0] for r in rows], [[lex for lex, n in zip(r[1], r[2]) for _ in range(n)] for r in rows]


def peer_scorer(conn, schema):
    """bm25s over the chunks' own lexemes: (chunk ids, query -> (scores by chunk, negated part))."""
    ids, tokens = lexeme_tokens(conn, schema)
    peer = bm25s.BM25(k1=1.2, b=0.75, method="lucene", dtype="float64")
    peer.index(tokens, show_progress=False)

    def score(query):
        positive, negative = tsquery.parse_query(conn, query)
        terms = sorted({t.replace("''", "'") for t in tsquery._LEXEME.findall(positive or "")})
        return (peer.get_scores(terms) if terms else np.zeros(len(ids))), negative

    return ids, score


def test_scores_equal_bm25s_on_the_same_tokens(indexed, schema, golden):
    conn, _, _ = indexed
    ids, score = peer_scorer(conn, schema)
    compared = 0
    for q in golden:
        expected, negative = score(q.query)
        hits = bm25_rank.bm25_search(conn, schema, q.query, n=50)
        for h in hits:
            assert h.score == pytest.approx(float(expected[ids.index(h.chunk_id)]), abs=1e-6)
            compared += 1
        if negative is None:  # "--exact-search" in q38 is a negation; the peer knows none
            top = sorted((i for i in range(len(ids)) if expected[i] > 0), key=lambda i: (-expected[i], ids[i]))[:50]
            assert [h.chunk_id for h in hits] == [ids[i] for i in top]
    assert compared > 1000


def stats_from_scratch(conn, schema):
    ids, tokens = lexeme_tokens(conn, schema)
    postings = sorted((lex, cid, toks.count(lex), len(toks)) for cid, toks in zip(ids, tokens) for lex in set(toks))
    df = Counter(lex for toks in tokens for lex in set(toks))
    return (len(ids), sum(len(t) for t in tokens)), postings, sorted(df.items())


def check_blocks(conn, schema):
    """The block layout bm25_search relies on: per term, blocks of 1 to BLOCK postings, cids
    ascending inside each, keyed by their first cid, ranges disjoint; the three arrays aligned."""
    rows = conn.execute(statement(schema, "SELECT term, first_cid, cids, tfs, lens FROM {postings} ORDER BY term, first_cid")).fetchall()
    last = {}
    for term, first, cids, tfs, lens in rows:
        assert 1 <= len(cids) <= bm25.BLOCK and len(cids) == len(tfs) == len(lens), (term, first)
        assert cids[0] == first and cids == sorted(set(cids)), (term, first, cids)
        assert last.get(term, -1) < first, (term, first)
        last[term] = cids[-1]


def stats_kept(conn, schema):
    check_blocks(conn, schema)
    n, total = conn.execute(statement(schema, "SELECT n, total_len FROM {bm25_stats}")).fetchone()
    return (
        (n, total),
        sorted(conn.execute(statement(schema, """SELECT p.term, cl.chunk_id, u.tf, u.len
            FROM {postings} p, unnest(p.cids, p.tfs, p.lens) AS u(cid, tf, len) JOIN {chunk_lengths} cl USING (cid)""")).fetchall()),
        sorted(conn.execute(statement(schema, "SELECT term, df FROM {term_df}")).fetchall()),
    )


@pytest.mark.parametrize("n", [1, 3, 10])
def test_pruned_top_n_equals_bm25s(indexed, schema, golden, n, monkeypatch):
    """Small n lets max-score pruning stop early: the answer must still be the exact top n.

    Lookups are made free so that the lead path runs even on this small corpus, where reading
    every posting is cheaper and is what bm25_search would otherwise choose."""
    conn, _, _ = indexed
    monkeypatch.setattr(bm25_rank, "LOOKUP_COST", 0)
    ids, score = peer_scorer(conn, schema)
    read_all = statement(schema, bm25_rank._ALL)
    pruned = 0
    for q in golden:
        expected, negative = score(q.query)
        if negative is not None:
            continue
        top = sorted((i for i in range(len(ids)) if expected[i] > 0), key=lambda i: (-expected[i], ids[i]))[:n]
        spy = Spy(conn)
        hits = bm25_rank.bm25_search(spy, schema, q.query, n=n)
        assert [h.chunk_id for h in hits] == [ids[i] for i in top], q.query_id
        assert [h.score for h in hits] == pytest.approx([float(expected[i]) for i in top], abs=1e-6)
        pruned += all(query != read_all for query, _ in spy.calls)
    assert pruned >= len(golden) // 2  # the lead alone settled most queries


def test_exact_over_small_blocks(indexed, scratch, golden, monkeypatch):
    """Blocks of 3 split every term's postings over many blocks: the lead's block lookups (greatest
    first cid at or below the chunk's) and the full read still give bm25s's exact top n."""
    _, embedder, chunks = indexed
    conn, schema = scratch
    monkeypatch.setattr(bm25, "BLOCK", 3)
    store.drop(conn, schema)
    store.create(conn, schema, embedder.dims)
    store.sync(conn, schema, chunks, embedder)
    check_blocks(conn, schema)
    assert conn.execute(statement(schema, "SELECT max(cardinality(cids)) FROM {postings}")).fetchone()[0] == 3
    ids, score = peer_scorer(conn, schema)
    for cost in (0, bm25_rank.LOOKUP_COST):  # the lead path forced, then bm25_search's own choice
        monkeypatch.setattr(bm25_rank, "LOOKUP_COST", cost)
        for q in golden[:16]:
            expected, negative = score(q.query)
            if negative is not None:
                continue
            top = sorted((i for i in range(len(ids)) if expected[i] > 0), key=lambda i: (-expected[i], ids[i]))[:10]
            hits = bm25_rank.bm25_search(conn, schema, q.query, n=10)
            assert [h.chunk_id for h in hits] == [ids[i] for i in top], (q.query_id, cost)
            assert [h.score for h in hits] == pytest.approx([float(expected[i]) for i in top], abs=1e-6)
    store.drop(conn, schema)


def make(doc, texts):
    return [Chunk(f"{doc}#{i:03d}", doc, "", 0, len(t), t) for i, t in enumerate(texts)]


@pytest.fixture()
def scratch(pg_dsn, schema):
    """(connection, a second schema of this module's, dropped afterwards)."""
    name = schema + "_stats"
    with pg.connect(pg_dsn) as connection:
        try:
            yield connection, name
        finally:
            connection.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.mark.parametrize("block", [2, 128])
def test_statistics_stay_exact_through_inserts_edits_and_deletions(scratch, block, monkeypatch):
    """Blocks of 2 make every write split, append to and empty blocks; 128 is the real size."""
    monkeypatch.setattr(bm25, "BLOCK", block)
    conn, schema = scratch
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    e = HashEmbedder()
    shared = [f"common shared words, number {i}" for i in range(7)]
    steps = [
        make("a", ["Ranking ranks the ranked lists", "the of and"]) + make("b", ["BM25 saturates term frequency"]),
        make("a", ["Ranking ranks the ranked lists again", "fresh words here"]) + make("b", ["BM25 saturates term frequency"]),
        make("b", ["BM25 saturates term frequency", "a second chunk of b"]) + make("c", shared),
        make("b", ["BM25 saturates term frequency"]) + make("c", shared[:1] + ["gap"] + shared[2:5] + ["common words again"] + shared[6:]),
        make("c", shared + ["common shared words, one more"]),
        [],
    ]
    for chunks in steps:
        store.sync(conn, schema, chunks, e, allow_shrink=True)
        assert stats_kept(conn, schema) == stats_from_scratch(conn, schema)
    store.upsert(conn, schema, make("c", ["upserted text counts too"]), e)
    assert stats_kept(conn, schema) == stats_from_scratch(conn, schema)
    store.drop(conn, schema)


def test_backfill_of_a_table_that_predates_the_postings(scratch):
    conn, schema = scratch
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    store.sync(conn, schema, make("a", ["alpha beta", "gamma delta gamma"]), HashEmbedder())
    conn.execute(statement(schema, "DROP TABLE {postings}, {chunk_lengths}, {bm25_stats}"))
    store.create(conn, schema, 256)
    assert stats_kept(conn, schema) == stats_from_scratch(conn, schema)
    # a schema from before block postings: one row per posting in chunk_terms, lengths without cid
    conn.execute(statement(schema, "DROP TABLE {postings}, {chunk_lengths}"))
    conn.execute(statement(schema, "CREATE TABLE {chunk_lengths} (chunk_id text PRIMARY KEY, len int)"))
    conn.execute(sql.SQL("CREATE TABLE {} (term text, chunk_id text, tf int, len int)").format(sql.Identifier(schema, "chunk_terms")))
    store.create(conn, schema, 256)
    assert stats_kept(conn, schema) == stats_from_scratch(conn, schema)
    assert conn.execute("SELECT to_regclass(%s)", (f"{schema}.chunk_terms",)).fetchone()[0] is None
    conn.execute(statement(schema, "DROP TABLE {term_df}"))  # postings from before document frequencies were kept
    store.create(conn, schema, 256)
    assert stats_kept(conn, schema) == stats_from_scratch(conn, schema)
    store.drop(conn, schema)


@pytest.mark.parametrize("query", HOSTILE + ["", "-", "-fusion -rank"])
def test_hostile_queries_never_raise(indexed, schema, query):
    """Hostile text gives well-formed lists equal to their references (bm25s; RRF of both lists)."""
    conn, embedder, _ = indexed
    hits = bm25_rank.bm25_search(conn, schema, query)
    assert isinstance(hits, list) and all(isinstance(h, Hit) for h in hits)
    assert [h.rank for h in hits] == list(range(1, len(hits) + 1))
    ids, score = peer_scorer(conn, schema)
    expected, negative = score(query)
    for h in hits:
        assert h.score == pytest.approx(float(expected[ids.index(h.chunk_id)]), abs=1e-6)
    if negative is None:
        top = sorted((i for i in range(len(ids)) if expected[i] > 0), key=lambda i: (-expected[i], ids[i]))[:50]
        assert [h.chunk_id for h in hits] == [ids[i] for i in top]
    params = RetrievalParams(lexical="bm25", weights=(0.5, 1.0))
    fused = hybrid.search(conn, schema, embedder, query, params)
    assert isinstance(fused, list) and all(isinstance(r, Ranked) for r in fused)
    assert [r.rank for r in fused] == list(range(1, len(fused) + 1)) and len(fused) <= params.k
    vector = dense.vector_search(conn, schema, embedder.embed([query])[0], params.n)
    assert fused == fusion.rrf([vector, hits], params.rrf_k, params.weights)[: params.k]


def test_negated_terms_exclude(indexed, schema):
    conn, _, chunks = indexed
    by_id = {c.chunk_id: c for c in chunks}
    hits = bm25_rank.bm25_search(conn, schema, "rank fusion -reciprocal", n=200)
    assert hits and all("reciprocal" not in by_id[h.chunk_id].text.lower() for h in hits)


def test_unknown_lexical_ranking_is_an_error(indexed, schema):
    conn, embedder, _ = indexed
    with pytest.raises(ValueError, match="unknown lexical ranking 'tfidf'"):
        hybrid.lexical_search(conn, schema, "x", 10, "tfidf")
    with pytest.raises(ValueError, match="lexical must be one of ts_rank_cd, bm25, got 'tfidf'"):
        hybrid.search(conn, schema, embedder, "x", RetrievalParams(lexical="tfidf"))


def test_reranker_with_corpus_idf():
    texts = ["alpha beta", "alpha gamma", "alpha alpha delta"]
    corpus = CorpusStats.from_texts(texts + ["zeta"] * 7)
    assert corpus.n == 10 and corpus.df["alpha"] == 3 and corpus.avg_len == pytest.approx((2 + 2 + 3 + 7) / 10)
    pooled = LexicalReranker().scores("alpha delta", texts)
    global_ = LexicalReranker(corpus=corpus).scores("alpha delta", texts)
    # in the pool alpha is everywhere (low idf); in the corpus it is in 3 of 10 chunks
    idf_alpha = np.log1p((10 - 3 + 0.5) / 3.5)
    norm = 1.2 * (1 - 0.75 + 0.75 * 2 / corpus.avg_len)
    assert global_[0] == pytest.approx(idf_alpha * 2.2 / (1 + norm))
    assert global_[0] > pooled[0]
