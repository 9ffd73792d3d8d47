"""The evaluation history: one row per pipeline of every evaluation in ``<schema>.eval_runs``,
and one row per query and pipeline in ``<schema>.eval_queries``.

Contract: ``record_run`` appends the rows of one ``Evaluation`` to both tables (creating the
schema and tables if missing, and adding the columns a table from an older version lacks) in
one transaction; ``latest_runs`` returns the newest row of every (partition, pipeline) of one
corpus, ``[]`` before the first run; ``trend`` the last runs' averages of one pipeline;
``query_rows`` one run's per-query rows; ``previous_run`` the latest earlier run of the same
partition and corpus with per-query rows. Rows written before the ``corpus`` column existed
belong to the fixture.
"""

from __future__ import annotations

from collections.abc import Mapping

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from retrieval_assets import pg
from retrieval_assets.evaluation.evaluate import Evaluation
from retrieval_assets.evaluation.metrics import score_query
from retrieval_assets.partitions import FIXTURE, QUERIES, RUNS

# eval_runs columns written by record_run, with their types (id and created_at are filled in)
COLUMNS = {
    "run_id": "text", "partition": "text", "embedder": "text", "pipeline": "text",
    "k": "int", "n": "int", "queries": "int", "recall_at_k": "float8", "precision_at_k": "float8",
    "mrr": "float8", "ndcg_at_k": "float8", "pool_recall": "float8", "p50_ms": "float8", "p95_ms": "float8",
    "corpus_hash": "text", "code_version": "text", "corpus": "text",
}
# columns added after the first version, with the value older rows get
ADDED = {"corpus": sql.Literal(FIXTURE)}
# eval_queries columns: per query and pipeline, its first relevant rank (within the list the
# pipeline returns; null: none) and scores; doc_hash identifies the query's document, text and anchor
QUERY_COLUMNS = {
    "run_id": "text", "partition": "text", "corpus": "text", "pipeline": "text", "k": "int", "query_id": "text",
    "kind": "text", "first_rank": "int", "recall_at_k": "float8", "rr": "float8", "ndcg_at_k": "float8", "doc_hash": "text",
}
# the list whose first relevant rank each pipeline reports (QueryResult.ranks)
RANK_LIST = {"hybrid": "fused", "rerank": "reranked", "mmr": "final"}


def _table(schema: str, name: str = RUNS) -> sql.Identifier:
    return sql.Identifier(schema, name)


def _columns_sql(columns: Mapping[str, str]) -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in columns.items())


def _ensure(conn: psycopg.Connection, schema: str) -> None:
    """Create ``schema.eval_runs`` if missing and add the columns an older table lacks (idempotent;
    in the caller's transaction, under a lock that serialises concurrent callers)."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.evaluation.history:' || %s))", (schema,))
    pg.ensure_schema(conn, schema)
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, {}, created_at timestamptz DEFAULT now())").format(
        _table(schema), _columns_sql(COLUMNS)))
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, {}, created_at timestamptz DEFAULT now())").format(
        _table(schema, QUERIES), _columns_sql(QUERY_COLUMNS)))
    conn.execute(sql.SQL("CREATE INDEX IF NOT EXISTS eval_queries_run ON {} (run_id, pipeline)").format(_table(schema, QUERIES)))
    present = {r[0] for r in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = %s", (schema, RUNS))}
    for column, default in ADDED.items():
        if column in present:
            continue
        conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {} NOT NULL DEFAULT {}").format(
            _table(schema), sql.Identifier(column), sql.SQL(COLUMNS[column]), default))


def _ready(conn: psycopg.Connection, schema: str) -> bool:
    """False before the first run; else True, with an older version's tables brought up to date
    (one catalog query when they already are; the DDL of ``_ensure`` only when something is missing)."""
    runs_table, queries_table, added = conn.execute(
        """SELECT to_regclass(format('%%I.%%I', %(s)s::text, %(runs)s::text)) IS NOT NULL,
                  to_regclass(format('%%I.%%I', %(s)s::text, %(queries)s::text)) IS NOT NULL,
                  (SELECT count(*) FROM information_schema.columns
                   WHERE table_schema = %(s)s AND table_name = %(runs)s AND column_name = ANY(%(added)s))""",
        {"s": schema, "runs": RUNS, "queries": QUERIES, "added": list(ADDED)}).fetchone()
    if not runs_table:
        return False
    if not queries_table or added < len(ADDED):
        with conn.transaction():
            _ensure(conn, schema)
    return True


def record_run(conn: psycopg.Connection, schema: str, ev: Evaluation, *, run_id: str, partition: str, embedder: str,
               corpus_hash: str, code_version: str, variant: str = "", corpus: str = FIXTURE,
               doc_hashes: Mapping[str, str] | None = None) -> None:
    """Append one row per pipeline of ``ev`` to ``schema.eval_runs`` and one per query and
    pipeline to ``schema.eval_queries``.

    ``variant`` prefixes the pipeline names (``bm25:mmr``) of a non-default configuration;
    ``doc_hashes`` maps query ids to the hash of their document, query text and anchor.
    """
    latency = ev.latency_ms
    rows = [
        {"run_id": run_id, "partition": partition, "embedder": embedder, "pipeline": variant + name, "k": ev.k, "n": ev.n,
         "queries": m.queries, "recall_at_k": m.recall_at_k, "precision_at_k": m.precision_at_k, "mrr": m.mrr,
         "ndcg_at_k": m.ndcg_at_k, "pool_recall": ev.pool_recall, "p50_ms": latency["p50"], "p95_ms": latency["p95"],
         "corpus_hash": corpus_hash, "code_version": code_version, "corpus": corpus}
        for name, m in ev.metrics.items()
    ]
    per_query = []
    for q in ev.queries:
        for name in ev.metrics:
            recall, _, rr, ndcg = score_query(q.ranked[name], set(q.relevant), ev.k)
            per_query.append({"run_id": run_id, "partition": partition, "corpus": corpus, "pipeline": variant + name, "k": ev.k,
                              "query_id": q.query_id, "kind": q.kind, "first_rank": q.ranks.get(RANK_LIST[name]),
                              "recall_at_k": recall, "rr": rr, "ndcg_at_k": ndcg, "doc_hash": (doc_hashes or {}).get(q.query_id, "")})
    with conn.transaction():
        _ensure(conn, schema)
        with conn.cursor() as cur:
            for table, columns, values in ((RUNS, COLUMNS, rows), (QUERIES, QUERY_COLUMNS, per_query)):
                cur.executemany(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                    _table(schema, table), sql.SQL(", ").join(map(sql.Identifier, columns)),
                    sql.SQL(", ").join(map(sql.Placeholder, columns))), values)


def latest_runs(conn: psycopg.Connection, schema: str, corpus: str = FIXTURE) -> list[dict]:
    """The newest row of every (partition, pipeline) of ``corpus`` in ``schema.eval_runs``; [] before the first run."""
    if not _ready(conn, schema):
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL(
            """SELECT DISTINCT ON (partition, pipeline) partition, embedder, pipeline, k, recall_at_k, precision_at_k,
                      mrr, ndcg_at_k, pool_recall, run_id, created_at
               FROM {} WHERE corpus = %s ORDER BY partition, pipeline, created_at DESC, id DESC""").format(_table(schema)),
            (corpus,)).fetchall()


def trend(conn: psycopg.Connection, schema: str, corpus: str = FIXTURE, pipeline: str = "mmr", runs: int = 20) -> list[dict]:
    """The last ``runs`` rows of ``pipeline`` per partition of ``corpus``, oldest first; [] before the first run."""
    if not _ready(conn, schema):
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL(
            """SELECT partition, run_id, k, recall_at_k, mrr, ndcg_at_k, created_at FROM (
                   SELECT *, row_number() OVER (PARTITION BY partition ORDER BY created_at DESC, id DESC) AS age
                   FROM {} WHERE corpus = %s AND pipeline = %s) recent
               WHERE age <= %s ORDER BY partition, created_at, id""").format(_table(schema)), (corpus, pipeline, runs)).fetchall()


def query_rows(conn: psycopg.Connection, schema: str, run_id: str, pipeline: str = "mmr") -> dict[str, dict]:
    """``{query_id: row}`` of one run and pipeline in ``schema.eval_queries``; {} when there are none."""
    if not _ready(conn, schema):
        return {}
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(sql.SQL("SELECT * FROM {} WHERE run_id = %s AND pipeline = %s ORDER BY query_id").format(
            _table(schema, QUERIES)), (run_id, pipeline)).fetchall()
    return {r["query_id"]: r for r in rows}


def previous_run(conn: psycopg.Connection, schema: str, run_id: str, *, partition: str, corpus: str) -> str | None:
    """The latest run of ``partition`` on ``corpus`` recorded before ``run_id`` that has per-query rows."""
    row = conn.execute(sql.SQL(
        """SELECT q.run_id FROM {queries} q
           WHERE q.partition = %s AND q.corpus = %s AND q.run_id <> %s
             AND q.created_at < (SELECT min(created_at) FROM {queries} WHERE run_id = %s)
           ORDER BY q.created_at DESC, q.id DESC LIMIT 1""").format(queries=_table(schema, QUERIES)),
        (partition, corpus, run_id, run_id)).fetchone()
    return row[0] if row else None


def run_ids(conn: psycopg.Connection, schema: str, prefix: str) -> set[str]:
    """The run ids with per-query history that start with ``prefix`` (taken literally)."""
    if not _ready(conn, schema):
        return set()
    pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return {r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT run_id FROM {} WHERE run_id LIKE %s").format(
        _table(schema, QUERIES)), (pattern,))}


def runs(conn: psycopg.Connection, schema: str, corpus: str | None = None, limit: int = 20) -> list[dict]:
    """The newest runs with per-query history: run id, partition, corpus, k, queries, time."""
    if not _ready(conn, schema):
        return []
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL(
            """SELECT run_id, partition, corpus, max(k) AS k, count(DISTINCT query_id) AS queries, min(created_at) AS created_at
               FROM {} WHERE %s::text IS NULL OR corpus = %s GROUP BY run_id, partition, corpus
               ORDER BY min(created_at) DESC LIMIT %s""").format(_table(schema, QUERIES)), (corpus, corpus, limit)).fetchall()


REPORTS = "failure_reports"  # the text of every failure report (failure_report, and what_ifs' extended one)


def record_report(conn: psycopg.Connection, schema: str, text: str, *, run_id: str, partition: str, corpus: str,
                  asset: str = "failure_report") -> None:
    """Keep the text of one report in ``schema.failure_reports`` (created if missing): the report lives in
    Postgres, and the file a step writes on its machine is a local copy."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.evaluation.history:' || %s))", (schema,))
        pg.ensure_schema(conn, schema)
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, run_id text NOT NULL, corpus text NOT NULL, "
                             "partition text NOT NULL, asset text NOT NULL, report text NOT NULL, created_at timestamptz DEFAULT now())"
                             ).format(_table(schema, REPORTS)))
        conn.execute(sql.SQL("INSERT INTO {} (run_id, corpus, partition, asset, report) VALUES (%s, %s, %s, %s, %s)").format(
            _table(schema, REPORTS)), (run_id, corpus, partition, asset, text))


def latest_report(conn: psycopg.Connection, schema: str, *, partition: str, corpus: str = FIXTURE) -> dict | None:
    """The newest report of ``partition`` on ``corpus`` (run_id, asset, report, created_at), None before the first."""
    if conn.execute("SELECT to_regclass(format('%%I.%%I', %s::text, %s::text))", (schema, REPORTS)).fetchone()[0] is None:
        return None
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql.SQL("SELECT run_id, asset, report, created_at FROM {} WHERE corpus = %s AND partition = %s "
                                   "ORDER BY created_at DESC, id DESC LIMIT 1").format(_table(schema, REPORTS)),
                           (corpus, partition)).fetchone()
