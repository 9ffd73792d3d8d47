"""The registered corpora: a name for each corpus folder, kept in Postgres beside the history.

Contract: the fixture corpus (``partitions.FIXTURE``, this checkout's fixtures/corpus) is always
registered and cannot be removed. ``add(conn, schema, name, path)`` registers a folder under a
name; registering the same name and folder again changes nothing; an invalid name, a folder that
does not exist, or a name or folder already registered under the other one raise ``CorpusNameError``
naming both, and change nothing. ``listed`` returns every corpus, the fixture first.
``Corpus.check()`` raises ``CorpusNameError`` when its folder has vanished since it was registered.
``remove(conn, schema, name, prefix)`` drops the corpus's schemas (``<prefix><name>__*``), its
history rows and stored asset values, then its registration, in one transaction, and never
touches another corpus: names hold no ``__``, so one corpus's schema prefix is no other's.
Concurrent callers serialise on an advisory lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from retrieval_assets import pg
from retrieval_assets.partitions import FIXTURE, FIXTURE_DIR, IO_TABLE, QUERIES, RULES, RUNS, check_corpus_name

TABLE = "corpora"
_LOCK = "retrieval_assets.corpus.registry"


class CorpusNameError(ValueError):
    """A corpus that cannot be registered, found or removed as asked."""


@dataclass(frozen=True)
class Corpus:
    name: str
    path: str

    @property
    def is_fixture(self) -> bool:
        return self.name == FIXTURE

    @property
    def golden_path(self) -> Path:
        return Path(self.path) / "golden.yaml"

    def check(self) -> Corpus:
        if not Path(self.path).exists():
            raise CorpusNameError(f"corpus directory not found: {self.path} (corpus {self.name} was registered with it: "
                                  f"restore it there, or register it again: corpus remove {self.name} --yes, then corpus add "
                                  f"{self.name} PATH)")
        return self


FIXTURE_CORPUS = Corpus(FIXTURE, str(FIXTURE_DIR))


def valid_name(name: str) -> str:
    """``name`` if it can name a corpus (``partitions.check_corpus_name``, and no ``__``), else ``CorpusNameError``."""
    try:
        check_corpus_name(name)
    except ValueError as exc:
        raise CorpusNameError(str(exc)) from None
    if "__" in name:
        raise CorpusNameError(f"corpus name '{name}': no double underscore (it separates the corpus from the embedder in schema names)")
    return name


def _ensure(conn: psycopg.Connection, schema: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_LOCK,))
    pg.ensure_schema(conn, schema)
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, path text NOT NULL UNIQUE, "
                         "added_at timestamptz NOT NULL DEFAULT now())").format(sql.Identifier(schema, TABLE)))


def ensure(conn: psycopg.Connection, schema: str) -> None:
    """Create the registry's schema and table if missing (the launching process; a worker only reads)."""
    with conn.transaction():
        _ensure(conn, schema)


def listed(conn: psycopg.Connection, schema: str) -> list[Corpus]:
    """Every registered corpus, the fixture first, then by name. Reads only (the definitions load calls it
    in every process, a worker's too): a server without the registry has the fixture alone."""
    if conn.execute("SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = %s", (schema, TABLE)).fetchone() is None:
        return [FIXTURE_CORPUS]
    rows = conn.execute(sql.SQL("SELECT name, path FROM {} ORDER BY name").format(sql.Identifier(schema, TABLE))).fetchall()
    return [FIXTURE_CORPUS, *(Corpus(name, path) for name, path in rows if name != FIXTURE)]


def get(conn: psycopg.Connection, schema: str, name: str) -> Corpus:
    """The corpus registered as ``name``; ``CorpusNameError`` naming the registered ones otherwise."""
    corpora = {c.name: c for c in listed(conn, schema)}
    if name not in corpora:
        raise CorpusNameError(f"no corpus named '{name}' (registered: {', '.join(corpora)}; add one with: corpus add NAME PATH)")
    return corpora[name]


def add(conn: psycopg.Connection, schema: str, name: str, path: str | Path) -> tuple[Corpus, bool]:
    """Register the folder ``path`` as ``name``: (the corpus, whether it is new)."""
    valid_name(name)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise CorpusNameError(f"corpus {name}: {folder} is not a folder")
    corpus = Corpus(name, str(folder.resolve()))
    if name == FIXTURE or corpus.path == FIXTURE_CORPUS.path:
        if corpus == FIXTURE_CORPUS:
            return FIXTURE_CORPUS, False
        raise CorpusNameError(f"corpus {name} ({corpus.path}): the name and folder '{FIXTURE}' ({FIXTURE_CORPUS.path}) "
                              "belong to this checkout's fixture corpus")
    with conn.transaction():
        _ensure(conn, schema)
        table = sql.Identifier(schema, TABLE)
        for column, value in (("name", name), ("path", corpus.path)):
            row = conn.execute(sql.SQL("SELECT name, path FROM {} WHERE {} = %s").format(table, sql.Identifier(column)),
                               (value,)).fetchone()
            if row and (row[0], row[1]) == (name, corpus.path):
                return corpus, False
            if row:
                raise CorpusNameError(f"corpus {name} ({corpus.path}): corpus {row[0]} is registered with the folder {row[1]}; "
                                      "a name and a folder belong to one corpus")
        conn.execute(sql.SQL("INSERT INTO {} (name, path) VALUES (%s, %s)").format(table), (name, corpus.path))
    return corpus, True


def remove(conn: psycopg.Connection, schema: str, name: str, prefix: str = "", value_schema: str = "") -> list[str]:
    """Drop corpus ``name``: its schemas, history rows, stored values (in ``value_schema``) and registration.
    Returns the dropped schemas."""
    if name == FIXTURE:
        raise CorpusNameError(f"corpus {FIXTURE} is this checkout's fixture corpus and cannot be removed")
    get(conn, schema, name)
    dropped = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (_LOCK,))
        pattern = (prefix + valid_name(name) + "__").replace("\\", "\\\\").replace("_", "\\_") + "%"
        for (nspname,) in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY nspname", (pattern,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(nspname)))
            dropped.append(nspname)
        for table in (RUNS, QUERIES, RULES):
            if conn.execute("SELECT to_regclass(%s)", (sql.Identifier(schema, table).as_string(conn),)).fetchone()[0]:
                conn.execute(sql.SQL("DELETE FROM {} WHERE corpus = %s").format(sql.Identifier(schema, table)), (name,))
        if value_schema and conn.execute("SELECT to_regclass(%s)", (sql.Identifier(value_schema, IO_TABLE).as_string(conn),)).fetchone()[0]:
            conn.execute(sql.SQL("DELETE FROM {} WHERE asset_key LIKE %s").format(sql.Identifier(value_schema, IO_TABLE)),
                         (name.replace("_", "\\_") + "/%",))
        conn.execute(sql.SQL("DELETE FROM {} WHERE name = %s").format(sql.Identifier(schema, TABLE)), (name,))
    return dropped
