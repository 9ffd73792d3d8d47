"""The executor from run config (in process by default, multiprocess, celery, k8s) and the run's
server, which every step compares with its own: real runs of ``evaluate_embedders`` against the
test Postgres, with steps in this process and in processes of their own."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import DagsterEventType
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.defs import executor
from retrieval_assets.defs.remote import SERVER_TAG

PREFIX = "t_exec_"
DEFS_FOLDER = Path(__file__).resolve().parents[1] / "retrieval_assets"
CELERY = {"celery": {"broker": "redis://127.0.0.1:6399/0", "backend": "redis://127.0.0.1:6399/0"}}


def evaluate_embedders() -> dg.JobDefinition:
    """The real job, rebuilt in each step process from the environment (``dg.reconstructable``)."""
    return dg.load_from_defs_folder(path_within_project=DEFS_FOLDER).resolve_job_def("evaluate_embedders")


def _drop(dsn: str) -> None:
    with pg.connect(dsn) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def env(pg_dsn, tmp_path_factory):
    _drop(pg_dsn)
    saved = {k: os.environ.get(k) for k in ("RETRIEVAL_DSN", "RETRIEVAL_SCHEMA_PREFIX", "RETRIEVAL_HOME")}
    os.environ.update(RETRIEVAL_DSN=pg_dsn, RETRIEVAL_SCHEMA_PREFIX=PREFIX, RETRIEVAL_HOME=str(tmp_path_factory.mktemp("home")))
    yield pg_dsn
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    _drop(pg_dsn)


@pytest.fixture(scope="module")
def instance(env, tmp_path_factory):
    """A persistent instance, which step processes open too."""
    with dg.DagsterInstance.local_temp(str(tmp_path_factory.mktemp("dagster_home")), overrides={"telemetry": {"enabled": False}}) as inst:
        yield inst


def _run(instance, run_config=None, tags=None) -> tuple[bool, str, dict[str, int], list[str]]:
    """(success, run id, pid of each started step, step failure messages)."""
    job = dg.reconstructable(evaluate_embedders)
    with dg.execute_job(job, instance=instance, run_config=run_config or {},
                        tags={"dagster/partition": "hash", **(tags or {})}) as result:
        run_id, success = result.run_id, result.success
    pids = {e.dagster_event.step_key: e.dagster_event.pid for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)}
    failures = [e.dagster_event.event_specific_data.error.message for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)]
    return success, run_id, pids, failures


def test_the_choices_are_the_installed_executors():
    assert executor.CHOICES == ("in_process", "multiprocess", "celery", "k8s")  # `uv sync --all-extras`: both extras


def test_each_choice_validates_and_an_unknown_one_names_the_choices(env):
    job = evaluate_embedders()
    assert job.executor_def is executor.retrieval_executor
    for config in ({}, {"in_process": {}}, {"multiprocess": {"max_concurrent": 2}}, CELERY, {"k8s": {"job_namespace": "dagster"}}):
        assert dg.validate_run_config(job, {"execution": {"config": config}} if config else {}) is not None, config
    resolved = dg.validate_run_config(job, {})
    assert resolved["execution"] == {"retrieval": {"in_process": {"retries": {"enabled": {}}}}}  # the default
    chosen = dg.validate_run_config(job, {"execution": {"config": CELERY}})["execution"]["retrieval"]
    assert chosen["celery"]["broker"] == CELERY["celery"]["broker"] and chosen["celery"]["retries"] == {"enabled": {}}
    with pytest.raises(dg.DagsterInvalidConfigError, match="docker"):
        dg.validate_run_config(job, {"execution": {"config": {"docker": {}}}})
    with pytest.raises(dg.DagsterInvalidConfigError):  # one choice at a time
        dg.validate_run_config(job, {"execution": {"config": {"in_process": {}, "multiprocess": {}}}})


def test_the_celery_choice_builds_dagster_celerys_executor_once_its_broker_answers(env, instance, tmp_path):
    """Built when the run starts; with a broker that does not answer (a redis-server stopped), a ``dg.Failure`` of one
    line naming it (``check_celery``), in Dagster's user-code boundary so that the run ends failed."""
    from dagster._core.errors import DagsterUserCodeExecutionError
    from dagster._core.executor.init import InitExecutorContext
    from dagster_celery.executor import CeleryExecutor

    config = dg.validate_run_config(evaluate_embedders(), {"execution": {"config": CELERY}})["execution"]["retrieval"]
    assert executor.retrieval_executor.get_requirements(config)  # steps elsewhere: a rebuildable job, a persistent instance
    assert not executor.retrieval_executor.get_requirements({"in_process": {}})
    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server binary on this machine (Debian: apt-get install redis-server; .ci/run does)")

    def build(broker: str):
        chosen = {"celery": {"broker": broker, "backend": broker}}
        config = dg.validate_run_config(evaluate_embedders(), {"execution": {"config": chosen}})["execution"]["retrieval"]
        return executor.retrieval_executor.executor_creation_fn(InitExecutorContext(
            job=dg.reconstructable(evaluate_embedders), executor_def=executor.retrieval_executor, executor_config=config,
            instance=instance))

    redis, url = common.start_redis(tmp_path / "redis")
    try:
        built = build(f"{url}/0")
    finally:
        common.stop(redis)
    assert isinstance(built, CeleryExecutor) and built.broker == f"{url}/0"
    with pytest.raises(DagsterUserCodeExecutionError) as info:  # the same broker, stopped
        build(f"{url}/0")
    assert isinstance(info.value.user_exception, dg.Failure)
    assert info.value.user_exception.description.startswith(f"the Celery broker at {url}/0 cannot be reached (")


def test_a_run_is_in_process_by_default_and_carries_its_server(env, instance):
    success, run_id, pids, failures = _run(instance)
    assert success, failures
    assert set(pids.values()) == {os.getpid()} and "fixture__eval_run" in pids
    tag = instance.get_run_by_id(run_id).tags[SERVER_TAG]
    with pg.connect(env) as conn:
        system = conn.execute("SELECT system_identifier::text FROM pg_control_system()").fetchone()[0]
    assert tag.startswith(f"{system}/{conninfo_to_dict(env)['dbname']}/{PREFIX} host=") and "password" not in tag


@pytest.mark.slow
def test_multiprocess_from_run_config_runs_each_step_in_its_own_process(env, instance):
    success, _, pids, failures = _run(instance, {"execution": {"config": {"multiprocess": {"max_concurrent": 2}}}})
    assert success, failures
    assert {"fixture__documents", "fixture__chunk_index", "fixture__eval_run", "fixture__failure_report"} <= set(pids)
    assert os.getpid() not in pids.values() and len(set(pids.values())) == len(pids)


@pytest.mark.slow
def test_a_step_process_on_another_server_or_database_refuses_before_writing(env, instance):
    """The run says which server it was launched against; a step process that reaches another database
    of the same server (or another server) stops at its first statement with one line."""
    with pg.connect(env) as conn:
        conn.execute("DROP DATABASE IF EXISTS t_exec_other WITH (FORCE)")
        conn.execute("CREATE DATABASE t_exec_other")
    tag = evaluate_embedders().tags[SERVER_TAG]
    system, rest = tag.split("/", 1)
    other_server = str(int(system) + 1) + "/" + rest
    other_database = tag.replace(f"/{conninfo_to_dict(env)['dbname']}/", "/t_exec_other/", 1)
    try:
        for wrong in (other_server, other_database):
            success, _, pids, failures = _run(instance, {"execution": {"config": {"multiprocess": {}}}}, {SERVER_TAG: wrong})
            assert not success and os.getpid() not in pids.values()
            assert len(failures) == 1 and failures[0].startswith("dagster._core.definitions.events.Failure: storing fixture/documents: "
                                                                 "RETRIEVAL_DSN here reaches database ")
            assert "set RETRIEVAL_DSN" in failures[0] and "\n" not in failures[0].strip()
        with pg.connect(make_conninfo(env, dbname="t_exec_other")) as conn:  # nothing was written there either
            assert not conn.execute("SELECT 1 FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchone()
    finally:
        with pg.connect(env) as conn:
            conn.execute("DROP DATABASE IF EXISTS t_exec_other WITH (FORCE)")


def test_a_step_without_retrieval_dsn_never_starts_an_embedded_server_for_a_run_launched_elsewhere(env, tmp_path, monkeypatch):
    """With RETRIEVAL_DSN unset and a RETRIEVAL_HOME of its own, the check a step runs first refuses a run
    whose server is the external one, or another host's embedded one, and starts nothing; this host's own
    embedded server (a multiprocess step beside its launcher) passes."""
    with pg.connect(env) as conn:
        external = pg.identity.identify(conn, env, PREFIX)
    monkeypatch.delenv("RETRIEVAL_DSN")
    monkeypatch.setenv("RETRIEVAL_HOME", str(tmp_path))
    elsewhere = pg.identity.ServerIdentity(external.system, "postgres", PREFIX, "embedded otherhost:" + str(tmp_path / ".retrieval" / "pgdata"))
    for run_server in (external, elsewhere):
        with pytest.raises(pg.ConnectError, match=r"^RETRIEVAL_DSN is not set on .*private embedded Postgres.*set RETRIEVAL_DSN"):
            pg.identity.check(run_server, None, PREFIX)
    assert not (tmp_path / ".retrieval").exists()
    here = pg.identity.ServerIdentity("0", "postgres", PREFIX, pg.identity.embedded_here())
    try:
        with pytest.raises(pg.ConnectError, match="RETRIEVAL_DSN here reaches database postgres on embedded "):
            pg.identity.check(here, None, PREFIX)  # started, as the launcher would, and still compared: not system 0
    finally:
        pg.stop_embedded(tmp_path / ".retrieval" / "pgdata")


REFUSE_IN_A_CELERY_TASK = """
import sys
from celery import Celery
import retrieval_assets.defs.resources  # the Dagster layer registers the refusal
from retrieval_assets import pg
app = Celery("t", broker="memory://", backend="cache+memory://")
app.conf.task_always_eager = True
@app.task
def step():
    try:
        pg.resolve_dsn()
    except pg.ConnectError as exc:
        return "refused: " + str(exc)
    return "started"
print(step.delay().get())
print("outside a task:", retrieval_assets.defs.resources.remote.refusal())
"""


def test_a_celery_task_without_retrieval_dsn_refuses_the_embedded_server_in_one_line(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("RETRIEVAL_DSN", "DAGSTER_PG_URL")}
    environment.update(RETRIEVAL_HOME=str(tmp_path), HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", REFUSE_IN_A_CELERY_TASK], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    task, outside = done.stdout.strip().splitlines()
    assert task.startswith("refused: RETRIEVAL_DSN is not set in a Celery task (") and "private embedded Postgres" in task
    assert outside == "outside a task: None"  # the same process, outside a task: the embedded default as before
    assert not (tmp_path / ".retrieval").exists()


@pytest.mark.parametrize(("argv", "variables", "where"), [
    (["dagster", "api", "execute_step"], {}, "`dagster api execute_step` on "),
    (["dagster", "api", "execute_run"], {"DAGSTER_RUN_JOB_NAME": "evaluate_embedders"}, "a Kubernetes pod of dagster-k8s ("),
], ids=["execute_step", "k8s_pod"])
def test_a_step_process_of_another_executor_without_retrieval_dsn_refuses_the_embedded_server(tmp_path, argv, variables, where):
    """The processes the Kubernetes and Docker executors start (`dagster api execute_step`, and any process of a
    dagster-k8s pod) load the instance and the definitions before their step: there the embedded default is
    refused outright."""
    code = (f"import sys; sys.argv = {argv!r}\n"
            "import retrieval_assets.defs.remote\nfrom retrieval_assets import pg\n"
            "try:\n    pg.resolve_dsn()\nexcept pg.ConnectError as exc:\n    print('refused:', exc)\n")
    environment = {k: v for k, v in os.environ.items() if k not in ("RETRIEVAL_DSN", "DAGSTER_RUN_JOB_NAME")}
    environment.update(RETRIEVAL_HOME=str(tmp_path), **variables)
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: RETRIEVAL_DSN is not set in " + where)
    assert not (tmp_path / ".retrieval").exists()
