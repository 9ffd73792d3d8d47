"""Run Dagster with its history in Postgres, with no manual setup.

``python -m retrieval_assets.ui [dagster args...]`` (default ``dev``) starts or reuses the
retrieval Postgres (``RETRIEVAL_DSN`` or the embedded default), creates a ``dagster`` database
on it if missing, points ``DAGSTER_HOME`` at ``dagster_home/`` (its ``dagster.yaml``: run, event-log and
schedule storage through dagster-postgres) and runs the dagster CLI with the given arguments.
``DAGSTER_PG_URL`` set beforehand wins.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets import pg

ROOT = Path(__file__).resolve().parents[1]


def dagster_environment(database: str = "dagster") -> dict[str, str]:
    """The environment variables dagster.yaml reads, creating the Dagster database if needed."""
    env: dict[str, str] = {}
    if not os.environ.get("DAGSTER_PG_URL"):
        dsn = pg.resolve_dsn()
        with pg.connect(dsn, autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        params = conninfo_to_dict(dsn)
        params["dbname"] = database
        env["DAGSTER_PG_URL"] = _as_url(params)
    home = pg.project_home() / ".retrieval" / "dagster"
    env.update(
        DAGSTER_HOME=str(ROOT / "dagster_home"),
        DAGSTER_ARTIFACTS_DIR=str(home / "storage"),
        DAGSTER_COMPUTE_LOGS_DIR=str(home / "logs"),
    )
    return env


def _as_url(params: dict) -> str:
    """A SQLAlchemy URL on psycopg2 (dagster-postgres NOTIFYs with client-side parameters; Unix-socket hosts go in the query string)."""
    from urllib.parse import quote

    user = quote(params.get("user", "postgres"), safe="")
    password = f":{quote(params['password'], safe='')}" if params.get("password") else ""
    host = params.get("host", "localhost")
    port = params.get("port")
    if host.startswith("/"):
        return f"postgresql+psycopg2://{user}{password}@/{params['dbname']}?host={quote(host, safe='/')}" + (f"&port={port}" if port else "")
    return f"postgresql+psycopg2://{user}{password}@{host}{':' + port if port else ''}/{params['dbname']}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["dev"]
    os.environ.update(dagster_environment())
    if args[0] == "dev" and "-w" not in args and "-m" not in args:
        args += ["-w", str(ROOT / "workspace.yaml")]
    dagster = Path(sys.executable).with_name("dagster")
    os.execv(str(dagster), [str(dagster), *args])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
