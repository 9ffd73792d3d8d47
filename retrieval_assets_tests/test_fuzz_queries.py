"""Issue 36: user query text never raises. The operator run that did (a long run of '-' failed the default and
the seed pipelines with "tsquery stack too small"), the Postgres limit behind it, and a property-based fuzz of
the whole query path against the fixture index (``fuzzing.check_query``; the longer run is
``python -m benchmarks fuzz``)."""

from __future__ import annotations

import logging

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from retrieval_assets.answers import answer
from retrieval_assets.params import DEFAULT, MAX_QUERY_NEGATIONS, SEED, limit_negations, limit_query
from retrieval_assets.search import bm25_rank, pipeline, ts_rank, tsquery
from retrieval_assets.index.tables import statement
from retrieval_assets_tests import fuzzing

OPERATOR_RUN = "-" * 3000  # issue 36's query: psycopg.errors.InternalError_ "tsquery stack too small" before the fix
EXAMPLES = 250  # derandomized: the same queries on every run; 20 to 30 s on a loaded 2-core machine


@pytest.fixture(scope="module")
def fuzz(indexed, schema):
    conn, embedder, chunks = indexed
    retrievers = {name: (pipeline.retriever(conn, schema, embedder, p), p) for name, p in (("default", DEFAULT), ("seed", SEED))}
    words = fuzzing.vocabulary(conn, schema, [c.text for c in chunks])
    return conn, retrievers, pipeline.retriever(conn, schema, embedder, answer.SOURCES), words


def _websearch(conn, text: str) -> str:
    return conn.execute("SELECT websearch_to_tsquery('english', %s)::text", (text,)).fetchone()[0]


@pytest.mark.parametrize(("before", "accepted"), [("", 32), ("fusion ", 31), ("fusion or rank ", 30)])
def test_postgres_holds_30_to_32_negations_in_a_row(conn, before, accepted):
    """What params.MAX_QUERY_NEGATIONS is chosen from: Postgres's websearch_to_tsquery takes ``accepted`` NOTs in a
    row after ``before`` (30 after "word or word", the worst place) and fails on one more."""
    assert _websearch(conn, before + "-" * accepted + "retrieval").count("!") == accepted
    with pytest.raises(psycopg.errors.InternalError, match="tsquery stack too small"), conn.transaction():
        _websearch(conn, before + "-" * (accepted + 1) + "retrieval")
    assert 2 * MAX_QUERY_NEGATIONS <= 30 - 10  # two runs a quote might join, with 10 to spare


def test_the_operator_run_is_searched_by_both_pipelines_and_the_answer(fuzz, caplog):
    conn, retrievers, answers, _ = fuzz
    with caplog.at_level(logging.INFO, logger="retrieval_assets.search.pipeline"):
        for name, (retriever, params) in retrievers.items():
            assert pipeline.run(conn, retriever, OPERATOR_RUN, params).final == []  # no word: nothing to find
            assert pipeline.run(conn, retriever, "retrieval " + OPERATOR_RUN, params).text  # a word, then the run
            assert pipeline.run(conn, retriever, OPERATOR_RUN[:900] + "retrieval", params).final  # NOT 900 times: retrieval
    assert "query cut from 3000 to 10 characters (limits: 1000 characters, 64 terms, 10 negations in a row)" in caplog.text
    assert answer.sources(conn, answers, OPERATOR_RUN) == []
    assert answer.sources(conn, answers, "fusion or rank " + "- " * 200 + "retrieval")


def test_every_statement_that_parses_query_text_cuts_the_run(indexed, schema, caplog):
    """The lexical lists and the parser called directly, without pipeline.run's cut: tsquery.clean cuts it, to
    the same lists as the run's parity gives (500 NOTs, as 2: saturation required, not scored)."""
    conn, _, _ = indexed
    query, same = "bm25 " + "-" * 500 + "saturation", "bm25 --saturation"
    with caplog.at_level(logging.INFO, logger="retrieval_assets.search.tsquery"):
        assert ts_rank.text_search(conn, schema, query) == ts_rank.text_search(conn, schema, same) != []
        assert bm25_rank.bm25_search(conn, schema, query) == bm25_rank.bm25_search(conn, schema, same) != []
        assert tsquery.parse_query(conn, query) == ("( 'bm25' )", "( !!!!!!!!!'satur' )")
        assert not ts_rank.plain_words(conn, query)
    assert "runs of negations cut from 515 to 25 characters (limit: 10 in a row)" in caplog.text


@pytest.mark.parametrize("n", [11, 12, 31, 32, 999, 1000])
def test_a_cut_run_means_what_it_meant(conn, schema, indexed, n):
    """NOT NOT x is x: the cut keeps a run's parity, so the same chunks match as with n % 2 minus signs."""
    cut = limit_negations("fusion " + "-" * n + "retrieval")
    assert cut.count("-") == MAX_QUERY_NEGATIONS - n % 2
    matching = "SELECT array_agg(chunk_id ORDER BY chunk_id) FROM {fulltext} WHERE tsv @@ websearch_to_tsquery('english', %s)"
    same = "fusion " + "-" * (n % 2) + "retrieval"
    assert conn.execute(statement(schema, matching), (cut,)).fetchone() == conn.execute(statement(schema, matching), (same,)).fetchone()


@pytest.mark.parametrize(("query", "expected"), [
    ("state-of-the-art -retrieval --fusion", "state-of-the-art -retrieval --fusion"),  # within the bound: unchanged
    ("x" + "-" * 40 + " y", "x" + "-" * 40 + " y"),  # dashes inside a word are no operators
    ("a " + "- " * 12 + "b", "a " + "- " * 10 + "  b"),  # the spaces between them stay
    ("(-!-)" * 6 + "x", "(-!-)" * 5 + "(!)x"),  # through every character the parser skips there
    ("-" * 11 + '"' + "-" * 11 + "x", "-" * 9 + '"' + "-" * 9 + "x"),  # a quote ends a run
    ("-\x00" * 11 + "x", "-\x00" * 9 + "\x00\x00x"),  # NUL is a space
])
def test_limit_negations(query, expected):
    assert limit_negations(query) == expected
    assert limit_query(query) == expected


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzz_the_query_path(fuzz, data):
    """Any query text: both pipelines and the answer path never raise, return within the statement timeout, find
    hits for a plain corpus word, and leave the index as it was."""
    conn, retrievers, answers, words = fuzz
    before = fuzzing.fingerprint(conn, answers.schema)
    query = data.draw(fuzzing.query_text(words), label="query")
    searched = limit_query(query)
    event("holds a plain corpus word" if fuzzing.plain_words(query, set(words)) else "holds no plain corpus word")
    event("cut" if searched != query else "not cut")
    event("negates" if "-" in searched else "negates nothing")
    fuzzing.check_query(conn, retrievers, answers, query, set(words))
    assert fuzzing.fingerprint(conn, answers.schema) == before
