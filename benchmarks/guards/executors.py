"""The main command on each executor: in process, multiprocess and a Celery worker, side by side.

Run: uv run python -m benchmarks executors [--repeats 3] [--dsn DSN]
Guards the figures of docs/scale.md (section "Executors"): ``dg launch --job evaluate_embedders
--partition hash`` with ``execution.config`` set to ``in_process`` (the default), ``multiprocess`` and
``celery``; the Celery worker runs from a second copy of the project (a clone with its own virtual
environment, HOME and RETRIEVAL_HOME, as test_celery.py does) on a redis-server of its own, sharing
only Postgres and the broker. The modes take turns, each run is timed as the user sees it (the
command's wall time) and as Dagster records it (the run's start to end); medians are printed.
Prints figures only; never asserts. Writes schemas under ``bench_exec_`` and a Dagster database
``bench_exec_dagster`` on the server ($RETRIEVAL_DSN, else the embedded one), dropped at the end.
Needs redis-server (Debian's package) and the celery extra.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

PREFIX = "bench_exec_"
DATABASE = "bench_exec_dagster"
BIN = Path(sys.executable).parent


def _drop(dsn: str) -> None:
    from psycopg import sql

    from retrieval_assets import pg

    with pg.connect(dsn) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


def _launch(env: dict[str, str], execution: dict) -> float:
    config = json.dumps({"execution": {"config": execution}})
    start = time.perf_counter()
    done = subprocess.run([str(BIN / "dg"), "launch", "--job", "evaluate_embedders", "--partition", "hash", "--config-json", config],
                          cwd=common.ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"dg launch ({next(iter(execution))}) failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return seconds


def _run_seconds(dagster_url: str, count: int) -> list[float]:
    """Start to end of the newest ``count`` runs, oldest first, from the Dagster instance."""
    import dagster as dg

    os.environ["DAGSTER_PG_URL"] = dagster_url
    with dg.DagsterInstance.from_config(str(common.ROOT)) as instance:
        records = instance.get_run_records(limit=count)
    return [r.end_time - r.start_time for r in reversed(records)]


def main(argv: list[str] | None = None) -> int:
    args = common.parser(__doc__, repeats=3).parse_args(argv)
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    from retrieval_assets import pg
    from retrieval_assets.defs.instance import sqlalchemy_url

    dsn = pg.resolve_dsn(args.dsn)
    common.connect(dsn).close()  # the machine block
    _drop(dsn)
    with pg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    dagster_url = sqlalchemy_url({**conninfo_to_dict(dsn), "dbname": DATABASE})
    shared = {"RETRIEVAL_DSN": dsn, "DAGSTER_PG_URL": dagster_url, "RETRIEVAL_SCHEMA_PREFIX": PREFIX}
    scratch = Path(tempfile.mkdtemp(prefix="bench-executors-"))
    redis, broker = common.start_redis(scratch / "redis")
    worker = None
    try:
        copy = common.second_copy(scratch / "copy")
        worker_env = {k: v for k, v in os.environ.items() if not k.startswith(("RETRIEVAL_", "DAGSTER_")) and k != "VIRTUAL_ENV"}
        worker_env.update(shared, HOME=str(scratch / "worker"), DAGSTER_HOME=str(copy), RETRIEVAL_HOME=str(scratch / "worker"))
        (scratch / "worker").mkdir()
        worker = common.start_worker(copy, worker_env, f"{broker}/0", "bench", scratch / "worker.log")
        launcher = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
        launcher.update(shared, RETRIEVAL_HOME=str(scratch / "launcher"))
        modes = {"in process": {"in_process": {}}, "multiprocess": {"multiprocess": {}},
                 "celery worker": {"celery": {"broker": f"{broker}/0", "backend": f"{broker}/0"}}}
        _launch(launcher, modes["in process"])  # the first run indexes the corpus: not timed
        wall: dict[str, list[float]] = {m: [] for m in modes}
        run: dict[str, list[float]] = {m: [] for m in modes}
        for _ in range(args.repeats):
            for mode, execution in modes.items():
                wall[mode].append(_launch(launcher, execution))
                run[mode].extend(_run_seconds(dagster_url, 1))
    finally:
        if worker is not None:
            common.stop(worker)
        common.stop(redis)
        _drop(dsn)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"\nevaluate_embedders --partition hash, {args.repeats} runs each (medians; every run's seconds in brackets)")
    print(f"  {'executor':<14} {'dg launch (wall)':>17} {'run (Dagster)':>14}")
    for mode in modes:
        print(f"  {mode:<14} {statistics.median(wall[mode]):>15.1f} s {statistics.median(run[mode]):>12.1f} s   "
              f"[{', '.join(f'{t:.1f}' for t in wall[mode])}]")
    common.print_load_end()
    return 0
