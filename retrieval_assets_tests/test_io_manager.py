"""The Postgres IO manager against the test Postgres: values round-trip (unpartitioned, one
partition, all partitions), ``None`` is stored, a missing value fails with a message, values are
keyed by the run that produced them (a run reads its own upstream values even when another run
wrote the same asset since; a re-execution reads its parent's), the defs folder registers it, and
two embedder partitions of ``evaluate_embedders`` run at once on the multiprocess executor, their
steps handing values over through Postgres alone."""

import concurrent.futures
import os
import pickle
import time
from pathlib import Path

import dagster as dg
import pytest
from psycopg import sql

from retrieval_assets.defs.io_manager import TABLE, PostgresPickleIOManager
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets_tests.conftest import drop_prefixed

PREFIX = "t_io_"  # every schema of this module, dropped before and after
DEFS_FOLDER = Path(__file__).resolve().parents[1] / "retrieval_assets"

letters = dg.StaticPartitionsDefinition(["a", "b"])


@dg.asset
def numbers() -> list[int]:
    return [1, 2, 3]


@dg.asset(partitions_def=letters)
def word(context: dg.AssetExecutionContext, numbers: list[int]) -> dict:
    return {"letter": context.partition_key, "total": sum(numbers)}


@dg.asset(partitions_def=letters)
def shout(context: dg.AssetExecutionContext, word: dict) -> str:
    return f"{word['letter'].upper()}{word['total']}"  # same partition: one value, not a dict


@dg.asset
def all_words(word: dict[str, dict]) -> list[str]:
    return sorted(w["letter"] for w in word.values())  # every partition: {partition: value}


@dg.asset
def report_only() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"rows": 1})  # Dagster does not call the IO manager


@dg.asset
def maybe_empty():
    return dg.Output(None, metadata={"status": "nothing to do"})  # stored: None is a value downstream reads


@dg.asset
def reads_empty(maybe_empty: list | None) -> str:
    return "empty" if maybe_empty is None else "full"


ASSETS = [numbers, word, shout, all_words, report_only, maybe_empty, reads_empty]


@pytest.fixture(scope="module")
def postgres(pg_dsn):
    drop_prefixed(pg_dsn, PREFIX)
    yield PostgresResource(dsn=pg_dsn, schema_prefix=PREFIX)
    drop_prefixed(pg_dsn, PREFIX)


def _materialize(postgres, selection, partition=None, io_postgres=None):
    return dg.materialize(
        ASSETS, selection=selection, partition_key=partition, raise_on_error=False,
        resources={"postgres": postgres, "io_manager": PostgresPickleIOManager(postgres=io_postgres or postgres)},
    )


def _rows(postgres) -> dict[tuple[str, str], object]:
    """The newest stored value of every (asset key, partition)."""
    with postgres.connect() as conn:
        rows = conn.execute(sql.SQL("SELECT DISTINCT ON (asset_key, partition) asset_key, partition, value FROM {} "
                                    "ORDER BY asset_key, partition, stored_at DESC").format(
            sql.Identifier(postgres.io_schema, TABLE))).fetchall()
    return {(key, partition): pickle.loads(value) for key, partition, value in rows}


def _failure(result) -> str:
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    return failure.event_specific_data.error.to_string()


def test_values_round_trip_through_postgres_across_runs(postgres):
    first = _materialize(postgres, ["numbers", "report_only", "maybe_empty"])
    assert first.success
    assert postgres.io_schema == PREFIX + "retrieval_io"
    assert _rows(postgres) == {("numbers", ""): [1, 2, 3], ("maybe_empty", ""): None}  # no row for report_only
    [event] = [e for e in first.get_asset_materialization_events() if e.asset_key == dg.AssetKey("numbers")]
    assert event.materialization.metadata["value_table"].value == f"{PREFIX}retrieval_io.{TABLE}"

    # Later runs (each its own ephemeral instance) read upstream values from the table alone.
    for letter in ("a", "b"):
        assert _materialize(postgres, ["word", "shout"], partition=letter).success
    both = _materialize(postgres, ["all_words", "reads_empty"])
    assert both.success and both.output_for_node("all_words") == ["a", "b"]
    assert both.output_for_node("reads_empty") == "empty"
    assert _rows(postgres) == {
        ("numbers", ""): [1, 2, 3],
        ("maybe_empty", ""): None,
        ("reads_empty", ""): "empty",
        ("word", "a"): {"letter": "a", "total": 6},
        ("word", "b"): {"letter": "b", "total": 6},
        ("shout", "a"): "A6",
        ("shout", "b"): "B6",
        ("all_words", ""): ["a", "b"],
    }


def test_unpartitioned_asset_in_a_partitioned_run_is_stored_unpartitioned_and_replaced(postgres):
    @dg.asset(name="numbers")
    def other_numbers() -> list[int]:
        return [10, 20]

    result = dg.materialize(
        [other_numbers, word], partition_key="a",
        resources={"postgres": postgres, "io_manager": PostgresPickleIOManager(postgres=postgres)},
    )
    assert result.success
    rows = _rows(postgres)
    assert rows[("numbers", "")] == [10, 20] and ("numbers", "a") not in rows
    assert rows[("word", "a")] == {"letter": "a", "total": 30}
    assert _materialize(postgres, ["numbers"]).success  # restore for the other tests
    assert _rows(postgres)[("numbers", "")] == [1, 2, 3]


def test_missing_value_fails_naming_asset_and_partition(postgres):
    elsewhere = PostgresResource(dsn=postgres.dsn, schema_prefix=PREFIX + "empty_")  # its table does not exist
    result = _materialize(postgres, ["word"], partition="a", io_postgres=elsewhere)
    assert not result.success
    message = _failure(result)
    assert f"no stored value for asset numbers (unpartitioned): materialize it first (looked in {PREFIX}empty_retrieval_io.{TABLE})" in message

    with postgres.connect() as conn:  # the table exists, one partition's row is gone
        conn.execute(sql.SQL("DELETE FROM {} WHERE asset_key = 'word' AND partition = 'b'").format(sql.Identifier(postgres.io_schema, TABLE)))
    assert "no stored value for asset word partition b: materialize it first" in _failure(_materialize(postgres, ["shout"], partition="b"))
    assert "no stored value for asset word partition b: materialize it first" in _failure(_materialize(postgres, ["all_words"]))
    assert _materialize(postgres, ["word"], partition="b").success  # restore


@dg.asset(deps=[numbers])
def pause() -> None:
    time.sleep(1.0)  # after numbers is stored, before slow_total reads it: another run writes numbers meanwhile


@dg.asset(deps=[pause])
def slow_total(numbers: list[int]) -> int:
    return sum(numbers)


def test_a_run_reads_its_own_upstream_value_while_another_run_writes_the_same_asset(postgres):
    """Two runs at once on one instance: each reads the numbers it produced, not the newer row of the other."""
    instance = dg.DagsterInstance.ephemeral()

    def launch(values: list[int]) -> int:
        @dg.asset(name="numbers")
        def these() -> list[int]:
            return values

        result = dg.materialize([these, pause, slow_total], instance=instance, resources=_io(postgres))
        assert result.success
        return result.output_for_node("slow_total")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(launch, [1, 2, 3])
        time.sleep(0.3)
        second = pool.submit(launch, [100, 200])
        assert (first.result(), second.result()) == (6, 300)
    assert _materialize(postgres, ["numbers"]).success  # restore


def test_a_re_execution_reads_the_parent_runs_values(postgres, tmp_path, monkeypatch):
    """Re-executing only slow_total reads numbers from the parent run, although a later run stored others."""
    monkeypatch.setenv("T_IO_DSN", postgres.dsn)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # Dagster's own files (telemetry) there, not in the working tree
    job = dg.reconstructable(_numbers_job)
    with dg.DagsterInstance.local_temp(str(home)) as instance:
        with dg.execute_job(job, instance=instance) as parent:
            assert parent.success and _rows(postgres)[("slow_total", "")] == 6

        @dg.asset(name="numbers")
        def other() -> list[int]:
            return [7]

        assert dg.materialize([other], instance=instance, resources=_io(postgres)).success  # the latest numbers: [7]
        options = dg.ReexecutionOptions(parent.run_id, step_selection=["slow_total"])
        with dg.execute_job(job, instance=instance, reexecution_options=options) as again:
            assert again.success and _rows(postgres)[("slow_total", "")] == 6  # the parent's [1, 2, 3], not 7
    assert _materialize(postgres, ["numbers"]).success  # restore


def _io(postgres: PostgresResource) -> dict:
    return {"postgres": postgres, "io_manager": PostgresPickleIOManager(postgres=postgres)}


def _numbers_job() -> dg.JobDefinition:
    """numbers -> slow_total on this module's schemas, rebuilt by Dagster for a re-execution."""
    postgres = PostgresResource(dsn=os.environ["T_IO_DSN"], schema_prefix=PREFIX)
    return dg.Definitions(assets=[numbers, pause, slow_total], jobs=[dg.define_asset_job("numbers_job")],
                          resources=_io(postgres)).resolve_job_def("numbers_job")


def test_the_defs_folder_registers_it_on_the_environment_postgres(monkeypatch, pg_dsn):
    monkeypatch.setenv("RETRIEVAL_DSN", pg_dsn)
    monkeypatch.setenv("RETRIEVAL_SCHEMA_PREFIX", PREFIX)
    defs = dg.load_from_defs_folder(path_within_project=DEFS_FOLDER)
    io_manager = defs.resources["io_manager"]
    assert isinstance(io_manager, PostgresPickleIOManager)
    assert io_manager.postgres.io_schema == PREFIX + "retrieval_io"
    assert io_manager.postgres.schema_prefix == defs.resources["postgres"].schema_prefix == PREFIX


# --- two partitions of the real job at once, on the multiprocess executor --------------------

def evaluate_embedders_multiprocess() -> dg.JobDefinition:
    """``evaluate_embedders`` from the defs folder as it is (the multiprocess executor is chosen by run
    config below), rebuilt in each step process from the environment (``dg.reconstructable``)."""
    defs = dg.load_from_defs_folder(path_within_project=DEFS_FOLDER)
    return defs.resolve_job_def("evaluate_embedders")


@pytest.mark.slow
def test_two_partitions_of_evaluate_embedders_in_parallel_on_the_multiprocess_executor(monkeypatch, postgres, pg_dsn, tmp_path):
    from dagster._core.events import DagsterEventType

    from retrieval_assets.evaluation.evaluate import Evaluation

    monkeypatch.setenv("RETRIEVAL_DSN", pg_dsn)
    monkeypatch.setenv("RETRIEVAL_SCHEMA_PREFIX", PREFIX)
    monkeypatch.setenv("RETRIEVAL_HOME", str(tmp_path))  # reports and the like outside the tree
    job = dg.reconstructable(evaluate_embedders_multiprocess)
    run_config = {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}}
    home = tmp_path / "dagster_home"  # a persistent instance, which the step processes open too
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # Dagster's own files (telemetry) there, not in the working tree
    # No instance overrides: an instance with settings configures Python logging (dictConfig) at each run's
    # start, and two runs starting in two threads deadlock on logging's locks (seen: Dagster 1.13.27).
    with dg.DagsterInstance.local_temp(str(home)) as instance:

        def launch(partition: str) -> tuple[str, bool]:
            with dg.execute_job(job, instance=instance, run_config=run_config, tags={"dagster/partition": partition}) as result:
                return result.run_id, result.success

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs = dict(zip(["hash", "minilm"], pool.map(launch, ["hash", "minilm"])))

        failures = {}
        for partition, (run_id, success) in runs.items():
            if not success:
                failures[partition] = [e.dagster_event.event_specific_data.error.to_string()
                                       for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)]
        assert not failures, failures

        records = {p: instance.get_run_record_by_id(run_id) for p, (run_id, _) in runs.items()}
        assert records["hash"].start_time < records["minilm"].end_time and records["minilm"].start_time < records["hash"].end_time
        for partition, (run_id, _) in runs.items():
            starts = instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
            assert {e.dagster_event.step_key for e in starts} >= {"fixture__documents", "fixture__chunks", "fixture__chunk_index", "fixture__eval_run"}
            assert os.getpid() not in {e.dagster_event.pid for e in starts}  # every step in a process of its own

        stored = _rows(postgres)
        assert {("fixture/documents", ""), ("fixture/chunks", ""), ("fixture/golden_queries", ""), ("fixture/eval_run", "hash"),
                ("fixture/eval_run", "minilm")} <= set(stored)
        assert not {k for k, p in stored if k in {"fixture/chunk_index", "fixture/embedder_comparison"}}  # MaterializeResult: no value

        defs = dg.load_from_defs_folder(path_within_project=DEFS_FOLDER)
        for partition, (run_id, _) in runs.items():
            value = defs.load_asset_value(["fixture", "eval_run"], partition_key=partition, instance=instance)
            assert isinstance(value, Evaluation) and value == stored[("fixture/eval_run", partition)]
            [record] = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(["fixture", "eval_run"]), asset_partitions=[partition]), limit=1).records
            assert record.run_id == run_id
            metadata = record.asset_materialization.metadata  # this run's row: the bytes it wrote
            assert metadata["value_table"].value == f"{PREFIX}retrieval_io.{TABLE}"
            with postgres.connect() as conn:
                size = conn.execute(sql.SQL("SELECT octet_length(value) FROM {} WHERE asset_key = 'fixture/eval_run' AND partition = %s "
                                            "AND run_id = %s").format(sql.Identifier(postgres.io_schema, TABLE)), (partition, run_id)).fetchone()[0]
            assert metadata["value_bytes"].value == size
