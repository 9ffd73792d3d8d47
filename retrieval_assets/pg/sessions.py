"""Connections to Postgres: ``connect``, the partner session a search runs beside a connection, and ``session``'s pool.

Contract: ``connect`` opens a connection to ``server.resolve_dsn``'s DSN with pgvector registered
(the extension created if missing) or raises ``ConnectError`` naming host, port and database but
never the password. ``partner`` gives a connection a second session (``$RETRIEVAL_SEARCH_SESSIONS``
1 turns that off), closed with it. ``session`` lends a connection for a block and keeps up to
``IDLE_MAX`` clean idle ones per process and server for the next block.
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
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets.pg import server

log = logging.getLogger(__name__)

ENV_SESSIONS = "RETRIEVAL_SEARCH_SESSIONS"  # 1: no partner sessions (a server or pooler with few connections to spare)
# Sessions a search runs in (``partner``; hybrid): one per core, at most two. An exact vector scan is split
# across them (Postgres's own parallel scan starts a fresh worker process for every query, which at 100k
# chunks began scanning 5 to 6 ms after the leader; two long-lived sessions each scanning half the pages do
# not wait for one), and a graph search runs in the second while the first runs the lexical list.
SCAN_SESSIONS = min(2, os.cpu_count() or 1)  # the default; $RETRIEVAL_SEARCH_SESSIONS overrides it (``search_sessions``)


def describe(dsn: str) -> str:
    """``host=... port=... dbname=...`` of ``dsn`` (the libpq defaults where it names none); never the password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparseable DSN"
    host = params.get("host") or os.environ.get("PGHOST") or "localhost"
    port = params.get("port") or os.environ.get("PGPORT") or "5432"
    dbname = params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user") or "(default)"
    return f"host={host} port={port} dbname={dbname}"


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
    dsn = server.resolve_dsn(dsn)
    try:
        conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        raise server.ConnectError("the Postgres DSN is not a valid connection string or URL (not shown: it may hold a "
                                  f"password); check ${server.ENV_DSN} or --dsn") from None
    try:
        conn = _Connection.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise server.ConnectError(server.mask_secrets(f"cannot connect to Postgres at {describe(dsn)}: {reason}", dsn)) from None
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
    committed: a caller holding a transaction open on ``conn`` must not use it (search.dense.scan_partner checks)."""
    dsn = _OPENED_WITH.get(conn)
    if search_sessions() < 2 or dsn is None or conn.closed:
        return None
    with _PARTNERS_LOCK:
        owner, other = _PARTNERS.get(conn, (None, None))
        if owner == os.getpid() and (other is None or not _broken(other)):
            return other
        try:
            other = connect(dsn)
        except server.ConnectError as exc:
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
    resolved = server.resolve_dsn(dsn)
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
