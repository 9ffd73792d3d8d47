"""The index repairs itself: a table of a partition's index dropped by hand is built again and the index
synced in full by the next sync (logged), never skipped as unchanged; a healthy index keeps its shortcut."""

import logging

import pytest
from psycopg import sql

from retrieval_assets.index import repair, store, vector_index
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.tables import statement
from retrieval_assets.params import RetrievalParams
from retrieval_assets.search import bm25_rank, pipeline

PARAMS = (RetrievalParams(), RetrievalParams(lexical="bm25"))


def contents(conn, schema) -> dict:
    """Everything a search reads, independent of physical layout: postings as (term, chunk, tf, length)."""
    read = lambda template: sorted(conn.execute(statement(schema, template)).fetchall())  # noqa: E731
    found = {
        "chunks": read("SELECT chunk_id, text, embedding::text FROM {chunks}"),
        "fulltext": read("SELECT chunk_id, tsv::text FROM {fulltext}"),
        "chunk_lengths": read("SELECT chunk_id, len FROM {chunk_lengths}"),
        "postings": read("""SELECT p.term, cl.chunk_id, u.tf, u.len FROM {postings} p,
                            unnest(p.cids, p.tfs, p.lens) AS u(cid, tf, len) JOIN {chunk_lengths} cl ON cl.cid = u.cid"""),
        "term_df": read("SELECT term, df FROM {term_df}"),
        "bm25_stats": read("SELECT n, total_len FROM {bm25_stats}"),
    }
    if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(schema, "vectors").as_string(conn),)).fetchone()[0]:
        found["vectors"] = read("SELECT chunk_id, embedding::text FROM {vectors}")
    return found


def top10s(conn, schema, golden) -> list:
    """The final top-10 of golden queries under both lexical lists, and the BM25 list with its scores."""
    golden = golden[::3]  # 16 of 48, every kind
    retriever = pipeline.retriever(conn, schema, HashEmbedder())
    finals = [[r.chunk_id for r in pipeline.run(conn, retriever, g.query, p).final] for p in PARAMS for g in golden]
    bm25 = [[(h.chunk_id, round(h.score, 6)) for h in bm25_rank.bm25_search(conn, schema, g.query, 10)] for g in golden]
    return [retriever.exact, finals, bm25]


def _index(conn, schema, documents, golden, kind: str):
    """The fixture corpus indexed afresh (``exact``: chosen to scan exactly, so it holds the narrow ``vectors``
    copy): its chunks, and its contents and top-10s."""
    from retrieval_assets.index.chunker import chunk

    chunks = [c for d in documents for c in chunk(d)]
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    store.sync(conn, schema, chunks, HashEmbedder())
    if kind == "exact":
        with conn.transaction():  # what choose_vector_index records when the graph misses its target
            vector_index._record(conn, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"))
    before = contents(conn, schema), top10s(conn, schema, golden)
    assert bool(before[1][0]) == (kind == "exact") and len(before[0]["chunks"]) == len(chunks) > 400
    return chunks, before


def _drop(conn, schema, table):
    conn.execute(sql.SQL("DROP TABLE {} CASCADE").format(sql.Identifier(schema, table)))


def _staged(monkeypatch) -> list:
    calls = []
    real = store._stage
    monkeypatch.setattr(store, "_stage", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize(("kind", "table"), [
    *(("hnsw", t) for t in ("chunks", "fulltext", "postings", "term_df", "chunk_lengths", "bm25_stats", "synced", "vector_index")),
    *(("exact", t) for t in ("vectors", "chunks", "postings", "vector_index"))])
def test_the_next_sync_rebuilds_a_dropped_table_and_the_index_searches_as_before(kind, table, conn, schema, corpus_documents,
                                                                                  golden, monkeypatch, caplog):
    chunks, before = _index(conn, schema, corpus_documents, golden, kind)
    _drop(conn, schema, table)
    staged = _staged(monkeypatch)
    with caplog.at_level(logging.WARNING, logger=repair.log.name):
        report = store.sync(conn, schema, chunks, HashEmbedder())
    assert staged == [1]  # synced in full, not skipped as unchanged
    assert report.inserted == (len(chunks) if table == "chunks" else 0) and report.deleted == 0
    warnings = [r.getMessage() for r in caplog.records if r.name == repair.log.name]
    assert len(warnings) == 1 and f"{schema}: the index is missing {table}" in warnings[0]
    expected = before if table != "vector_index" else (  # the exact choice went with its table: the graph, as a new table has
        {k: v for k, v in before[0].items() if k != "vectors"}, [False, *before[1][1:]])
    assert (contents(conn, schema), top10s(conn, schema, golden)) == expected

    caplog.clear()
    assert store.sync(conn, schema, chunks, HashEmbedder()) == store.SyncReport(0, 0, 0, len(chunks), 0)
    assert staged == [1] and not caplog.records  # whole again: the shortcut holds, nothing logged


def test_drop_chunks_cascade_then_create_and_sync_as_the_asset_does(conn, schema, corpus_documents, golden, caplog):
    """The reported case: DROP TABLE <schema>.chunks CASCADE, then the asset's create + sync, reported
    '0 rows' for good; now create logs what is missing and the sync fills the index again."""
    chunks, before = _index(conn, schema, corpus_documents, golden, "hnsw")
    _drop(conn, schema, "chunks")
    with caplog.at_level(logging.WARNING, logger=repair.log.name):
        store.create(conn, schema, 256)
        report = store.sync(conn, schema, chunks, HashEmbedder())
    assert (report.inserted, report.embedded) == (len(chunks), len(chunks))
    assert [r.getMessage() for r in caplog.records if r.name == repair.log.name] == [
        f"{schema}: the index is missing chunks; re-creating chunks (every chunk embedded again) and the tables "
        "written from it, then syncing in full"]
    assert (contents(conn, schema), top10s(conn, schema, golden)) == before


def test_a_chunk_table_replaced_behind_the_record_is_not_vouched_for(conn, schema, corpus_documents, golden, monkeypatch, caplog):
    """The sync record names the tables it was written for: a chunk table dropped and made again by a create
    that does not repair (an older version of this code on the same server) is synced in full, its derived
    tables written again from it, not taken for the table the record describes."""
    chunks, before = _index(conn, schema, corpus_documents, golden, "hnsw")
    _drop(conn, schema, "chunks")
    with monkeypatch.context() as patch:
        patch.setattr(repair, "clear", lambda conn, schema: None)
        store.create(conn, schema, 256)  # an empty chunks; fulltext, postings and the record still of the old one
    with caplog.at_level(logging.WARNING, logger=repair.log.name):
        report = store.sync(conn, schema, chunks, HashEmbedder())
    assert report.inserted == len(chunks)
    assert any("has chunks replaced since its last sync" in r.getMessage() for r in caplog.records)
    assert (contents(conn, schema), top10s(conn, schema, golden)) == before


def test_a_dropped_chunk_table_of_a_large_index_comes_back_through_the_bulk_load(conn, schema, corpus_documents, golden,
                                                                                monkeypatch, caplog):
    """From ``BULK_MIN`` chunks the re-created, empty table is filled by the bulk load, with the same contents."""
    chunks, before = _index(conn, schema, corpus_documents, golden, "hnsw")
    _drop(conn, schema, "chunks")
    monkeypatch.setattr(store, "BULK_MIN", 100)
    loads = []
    real = store.bulk.load
    monkeypatch.setattr(store.bulk, "load", lambda *a, **k: loads.append(1) or real(*a, **k))
    with caplog.at_level(logging.WARNING, logger=repair.log.name):
        report = store.sync(conn, schema, chunks, HashEmbedder(), recall_target=None)
    assert loads == [1] and report.inserted == len(chunks)
    assert any(f"{schema}: the index is missing chunks" in r.getMessage() for r in caplog.records)
    assert (contents(conn, schema), top10s(conn, schema, golden)) == before
