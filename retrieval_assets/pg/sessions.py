"""Connections to Postgres: ``connect``, and ``session``'s pool.

Contract: ``connect`` opens a connection to ``server.resolve_dsn``'s DSN with pgvector registered
(the extension created if missing) or raises ``ConnectError`` naming host, port and database but
never the password; ``dsn_of`` and ``describe`` give back what it connected to. ``search_sessions`` reads
``$RETRIEVAL_SEARCH_SESSIONS`` (whether searches borrow a partner session, ``pg.partners``). ``session``
lends a connection for a block and keeps up to ``IDLE_MAX`` clean idle ones per process and server for
the next block.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from pgvector.psycopg import register_vector
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets.pg import errors, server

log = logging.getLogger(__name__)

ENV_SESSIONS = "RETRIEVAL_SEARCH_SESSIONS"  # 1: no partner sessions (a server or pooler with few connections to spare)
# Sessions a search runs in (``pg.partners``): one per core, at most two. An exact vector scan is split across
# them (Postgres's own parallel scan starts a fresh worker process for every query, which at 100k chunks began
# scanning 5 to 6 ms after the leader; two long-lived sessions each scanning half the pages do not wait for one).
SCAN_SESSIONS = min(2, os.cpu_count() or 1)  # the default; $RETRIEVAL_SEARCH_SESSIONS overrides it (``search_sessions``)


def ensure_extension(conn: psycopg.Connection) -> None:
    """``CREATE EXTENSION vector`` once, even when many connections race to do it; a role that may not
    (or a server without pgvector) raises ``errors.PrivilegeError`` giving the SQL a superuser must run."""
    with errors.privileges(conn), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.extension'))")
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")


def ensure_schema(conn: psycopg.Connection, schema: str) -> None:
    """``CREATE SCHEMA IF NOT EXISTS`` that callers under different locks may race (the evaluation history and the
    retrieval rules share a schema): the loser's unique violation on pg_namespace, raised once the winner commits, is
    taken in a savepoint of the caller's transaction, and the schema is there."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema):
        pass


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
    dsn = server.resolve_dsn(dsn)
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise server.ConnectError("the Postgres DSN is not a valid connection string or URL (not shown: it may hold a "
                                  f"password); check ${server.ENV_DSN} or --dsn") from None
    try:
        conn = psycopg.Connection.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        raise errors.connect_failure(exc, dsn) from None
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


def dsn_of(conn: psycopg.Connection) -> str | None:
    """The DSN ``connect`` opened ``conn`` with (None for a connection opened elsewhere)."""
    return _OPENED_WITH.get(conn)


def describe(conn: psycopg.Connection) -> str:
    """``host=... port=... dbname=...`` of a ``connect``-ed connection (no password), for messages."""
    dsn = _OPENED_WITH.get(conn)
    return errors.describe(dsn) if dsn else "the server"


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
    resolved = server.resolve_dsn(dsn)
    key = (os.getpid(), resolved)
    conn = None
    with _IDLE_LOCK:
        idle = _IDLE.get(key, [])
        while idle and conn is None:
            candidate = idle.pop()
            if broken(candidate):
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


def broken(conn: psycopg.Connection) -> bool:
    """Closed, or its socket failed: not to be handed out or kept."""
    return conn.closed or conn.info.status != pq.ConnStatus.OK


def _give_back(key: tuple[int, str], conn: psycopg.Connection, row_factory) -> None:
    if broken(conn) or not conn.autocommit or conn.row_factory is not row_factory:
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
