"""The Dagster instance of this project, named by the root ``dagster.yaml``.

Every way of running the graph (``dg launch``, ``dagster asset materialize``, ``dagster dev``,
``python -m retrieval_assets.ui``, ``dagster-daemon``) reads that file from the project root, so
every run lands in one history: run, event-log and schedule storage in Postgres
(``DAGSTER_PG_URL``, else a ``dagster`` database created on the retrieval server), artifacts
and compute logs under ``<RETRIEVAL_HOME>/.retrieval/dagster``. This module is Dagster wiring,
like ``definitions.py``; the pipeline modules never import it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import quote

from dagster._core.storage.local_compute_log_manager import LocalComputeLogManager
from dagster._core.storage.root import LocalArtifactStorage
from dagster_postgres import DagsterPostgresStorage
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets import pg
from retrieval_assets.defs import remote  # noqa: F401 - a Celery task's instance never starts an embedded server

DATABASE = "dagster"
POOL_RECYCLE_S = 3600  # the pool's connections are replaced after an hour
POOL_OVERFLOW = 4  # connections beyond the pooled one while several threads store at once, closed when returned


def dagster_url(database: str = DATABASE) -> str:
    """``DAGSTER_PG_URL`` when set, else ``database`` on the retrieval server (created if missing)."""
    if os.environ.get("DAGSTER_PG_URL"):
        return os.environ["DAGSTER_PG_URL"]
    dsn = pg.resolve_dsn()
    with pg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    params = conninfo_to_dict(dsn)
    params["dbname"] = database
    return sqlalchemy_url(params)


def sqlalchemy_url(params: dict) -> str:
    """A SQLAlchemy URL on psycopg2, which dagster-postgres uses; Unix-socket hosts go in the query string."""
    user = quote(params.get("user") or "postgres", safe="")
    password = f":{quote(params['password'], safe='')}" if params.get("password") else ""
    host = params.get("host") or "localhost"
    port = params.get("port")
    if host.startswith("/"):
        return f"postgresql+psycopg2://{user}{password}@/{params['dbname']}?host={quote(host, safe='/')}" + (f"&port={port}" if port else "")
    return f"postgresql+psycopg2://{user}{password}@{host}{':' + port if port else ''}/{params['dbname']}"


def local_dir(name: str) -> str:
    """``<RETRIEVAL_HOME>/.retrieval/dagster/<name>``: instance files that stay on this machine."""
    return str(Path(pg.project_home()) / ".retrieval" / "dagster" / name)


class _Unconfigured:
    """Instance parts that take nothing from dagster.yaml: their places come from the environment."""

    @classmethod
    def config_type(cls):
        return {}


class RetrievalStorage(_Unconfigured, DagsterPostgresStorage):
    """Run, event-log and schedule storage in the Postgres of :func:`dagster_url`."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: ARG003 - nothing to configure
        url = dagster_url()
        try:
            from sqlalchemy.engine import make_url

            make_url(url)
        except Exception:
            raise pg.ConnectError("DAGSTER_PG_URL is not a valid SQLAlchemy URL (not shown: it may hold a password)") from None
        storage = cls(postgres_url=url, inst_data=inst_data)
        # dagster-postgres opens a new connection for every event it stores (NullPool: a webserver
        # must not hold idle ones per instance), 225 of them in one main-command run (0.5 s of 5);
        # a process holding this instance keeps one per storage instead, as dagster-webserver does
        # (and re-tunes when it starts: instance.optimize_for_webserver).
        for part in (storage.run_storage, storage.event_log_storage, storage.schedule_storage):
            part.optimize_for_webserver(statement_timeout=0, pool_recycle=POOL_RECYCLE_S, max_overflow=POOL_OVERFLOW)
        return storage


class RetrievalArtifactStorage(_Unconfigured, LocalArtifactStorage):
    """Local artifacts (run scratch files) under ``.retrieval/dagster``."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: ARG003
        return cls(base_dir=local_dir("artifacts"), inst_data=inst_data)


class RetrievalComputeLogs(_Unconfigured, LocalComputeLogManager):
    """Captured stdout/stderr of each step under ``.retrieval/dagster/logs``."""

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: ARG003
        return cls(base_dir=local_dir("logs"), inst_data=inst_data)
