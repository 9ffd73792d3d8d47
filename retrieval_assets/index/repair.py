"""The index's self-repair: a table of a partition's index that went missing (a ``DROP TABLE`` by hand,
a partial restore) or was replaced since the last sync is built again and the index synced in full,
instead of the sync record vouching for tables it never saw.

Contract: ``inspect(conn, schema)`` reads the catalogue in one statement: which tables of the index
exist (with their oids) and the dimension of ``chunks.embedding``. ``Health.missing`` names the
``REQUIRED`` tables an index lacks (``vectors`` too while the exact scan's triggers on ``chunks`` are
there; nothing for a schema with no index at all); ``Health.replaced`` the ``TRUSTED`` tables whose
identity differs from the one a sync record (``record``: the sync's fingerprint bound to those
tables' oids) was written for. ``clear(conn, schema)``, inside ``store.create``'s transaction and lock,
logs what is missing or replaced at WARNING and removes what cannot be trusted without it, so that
``create`` builds it again from ``chunks`` and the next sync is a full one: every table derived from
``chunks`` when ``chunks`` went; the postings when a BM25 table went (``bm25.create`` then writes all
four afresh); the exact copy's dangling triggers when ``vectors`` went (``create`` copies it again
while the exact scan is the table's choice), the copy itself when the choice went; and the sync
record always. A healthy index costs ``store.sync`` one catalogue statement, in place of the
dimension check it replaces.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg
from psycopg import sql

from retrieval_assets.index.copies import unmirror
from retrieval_assets.index.tables import statement

log = logging.getLogger(__name__)

BM25 = ("chunk_lengths", "postings", "term_df", "bm25_stats")
TRUSTED = ("chunks", "fulltext", *BM25)  # what a sync writes and its record vouches for, by identity
REQUIRED = (*TRUSTED, "vector_index", "synced")  # a whole index; ``vectors`` only while its triggers are on chunks
_INSPECT = """SELECT c.relname, c.oid::int8,
                     CASE WHEN c.relname = 'chunks' THEN (SELECT a.atttypmod FROM pg_attribute a WHERE a.attrelid = c.oid
                                                          AND a.attname = 'embedding' AND NOT a.attisdropped) END,
                     c.relname = 'chunks' AND EXISTS (SELECT 1 FROM pg_trigger g WHERE g.tgrelid = c.oid AND g.tgname = 'vectors_insert')
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = %(schema)s AND c.relname = ANY(%(tables)s) AND c.relkind IN ('r', 'p')"""


@dataclass(frozen=True)
class Health:
    """What the catalogue says of ``schema``'s index (``inspect``)."""

    oids: dict[str, int]  # the index's tables that exist, by name
    dims: int | None  # chunks.embedding's dimension, None without chunks
    mirrored: bool  # the exact copy's triggers are on chunks, so ``vectors`` should exist

    @property
    def missing(self) -> list[str]:
        """The tables a whole index has and this one lacks; [] for a schema without any table of an index."""
        if not self.oids:
            return []
        gone = [t for t in REQUIRED if t not in self.oids]
        return gone + (["vectors"] if self.mirrored and "vectors" not in self.oids else [])

    @property
    def identity(self) -> str:
        """The oids of the ``TRUSTED`` tables, in order (0 for one missing)."""
        return ",".join(str(self.oids.get(t, 0)) for t in TRUSTED)

    def replaced(self, stored: str | None) -> list[str]:
        """The ``TRUSTED`` tables that are not the ones the sync record ``stored`` was written for
        (none without a record, or with one from before records named their tables)."""
        if not stored or "@" not in stored:
            return []
        then = stored.rsplit("@", 1)[1].split(",")
        return [t for t, was, now in zip(TRUSTED, then, self.identity.split(",")) if was != now and t in self.oids]


def inspect(conn: psycopg.Connection, schema: str) -> Health:
    """``schema``'s index as the catalogue has it, in one statement."""
    rows = conn.execute(_INSPECT, {"schema": schema, "tables": [*REQUIRED, "vectors"]}).fetchall()
    chunks = [(dims, mirrored) for name, _, dims, mirrored in rows if name == "chunks"]
    return Health({name: oid for name, oid, _, _ in rows}, *(chunks[0] if chunks else (None, False)))


def record(fingerprint: str, health: Health) -> str:
    """What a sync stores: its chunks' fingerprint, bound to the tables it made equal to them."""
    return f"{fingerprint}@{health.identity}"


def stored(conn: psycopg.Connection, schema: str, health: Health) -> str | None:
    """The sync record in ``schema`` (None when there is none, or no ``synced`` table)."""
    if "synced" not in health.oids:
        return None
    row = conn.execute(statement(schema, "SELECT fingerprint FROM {synced}")).fetchone()
    return row[0] if row else None


def clear(conn: psycopg.Connection, schema: str) -> None:
    """Inside ``store.create``'s transaction and lock: when the index is damaged, log what is missing or
    replaced and remove what ``create`` must build again from ``chunks``, and the sync record."""
    health = inspect(conn, schema)
    missing, replaced = health.missing, health.replaced(stored(conn, schema, health))
    if not missing and not replaced:
        return
    broken = set(missing) | set(replaced)
    found = ([f"is missing {', '.join(missing)}"] if missing else []) + (
        [f"has {', '.join(replaced)} replaced since its last sync"] if replaced else [])
    doing = ("re-creating chunks (every chunk embedded again) and the tables written from it" if "chunks" in missing
             else "writing the tables derived from chunks again" if "chunks" in broken else "re-creating what is missing from chunks")
    log.warning("%s: the index %s; %s, then syncing in full", schema, " and ".join(found), doing)
    drop: list[str] = []
    if "chunks" in broken:  # everything written from the chunks that went
        if "chunks" in health.oids:
            unmirror(conn, schema, "vectors")
        drop += ["fulltext", "vectors", *BM25]
    if broken & set(BM25):
        drop.append("postings")  # bm25.create then drops and writes chunk_lengths, term_df and bm25_stats too
    if "fulltext" in broken:
        drop.append("fulltext")
    if "vectors" in broken:
        unmirror(conn, schema, "vectors")  # create copies it again while vector_index says exact
    if "vector_index" in missing and "vectors" in health.oids and "chunks" in health.oids:
        unmirror(conn, schema, "vectors")  # the exact scan's choice is gone: a graph, as a new table has
        drop.append("vectors")
    if drop:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(
            sql.SQL(", ").join(sql.Identifier(schema, t) for t in dict.fromkeys(drop))))
    if "synced" in health.oids:
        conn.execute(statement(schema, "DELETE FROM {synced}"))
