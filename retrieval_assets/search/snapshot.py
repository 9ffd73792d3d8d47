"""One search's sessions: every statement of a search reads one committed state, and a search that fails
leaves nothing running.

Contract: ``search(conn, timeout_ms, partner=False)`` is the block the statements of one search run in
(``pipeline.run``, ``hybrid.first_stage``, ``dense.vector_search``, ``bm25_rank.bm25_search``); a block opened
inside another on the same connection joins it. On a connection with no transaction open it is one
REPEATABLE READ, READ ONLY transaction in one pipeline (``BEGIN`` rides with the first statements, ``COMMIT``
with the last), with ``statement_timeout`` local to it (``timeout_ms``; 0: the session's own; at most
``TIMEOUT_MAX_MS``). With ``partner`` it borrows a partner session (``pg.lend_partner``) for the block, and
``Search.beside`` runs statements there in a thread, in the same snapshot (``pg_export_snapshot()`` on the
connection, ``SET TRANSACTION SNAPSHOT`` on the partner): a sync committing meanwhile is seen wholly or not at
all. Inside a transaction of the caller's the block reads what that transaction reads (a savepoint; no partner).

When the block fails or is interrupted, every statement it started is cancelled and waited for, on both
sessions, before the exception leaves: the connection is rolled back and usable, and a partner that is not clean
is closed, never lent to another search. A statement past the limit raises ``SearchTimeout``; a lost connection
(the server restarted or gone) raises ``pg.ConnectError``.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import psycopg
from psycopg import pq, sql

from retrieval_assets.pg import partners, server, sessions
from retrieval_assets.pg.errors import chain

T = TypeVar("T")
TIMEOUT_MAX_MS = 2_147_483_647  # Postgres's largest statement_timeout (24.8 days): a larger limit is this one
DRAIN_S = 10.0  # how long a failed search waits for its partner's cancelled statement; past it the partner is closed when it ends
_BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY"
_TIMEOUT = "SELECT set_config('statement_timeout', %s, true)"
# runs the partners' statements; sized for PARTNERS_MAX per server, and a few servers
_THREADS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="partner")
_ACTIVE: weakref.WeakKeyDictionary[psycopg.Connection, Search] = weakref.WeakKeyDictionary()  # conn -> its open block


class SearchTimeout(RuntimeError):
    """A search statement ran past ``statement_timeout_ms``; the message says which limit."""


class Search:
    """The sessions of one search: ``conn``, and the ``partner`` it borrowed (None: it runs in ``conn`` alone)."""

    def __init__(self, conn: psycopg.Connection, timeout_ms: int, partner: psycopg.Connection | None = None):
        self.conn, self.timeout_ms, self.partner = conn, timeout_ms, partner
        self._snapshot: str | None = None
        self._futures: list[Future] = []

    def beside(self, work: Callable[[psycopg.Connection], Callable[[], T]]) -> Callable[[], T]:
        """Run ``work(partner)`` in a thread, in this search's snapshot and under its limit (``work`` executes the
        partner's statements and returns the function that reads them); the function that waits for that read.
        The first call exports the snapshot: one round trip on ``conn``. A partner whose connection was lost (a
        server restarted since it was pooled) leaves its part to ``conn``."""
        if self._snapshot is None:
            self._snapshot = self.conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
        future = _THREADS.submit(_on_partner, self.partner, self._snapshot, self.timeout_ms, work)
        self._futures.append(future)

        def read() -> T:
            try:
                return future.result()
            except psycopg.OperationalError:
                if not sessions.broken(self.partner) or sessions.broken(self.conn):
                    raise
                # a partner lost since it was pooled (a server restart): its part runs on conn, in the same snapshot
                return work(self.conn)()
        return read

    def _stop(self) -> bool:
        """Cancel the partner's statements still running and wait for them (at most ``DRAIN_S``); True when
        none is left running."""
        deadline = time.monotonic() + DRAIN_S
        for future in self._futures:
            while not future.done() and time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    self.partner.cancel_safe(timeout=1.0)  # repeated: a cancel that came before the statement is lost
                with contextlib.suppress(Exception):
                    future.exception(timeout=0.05)
        return all(future.done() for future in self._futures)

    def _release(self) -> None:
        """Give the partner back once nothing of this search runs on it (``_stop`` first)."""
        if self.partner is None:
            return
        if self._stop():
            partners.give_back_partner(self.partner)
        else:  # still running after DRAIN_S: never lent again, closed when its thread ends
            partner = self.partner
            self._futures[-1].add_done_callback(lambda _: partner.close())


def _on_partner(partner: psycopg.Connection, snapshot: str, timeout_ms: int, work: Callable) -> object:
    """``work`` on ``partner`` inside a transaction that reads ``snapshot``, in one round trip; a failed one is
    rolled back (psycopg forgets the statements it prepared), so that a timeout does not cost the partner."""
    try:
        with partner.pipeline():
            partner.execute(_BEGIN)
            # a utility statement takes no parameters: the server's snapshot id, quoted as a literal
            partner.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)), prepare=False)
            if timeout_ms:
                partner.execute(_TIMEOUT, (str(timeout_ms),))
            read = work(partner)
            partner.execute("COMMIT")
    except BaseException:
        if not sessions.broken(partner) and partner.info.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                partner.rollback()
        raise
    return read()


@contextlib.contextmanager
def search(conn: psycopg.Connection, timeout_ms: int = 0, *, partner: bool = False) -> Iterator[Search]:
    """The block one search's statements run in (see the module's contract); yields its ``Search``."""
    joined = _ACTIVE.get(conn)
    if joined is not None:
        yield joined
        return
    ms = min(int(timeout_ms), TIMEOUT_MAX_MS)
    pipelined = isinstance(conn, psycopg.Connection) and psycopg.Pipeline.is_supported()
    if pipelined and conn.pgconn.pipeline_status != pq.PipelineStatus.OFF:  # the caller's own pipeline: its batch
        yield Search(conn, ms)
        return
    idle = conn.info.transaction_status == pq.TransactionStatus.IDLE
    scope = Search(conn, ms, partners.lend_partner(conn) if partner and pipelined and idle else None)
    _ACTIVE[conn] = scope
    try:
        if pipelined and idle:
            with _own_pipeline(scope):
                yield scope
        else:  # a transaction of the caller's (a savepoint in it), or a connection without pipeline mode
            with conn.transaction(), conn.pipeline() if pipelined else contextlib.nullcontext():
                if idle:
                    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                if ms:
                    conn.execute(_TIMEOUT, (str(ms),))
                yield scope
    except psycopg.errors.QueryCanceled:
        raise SearchTimeout(f"a search statement ran past statement_timeout_ms={timeout_ms} and was cancelled "
                            "(RetrievalParams.statement_timeout_ms; 0 lifts the limit)") from None
    except psycopg.OperationalError as exc:
        if not _lost(exc) and not any(sessions.broken(c) for c in (conn, scope.partner) if c is not None):
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise server.ConnectError(f"lost the connection to Postgres at {sessions.describe(conn)} during a search: {reason}") from None
    finally:
        _ACTIVE.pop(conn, None)
        scope._release()


_SHUTDOWN = (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown, psycopg.errors.CannotConnectNow)


def _lost(exc: BaseException) -> bool:
    """Whether the server ended the session (restart, ``pg_terminate_backend``) anywhere in ``exc``'s chain: psycopg
    can report it as the error leaving the pipeline ("cannot exit pipeline mode while busy") before libpq has seen
    the socket close, so the connection does not look broken yet."""
    return any(isinstance(e, _SHUTDOWN) for e in chain(exc))


@contextlib.contextmanager
def _own_pipeline(scope: Search) -> Iterator[None]:
    """``search``'s transaction on an idle connection, in one pipeline; on failure both sessions' statements
    are cancelled and drained, and the connection rolled back (which also forgets statements psycopg prepared)."""
    conn = scope.conn
    block = conn.pipeline()
    pipe = block.__enter__()
    open_ = True
    try:
        # without autocommit psycopg sends its own BEGIN first; the isolation is then set as the first statement
        conn.execute(_BEGIN if conn.autocommit else "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if scope.timeout_ms:
            conn.execute(_TIMEOUT, (str(scope.timeout_ms),))
        yield
        conn.execute("COMMIT")
        open_ = False
        block.__exit__(None, None, None)  # the last batch: an error of it raises here
    except BaseException:
        scope._stop()
        if open_:
            if conn.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:  # statements of conn's still running
                with contextlib.suppress(Exception):
                    conn.cancel_safe(timeout=1.0)
            with contextlib.suppress(psycopg.Error):
                pipe.sync()  # drained here, so that leaving the pipeline has nothing left to report
            with contextlib.suppress(psycopg.Error):
                block.__exit__(None, None, None)
        if not sessions.broken(conn) and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.rollback()
        raise
