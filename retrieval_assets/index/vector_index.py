"""The vector search of a chunk table, chosen by measured recall after a bulk load.

Contract: ``choose_vector_index`` keeps an HNSW graph on ``schema.chunks`` at the least ef_search
of ``EF_LADDER`` at which its recall@10 against exact search (``vector_recall``, on keyword
queries made of the table's own chunks by ``query_words``) reaches ``RECALL_TARGET``, else drops
it for an exact scan of the narrow copy ``vectors`` (``copies.exact_copy``), in halfvec when its
scan keeps ``HALF_RECALL`` against float32; a large table without a graph is probed on
``PROBE_ROWS`` of its rows first. The choice is recorded in the schema's ``vector_index`` table
and read back by ``vector_index`` (None when never checked); ``check_recall_target`` rejects a
target outside [0, 1]. ``HNSW`` is the graph's statement, as ``store.create`` and ``bulk.load`` build it.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql

from retrieval_assets.index.copies import drop_exact_copy, exact_copy
from retrieval_assets.index.embed import Embedder, embed_queries
from retrieval_assets.index.tables import count, exists, statement
from retrieval_assets.params import DEFAULT, hnsw_ef_search

log = logging.getLogger(__name__)

RECALL_TARGET = 0.95  # recall@10 against exact search the HNSW index must keep, checked after each bulk load
RECALL_SAMPLE = 50  # the table's own chunks whose words make that check's queries
QUERY_WORDS = 4  # words of a chunk in one such query
PROBE_ROWS = 20_000  # a bulk load of twice this many rows first checks a graph over this many (choose_vector_index)
HALF_RECALL = 0.99  # recall@10 against float32 exact search a halfvec copy must keep to be the exact scan's copy
EF_LADDER = (None, 100, 200, 400)  # the hnsw.ef_search values tried, cheapest first (None: the pipeline's, for DEFAULT.n)
_WORD = re.compile(r"[^\W\d_][\w'-]*")
HNSW = "CREATE INDEX IF NOT EXISTS chunks_embedding_hnsw ON {chunks} USING hnsw (embedding vector_cosine_ops)"


@dataclass(frozen=True)
class VectorIndex:
    """How ``chunks`` is searched by vector, as chosen after its last bulk load (``choose_vector_index``)."""

    kind: str  # "hnsw" (the graph index) or "exact" (no vector index: every search scans the table)
    recall: float | None  # the HNSW index's recall@10 against exact search when it was checked
    sample: int  # the queries (words of the table's own chunks)
    ef_search: int  # hnsw: the least ef_search searches use (the first of EF_LADDER that reached the target); exact: the top one tried
    reason: str


def check_recall_target(target: float | None) -> None:
    """ValueError unless ``target`` is None or a number within [0, 1] (``store.sync``'s and ``choose_vector_index``'s)."""
    if target is not None and not (isinstance(target, (int, float)) and 0.0 <= target <= 1.0):
        raise ValueError(f"recall_target must be a number within [0, 1] or None, got {target!r}")


def vector_index(conn: psycopg.Connection, schema: str) -> VectorIndex | None:
    """The vector search chosen for ``schema.chunks`` at its last check, or None (never checked, or a
    table made before the check existed)."""
    if not exists(conn, schema, "vector_index"):
        return None
    row = conn.execute(statement(schema, """SELECT kind, recall, sample, ef_search, reason FROM {vector_index}
                                           ORDER BY checked_at DESC LIMIT 1""")).fetchone()
    return VectorIndex(*row) if row else None


def query_words(text: str, words: int = QUERY_WORDS) -> str:
    """``words`` words spread evenly over ``text`` (all of them when it has fewer): a keyword query made of a chunk."""
    found = _WORD.findall(text)
    if len(found) <= words:
        return " ".join(found)
    return " ".join(found[round(i * (len(found) - 1) / (words - 1))] for i in range(words))


def vector_recall(conn: psycopg.Connection, schema: str, embedder: Embedder, *, sample: int = RECALL_SAMPLE, k: int = 10,
                  ef_search: int | None = DEFAULT.ef_search) -> tuple[float, int]:
    """(recall@k, queries) of the vector search as the pipeline runs it (``hnsw.ef_search`` for a pool of
    ``DEFAULT.n``, or ``ef_search``; the planner free to pick the index) against exact search. The
    queries are made of the table's own chunks: ``query_words`` of ``sample`` chunks in a fixed
    order (by hash of chunk_id), embedded by ``embedder``; short, like users' queries (a chunk's
    whole vector as the query is easier: recall 0.97 against 0.69 for keyword queries on 5,000 hash
    vectors, benchmarks/guards/bench_vector_index.py). A result counts when its distance is within
    the exact k-th distance (equal vectors are not misses). Exact search runs in numpy over the
    table, streamed in batches.
    """
    ef = hnsw_ef_search(DEFAULT.n, ef_search)
    recalls, truth = _ladder_recall(conn, schema, embedder, sample, k, [ef])
    return recalls[ef], _queries(truth)


def _ladder_recall(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, k: int,
                   efs: Sequence[int]) -> tuple[dict[int, float], tuple | None]:
    """``vector_recall`` at each of ``efs`` (the exact lists computed once): ({ef: recall}, the
    ``_exact_truth`` they were judged against, for a later check of the same table)."""
    with conn.transaction():  # the settings are local to it; the scan's server-side cursor needs one
        truth = _exact_truth(conn, schema, embedder, sample, k)
        if truth is None:
            return {ef: 1.0 for ef in efs}, None
        search = statement(schema, "SELECT embedding FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(k)s")
        recalls = {}
        for ef in efs:
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(ef),))
            recalls[ef] = _recall(conn, search, truth, k)
    return recalls, truth


def _queries(truth: tuple | None) -> int:
    """How many queries an ``_exact_truth`` holds (0 for None: none had a vector)."""
    return 0 if truth is None else len(truth[0])


def _exact_truth(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, k: int):
    """(query vectors, unit query vectors in float64, the k smallest exact distances of each, how many
    each has) for ``sample`` keyword queries of the table's chunks; None when no query has a vector.
    Exact search runs in numpy over ``chunks``, streamed in batches (inside the caller's transaction)."""
    texts = [t for (t,) in conn.execute(statement(schema, """SELECT text FROM {chunks} WHERE embedding IS NOT NULL
                                                           ORDER BY hashtext(chunk_id), chunk_id LIMIT %s"""), (sample,))]
    queries = [q for q in (query_words(t) for t in texts) if q]
    vectors = np.asarray(embed_queries(embedder, queries), dtype=np.float32) if queries else np.zeros((0, 1), np.float32)
    vectors = vectors[np.linalg.norm(vectors, axis=1) > 0]  # words the embedder maps to zero search nothing
    if not len(vectors):
        return None
    unit = vectors.astype(np.float64) / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    best = np.full((len(unit), k), np.inf)  # the k smallest exact distances per query
    with conn.cursor(name="vector_recall_scan", binary=True) as scan:
        scan.itersize = 10_000
        scan.execute(statement(schema, "SELECT embedding FROM {chunks} WHERE embedding IS NOT NULL"))
        while batch := scan.fetchmany(10_000):
            rows = np.stack([r[0].to_numpy() for r in batch]).astype(np.float64)
            distances = 1.0 - unit @ rows.T / np.maximum(np.linalg.norm(rows, axis=1), 1e-12)  # (queries, batch)
            best = np.sort(np.concatenate([best, distances], axis=1), axis=1)[:, :k]
    return vectors, unit, best, np.isfinite(best).sum(axis=1)  # neighbours per query: k, or every row of a smaller table


def _recall(conn: psycopg.Connection, search: sql.Composable, truth, k: int, bind: Callable = lambda v: v) -> float:
    """Recall@k of ``search`` (its rows: the found chunks' float32 embeddings) against ``_exact_truth``:
    a found row counts when its distance, in float64 like the exact ones, is within the exact k-th."""
    vectors, unit, best, available = truth
    hits = 0
    with conn.cursor(binary=True) as cur:
        for j, vector in enumerate(vectors):
            found = np.stack([r[0].to_numpy() for r in cur.execute(search, {"q": bind(vector), "k": k}).fetchall()]).astype(np.float64)
            distances = 1.0 - found @ unit[j] / np.maximum(np.linalg.norm(found, axis=1), 1e-12)
            hits += int(np.sum(distances <= best[j, available[j] - 1] + 1e-9))
    return hits / int(available.sum())


def choose_vector_index(conn: psycopg.Connection, schema: str, embedder: Embedder, target: float = RECALL_TARGET, *,
                        sample: int = RECALL_SAMPLE, phases: dict[str, float] | None = None) -> VectorIndex:
    """The first of ``EF_LADDER`` at which an HNSW index on ``schema.chunks`` reaches ``target`` recall@10
    (``vector_recall``); when none does, the graph is dropped and every vector search scans the table
    exactly (recall 1 at the cost of a scan). The chosen ef_search is the least that searches of the
    table use (``pipeline.retriever`` reads it). A table of at least ``2 * PROBE_ROWS`` rows without a
    graph is probed first: a graph over ``PROBE_ROWS`` of its rows (a temporary table) at the
    ladder's top; when that misses the target the full graph is not built, since a graph's recall
    at a fixed ef_search only falls as it grows. The choice is recorded in ``vector_index``
    (``store.create`` then builds no graph for an exact table) and logged with its reason; ``phases`` gets
    the seconds of the probe, the build and the check. Run inside a transaction.
    """
    check_recall_target(target)
    phases = {} if phases is None else phases
    ladder = sorted({hnsw_ef_search(DEFAULT.n, ef) for ef in EF_LADDER})
    about = f"{{queries}} queries of {QUERY_WORDS} words from the table's chunks"
    rows = count(conn, schema)
    if rows >= 2 * PROBE_ROWS and not _has_graph(conn, schema):
        mark = time.perf_counter()
        recall, queries = _probe(conn, schema, embedder, sample, ladder[-1])
        phases["vector_index_probe"] = time.perf_counter() - mark
        if recall < target:
            return _record(conn, schema, VectorIndex(
                "exact", recall, queries, ladder[-1],
                f"HNSW recall@10 {recall:.3f} at ef_search {ladder[-1]} on a graph of {PROBE_ROWS:,} of the table's {rows:,} rows, "
                f"{about.format(queries=queries)}: below {target}, and lower still at full size; no graph built, vector "
                "search scans the table exactly"), phases, embedder, sample)
    mark = time.perf_counter()
    conn.execute(statement(schema, HNSW))
    phases["chunks_embedding_hnsw"] = time.perf_counter() - mark
    mark = time.perf_counter()
    recalls, truth = _ladder_recall(conn, schema, embedder, sample, 10, ladder)
    queries = _queries(truth)
    phases["vector_index_check"] = time.perf_counter() - mark
    measured = ", ".join(f"{recalls[ef]:.3f} at ef_search {ef}" for ef in ladder)
    measured = f"HNSW recall@10 against exact search {measured} ({about.format(queries=queries)})"
    for ef in ladder:
        if recalls[ef] >= target:
            return _record(conn, schema, VectorIndex("hnsw", recalls[ef], queries, ef,
                                                     f"{measured}: HNSW kept, searched at ef_search {ef} or more (target {target})"))
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "chunks_embedding_hnsw")))
    return _record(conn, schema, VectorIndex("exact", recalls[ladder[-1]], queries, ladder[-1],
                                             f"{measured}: below {target} throughout, HNSW dropped; vector search scans the table exactly"),
                   phases, embedder, sample, truth)  # the same table's truth: the copy's check reuses it


# the chunks an exact scan of the halfvec copy returns, with their float32 embeddings (for _recall)
_HALF_SEARCH = """SELECT c.embedding FROM (SELECT chunk_id FROM {vectors} ORDER BY embedding <=> %(q)s, chunk_id LIMIT %(k)s) AS top
                  JOIN {chunks} c USING (chunk_id)"""


def _exact_copy_checked(conn: psycopg.Connection, schema: str, choice: VectorIndex, embedder: Embedder | None,
                        sample: int, truth: tuple | None = None) -> VectorIndex:
    """Make the exact scan's copy: in halfvec when the scan of it keeps ``HALF_RECALL`` recall@10 against
    float32 exact search on the recall check's queries (``truth``: their ``_exact_truth`` on this table
    when the caller has it), else in float32; ``choice`` with the reason told."""
    if embedder is None:
        exact_copy(conn, schema)
        return choice
    exact_copy(conn, schema, half=True)
    with conn.transaction():  # the truth's server-side cursor needs one
        if truth is None:
            truth = _exact_truth(conn, schema, embedder, sample, 10)
        recall = 1.0 if truth is None else _recall(conn, statement(schema, _HALF_SEARCH), truth, 10, HalfVector)
    if recall >= HALF_RECALL:
        return replace(choice, reason=f"{choice.reason}; its copy holds halfvec (recall@10 {recall:.3f} against float32 exact "
                                      f"search, target {HALF_RECALL})")
    exact_copy(conn, schema)
    return replace(choice, reason=f"{choice.reason}; its copy holds float32 (halfvec's recall@10 {recall:.3f} is below {HALF_RECALL})")


def _has_graph(conn: psycopg.Connection, schema: str) -> bool:
    return conn.execute("SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE schemaname = %s AND indexname = 'chunks_embedding_hnsw')",
                        (schema,)).fetchone()[0]


def _probe(conn: psycopg.Connection, schema: str, embedder: Embedder, sample: int, ef_search: int) -> tuple[float, int]:
    """``vector_recall`` at ``ef_search`` of a graph over ``PROBE_ROWS`` rows of the table (by hash of
    chunk_id), built in a temporary table ``pg_temp.chunks`` that is dropped afterwards."""
    probe = "pg_temp"
    conn.execute(statement(probe, "DROP TABLE IF EXISTS {chunks}"))
    conn.execute(sql.SQL("CREATE TEMP TABLE chunks AS SELECT chunk_id, text, embedding FROM {} ORDER BY hashtext(chunk_id), chunk_id LIMIT {}")
                 .format(sql.Identifier(schema, "chunks"), sql.Literal(PROBE_ROWS)))
    conn.execute(statement(probe, HNSW))
    conn.execute(statement(probe, "ANALYZE {chunks}"))
    try:
        return vector_recall(conn, probe, embedder, sample=sample, ef_search=ef_search)
    finally:
        conn.execute(statement(probe, "DROP TABLE {chunks}"))


def _record(conn: psycopg.Connection, schema: str, choice: VectorIndex, phases: dict[str, float] | None = None,
            embedder: Embedder | None = None, sample: int = RECALL_SAMPLE, truth: tuple | None = None) -> VectorIndex:
    """Record ``choice``; for an exact scan, make its narrow copy first (in halfvec when ``embedder``'s
    queries show it keeps ``HALF_RECALL``, ``_exact_copy_checked``; without an embedder, in float32)."""
    if choice.kind == "exact":
        mark = time.perf_counter()
        choice = _exact_copy_checked(conn, schema, choice, embedder, sample, truth)
        if phases is not None:
            phases["exact_copy"] = time.perf_counter() - mark
    (log.info if choice.kind == "hnsw" else log.warning)("%s: %s", schema, choice.reason)
    if choice.kind != "exact":
        drop_exact_copy(conn, schema)
    conn.execute(statement(schema, "DELETE FROM {vector_index}"))
    conn.execute(statement(schema, "INSERT INTO {vector_index} (kind, recall, sample, ef_search, reason) VALUES (%s, %s, %s, %s, %s)"),
                 (choice.kind, choice.recall, choice.sample, choice.ef_search, choice.reason))
    return choice
