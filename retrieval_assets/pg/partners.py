"""The partner sessions searches borrow: a second session to a connection's server, lent to one search at a time.

Contract: ``lend_partner(conn)`` lends a search on ``conn`` (a connection of ``sessions.connect``) a partner
session: an idle one of this process's, else a new one (opened through an autocommit ``conn`` only). Every
partner holds one of ``PARTNER_SLOTS`` slots of its server (a session advisory lock, released when it
closes or its process dies; reserved through ``conn`` while it opens), so all processes together hold at
most ``PARTNER_SLOTS`` partners per server, and one process at most ``PARTNERS_MAX``; a partner idle for
``IDLE_S`` is closed at the process's next lend. None when none can be had, and the search runs in its own
session: all lent, no slot free (not asked again for ``NO_SLOT_PAUSE_S``), the server refusing connections
(logged; not asked again for ``REFUSED_PAUSE_S``), a connection not opened by ``connect``, or
``$RETRIEVAL_SEARCH_SESSIONS`` 1. ``give_back_partner`` keeps a clean partner for the next search and closes
any other; ``partner`` is the two around a block. Searches through N connections thus hold at most
N + ``PARTNER_SLOTS`` backends of a server, N + ``PARTNERS_MAX`` within one process (docs/postgres.md).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import pq

from retrieval_assets.pg import server, sessions

log = logging.getLogger(__name__)

# Partners one process holds per server, each lent to one search at a time and kept open between searches
# (opening one costs about 5 ms, more than a split saves on a small table). A search that finds none free runs
# in its own session: more searches at once than this are the load under which a split no longer helps.
PARTNERS_MAX = 2
PARTNER_SLOTS = 4  # partners of all processes together, per server
IDLE_S = 10.0  # a partner idle this long is closed (at its process's next lend), freeing its slot
NO_SLOT_PAUSE_S = 5.0  # after finding every slot taken, a process's searches run alone this long
REFUSED_PAUSE_S = 30.0  # after the server refused a partner (max_connections reached), this long
# A partner holds slot s as the advisory lock (SLOT_KEY, s) of its session. To open one, the searching connection
# first reserves a slot that no partner holds, as its own lock (RESERVE_KEY, s), until the new partner holds it:
# processes starting at once never open more partners than there are slots, not even for a moment.
SLOT_KEY, RESERVE_KEY = 741_100_041, 741_100_042
_RESERVE = """SELECT slot FROM generate_series(0, %(slots)s::int - 1) AS slot
    WHERE NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = %(held)s::oid AND objid = slot::oid
                      AND objsubid = 2)
      AND pg_try_advisory_lock(%(reserve)s, slot)
    LIMIT 1"""

_LOCK = threading.Lock()
_IDLE: dict[tuple[int, str], list[tuple[psycopg.Connection, float]]] = {}  # (pid, DSN) -> [(partner, idle since)]
_OPEN: dict[tuple[int, str], int] = {}  # (pid, DSN) -> partners open, idle or lent
_KEY: weakref.WeakKeyDictionary[psycopg.Connection, tuple[int, str]] = weakref.WeakKeyDictionary()
_PAUSED_UNTIL: dict[tuple[int, str], float] = {}  # (pid, DSN) -> when a new partner may be asked for again


def lend_partner(conn: psycopg.Connection) -> psycopg.Connection | None:
    """A partner session for one search on ``conn``, lent to it alone until ``give_back_partner`` (see the
    module's contract); None: the search runs in ``conn``'s session."""
    dsn = sessions.dsn_of(conn)
    if dsn is None or conn.closed or sessions.search_sessions() < 2:
        return None
    key, now, other = (os.getpid(), dsn), time.monotonic(), None
    with _LOCK:
        idle = _IDLE.setdefault(key, [])
        stale = [c for c, since in idle if sessions.broken(c) or now - since >= IDLE_S]
        idle[:] = [(c, since) for c, since in idle if not any(c is s for s in stale)]
        _OPEN[key] = _OPEN.get(key, 0) - len(stale)
        if idle:
            other = idle.pop()[0]  # the one used last: older ones age out
        elif _OPEN[key] < PARTNERS_MAX and now >= _PAUSED_UNTIL.get(key, 0.0) and conn.autocommit:
            _OPEN[key] += 1  # taken while it connects
        else:
            key = None
    for dead in stale:
        dead.close()
    return other if other is not None or key is None else _open(key, dsn, conn)


def _open(key: tuple[int, str], dsn: str, conn: psycopg.Connection) -> psycopg.Connection | None:
    """A new partner holding a slot of its server (reserved through ``conn``, idle and in autocommit); None (the
    count given back, a pause set) when no slot is free or the server refuses the connection."""
    pause, other, slot = NO_SLOT_PAUSE_S, None, None
    try:
        row = conn.execute(_RESERVE, {"slots": PARTNER_SLOTS, "held": SLOT_KEY, "reserve": RESERVE_KEY}).fetchone()
        if row is not None:
            slot = row[0]
            other = sessions.connect(dsn)
            if other.execute("SELECT pg_try_advisory_lock(%s, %s)", (SLOT_KEY, slot)).fetchone()[0]:
                _KEY[other] = key
                return other
        log.debug("every partner slot of the server is taken: searches run in their own session for %g s", pause)
    except server.ConnectError as exc:
        pause = REFUSED_PAUSE_S
        log.warning("searches run in their own session for %g s: the server refused a partner session (%s)", pause, exc)
    except psycopg.Error as exc:
        log.debug("no partner session (%s)", exc)
    finally:
        if slot is not None and not sessions.broken(conn):
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (RESERVE_KEY, slot))
    if other is not None:
        other.close()
    with _LOCK:
        _OPEN[key] -= 1
        _PAUSED_UNTIL[key] = time.monotonic() + pause
    return None


def give_back_partner(other: psycopg.Connection) -> None:
    """Return a partner ``lend_partner`` lent: kept for the next search when it is clean (open, no transaction,
    no pipeline), else closed (a search that failed on it leaves it so)."""
    key = _KEY.get(other)
    clean = not sessions.broken(other) and other.info.transaction_status == pq.TransactionStatus.IDLE \
        and other.pgconn.pipeline_status == pq.PipelineStatus.OFF
    with _LOCK:
        if key is not None and key[0] == os.getpid():
            if clean:
                _IDLE.setdefault(key, []).append((other, time.monotonic()))
                return
            _OPEN[key] -= 1
    other.close()


@contextmanager
def partner(conn: psycopg.Connection) -> Iterator[psycopg.Connection | None]:
    """``lend_partner(conn)`` for the block, given back after it (None: no partner)."""
    other = lend_partner(conn)
    try:
        yield other
    finally:
        if other is not None:
            give_back_partner(other)


@atexit.register
def _close_idle() -> None:
    """At exit, this process's idle partners end their backends (and free their slots) cleanly; those a forked
    child inherited belong to its parent."""
    with _LOCK:
        for (owner, _dsn), idle in _IDLE.items():
            if owner == os.getpid():
                for other, _since in idle:
                    other.close()
        _IDLE.clear()
        _OPEN.clear()
