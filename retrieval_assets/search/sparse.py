"""The learned sparse list: SPLADE vectors beside ``chunks`` and the top n chunks by inner product with a query's.

Contract: ``sync(conn, schema, encoder)`` makes the ``splade`` table (chunk_id, md5 of the text, pgvector
``sparsevec``) equal to ``chunks``: it encodes the chunks that are new or whose text changed since it last ran,
deletes the rows of chunks gone, and returns (encoded, deleted); a second run encodes nothing. ``search`` returns
``Hit(chunk_id, score, rank)`` for the chunks sharing a word piece with the query vector, scored by the inner
product, best first, ties by chunk_id, at most ``n``; [] for an empty query vector or a schema never synced.
Everything runs in the caller's transaction (``pipeline.run``'s snapshot when it searches).
"""

from __future__ import annotations

import psycopg
from pgvector import SparseVector

from retrieval_assets.index.splade import SpladeEncoder
from retrieval_assets.index.tables import exists, statement
from retrieval_assets.types import Hit, as_hits

_CREATE = "CREATE TABLE IF NOT EXISTS {splade} (chunk_id text PRIMARY KEY, text_md5 text NOT NULL, vec sparsevec NOT NULL)"
_STALE = """SELECT c.chunk_id, c.text FROM {chunks} c LEFT JOIN {splade} s USING (chunk_id)
            WHERE s.chunk_id IS NULL OR s.text_md5 <> md5(c.text) ORDER BY c.chunk_id"""
_GONE = "DELETE FROM {splade} s WHERE NOT EXISTS (SELECT 1 FROM {chunks} c WHERE c.chunk_id = s.chunk_id)"
_UPSERT = """INSERT INTO {splade} (chunk_id, text_md5, vec) VALUES (%s, md5(%s), %s)
             ON CONFLICT (chunk_id) DO UPDATE SET text_md5 = excluded.text_md5, vec = excluded.vec"""
# the inner product's top n; chunks sharing no word piece (product 0) are no match
_SEARCH = """SELECT chunk_id, score FROM (SELECT chunk_id, -(vec <#> %(q)s) AS score FROM {splade}
             ORDER BY vec <#> %(q)s, chunk_id COLLATE "C" LIMIT %(n)s) AS top WHERE score > 0"""


def vector(weights: dict[int, float], dims: int) -> SparseVector:
    """One ``SpladeEncoder.encode`` result as a pgvector ``SparseVector`` of ``dims`` (the vocabulary)."""
    return SparseVector(weights, dims)


def sync(conn: psycopg.Connection, schema: str, encoder: SpladeEncoder, *, batch: int = 64) -> tuple[int, int]:
    """Encode the new and changed chunks of ``schema`` into its ``splade`` table, drop the gone; (encoded, deleted)."""
    with conn.transaction():
        conn.execute(statement(schema, _CREATE))
        deleted = conn.execute(statement(schema, _GONE)).rowcount
        stale = conn.execute(statement(schema, _STALE)).fetchall()
        dims = encoder.dims
        with conn.cursor() as cur:
            for start in range(0, len(stale), batch):
                rows = stale[start : start + batch]
                encoded = encoder.encode([text for _, text in rows])
                cur.executemany(statement(schema, _UPSERT), [(cid, text, vector(w, dims)) for (cid, text), w in zip(rows, encoded)])
    return len(stale), deleted


def search(conn: psycopg.Connection, schema: str, query: dict[int, float], dims: int, n: int) -> list[Hit]:
    """The chunks of ``schema`` by inner product with the query's SPLADE vector ``query``, top ``n``."""
    if not query or not exists(conn, schema, "splade"):
        return []
    return as_hits(conn.execute(statement(schema, _SEARCH), {"q": vector(query, dims), "n": n}).fetchall())
