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
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import make_url

from retrieval_assets import pg
from retrieval_assets.defs import remote  # a Celery task's instance never starts an embedded server
from retrieval_assets.pg import errors as pg_errors

DATABASE = "dagster"
ENV_URL = "DAGSTER_PG_URL"
# The forms DAGSTER_PG_URL may take. Each becomes a psycopg2 URL: dagster-postgres sets the statement timeout of a
# pooled connection with `with dbapi_conn:` (optimize_for_webserver), which ends a transaction in psycopg2 but
# closes the connection in psycopg 3, the driver SQLAlchemy 2.1 picks for a bare postgresql:// ("the connection is
# closed" at the first query).
URL_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg", "postgresql+psycopg2")
POOL_RECYCLE_S = 3600  # the pool's connections are replaced after an hour
POOL_OVERFLOW = 4  # connections beyond the pooled one while several threads store at once, closed when returned


REMOTE_NEEDS = {ENV_URL: "the launcher's Dagster database (where its runs are)",
                pg.ENV_DSN: "the launcher's retrieval database (its corpus registry, indexes and history)"}


def check_remote_settings() -> None:
    """A process that runs steps of runs launched elsewhere (``remote.remote_process``: a Celery task opens
    the instance before it loads the job) needs both databases named, or it fails in ways that name neither:
    without ``DAGSTER_PG_URL`` the default, a ``dagster`` database on the retrieval server, does not hold the
    run ("Could not load run"); without ``RETRIEVAL_DSN`` the definitions cannot read the corpus registry (a
    corpus's job "not found"). ``ConnectError`` naming what is missing, before anything is created."""
    where = remote.remote_process()
    missing = [name for name in REMOTE_NEEDS if not os.environ.get(name)]
    if where and missing:
        raise pg.ConnectError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set in {where}, which runs "
                              "steps of runs launched elsewhere: set " + "; ".join(f"{name} to {REMOTE_NEEDS[name]}" for name in missing)
                              + "; a remote step never falls back to a database of its own")


def dagster_url(database: str = DATABASE) -> str:
    """``DAGSTER_PG_URL`` when set, else ``database`` on the retrieval server (created if missing)."""
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL]
    dsn = pg.resolve_dsn()
    with pg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
            except psycopg.errors.InsufficientPrivilege:
                role, name = sql.Identifier(conn.info.user).as_string(), sql.Identifier(database).as_string()
                raise pg.PrivilegeError(
                    f"role {conn.info.user} may not create the Dagster instance database {database} on the ${pg.ENV_DSN} server "
                    f"(host={conn.info.host} port={conn.info.port}; the role lacks CREATEDB): a superuser must run "
                    f"CREATE DATABASE {name} OWNER {role}; (or ALTER ROLE {role} CREATEDB;), or set {ENV_URL} to an existing "
                    "database") from None
    params = conninfo_to_dict(dsn)
    params["dbname"] = database
    return sqlalchemy_url(params)


def storage_url(url: str) -> str:
    """``url`` (any of ``URL_SCHEMES``) as the psycopg2 URL dagster-postgres is given; ``ConnectError`` naming
    ``DAGSTER_PG_URL`` for anything else."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - SQLAlchemy raises several kinds; none may show the URL
        raise pg.ConnectError(f"{ENV_URL} is not a valid SQLAlchemy URL (not shown: it may hold a password); "
                              "use postgresql://user:password@host:5432/dagster") from None
    if parsed.drivername not in URL_SCHEMES:
        raise pg.ConnectError(f"{ENV_URL} must start with postgresql://, postgresql+psycopg:// or postgresql+psycopg2:// "
                              f"(got {parsed.drivername}://)")
    return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


def check_storage(url: str) -> None:
    """Connect once to the instance database of ``url`` (a ``storage_url``) before Dagster does: a failure is one
    ``ConnectError`` naming the variable and the database, password masked (dagster-postgres would retry five
    times, logging each, and end in a traceback); so is a role that may not create Dagster's tables there, or
    may not write those that another role created."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    source = f"{ENV_URL} ({pg.mask_dsn(dsn)})" if os.environ.get(ENV_URL) else f"the Dagster instance database ({ENV_URL} unset)"
    try:
        with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
            schema, creatable, ready, refused, owner = conn.execute(_STORAGE_PRIVILEGES).fetchone()
            role, database = conn.info.user, conn.info.dbname
    except psycopg.Error as exc:
        failure = pg_errors.connect_failure(exc, dsn, ENV_URL)
        raise type(failure)(f"{source}: {failure}") from None
    target, grantee = sql.Identifier(schema or "public").as_string(), sql.Identifier(role).as_string()
    if not ready and not creatable:
        raise pg.PrivilegeError(f"{source}: role {role} may not create Dagster's tables in schema {schema or '(none)'} of "
                                f"database {database}: its owner or a superuser must run GRANT USAGE, CREATE ON SCHEMA {target} "
                                f"TO {grantee};")
    if refused:
        raise pg.PrivilegeError(
            f"{source}: role {role} may not write Dagster's tables in database {database} ({', '.join(refused[:3])}"
            f"{', ...' if len(refused) > 3 else ''}; created by role {owner}): run as that role, set {ENV_URL} to a database "
            f"of role {role}'s own, or a superuser runs GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {target} "
            f"TO {grantee}; GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {target} TO {grantee};")


# (schema, may create there, Dagster's tables exist, tables of that schema the role may not write, owner of `runs`)
_STORAGE_PRIVILEGES = """
SELECT current_schema(), has_schema_privilege(current_schema(), 'CREATE'), to_regclass('runs') IS NOT NULL,
       (SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = current_schema() AND c.relkind = 'r' AND NOT has_table_privilege(c.oid, 'SELECT,INSERT,UPDATE,DELETE')),
       (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('runs'))
"""


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
        check_remote_settings()
        url = storage_url(dagster_url())
        check_storage(url)
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
