"""Setting up against a real server as a normal role (``CREATE ROLE ... LOGIN PASSWORD ...``): every way it can
be refused is one line naming the cause and the fix, the same sentence from the command line
(``python -m retrieval_assets evaluate``: ``error: ...``, exit 2) and as the first line of ``dg launch``,
with nothing half-written and never the password. ``DAGSTER_PG_URL`` works in each documented form."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_assets import partitions, pg
from retrieval_assets.defs import instance
from retrieval_assets.index import store

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ROLE, PASSWORD = "t_setup_role", "T0p-s3cret!pw"
PREFIX = "t_setup_"
DATABASES = {  # name: (owned by the role, pgvector created by a superuser, PUBLIC keeps CONNECT)
    "t_setup_noext": (True, False, True),
    "t_setup_connect": (False, True, True),
    "t_setup_noconnect": (False, True, False),
    "t_setup_ok": (True, True, True),
    "t_setup_dagster": (True, False, True),
}


def _dsn(base: str, dbname: str, user: str = ROLE, password: str = PASSWORD) -> str:
    params = {k: v for k, v in conninfo_to_dict(base).items() if k not in ("user", "password", "dbname")}
    return make_conninfo(**params, user=user, password=password, dbname=dbname)


def _url(base: str, dbname: str, scheme: str = "postgresql") -> str:
    """A SQLAlchemy URL for the role (``sqlalchemy_url``'s form, under ``scheme``)."""
    params = {**conninfo_to_dict(base), "user": ROLE, "password": PASSWORD, "dbname": dbname}
    return scheme + instance.sqlalchemy_url(params).removeprefix("postgresql+psycopg2")


@pytest.fixture(scope="module")
def server(pg_dsn):
    """The test server with ``ROLE`` (no CREATEDB, no superuser) and the databases of ``DATABASES``."""
    with pg.connect(pg_dsn) as admin:
        if not admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]:
            pytest.skip("the test server's role is no superuser: it cannot make a role and databases for these cases")
        _drop(admin)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} NOCREATEDB").format(sql.Identifier(ROLE), sql.Literal(PASSWORD)))
        for name, (owned, vector, connect) in DATABASES.items():
            owner = sql.SQL(" OWNER {}").format(sql.Identifier(ROLE)) if owned else sql.SQL("")
            admin.execute(sql.SQL("CREATE DATABASE {}{}").format(sql.Identifier(name), owner))
            if not connect:
                admin.execute(sql.SQL("REVOKE CONNECT ON DATABASE {} FROM PUBLIC").format(sql.Identifier(name)))
            if vector:
                with psycopg.connect(_dsn(pg_dsn, name, *_admin(pg_dsn)), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION vector")
    yield pg_dsn
    with pg.connect(pg_dsn) as admin:
        _drop(admin)


def _admin(pg_dsn: str) -> tuple[str, str]:
    params = conninfo_to_dict(pg_dsn)
    return params.get("user") or "postgres", params.get("password") or ""


def _drop(admin) -> None:
    for name in DATABASES:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))


def _schemas(server: str, dbname: str) -> list[str]:
    with psycopg.connect(_dsn(server, dbname, *_admin(server))) as conn:
        return [r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY 1", (PREFIX + "%",))]


def _env(tmp_path, retrieval_dsn: str, dagster_url: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "DAGSTER_PG_URL", "XDG_CONFIG_HOME", "DG_CLI_CONFIG")}
    (tmp_path / "home").mkdir(exist_ok=True)
    env.update(HOME=str(tmp_path / "home"), RETRIEVAL_HOME=str(tmp_path), RETRIEVAL_DSN=retrieval_dsn,
               RETRIEVAL_SCHEMA_PREFIX=PREFIX, VIRTUAL_ENV=sys.prefix)
    if dagster_url:
        env["DAGSTER_PG_URL"] = dagster_url
    return env


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "retrieval_assets", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _launch(env: dict, job: str = "evaluate_embedders", partition: str = "hash") -> tuple[int, list[str]]:
    """``dg launch`` as the README runs it: its return code and its output's lines (stderr and stdout as printed)."""
    done = subprocess.run([str(BIN / "dg"), "launch", "--job", job, "--partition", partition], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert PASSWORD not in done.stdout
    return done.returncode, done.stdout.splitlines()


def _cli_sentence(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert PASSWORD not in done.stderr + done.stdout
    return done.stderr.strip().removeprefix("error: ")


# --- in process: the library's sentences ------------------------------------------------------------------------

def test_without_pgvector_a_normal_role_is_told_the_sql_a_superuser_must_run(server):
    with pytest.raises(pg.PrivilegeError) as info:
        pg.connect(_dsn(server, "t_setup_noext"))
    assert str(info.value).startswith("pgvector is not enabled in database t_setup_noext at host=")
    assert f"role {ROLE} may not enable it: a superuser must run, in that database: CREATE EXTENSION vector;" in str(info.value)


def test_a_role_with_connect_only_is_told_the_grant(server):
    with pg.connect(_dsn(server, "t_setup_connect")) as conn, pytest.raises(pg.PrivilegeError) as info, pg.privileges(conn):
        store.create(conn, PREFIX + "hash", 256)
    assert 'may not create schemas in database t_setup_connect' in str(info.value)
    assert str(info.value).endswith(f'GRANT CREATE ON DATABASE "t_setup_connect" TO "{ROLE}";')
    with pytest.raises(pg.PrivilegeError, match=f'GRANT CONNECT ON DATABASE "t_setup_noconnect" TO "{ROLE}";'):
        pg.connect(_dsn(server, "t_setup_noconnect"))
    assert _schemas(server, "t_setup_connect") == []


@pytest.mark.parametrize("scheme", ["postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres"])
def test_dagster_pg_url_works_in_each_documented_form(server, monkeypatch, scheme):
    """``postgresql://`` used to end in "(psycopg.OperationalError) the connection is closed" at the first query."""
    monkeypatch.setenv("DAGSTER_PG_URL", _url(server, "t_setup_dagster", scheme))
    storage = instance.RetrievalStorage.from_config_value(None, {})
    assert storage.run_storage.get_runs() == []  # each part's pooled engine runs a statement
    assert storage.event_log_storage.get_logs_for_run("no-such-run") == []
    assert list(storage.schedule_storage.all_instigator_state()) == []


@pytest.mark.parametrize("case", ["unreachable", "scheme", "no tables of its own"])
def test_a_storage_error_names_dagster_pg_url_in_one_line_without_the_password(server, monkeypatch, case):
    url = {"unreachable": f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:1/dagster",
           "scheme": f"mysql://{ROLE}:{PASSWORD}@127.0.0.1:1/dagster",
           "no tables of its own": _url(server, "t_setup_connect")}[case]
    monkeypatch.setenv("DAGSTER_PG_URL", url)
    with pytest.raises(pg.ConnectError) as info:
        instance.RetrievalStorage.from_config_value(None, {})
    text = str(info.value)
    assert text.startswith("DAGSTER_PG_URL") and "\n" not in text and PASSWORD not in text
    assert {"unreachable": "password=*** dbname=dagster host=127.0.0.1 port=1): cannot connect to Postgres",
            "scheme": "must start with postgresql://, postgresql+psycopg:// or postgresql+psycopg2:// (got mysql://)",
            "no tables of its own": f'GRANT USAGE, CREATE ON SCHEMA "public" TO "{ROLE}";'}[case] in text


# --- through the command line and dg launch -----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("case", ["no pgvector", "connect only", "no connect", "unreachable"])
def test_a_refused_setup_is_the_same_first_line_from_the_cli_and_dg_launch(server, tmp_path, case):
    database = {"no pgvector": "t_setup_noext", "connect only": "t_setup_connect", "no connect": "t_setup_noconnect",
                "unreachable": "t_setup_ok"}[case]
    dsn = _dsn(server, database) if case != "unreachable" else f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:1/{database}"
    expected = {"no pgvector": "a superuser must run, in that database: CREATE EXTENSION vector;",
                "connect only": f'GRANT CREATE ON DATABASE "t_setup_connect" TO "{ROLE}";',
                "no connect": f'GRANT CONNECT ON DATABASE "t_setup_noconnect" TO "{ROLE}";',
                "unreachable": "Connection refused"}[case]
    sentence = _cli_sentence(_cli(_env(tmp_path, dsn, _url(server, "t_setup_dagster")), "evaluate"))
    assert expected in sentence
    # past the instance (the definitions fail), and in it (DAGSTER_PG_URL unset: the instance database is on that
    # server, so a role with CONNECT only is first refused CREATE DATABASE, the case below)
    for dagster_url in (_url(server, "t_setup_dagster"), *([None] if case != "connect only" else [])):
        code, lines = _launch(_env(tmp_path, dsn, dagster_url))
        assert code != 0 and lines == [f"error: {sentence}"]
    if case != "unreachable":
        assert _schemas(server, database) == []


@pytest.mark.slow
def test_without_createdb_dg_launch_names_the_privilege_and_dagster_pg_url(server, tmp_path):
    with pg.connect(server) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (instance.DATABASE,)).fetchone():
            pytest.skip(f"a database {instance.DATABASE} exists on the test server; this case needs it absent")
    code, lines = _launch(_env(tmp_path, _dsn(server, "t_setup_ok"), None))
    assert code != 0 and len(lines) == 1
    assert lines[0].startswith(f"error: role {ROLE} may not create the Dagster instance database dagster on the $RETRIEVAL_DSN server")
    assert f'CREATE DATABASE "dagster" OWNER "{ROLE}"; (or ALTER ROLE "{ROLE}" CREATEDB;), or set DAGSTER_PG_URL' in lines[0]
    with pg.connect(server) as admin:
        assert admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (instance.DATABASE,)).fetchone() is None
    assert _schemas(server, "t_setup_ok") == []


@pytest.mark.slow
def test_dg_launch_with_an_unreachable_dagster_pg_url_is_one_line(server, tmp_path):
    code, lines = _launch(_env(tmp_path, _dsn(server, "t_setup_ok"), f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:1/dagster"))
    assert code != 0 and len(lines) == 1
    assert lines[0].startswith("error: DAGSTER_PG_URL (") and "password=***" in lines[0] and "Connection refused" in lines[0]


def _runs(server: str) -> int:
    with psycopg.connect(_dsn(server, "t_setup_dagster")) as conn:
        return conn.execute("SELECT count(*) FROM runs").fetchone()[0] if conn.execute(
            "SELECT to_regclass('runs')").fetchone()[0] else 0


def _written(server: str, corpus: str) -> tuple:
    """What a run of ``corpus`` left: its schemas, stored values and history rows."""
    with psycopg.connect(_dsn(server, "t_setup_ok")) as conn:
        def count(schema: str, table: str, where: str, value: str) -> int:
            if not conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]:
                return 0
            return conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE {} LIKE %s").format(
                sql.Identifier(schema, table), sql.Identifier(where)), (value,)).fetchone()[0]
        return (_schemas(server, "t_setup_ok"), count(PREFIX + partitions.IO_VALUES, partitions.IO_TABLE, "asset_key", corpus + "/%"),
                count(PREFIX + partitions.HISTORY, "eval_runs", "corpus", corpus))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing folder", "bad golden set", "unknown partition", "unavailable model"])
def test_bad_input_is_the_same_sentence_in_one_line_and_writes_nothing(server, tmp_path, case):
    """The CLI's sentence (exit 2) is ``dg launch``'s one line: before any run (unknown partition), or as the failed
    step's STEP_FAILURE line, with no Python stack after it (``defs/console.py``); ``dg`` exits 1 (its own code)."""
    env = _env(tmp_path, _dsn(server, "t_setup_ok"), _url(server, "t_setup_dagster"))
    (tmp_path / "cache").mkdir()
    env.update(HF_HUB_OFFLINE="1", FASTEMBED_CACHE_PATH=str(tmp_path / "cache"))  # bge-small's files: not on this machine
    name = {"missing folder": "gone", "bad golden set": "badgold", "unknown partition": "ferries", "unavailable model": "nomodel"}[case]
    folder = tmp_path / name
    folder.mkdir()
    (folder / "ferry.md").write_text("# Ferry\n\nThe ferry leaves the harbour at dawn every day.\n")
    (folder / "golden.yaml").write_text("- {query_id: f1, kind: factual, query: when does it leave, doc_id: "
                                        f"{'nosuchdoc' if case == 'bad golden set' else 'ferry'}, anchor: at dawn}}\n")
    added = _cli(env, "corpus", "add", name, str(folder))
    assert added.returncode == 0, added.stderr
    if case == "missing folder":
        folder.rename(tmp_path / "moved")
    partition = {"unknown partition": "nope", "unavailable model": "bge-small"}.get(case, "hash")
    cli_args = ["--embedder", partition] if partition != "hash" else []
    sentence = _cli_sentence(_cli(env, "evaluate", "--corpus", str(folder), *cli_args))
    before, runs = _written(server, name), _runs(server)
    code, lines = _launch(env, partitions.job_name("evaluate_embedders", name), partition)
    assert code != 0
    if case == "unknown partition":
        assert sentence.endswith("unknown embedder 'nope': the embedder partitions are hash, minilm, mpnet, bge-small")
        assert lines == ["error: unknown embedder 'nope': the embedder partitions are hash, minilm, mpnet, bge-small"]
        assert _runs(server) == runs  # refused before a run was made
        assert _written(server, name) == before == ([PREFIX + partitions.HISTORY], 0, 0)
        return
    step, told = {"missing folder": ("documents", f"documents: {sentence} (corpus {name} was registered with it: restore it "
                                     f"there, or register it again: corpus remove {name} --yes, then corpus add {name} PATH)"),
                  "bad golden set": ("documents", f"golden_queries: {sentence}"),
                  "unavailable model": ("chunk_index", f"chunk_index bge-small: {sentence}")}[case]
    failed = [line for line in lines if " - STEP_FAILURE - " in line]
    assert len(failed) == 1 and failed[0].endswith(f" - {name}__{step} - STEP_FAILURE - {told}"), lines
    assert f" - ERROR - {partitions.job_name('evaluate_embedders', name)} - " in failed[0]
    # every line one record: the failure, Dagster's one line per skipped step, RUN_FAILURE, click's last line
    assert all(" - dagster - " in line for line in lines[:-1]) and lines[-1].startswith("Error: Run "), lines
    assert not any("Stack Trace" in line or line.startswith("  File ") for line in lines)
    assert _runs(server) == runs + 1
    if case == "unavailable model":  # the corpus steps before it log first; nothing of the partition is written
        assert " - INFO - " in lines[0] and lines[0].endswith(f" - {name}__documents - corpus {name}: 1 documents from {folder}")
        assert failed[0] == lines[1]
        schemas, _values, history_rows = _written(server, name)
        assert partitions.schema_name("bge-small", prefix=PREFIX, corpus=name) not in schemas and history_rows == 0
    else:
        assert failed[0] == lines[0]
        assert _written(server, name) == before == ([PREFIX + partitions.HISTORY], 0, 0)
