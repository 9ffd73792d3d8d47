"""The evaluation history: one row per pipeline of every evaluation, in ``<schema>.eval_runs``.

Contract: ``record_run`` appends the rows of one ``Evaluation`` (creating the schema and table
if missing, and adding the columns a table from an older version lacks) in one transaction;
``latest_runs`` returns the newest row of every (partition, pipeline) of one corpus, ``[]``
before the first run. Rows written before the ``corpus`` column existed belong to the fixture.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from retrieval_assets.evaluation import Evaluation
from retrieval_assets.partitions import FIXTURE

# eval_runs columns written by record_run, with their types (id and created_at are filled in)
COLUMNS = {
    "run_id": "text", "partition": "text", "embedder": "text", "pipeline": "text",
    "k": "int", "n": "int", "queries": "int", "recall_at_k": "float8", "precision_at_k": "float8",
    "mrr": "float8", "ndcg_at_k": "float8", "pool_recall": "float8", "p50_ms": "float8", "p95_ms": "float8",
    "corpus_hash": "text", "code_version": "text", "corpus": "text",
}
# columns added after the first version, with the value older rows get
ADDED = {"corpus": sql.Literal(FIXTURE)}


def _table(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "eval_runs")


def _ensure(conn: psycopg.Connection, schema: str) -> None:
    """Create ``schema.eval_runs`` if missing and add the columns an older table lacks (idempotent)."""
    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, {}, created_at timestamptz DEFAULT now())").format(
        _table(schema), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in COLUMNS.items())))
    present = {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'eval_runs'", (schema,))}
    for column, default in ADDED.items():
        if column in present:
            continue
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {} NOT NULL DEFAULT {}").format(
            _table(schema), sql.Identifier(column), sql.SQL(COLUMNS[column]), default))


def _exists(conn: psycopg.Connection, schema: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = %s AND tablename = 'eval_runs')",
                        (schema,)).fetchone()[0]


def record_run(conn: psycopg.Connection, schema: str, ev: Evaluation, *, run_id: str, partition: str, embedder: str,
               corpus_hash: str, code_version: str, variant: str = "", corpus: str = FIXTURE) -> None:
    """Append one row per pipeline of ``ev`` to ``schema.eval_runs``.

    ``variant`` prefixes the pipeline names (``bm25:mmr``) of a non-default configuration.
    """
    latency = ev.latency_ms
    rows = [
        {"run_id": run_id, "partition": partition, "embedder": embedder, "pipeline": variant + name, "k": ev.k, "n": ev.n,
         "queries": m.queries, "recall_at_k": m.recall_at_k, "precision_at_k": m.precision_at_k, "mrr": m.mrr,
         "ndcg_at_k": m.ndcg_at_k, "pool_recall": ev.pool_recall, "p50_ms": latency["p50"], "p95_ms": latency["p95"],
         "corpus_hash": corpus_hash, "code_version": code_version, "corpus": corpus}
        for name, m in ev.metrics.items()
    ]
    columns = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    with conn.transaction():
        _ensure(conn, schema)
        with conn.cursor() as cur:
            cur.executemany(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                _table(schema), columns, sql.SQL(", ").join(map(sql.Placeholder, COLUMNS))), rows)


def latest_runs(conn: psycopg.Connection, schema: str, corpus: str = FIXTURE) -> list[dict]:
    """The newest row of every (partition, pipeline) of ``corpus`` in ``schema.eval_runs``; [] before the first run."""
    if not _exists(conn, schema):
        return []
    with conn.transaction():
        _ensure(conn, schema)
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL(
            """SELECT DISTINCT ON (partition, pipeline) partition, embedder, pipeline, k, recall_at_k, precision_at_k,
                      mrr, ndcg_at_k, pool_recall, run_id, created_at
               FROM {} WHERE corpus = %s ORDER BY partition, pipeline, created_at DESC, id DESC""").format(_table(schema)),
            (corpus,)).fetchall()
