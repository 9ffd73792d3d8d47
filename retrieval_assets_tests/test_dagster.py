"""The Dagster graph materialised in process against the test Postgres."""

import datetime
import shutil
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml

from psycopg import sql

from retrieval_assets import evaluation, golden, pg
from retrieval_assets.defs import corpus, diagnosis, index
from retrieval_assets.defs import evaluation as evaluation_defs
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.definitions import defs
from retrieval_assets.defs.jobs import nightly_evaluation
from retrieval_assets.embed import HashEmbedder
from retrieval_assets.pipeline import Retriever
from retrieval_assets.rerank import LexicalReranker
from retrieval_assets_tests.conftest import CORPUS

ALL = dg.load_assets_from_modules([corpus, index, evaluation_defs, diagnosis])
PREFIX = "t_dagster_"
REPORTS = Path(tempfile.mkdtemp(prefix="retrieval-reports-"))


@pytest.fixture(scope="module")
def resource(pg_dsn):
    yield PostgresResource(dsn=pg_dsn, schema_prefix=PREFIX)
    with pg.connect(pg_dsn) as conn:
        for schema in ("hash", "whatif_hash", "retrieval_history"):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(PREFIX + schema)))


def run(resource, corpus=CORPUS, eval_config=None, partition="hash", selection=None, what_if=False):
    corpus_config = {"config": {"corpus_dir": str(corpus)}}
    report_config = {"config": {"what_if": what_if, "report_dir": str(REPORTS)}}
    ops = {"documents": corpus_config, "golden_queries": corpus_config, "failure_report": report_config}
    if eval_config:
        ops["eval_run"] = {"config": eval_config}
    if selection:
        ops = {name: value for name, value in ops.items() if name in selection}
    return dg.materialize(
        ALL, partition_key=partition, resources={"postgres": resource}, run_config={"ops": ops},
        raise_on_error=False, selection=selection,
    )


def metadata(result, key):
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(key)]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_definitions_load_with_jobs_schedule_and_partitions():
    repo = defs.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {
        "documents", "chunks", "golden_queries", "chunk_index", "eval_run", "failure_report", "embedder_comparison", "answers", "cranfield_report"}
    job = defs.resolve_job_def("evaluate_embedders")
    assert job.partitions_def.get_partition_keys() == ["hash", "minilm", "bge-small"]
    assert nightly_evaluation.default_status == dg.DefaultScheduleStatus.STOPPED
    requests = list(nightly_evaluation(dg.build_schedule_context(scheduled_execution_time=datetime.datetime(2026, 12, 2))))
    assert [r.partition_key for r in requests] == ["hash", "minilm", "bge-small"]


def test_whole_graph_for_hash_matches_the_library(resource):
    result = run(resource, what_if=True)
    assert result.success
    index = metadata(result, "chunk_index")
    chunks = result.output_for_node("chunks")
    assert index["rows"] == len(chunks) == 430 and index["dims"] == 256
    ev_meta = metadata(result, "eval_run")
    with resource.connect() as conn:
        queries = golden.load_golden(CORPUS / "golden.yaml")
        ev = evaluation.evaluate_pipelines(conn, Retriever(resource.schema("hash"), HashEmbedder(), LexicalReranker()), queries)
    for pipeline, m in ev.metrics.items():
        assert ev_meta[f"{pipeline}/recall@k"] == m.recall_at_k
        assert ev_meta[f"{pipeline}/mrr"] == m.mrr
        assert ev_meta[f"{pipeline}/ndcg@k"] == m.ndcg_at_k
        assert ev_meta[f"{pipeline}/precision@k"] == m.precision_at_k
    assert ev_meta["fused_recall@50"] == ev.pool_recall
    assert "| mmr | conceptual |" in ev_meta["by_kind"]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"index_consistent": True, "anchors_inside_chunks": True, "quality_floors": True}
    report = metadata(result, "failure_report")
    assert report["misses"] == len(ev.failures()) and "| q" in report["report"]
    assert (REPORTS / "hash" / "RETRIEVAL_ANALYSIS.md").read_text() == report["report"]
    assert any(k.startswith("rescued/hybrid-weights") for k in report)
    comparison = metadata(result, "embedder_comparison")
    assert comparison["hash/mmr/mrr"] == ev.metrics["mmr"].mrr
    with resource.connect() as conn:
        rows = dict(conn.execute(sql.SQL("SELECT pipeline, mrr FROM {} WHERE run_id = %s").format(
            sql.Identifier(resource.history_schema, "eval_runs")), (result.run_id,)).fetchall())
    assert {p: rows[p] for p in ev.metrics} == {p: m.mrr for p, m in ev.metrics.items()}
    assert set(rows) == {*ev.metrics, "bm25:hybrid", "bm25:rerank", "bm25:mmr"}
    assert ev_meta["bm25:mmr/mrr"] == rows["bm25:mmr"]
    assert ev_meta["best_pipeline"] in {f"{lexical}:{p}" for lexical in ("ts_rank_cd", "bm25") for p in ev.metrics}


def test_rematerialising_changes_nothing(resource):
    run(resource)
    again = metadata(run(resource), "chunk_index")
    assert (again["inserted"], again["updated"], again["deleted"], again["embedded"]) == (0, 0, 0, 0)
    assert again["unchanged"] == 430


def test_deleting_a_document_removes_its_chunks(resource, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus)
    (corpus / "docs" / "bm25.md").unlink()
    golden = [q for q in yaml.safe_load((corpus / "golden.yaml").read_text()) if q["doc_id"] != "bm25"]
    (corpus / "golden.yaml").write_text(yaml.safe_dump(golden))
    try:
        result = run(resource, corpus=corpus, eval_config={"min_recall": 0.0, "min_mrr": 0.0, "min_ndcg": 0.0})
        assert result.success
        index = metadata(result, "chunk_index")
        assert index["deleted"] == 13 and index["rows"] == 430 - 13
        with resource.connect() as conn:
            assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE doc_id = 'bm25'").format(
                sql.Identifier(resource.schema("hash"), "chunks"))).fetchone()[0] == 0
    finally:
        assert run(resource).success  # restore the full index for the other tests


def test_a_failing_floor_blocks_the_downstream_assets(resource):
    result = run(resource, eval_config={"min_recall": 1.01})
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["quality_floors"] is False
    done = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "eval_run" in done
    assert "failure_report" not in done and "embedder_comparison" not in done


def test_missing_corpus_fails_documents_and_writes_nothing(resource, tmp_path):
    table = sql.Identifier(resource.schema("hash"), "chunks")
    with resource.connect() as conn:
        before = conn.execute(sql.SQL("SELECT count(*), max(xmin::text::bigint) FROM {}").format(table)).fetchone()
    result = run(resource, corpus=tmp_path / "nowhere")
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "documents"
    assert "corpus directory not found" in failure.event_specific_data.error.to_string()
    assert not result.get_asset_materialization_events()
    with resource.connect() as conn:
        assert conn.execute(sql.SQL("SELECT count(*), max(xmin::text::bigint) FROM {}").format(table)).fetchone() == before


def test_unavailable_embedders_fail_at_once_with_a_message(resource):
    result = run(resource, partition="bge-small", selection=["documents", "chunks", "chunk_index"])
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "chunk_index"
    assert "BAAI/bge-small-en-v1.5" in failure.event_specific_data.error.to_string()
