"""Issue 18: the first stage in one or two round trips, with the lists of the statements it replaced; issue 41:
one snapshot per search (a REPEATABLE READ transaction whose BEGIN rides with the first statements and whose
COMMIT rides with the last, or takes a trip of its own after a list read in several trips, as BM25's).

Round trips are counted from libpq's own trace of the protocol: the client waits for the server
at every Flush it sends, and at every Sync or simple Query not followed by a Flush (a Sync then a
Flush, as a pipeline ends, is one wait). Counting the frontend messages, not where backend ones
fall between them, keeps the count independent of timing: in pipeline mode psycopg reads results
that have already arrived while it is still sending, so under load the backend's lines can land
inside one batch (a run counted 5 trips where there were 3). The lists are compared exactly (chunk ids,
ranks and float scores) with the old sequence written out here: BEGIN, set_config, the vector
query, COMMIT; ``tsquery.parse_query`` (a statement of its own) and the text query with its
results as parameters; the BM25 statistics looked up from ``parse_query``'s lexemes.
"""

import os
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import pq

from retrieval_assets import pg

from retrieval_assets.search import bm25_rank, dense, hybrid, pipeline, ts_rank, tsquery
from retrieval_assets.params import DEFAULT, SEED, RetrievalParams, limit_query
from retrieval_assets.index.tables import statement
from retrieval_assets.types import Hit, as_hits
from retrieval_assets_tests.test_hybrid import HOSTILE, Spy

TS_RANK_CD = RetrievalParams(n=50, k=10, lexical="ts_rank_cd")
BM25 = RetrievalParams(n=50, k=10, lexical="bm25")


@contextmanager
def round_trips(conn, tmp_path):
    """``[count]`` after the block: the round trips ``conn`` made inside it, from libpq's trace."""
    counted = []
    path = tmp_path / "libpq.trace"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    conn.pgconn.trace(fd)
    conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
    try:
        yield counted
    finally:
        conn.pgconn.untrace()
        os.close(fd)
    sent = [fields[2].split(" ", 1)[0].strip() for fields in (line.split("\t") for line in path.read_text().splitlines())
            if len(fields) > 2 and fields[0] == "F"]
    counted.append(sum(1 for i, message in enumerate(sent)
                       if message == "Flush" or (message in ("Sync", "Query") and sent[i + 1 : i + 2] != ["Flush"])))


def trips(conn, tmp_path, fn) -> int:
    with round_trips(conn, tmp_path) as counted:
        fn()
    return counted[0]


def test_first_stage_is_one_round_trip_with_ts_rank_cd_and_two_with_bm25(indexed, schema, golden, tmp_path):
    conn, embedder, _ = indexed
    for q in golden:  # warm: psycopg prepares a statement on its sixth use, in a trip of its own
        for _ in range(6):
            hybrid.first_stage(conn, schema, embedder.embed([q.query])[0], q.query, BM25)
            hybrid.first_stage(conn, schema, embedder.embed([q.query])[0], q.query, TS_RANK_CD)
    for q in golden:
        vector = embedder.embed([q.query])[0]
        assert trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, TS_RANK_CD)) == 1, q.query
        # BM25: the statistics, the postings, and the COMMIT that ends the snapshot they were read in
        assert trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, BM25)) == 3, q.query
        assert trips(conn, tmp_path, lambda: hybrid.search(conn, schema, embedder, q.query, TS_RANK_CD)) == 1
        assert trips(conn, tmp_path, lambda: dense.vector_search(conn, schema, vector, 50)) == 1
        assert trips(conn, tmp_path, lambda: ts_rank.text_search(conn, schema, q.query, 50)) == 1
        assert trips(conn, tmp_path, lambda: bm25_rank.bm25_search(conn, schema, q.query, 50)) == 3
    # the counter sees the trips of a connection without pipeline mode: BEGIN, SET TRANSACTION, set_config, query, COMMIT
    assert trips(conn, tmp_path, lambda: dense.vector_search(Spy(conn), schema, embedder.embed(["rank"])[0], 50)) == 5


def old_vector_search(conn, schema, vector, n, ef_search):
    """The vector list as it was sent before: four statements in a transaction of its own."""
    if not np.any(vector):
        return []
    with conn.transaction():
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(max(ef_search or n, 40), 1000)),))
        rows = conn.execute(statement(schema, "SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM {chunks} "
                                              "ORDER BY embedding <=> %(q)s LIMIT %(n)s"),
                            {"q": np.asarray(vector, dtype=np.float32), "n": n}).fetchall()
    return as_hits(rows)


def old_text_search(conn, schema, query, n):
    """The ts_rank_cd list as it was sent before: the query parsed by one statement, searched by another."""
    positive, negative = tsquery.parse_query(conn, query)
    if positive is None:
        return []
    return as_hits(conn.execute(statement(
        schema, """SELECT chunk_id, ts_rank_cd(tsv, q, 32) AS score FROM {chunks}, CAST(%(pos)s AS tsquery) AS q
                   WHERE tsv @@ q AND (%(neg)s::tsquery IS NULL OR NOT tsv @@ %(neg)s::tsquery)
                   ORDER BY score DESC, chunk_id LIMIT %(n)s"""), {"pos": positive, "neg": negative, "n": n}).fetchall())


def old_bm25_statistics(conn, schema, query):
    """What bm25_search read before its postings: parse_query's negated part and the terms' statistics."""
    positive, negative = tsquery.parse_query(conn, query)
    if positive is None:
        return []
    rows = conn.execute(statement(schema, """SELECT s.n::float8, greatest(s.total_len, 1)::float8 / greatest(s.n, 1), d.term, d.df
           FROM {bm25_stats} s JOIN {term_df} d ON d.term = ANY(%s) AND d.df > 0
           ORDER BY d.df, d.term"""), (tsquery.lexemes(positive),)).fetchall()
    return [(negative, *r) for r in rows]


def test_lists_equal_the_statements_they_replace(indexed, schema, golden):
    conn, embedder, _ = indexed
    queries = [q.query for q in golden] + HOSTILE + ["rank fusion -reciprocal", 'ranking -"rank fusion"', "-fusion -rank", ""]
    for query in queries:
        query = limit_query(query)
        vector = embedder.embed([query])[0]
        for params in (TS_RANK_CD, BM25, BM25.with_(n=7, k=7, ef_search=300)):
            got_vector, got_lexical = hybrid.first_stage(conn, schema, vector, query, params)
            assert got_vector == old_vector_search(conn, schema, vector, params.n, params.ef_search), query
            if params.lexical == "ts_rank_cd":
                assert got_lexical == old_text_search(conn, schema, query, params.n), query
            else:
                # the same statements one at a time (a connection without pipeline mode) give the same list
                assert got_lexical == bm25_rank.bm25_search(Spy(conn), schema, query, params.n), query
        assert ts_rank.text_search(conn, schema, query, 50) == old_text_search(conn, schema, query, 50)
        stats = conn.execute(statement(schema, bm25_rank._STATS), {"query": tsquery.clean(query)}).fetchall()
        assert stats == old_bm25_statistics(conn, schema, query), query
    # and what the pipeline keeps of them: each list's ranks in the Trace
    retriever = pipeline.Retriever(schema, embedder, None)
    trace = pipeline.run(conn, retriever, golden[0].query, SEED)
    vector = embedder.embed([golden[0].query])[0]
    assert trace.vector == old_vector_search(conn, schema, vector, SEED.n, SEED.ef_search)
    assert trace.text == old_text_search(conn, schema, golden[0].query, SEED.n)
    assert all(isinstance(h, Hit) for h in trace.text)


def parsed_in_sql(conn, query):
    """``(pos, neg)`` and the lexemes of pos, as tsquery.PARSED and tsquery.LEXEMES compute them."""
    params = {"query": tsquery.clean(query)}
    pos, neg = conn.execute(f"WITH {tsquery.PARSED} SELECT pos, neg FROM parsed", params).fetchone()
    terms = conn.execute(f"WITH {tsquery.PARSED}, t AS ({tsquery.LEXEMES}) SELECT term FROM t ORDER BY term COLLATE \"C\"",
                         params).fetchall()
    return (pos, neg), [t for (t,) in terms]


@pytest.mark.parametrize("query", [*HOSTILE, "it's o'neil's -rock'n'roll", '"a (b) c" -(x y) or z', "--a -\"foo-bar baz\" qux",
                                   "a & b | c ! d", "foo-bar-baz -qux-quux", "(a b) or (c -d)", "", "'''"])
def test_parse_in_sql_equals_parse_query(conn, query):
    (pos, neg), terms = parsed_in_sql(conn, query)
    assert (pos, neg) == tsquery.parse_query(conn, query)
    assert terms == sorted(tsquery.lexemes(pos or ""))


def test_parse_in_sql_equals_parse_query_on_the_golden_queries(conn, golden):
    for q in golden:
        (pos, neg), terms = parsed_in_sql(conn, q.query)
        assert (pos, neg) == tsquery.parse_query(conn, q.query), q.query
        assert terms == sorted(tsquery.lexemes(pos or ""))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.lists(st.sampled_from([*"ab c-\"'()&|!:*<>\\ ", "or", "OR", "rank", "it's", "foo-bar", "é", "\x00"]),
                      max_size=40).map("".join) | st.text(max_size=60))
def test_parse_in_sql_equals_parse_query_on_any_text(conn, query):
    (pos, neg), terms = parsed_in_sql(conn, query)
    assert (pos, neg) == tsquery.parse_query(conn, query)
    assert terms == sorted(tsquery.lexemes(pos or ""))


def test_ef_search_takes_effect_before_the_index_scan(indexed, schema, pg_dsn):
    _, embedder, _ = indexed
    vector = embedder.embed(["postgres index"])[0]
    conn = pg.connect(pg_dsn)  # new: no statement prepared (planned) before enable_seqscan is off
    with conn, conn.transaction():
        # the planner reads 430 rows exactly (a sequential scan): make it use the HNSW index
        conn.execute("SET LOCAL enable_seqscan = off")
        # ef_search 40 < n: the graph search returns at most 40 candidates; ef_search n returns n
        assert len(dense.vector_search(conn, schema, vector, 50, ef_search=40)) <= 40
        assert len(dense.vector_search(conn, schema, vector, 50)) == 50
        small, _ = hybrid.first_stage(conn, schema, vector, "postgres index", BM25.with_(ef_search=40))
        assert len(small) <= 40
        assert conn.execute("SELECT current_setting('hnsw.ef_search')").fetchone()[0] == "40"
        large, _ = hybrid.first_stage(conn, schema, vector, "postgres index", BM25.with_(ef_search=120))
        assert len(large) == 50
        assert conn.execute("SELECT current_setting('hnsw.ef_search')").fetchone()[0] == "120"
    conn, _, _ = indexed
    # outside a transaction the setting lives and ends with the statements it was sent with
    hybrid.first_stage(conn, schema, vector, "postgres index", BM25.with_(ef_search=300))
    assert conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "40"
    assert conn.pgconn.pipeline_status == pq.PipelineStatus.OFF
    assert conn.info.transaction_status == pq.TransactionStatus.IDLE


def test_a_connection_without_autocommit_is_left_as_before(indexed, schema, pg_dsn):
    _, embedder, _ = indexed
    vector = embedder.embed(["postgres index"])[0]
    with pg.connect(pg_dsn, autocommit=False) as conn:
        for partner in (None, hybrid.AUTO):  # the graph search on conn, then on pg.partner beside the text list
            vector_hits, text_hits = hybrid.first_stage(conn, schema, vector, "postgres index", TS_RANK_CD, partner=partner)
            assert vector_hits and text_hits
            assert conn.info.transaction_status == pq.TransactionStatus.IDLE  # committed, as conn.transaction() did
            assert conn.execute("SHOW hnsw.ef_search").fetchone()[0] == "40"  # pgvector loaded by the first pass
            conn.commit()


def _lists(trace):
    return [trace.vector, trace.text, trace.fused, trace.reranked, trace.final, sorted(trace.chunks)]


def test_a_pipeline_run_is_two_round_trips_with_ts_rank_cd_and_three_with_bm25(indexed, schema, golden, tmp_path, monkeypatch, pg_dsn):
    """BEGIN and the statement timeout (local to the run's transaction) ride with the first-stage statements and
    COMMIT with the pool's fetch (was 5 and 6: BEGIN, set_config, the first stage, the fetch and COMMIT each a
    trip); same lists.
    On an idle autocommit connection, as pg.connect opens them (others keep the transaction)."""
    _, embedder, _ = indexed
    with pg.connect(pg_dsn) as conn:
        assert conn.autocommit
        _run_trips(conn, embedder, schema, golden, tmp_path, monkeypatch)


def _run_trips(conn, embedder, schema, golden, tmp_path, monkeypatch):
    # psycopg prepares a statement on its sixth use and drops the least used past 100 (a trip each);
    # the count here is the steady state, without either
    monkeypatch.setattr(conn, "prepare_threshold", None)
    cases = [SEED, DEFAULT]  # SEED: ts_rank_cd + MMR (the pool's vectors fetched); DEFAULT: bm25, no MMR
    retrievers = {p: pipeline.retriever(conn, schema, embedder, p) for p in cases}
    for p in cases:  # a new connection's first statements can look types up, a trip each, once
        pipeline.run(conn, retrievers[p], golden[-1].query, p)
    traces = {}
    for q in golden[:8]:
        vector = embedder.embed([q.query])[0]
        for p in cases:
            # the first stage's own trips: 1 with ts_rank_cd; 2 with BM25 on this table as indexed, more when
            # other tests' writes to it make max-score pruning widen its lead (first_stage's docstring)
            first = trips(conn, tmp_path, lambda: hybrid.first_stage(conn, schema, vector, q.query, p))
            if p.lexical == "ts_rank_cd":
                assert first == 1, q.query
            got = []
            # the run adds the pool's fetch, which carries the COMMIT: one trip more with ts_rank_cd (2 here), none
            # with BM25, whose first stage alone spends a trip on its COMMIT (3 here)
            assert trips(conn, tmp_path, lambda: got.append(pipeline.run(conn, retrievers[p], q.query, p))) \
                == first + (p.lexical == "ts_rank_cd"), (q.query, p.lexical)
            traces[q.query, p.lexical] = got[0]
    assert conn.info.transaction_status == pq.TransactionStatus.IDLE
    monkeypatch.setattr(pipeline.psycopg.Pipeline, "is_supported", classmethod(lambda cls: False))  # the statements one by one
    for q in golden[:8]:
        for p in cases:
            old = []
            assert trips(conn, tmp_path, lambda: old.append(pipeline.run(conn, retrievers[p], q.query, p))) >= 5
            assert _lists(old[0]) == _lists(traces[q.query, p.lexical]), q.query
