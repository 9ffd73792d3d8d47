"""Stage 07, automated: every miss of the default pipeline classified, checked against the hand-labelled key."""

import re

import pytest

from retrieval_assets import cli

from retrieval_assets.corpus import golden

from retrieval_assets.evaluation import diagnose

from retrieval_assets.search import pipeline
from retrieval_assets.evaluation.evaluate import evaluate_pipelines
from retrieval_assets.params import DEFAULT, SEED
from retrieval_assets_tests.conftest import CORPUS

KEY = golden.load_yaml((CORPUS / "failure_key.yaml").read_text(), "failure_key.yaml")


@pytest.fixture(scope="module")
def misses(indexed, schema, golden):
    conn, embedder, _ = indexed
    return diagnose.diagnose(conn, pipeline.retriever(conn, schema, embedder, DEFAULT), golden, DEFAULT)


@pytest.fixture(scope="module")
def report(misses, indexed, golden, corpus_documents, schema):
    conn, embedder, chunks = indexed
    what_ifs = diagnose.what_if(conn, pipeline.retriever(conn, schema, embedder, DEFAULT), golden, corpus_documents, chunks,
                                DEFAULT, scratch=schema + "_whatif", others={"minilm": None})
    return diagnose.Report("hash", DEFAULT.k, DEFAULT.n, len(golden), misses, what_ifs)


def test_misses_are_exactly_the_queries_without_a_relevant_chunk_in_the_top_k(misses, indexed, schema, golden):
    conn, embedder, _ = indexed
    ev = evaluate_pipelines(conn, pipeline.retriever(conn, schema, embedder, DEFAULT), golden, DEFAULT)
    assert {d.query.query_id for d in misses} == {q.query_id for q in ev.failures()}
    for d in misses:
        assert d.ranks["final"] is None
        assert set(d.ranks) == set(diagnose.LISTS)


def test_every_miss_has_a_row_in_the_vocabulary(report):
    text = diagnose.render(report)
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^\| (q\d\d) \| ([\w-]+) \| ([\w-]+) \|", text, re.M)}
    assert set(rows) == {d.query.query_id for d in report.misses}
    assert all(f in diagnose.FAILURES and x in diagnose.FIXES for f, x in rows.values())
    assert len({f for f, _ in rows.values()}) > 1


@pytest.fixture(scope="module")
def seed_misses(indexed, schema, golden):
    """The seed pipeline's misses: the ones failure_key.yaml labels by hand."""
    conn, embedder, _ = indexed
    return diagnose.diagnose(conn, pipeline.retriever(conn, schema, embedder, SEED), golden, SEED)


def test_agreement_with_the_hand_labelled_key(seed_misses):
    misses = seed_misses
    assert {d.query.query_id for d in misses} <= set(KEY), "a miss the key has not labelled"
    agree = sum(d.failure in KEY[d.query.query_id]["failure"] for d in misses)
    assert agree / len(misses) >= 0.7


def test_one_paragraph_of_25_words_per_kind_used(report):
    text = diagnose.render(report)
    for kind in {d.failure for d in report.misses}:
        section = text.split(f"## {kind}\n", 1)[1].split("\n## ", 1)[0]
        assert len(section.split()) >= 25
        assert any(d.query.query_id in section for d in report.misses if d.failure == kind)


def test_what_ifs_report_rescued_and_lost_and_the_missing_partition(report, misses):
    fixes = {w.fix for w in report.what_ifs}
    assert {"hybrid-weights", "contextual-chunk-headers", "smaller-chunks", "better-embedder"} == fixes
    miss_ids = {d.query.query_id for d in misses}
    for w in report.what_ifs:
        assert set(w.rescued) <= miss_ids and not set(w.lost) & miss_ids
    [other] = [w for w in report.what_ifs if w.fix == "better-embedder"]
    assert other.note.startswith("not run") and not other.rescued
    assert "## What-if experiments" in diagnose.render(report)


@pytest.mark.parametrize(
    "ranks, neighbour, same_doc, expected",
    [
        ({"fused": 3}, None, None, "reranker-demotion"),
        ({"fused": 30}, ("d#004", 7), None, "chunk-boundary"),
        ({"fused": 30}, None, ("d#009", 2), "ranking"),
        ({"fused": None}, None, ("d#009", 2), "anchor-ambiguity"),
        ({"fused": None}, None, None, "vocabulary-gap"),
    ],
)
def test_classification_rules(ranks, neighbour, same_doc, expected):
    assert diagnose.classify(ranks, neighbour, same_doc, 10) == expected


def test_what_if_scratch_schema_is_dropped_afterwards(report, conn, schema):
    assert report.what_ifs
    assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema + "_whatif",)).fetchone()[0] == 0


def test_cli_prints_the_same_report(pg_dsn, capsys, misses, conn, cli_schemas):
    assert cli.main(["diagnose", "--corpus", str(CORPUS), "--dsn", pg_dsn, "--no-what-if"]) == 0
    out = capsys.readouterr().out
    for d in misses:
        assert f"| {d.query.query_id} | {d.failure} | {d.fix} |" in out
    assert "Not run: materialize the `what_ifs` asset" in out and "| fix | variant |" not in out
    # the command line indexed into its own (here: prefixed) schema
    assert conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (cli_schemas[0],)).fetchone()[0] == 1
    assert cli.main(["diagnose", "--corpus", "missing/dir", "--dsn", pg_dsn]) == 2
    err = capsys.readouterr().err
    assert "corpus directory not found" in err and err.startswith("error: ")
