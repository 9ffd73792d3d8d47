"""Stage 02: the chunk table, idempotent upserts, sync, and both dimension mismatches."""

import threading
import time
import zlib

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from retrieval_assets import pg
from retrieval_assets.pg import partners, sessions

from retrieval_assets.index import bm25, bulk, copies, store, tables, vector_index

from retrieval_assets.search import bm25_rank, dense, hybrid, pipeline, snapshot, ts_rank
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import RetrievalParams, hnsw_ef_search
from retrieval_assets.search.rerank import LexicalReranker
from retrieval_assets.index.tables import statement
from retrieval_assets.types import Chunk


class CountingEmbedder(HashEmbedder):
    def __init__(self, dims=256):
        super().__init__(dims)
        self.seen: list[str] = []
        self.calls: list[int] = []

    def embed(self, texts):
        self.seen.extend(texts)
        self.calls.append(len(texts))
        return super().embed(texts)


def make_chunks(doc_id: str, texts: list[str]) -> list[Chunk]:
    out, pos = [], 0
    for i, t in enumerate(texts):
        out.append(Chunk(f"{doc_id}#{i:03d}", doc_id, "T > S", pos, pos + len(t), t))
        pos += len(t) + 2
    return out


@pytest.fixture()
def table(conn, schema):
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    return conn


def rows(conn, schema):
    return conn.execute(statement(schema, "SELECT chunk_id, text, xmin::text FROM {chunks} ORDER BY chunk_id")).fetchall()


def test_columns_and_both_indexes(table, schema):
    cols = dict(table.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = 'chunks'",
        (schema,),
    ).fetchall())
    assert set(cols) == {"chunk_id", "doc_id", "heading_path", "start_char", "end_char", "text", "tsv", "embedding"}
    assert cols["tsv"] == "tsvector"
    generated = table.execute(
        "SELECT is_generated FROM information_schema.columns WHERE table_schema = %s AND table_name = 'chunks' AND column_name = 'tsv'",
        (schema,),
    ).fetchone()[0]
    assert generated == "ALWAYS"
    indexes = indexdefs(table, schema)
    assert any("USING hnsw (embedding vector_cosine_ops)" in d for d in indexes)
    assert any("USING gin (tsv)" in d for d in indexes)
    assert tables.table_dims(table, schema) == 256
    store.create(table, schema, 256)  # idempotent


def test_dimension_mismatches_raise_before_writing(table, schema):
    with pytest.raises(ValueError, match="dimension 256, not 384"):
        store.create(table, schema, 384)
    with pytest.raises(ValueError, match=f"64 dimensions, table {schema}.chunks has 256"):
        store.upsert(table, schema, make_chunks("d", ["some text"]), HashEmbedder(64))
    with pytest.raises(ValueError, match="64 dimensions"):
        store.sync(table, schema, make_chunks("d", ["some text"]), HashEmbedder(64))
    assert tables.count(table, schema) == 0


def test_upsert_is_idempotent_and_stores_the_vectors(table, schema):
    e = HashEmbedder()
    chunks = make_chunks("d", ["alpha beta gamma", "delta epsilon", "zeta eta theta"])
    assert store.upsert(table, schema, chunks, e, batch=2) == 3
    before = rows(table, schema)
    assert store.upsert(table, schema, chunks, e) == 0
    assert rows(table, schema) == before  # same xmin: nothing rewritten
    stored = dict(table.execute(statement(schema, "SELECT chunk_id, embedding FROM {chunks}")).fetchall())
    for c, v in zip(chunks, e.embed([c.text for c in chunks])):
        np.testing.assert_allclose(stored[c.chunk_id].to_numpy(), v, atol=1e-7)
    edited = [chunks[0], Chunk(chunks[1].chunk_id, "d", "T > S", 18, 40, "delta epsilon EDITED"), chunks[2]]
    assert store.upsert(table, schema, edited, e) == 1
    text, vec = table.execute(statement(schema, "SELECT text, embedding FROM {chunks} WHERE chunk_id = 'd#001'")).fetchone()
    assert text == "delta epsilon EDITED"
    np.testing.assert_allclose(vec.to_numpy(), e.embed([text])[0], atol=1e-7)
    tsv = table.execute(statement(schema, "SELECT tsv::text FROM {chunks} WHERE chunk_id = 'd#001'")).fetchone()[0]
    assert "'edit'" in tsv


def test_sync_reports_counts_and_reembeds_only_new_text(table, schema):
    e = CountingEmbedder()
    first = make_chunks("a", ["one fish", "two fish", "red fish"]) + make_chunks("b", ["blue fish"])
    report = store.sync(table, schema, first, e)
    assert report == store.SyncReport(inserted=4, updated=0, deleted=0, unchanged=0, embedded=4)
    e.seen.clear()
    assert store.sync(table, schema, first, e) == store.SyncReport(0, 0, 0, 4, 0)
    assert e.seen == []
    # document a edited: its middle chunk changes, one text moves id; b deleted
    second = make_chunks("a", ["one fish", "green fish", "two fish"])
    report = store.sync(table, schema, second, e)
    assert report == store.SyncReport(inserted=0, updated=2, deleted=1, unchanged=1, embedded=1)
    assert e.seen == ["green fish"]
    assert [r[:2] for r in rows(table, schema)] == [("a#000", "one fish"), ("a#001", "green fish"), ("a#002", "two fish")]
    moved = table.execute(statement(schema, "SELECT embedding FROM {chunks} WHERE chunk_id = 'a#002'")).fetchone()[0]
    np.testing.assert_allclose(moved.to_numpy(), HashEmbedder().embed(["two fish"])[0], atol=1e-7)
    with pytest.raises(store.ShrinkError, match="would delete 3 of the index's 3 chunks"):
        store.sync(table, schema, [], e)
    assert store.sync(table, schema, [], e, allow_shrink=True) == store.SyncReport(0, 0, 3, 0, 0)
    assert tables.count(table, schema) == 0


def test_sync_failing_half_way_leaves_the_previous_state(table, schema, monkeypatch):
    e = HashEmbedder()
    store.sync(table, schema, make_chunks("a", ["one", "two", "three"]), e)
    before = rows(table, schema)

    def explode(conn, schema, chunk_ids):
        raise RuntimeError("killed after the delete and the upsert")

    monkeypatch.setattr(bm25, "add_terms", explode)
    with pytest.raises(RuntimeError, match="killed"):
        store.sync(table, schema, make_chunks("b", ["other"]), e, allow_shrink=True)
    assert rows(table, schema) == before


def test_concurrent_syncs_are_serialised(table, pg_dsn, schema):
    e = HashEmbedder()
    store.sync(table, schema, make_chunks("a", ["one"]), e)
    done = threading.Event()
    with pg.connect(pg_dsn) as holder, holder.transaction():
        store._lock(holder, schema)

        def other():
            with pg.connect(pg_dsn) as c:
                store.sync(c, schema, make_chunks("a", ["one", "two"]), e)
            done.set()

        worker = threading.Thread(target=other)
        worker.start()
        time.sleep(0.5)
        waiting = table.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone()[0]
        assert not done.is_set() and waiting == 1
    worker.join(10)
    assert done.is_set() and tables.count(table, schema) == 2


def test_duplicate_chunk_ids_with_different_content_are_rejected(table, schema):
    a = Chunk("d#000", "d", "", 0, 3, "one")
    b = Chunk("d#000", "d", "", 0, 3, "two")
    with pytest.raises(ValueError, match="d#000"):
        store.sync(table, schema, [a, b], HashEmbedder())
    assert tables.count(table, schema) == 0


def indexdefs(conn, schema):
    return sorted(r[0] for r in conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND tablename IN ('chunks', 'fulltext')", (schema,)))


def test_bulk_load_into_an_empty_table_equals_the_row_by_row_sync(table, schema, corpus_documents, monkeypatch):
    from retrieval_assets.index import chunker
    from retrieval_assets_tests.test_bm25 import stats_from_scratch, stats_kept

    chunks = [c for d in corpus_documents for c in chunker.chunk(d)]
    e = HashEmbedder()
    contents = statement(
        schema, "SELECT chunk_id, doc_id, heading_path, start_char, end_char, text, embedding::text FROM {chunks} ORDER BY chunk_id")
    definitions = indexdefs(table, schema)
    assert store.sync(table, schema, chunks, e) == store.SyncReport(len(chunks), 0, 0, 0, len(chunks))
    row_by_row = table.execute(contents).fetchall()
    store.drop(table, schema)
    store.create(table, schema, 256)

    monkeypatch.setattr(store, "BULK_MIN", 1)
    monkeypatch.setattr(bulk, "BULK_BATCH", 100)  # several batches, the last one short
    assert store.sync(table, schema, chunks, e) == store.SyncReport(len(chunks), 0, 0, 0, len(chunks))
    assert table.execute(contents).fetchall() == row_by_row
    assert stats_kept(table, schema) == stats_from_scratch(table, schema)
    assert indexdefs(table, schema) == definitions  # HNSW and GIN rebuilt as they were defined
    for name in ("chunks", "fulltext", "postings"):  # vacuumed after the commit: every page all-visible
        pages, visible = table.execute("SELECT relpages, relallvisible FROM pg_class WHERE oid = %s::regclass",
                                       (sql.Identifier(schema, name).as_string(table),)).fetchone()
        assert visible == pages > 0, name
    # a table with rows goes the row-by-row way
    assert store.sync(table, schema, chunks[:-1], e) == store.SyncReport(0, 0, 1, len(chunks) - 1, 0)
    assert stats_kept(table, schema) == stats_from_scratch(table, schema)


def test_bulk_load_failing_half_way_leaves_the_empty_table_and_its_indexes(table, schema, corpus_documents, monkeypatch):
    from retrieval_assets.index import chunker

    chunks = [c for d in corpus_documents for c in chunker.chunk(d)]
    definitions = indexdefs(table, schema)
    monkeypatch.setattr(store, "BULK_MIN", 1)
    monkeypatch.setattr(bulk, "BULK_BATCH", 100)

    class Failing(HashEmbedder):
        calls = 0

        def embed(self, texts):
            Failing.calls += 1
            if Failing.calls == 3:
                raise RuntimeError("embedder died on the third batch")
            return super().embed(texts)

    with pytest.raises(RuntimeError, match="third batch"):
        store.sync(table, schema, chunks, Failing())
    assert tables.count(table, schema) == 0 and indexdefs(table, schema) == definitions


def test_a_schema_without_chunks_never_acts_on_public_chunks(pg_dsn, schema):
    """A schema without chunks must not fall through to public.chunks (every statement names its schema)."""
    empty = schema + "_empty"
    with pg.connect(pg_dsn) as admin:
        admin.execute("CREATE TABLE public.chunks (chunk_id text PRIMARY KEY, embedding vector(3))")
        admin.execute("INSERT INTO public.chunks VALUES ('p', '[1,2,3]')")
    try:
        with pg.connect(pg_dsn) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(empty)))
            assert tables.table_dims(conn, empty) is None
            with pytest.raises(psycopg.errors.UndefinedTable):
                tables.count(conn, empty)
            with pytest.raises(ValueError, match=f"table {empty}.chunks does not exist"):
                store.sync(conn, empty, make_chunks("a", ["one"]), HashEmbedder())
            store.drop(conn, empty)
        with pg.connect(pg_dsn) as admin:
            assert admin.execute("SELECT count(*) FROM public.chunks").fetchone()[0] == 1
    finally:
        with pg.connect(pg_dsn) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(empty)))
            admin.execute("DROP TABLE IF EXISTS public.chunks")


def test_decoy_public_chunks_never_touched(conn, schema, pg_dsn):
    """Every entry point names the module's schema: a decoy public.chunks is neither read nor written."""
    with pg.connect(pg_dsn) as admin:
        admin.execute("CREATE TABLE public.chunks (chunk_id text)")
        admin.execute("INSERT INTO public.chunks VALUES ('decoy#000')")
    try:
        e = HashEmbedder()
        store.drop(conn, schema)
        store.create(conn, schema, e.dims)
        chunks = make_chunks("d", ["decoy rank fusion text", "reciprocal rank fusion merges lists", "decoy words again"])
        assert store.sync(conn, schema, chunks, e).inserted == 3
        assert store.upsert(conn, schema, make_chunks("u", ["upserted decoy rank text"]), e) == 1
        assert tables.count(conn, schema) == 4
        ids = {c.chunk_id for c in chunks} | {"u#000"}
        results = []
        for lexical in ("ts_rank_cd", "bm25"):
            fused = hybrid.search(conn, schema, e, "decoy rank fusion", RetrievalParams(lexical=lexical))
            assert fused
            results.append([r.chunk_id for r in fused])
        lexical_hits = bm25_rank.bm25_search(conn, schema, "decoy rank fusion")
        assert lexical_hits
        results.append([h.chunk_id for h in lexical_hits])
        trace = pipeline.run(conn, pipeline.Retriever(schema, e, LexicalReranker()), "decoy rank fusion", RetrievalParams())
        assert trace.final
        results += [[h.chunk_id for h in trace.vector], [h.chunk_id for h in trace.text],
                    [r.chunk_id for r in trace.fused], [r.chunk_id for r in trace.reranked],
                    [r.chunk_id for r in trace.final], list(trace.chunks)]
        for got in results:
            assert "decoy#000" not in got and set(got) <= ids
        store.drop(conn, schema)
        assert tables.table_dims(conn, schema) is None
        with pg.connect(pg_dsn) as admin:
            assert admin.execute("SELECT chunk_id FROM public.chunks").fetchall() == [("decoy#000",)]
    finally:
        with pg.connect(pg_dsn) as admin:
            admin.execute("DROP TABLE IF EXISTS public.chunks")


def test_sync_and_upsert_embed_in_batches_as_they_write(table, schema):
    """Never every embedding at once: the embedder sees at most ``batch`` texts per call."""
    e = CountingEmbedder()
    store.sync(table, schema, make_chunks("a", [f"text number {i}" for i in range(150)]), e, batch=64)
    assert e.calls == [64, 64, 22]
    e.calls.clear()
    edited = make_chunks("a", [f"text number {i}" + (" edited" if i % 50 == 0 else "") for i in range(150)])
    assert store.sync(table, schema, edited, e, batch=64).embedded == 3 and e.calls == [2, 1]  # 0 and 50, then 100
    e.calls.clear()
    store.upsert(table, schema, make_chunks("b", [f"other {i}" for i in range(70)]), e, batch=64)
    assert e.calls == [64, 6]


class GaussianEmbedder(HashEmbedder):
    """Independent Gaussian vectors per text (seeded by the text): the hard case for a graph index."""

    def embed(self, texts):
        return np.stack([np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dims).astype(np.float32) for t in texts])


def exact_recall(conn, schema, embedder, k=10, sample=vector_index.RECALL_SAMPLE):
    """vector_recall's figure the slow way: every query's exact and planned lists from Postgres."""
    texts = [t for (t,) in conn.execute(statement(schema, "SELECT text FROM {chunks} ORDER BY hashtext(chunk_id), chunk_id LIMIT %s"),
                                        (sample,))]
    search = statement(schema, "SELECT embedding <=> %(q)s FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(k)s")
    hits = 0
    for vector in embedder.embed([vector_index.query_words(t) for t in texts]):
        with conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            conn.execute("SET LOCAL enable_seqscan = on")
            truth = [d for (d,) in conn.execute(search, {"q": vector, "k": k}).fetchall()]
        with conn.transaction():
            conn.execute("SELECT set_config('hnsw.ef_search', '50', true)")
            found = [d for (d,) in conn.execute(search, {"q": vector, "k": k}).fetchall()]
        hits += sum(1 for d in found if d <= truth[-1] + 1e-6)
    return hits / (k * len(texts))


def test_the_vector_index_is_kept_only_when_its_recall_reaches_the_target(table, schema, monkeypatch, caplog):
    chunks = make_chunks("g", [f"topic{i % 50} note{i} item{i * 7 % 13}" for i in range(2_000)])
    monkeypatch.setattr(store, "BULK_MIN", 1)
    monkeypatch.setattr(vector_index, "EF_LADDER", (None,))  # the pipeline's ef_search only (the ladder: the next test)
    # the planner must use the graph at this size, as it does at 100k: else every search is exact
    table.execute("SET enable_seqscan = off")
    try:
        with caplog.at_level("INFO", logger="retrieval_assets.index.vector_index"):
            store.sync(table, schema, chunks, GaussianEmbedder(), recall_target=0.0)
        kept = vector_index.vector_index(table, schema)
        assert kept.kind == "hnsw" and kept.sample == vector_index.RECALL_SAMPLE and kept.ef_search == 50
        assert kept.recall == pytest.approx(exact_recall(table, schema, GaussianEmbedder()))  # numpy's exact lists equal Postgres'
        assert kept.recall < 1.0  # approximate on independent 256-d vectors (0.97-0.99 at 2,000: the build is random)
        assert "HNSW kept" in caplog.text
        assert any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))

        # a target above what it measures: the graph is dropped, every search exact, and create() leaves it out
        with table.transaction():
            chosen = vector_index.choose_vector_index(table, schema, GaussianEmbedder(), target=1.0)
        assert chosen.kind == "exact" and chosen.ef_search == 50 and chosen.recall == pytest.approx(kept.recall)
        assert f"{kept.recall:.3f} at ef_search 50" in chosen.reason and "below 1.0 throughout" in chosen.reason
        assert not any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))
        store.create(table, schema, 256)
        assert not any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))
        assert vector_index.vector_index(table, schema) == chosen
        assert vector_index.vector_recall(table, schema, GaussianEmbedder()) == (1.0, vector_index.RECALL_SAMPLE)  # exact scan: the exact lists

        # the next bulk load builds the graph again and checks it afresh
        store.sync(table, schema, [], GaussianEmbedder(), allow_shrink=True)
        store.sync(table, schema, chunks, GaussianEmbedder(), recall_target=0.0)
        assert vector_index.vector_index(table, schema).kind == "hnsw"
        assert any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))

        # a table of twice PROBE_ROWS is probed first: a graph over PROBE_ROWS of its rows that misses
        # the target means no full graph is built at all
        more = make_chunks("g", [f"topic{i % 50} note{i} item{i * 7 % 13}" for i in range(4_000)])
        monkeypatch.setattr(vector_index, "PROBE_ROWS", 2_000)  # a graph of 2,000 of these measures 0.97-0.99
        store.sync(table, schema, [], GaussianEmbedder(), allow_shrink=True)
        caplog.clear()
        store.sync(table, schema, more, GaussianEmbedder(), recall_target=1.0)
        probed = vector_index.vector_index(table, schema)
        assert probed.kind == "exact" and probed.recall < 1.0 and "graph of 2,000 of the table's 4,000 rows" in probed.reason
        assert "no graph built" in caplog.text
        assert not any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))
        assert table.execute("SELECT to_regclass('pg_temp.chunks')").fetchone()[0] is None  # the probe's table is gone
        # a probe that reaches the target goes on to the full graph and its own check
        store.sync(table, schema, [], GaussianEmbedder(), allow_shrink=True)
        store.sync(table, schema, more, GaussianEmbedder(), recall_target=0.0)
        assert vector_index.vector_index(table, schema).kind == "hnsw" and "graph of" not in vector_index.vector_index(table, schema).reason
        assert any("chunks_embedding_hnsw" in d for d in indexdefs(table, schema))
    finally:
        table.execute("RESET enable_seqscan")


@pytest.mark.parametrize("target", [-0.1, 1.5, "0.9", float("nan")])
def test_a_recall_target_outside_zero_to_one_is_refused_before_anything_changes(table, schema, target):
    before = indexdefs(table, schema)
    with pytest.raises(ValueError, match="recall_target must be a number within \\[0, 1\\]"):
        store.sync(table, schema, make_chunks("a", ["one", "two"]), HashEmbedder(), recall_target=target)
    with pytest.raises(ValueError, match="recall_target must be a number within \\[0, 1\\]"):
        vector_index.choose_vector_index(table, schema, HashEmbedder(), target)
    assert tables.count(table, schema) == 0 and indexdefs(table, schema) == before and vector_index.vector_index(table, schema) is None


def test_the_ladder_keeps_the_graph_at_the_least_ef_search_that_reaches_the_target(table, schema, monkeypatch):
    """A target between the graph's recall at ef_search 50 and at a higher rung keeps it at that rung; the
    retriever reads the rung and every search of the table runs with at least that ef_search."""
    chunks = make_chunks("g", [f"topic{i % 50} note{i} item{i * 7 % 13}" for i in range(2_000)])
    table.execute("SET enable_seqscan = off")
    try:
        store.sync(table, schema, chunks, GaussianEmbedder(), recall_target=None)  # the graph, not checked
        ladder = sorted({hnsw_ef_search(50, ef) for ef in vector_index.EF_LADDER})
        recalls, _ = vector_index._ladder_recall(table, schema, GaussianEmbedder(), vector_index.RECALL_SAMPLE, 10, ladder)
        assert recalls[ladder[0]] <= recalls[ladder[-1]]
        rung = next((ef for ef in ladder if recalls[ef] > recalls[ladder[0]]), None)
        assert rung is not None, recalls  # the graph misses something at 50 that a wider search finds
        with table.transaction():
            chosen = vector_index.choose_vector_index(table, schema, GaussianEmbedder(), target=recalls[rung])
        assert (chosen.kind, chosen.ef_search, chosen.recall) == ("hnsw", rung, recalls[rung])
        retriever = pipeline.retriever(table, schema, GaussianEmbedder(), RetrievalParams())
        assert retriever.ef_search == rung
        seen = []
        real = hybrid.first_stage
        monkeypatch.setattr(hybrid, "first_stage", lambda conn, s, v, q, p, **kw: seen.append(p.ef_search) or real(conn, s, v, q, p, **kw))
        pipeline.run(table, retriever, "topic3 note7", RetrievalParams())
        pipeline.run(table, retriever, "topic3 note7", RetrievalParams(ef_search=1000))  # a wider search of the caller's stays
        assert seen == [rung, 1000]
    finally:
        table.execute("RESET enable_seqscan")


def test_a_table_smaller_than_k_is_judged_on_the_neighbours_it_has(table, schema):
    """Four rows: every query's exact top 10 is those four, and finding all four is recall 1 (was 0.4)."""
    store.sync(table, schema, make_chunks("s", ["rotate the signing key now", "keys live in the token",
                                                "install the tool first", "point the tool at the registry"]), HashEmbedder())
    assert vector_index.vector_recall(table, schema, HashEmbedder()) == (1.0, 4)
    with table.transaction():
        chosen = vector_index.choose_vector_index(table, schema, HashEmbedder())
    assert chosen.kind == "hnsw" and chosen.recall == 1.0 and chosen.ef_search == 50


def copy_rows(conn, schema):
    return conn.execute(statement(schema, "SELECT chunk_id, embedding::text FROM {vectors} ORDER BY chunk_id")).fetchall()


def chunk_vectors(conn, schema):
    return conn.execute(statement(schema, "SELECT chunk_id, embedding::text FROM {chunks} WHERE embedding IS NOT NULL ORDER BY chunk_id")).fetchall()


def test_an_exact_table_is_scanned_through_its_narrow_copy_kept_equal_by_every_write(table, schema, monkeypatch):
    """Chosen exact: ``vectors`` holds every embedding, and sync's inserts, edits and deletes reach it;
    the retriever scans it, with the lists an exact scan of the chunk table gives; chosen HNSW: it goes."""
    chunks = make_chunks("e", [f"topic{i % 7} note{i} item{i * 7 % 13}" for i in range(300)])
    store.sync(table, schema, chunks, HashEmbedder())
    assert not copies.has_exact_copy(table, schema)
    with table.transaction():  # the choice choose_vector_index records when the graph misses its target
        vector_index._record(table, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"))
    assert copies.has_exact_copy(table, schema) and copy_rows(table, schema) == chunk_vectors(table, schema)
    edited = [*chunks[:100], Chunk(chunks[100].chunk_id, "e", "T > S", 0, 9, "an edited text"),
              *chunks[101:250], *make_chunks("f", ["a new chunk", "another new one"])]
    store.sync(table, schema, edited, HashEmbedder(), allow_shrink=True)  # 50 deleted, 1 edited, 2 inserted
    store.upsert(table, schema, make_chunks("u", ["upserted alone"]), HashEmbedder())
    assert len(copy_rows(table, schema)) == 253 and copy_rows(table, schema) == chunk_vectors(table, schema)

    retriever = pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams())
    assert retriever.exact and retriever.ef_search is None
    for query in ["topic3 note7", "an edited text", "new chunk", "item5"]:
        vector = HashEmbedder().embed([query])[0]
        with table.transaction():
            table.execute("SET LOCAL enable_indexscan = off")
            truth = table.execute(statement(schema, "SELECT chunk_id, embedding <=> %(q)s AS d FROM {chunks} ORDER BY d, chunk_id LIMIT 20"),
                                  {"q": vector}).fetchall()
        got = dense.vector_search(table, schema, vector, 20, exact=True)
        assert [h.chunk_id for h in got] == [cid for cid, _ in truth]
        assert [h.score for h in got] == pytest.approx([1 - d for _, d in truth])
        assert pipeline.run(table, retriever, query, RetrievalParams()).vector == dense.vector_search(table, schema, vector, 50, exact=True)

    # a later check that keeps the graph removes the copy and its triggers; writes go on without it
    with table.transaction():
        vector_index._record(table, schema, vector_index.VectorIndex("hnsw", 1.0, 1, 50, "test"))
    assert not copies.has_exact_copy(table, schema)
    store.upsert(table, schema, make_chunks("v", ["after the copy went"]), HashEmbedder())
    assert not pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams()).exact


def test_an_exact_copy_holds_halfvec_when_its_scan_keeps_the_recall_target(table, schema, monkeypatch):
    """Chosen exact with the embedder at hand: the copy holds halfvec once its scan keeps HALF_RECALL against
    float32 exact search on the check's queries (the retriever binds the query as halfvec, lists within
    half precision of the chunk table's); a target it misses leaves the copy in float32."""
    chunks = make_chunks("h", [f"topic{i % 7} note{i} item{i * 7 % 13}" for i in range(300)])
    store.sync(table, schema, chunks, HashEmbedder())
    with table.transaction():
        chosen = vector_index._record(table, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"), embedder=HashEmbedder())
    assert copies.exact_copy_type(table, schema) == "halfvec"
    assert "its copy holds halfvec (recall@10 " in chosen.reason and vector_index.vector_index(table, schema) == chosen
    recall = float(chosen.reason.split("recall@10 ")[1].split()[0])
    assert vector_index.HALF_RECALL <= recall <= 1.0
    retriever = pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams())
    assert retriever.exact == "halfvec"
    for query in ["topic3 note7", "item5", "note12 topic1"]:
        vector = HashEmbedder().embed([query])[0]
        with table.transaction():
            table.execute("SET LOCAL enable_indexscan = off")
            truth = dict(table.execute(statement(schema, "SELECT chunk_id, 1 - (embedding <=> %(q)s) FROM {chunks}"), {"q": vector}).fetchall())
        got = dense.vector_search(table, schema, vector, 20, exact="halfvec")
        best = sorted(truth.values(), reverse=True)[:20]
        assert [h.score for h in got] == pytest.approx(best, abs=2e-3)  # the top 20 up to half precision
        assert [h.score for h in got] == pytest.approx([truth[h.chunk_id] for h in got], abs=2e-3)
        assert pipeline.run(table, retriever, query, RetrievalParams()).vector == dense.vector_search(table, schema, vector, 50, exact="halfvec")
    store.upsert(table, schema, make_chunks("w", ["written after the choice"]), HashEmbedder())  # the triggers cast
    assert len(copy_rows(table, schema)) == 301

    monkeypatch.setattr(vector_index, "HALF_RECALL", 1.01)  # a target halfvec cannot keep
    with table.transaction():
        chosen = vector_index._record(table, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"), embedder=HashEmbedder())
    assert copies.exact_copy_type(table, schema) == "vector" and "its copy holds float32 (halfvec's recall@10" in chosen.reason
    assert copy_rows(table, schema) == chunk_vectors(table, schema)
    assert pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams()).exact == "vector"


def _pages_of(conn, schema, chunk_ids) -> set[int]:
    return {r[0] for r in conn.execute(statement(schema, "SELECT (ctid::text::point)[0]::int FROM {vectors} WHERE chunk_id = ANY(%s)"),
                                         (chunk_ids,)).fetchall()}


@pytest.mark.parametrize("half", [False, True])
def test_a_split_exact_scan_returns_the_lists_of_one_statement(table, schema, half, pg_dsn, monkeypatch):
    """On a connection of ``pg.connect`` with no transaction open, the exact scan runs in two sessions (the
    partner scans the pages from half the copy's size up) and the merged lists equal one statement's, ids and
    scores, ties by chunk_id across the parts; inside a transaction, on a connection opened elsewhere, and with
    ``$RETRIEVAL_SEARCH_SESSIONS`` 1 it is one statement, and a row the transaction wrote but did not commit is found."""
    texts = [f"topic{i % 7} note{i} item{i * 7 % 13}" for i in range(400)]
    texts[3] = texts[396] = texts[200] = "twin words exactly alike"  # identical vectors in both parts of the split
    store.sync(table, schema, make_chunks("s", texts), HashEmbedder())
    with table.transaction():
        vector_index._record(table, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"), embedder=HashEmbedder() if half else None)
    exact = pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams()).exact
    assert exact == ("halfvec" if half else "vector")
    queries = ["twin words exactly alike", "topic3 note7", "item5 topic1", "note123"]
    for query in queries * 2:  # the first search learns the copy's size; the second splits it in half
        vector = HashEmbedder().embed([query])[0]
        split = dense.vector_search(table, schema, vector, 120, exact=exact)
        with table.transaction():
            one = dense.vector_search(table, schema, vector, 120, exact=exact)
        assert split == one  # ids, scores and ranks
    boundary = dense._PAGES[table][schema] // 2
    assert boundary > 0
    # the pipeline splits too, the partner's part in the run's snapshot and under the same limit, local to its
    # transaction: the partner goes back to the pool with its own settings
    retriever = pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams())
    dense._PAGES[table].clear()  # filled again only by a split
    params = RetrievalParams(n=120, statement_timeout_ms=4321)
    limits = []
    real = snapshot._on_partner
    monkeypatch.setattr(snapshot, "_on_partner", lambda partner, snap, ms, work: limits.append(ms) or real(partner, snap, ms, work))
    ran = pipeline.run(table, retriever, "topic3 note7", params).vector
    monkeypatch.undo()
    assert limits == [4321]
    with pg.partner(table) as other:
        assert other is not None and other.execute("SHOW statement_timeout").fetchone()[0] == "0"
    assert dense._PAGES[table][schema] in (2 * boundary, 2 * boundary + 1)
    assert ran == dense.vector_search(table, schema, HashEmbedder().embed(["topic3 note7"])[0], 120, exact=exact)
    twins = [h.chunk_id for h in dense.vector_search(table, schema, HashEmbedder().embed(["twin words exactly alike"])[0], 3, exact=exact)]
    assert twins == ["s#003", "s#200", "s#396"]
    pages = _pages_of(table, schema, twins)
    assert min(pages) < boundary <= max(pages)  # the tie crossed the parts

    with table.transaction():  # a row written and not committed: the partner cannot see it, so no split
        store.upsert(table, schema, make_chunks("zz", ["uncommitted twin words exactly alike"]), HashEmbedder())
        got = dense.vector_search(table, schema, HashEmbedder().embed(["uncommitted twin words exactly alike"])[0], 5, exact=exact)
        assert got[0].chunk_id == "zz#000"
        raise psycopg.Rollback()
    vector = HashEmbedder().embed(["topic3 note7"])[0]
    expected = dense.vector_search(table, schema, vector, 120, exact=exact)
    with psycopg.connect(pg_dsn, autocommit=True) as other:  # not opened by pg.connect: no partner
        register_vector(other)
        with pg.partner(other) as none:
            assert none is None
        assert dense.vector_search(other, schema, vector, 120, exact=exact) == expected
    monkeypatch.setenv(pg.ENV_SESSIONS, "1")
    assert dense.vector_search(table, schema, vector, 120, exact=exact) == expected


def test_a_refused_partner_leaves_the_exact_scan_in_one_statement(table, schema, pg_dsn, monkeypatch, caplog):
    """A server that refuses the second session (max_connections reached, say): the search runs as one
    statement with the same lists, the refusal is logged, and the process does not ask again for
    ``REFUSED_PAUSE_S``."""
    store.sync(table, schema, make_chunks("r", [f"topic{i % 7} note{i}" for i in range(200)]), HashEmbedder())
    with table.transaction():
        vector_index._record(table, schema, vector_index.VectorIndex("exact", 0.5, 1, 400, "test"))
    vector = HashEmbedder().embed(["topic3 note7"])[0]
    with table.transaction():
        expected = dense.vector_search(table, schema, vector, 50, exact=True)
    for pool in ("_IDLE", "_OPEN", "_PAUSED_UNTIL"):  # this test's own pool, empty
        monkeypatch.setattr(partners, pool, {})
    with pg.connect(pg_dsn) as fresh:
        calls = []

        def refuse(dsn=None, **kwargs):
            calls.append(dsn)
            raise pg.ConnectError("cannot connect to Postgres at test: sorry, too many clients already")

        monkeypatch.setattr(sessions, "connect", refuse)
        with caplog.at_level("WARNING", logger="retrieval_assets.pg"):
            assert dense.vector_search(fresh, schema, vector, 50, exact=True) == expected
            assert dense.vector_search(fresh, schema, vector, 50, exact=True) == expected
        assert len(calls) == 1
        with pg.partner(fresh) as other:
            assert other is None
        assert [r.message for r in caplog.records].count(
            "searches run in their own session for 30 s: the server refused a partner session "
            "(cannot connect to Postgres at test: sorry, too many clients already)") == 1


def test_an_exact_table_from_before_the_narrow_copy_gets_it_on_create(table, schema):
    store.sync(table, schema, make_chunks("m", ["one chunk", "two chunks", "three chunks"]), HashEmbedder())
    with table.transaction():
        vector_index._record(table, schema, vector_index.VectorIndex("exact", 1.0, 1, 50, "test"))
        copies.drop_exact_copy(table, schema)  # as a schema chosen exact before the copy existed
    assert not pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams()).exact  # no copy: the chunk table's scan
    store.create(table, schema, 256)
    assert copies.has_exact_copy(table, schema) and copy_rows(table, schema) == chunk_vectors(table, schema)
    assert pipeline.retriever(table, schema, HashEmbedder(), RetrievalParams()).exact


def test_a_sync_of_what_the_table_already_holds_reads_and_writes_nothing(table, schema, monkeypatch):
    """The second sync of the same chunks returns at once (no staging, no embedding); an upsert, a write
    in SQL, another embedder or another chunk order in between means a full sync again, with the right counts."""
    chunks = make_chunks("s", [f"chunk number {i} about topic{i % 5}" for i in range(40)])
    assert store.sync(table, schema, chunks, HashEmbedder()).inserted == 40
    staged = []
    real_stage = store._stage
    monkeypatch.setattr(store, "_stage", lambda *a, **k: staged.append(1) or real_stage(*a, **k))
    counting = CountingEmbedder()
    assert store.sync(table, schema, chunks, counting) == store.SyncReport(0, 0, 0, 40, 0)
    assert staged == [] and counting.seen == []

    store.upsert(table, schema, [Chunk(chunks[3].chunk_id, "s", "T > S", 0, 5, "changed by an upsert")], HashEmbedder())
    staged.clear()
    report = store.sync(table, schema, chunks, counting)
    assert (report.updated, report.unchanged, staged) == (1, 39, [1])  # the upsert cleared the record: chunk 3 restored
    assert store.sync(table, schema, chunks, counting).unchanged == 40 and staged == [1]

    table.execute(statement(schema, "DELETE FROM {chunks} WHERE chunk_id = %s"), (chunks[7].chunk_id,))  # behind the store's back
    assert store.sync(table, schema, chunks, counting).inserted == 1 and tables.count(table, schema) == 40
    table.execute(statement(schema, "TRUNCATE {chunks} CASCADE"))
    assert store.sync(table, schema, chunks, HashEmbedder()).inserted == 40

    staged.clear()
    store.sync(table, schema, list(reversed(chunks)), HashEmbedder())  # same set, another order: synced again
    store.sync(table, schema, chunks, HashEmbedder(256))  # a new but equal embedder (same name and dims): the order back
    assert len(staged) == 2 and store.sync(table, schema, chunks, HashEmbedder(256)).unchanged == 40 and len(staged) == 2
    with pytest.raises(ValueError, match="dimensions"):
        store.sync(table, schema, chunks, HashEmbedder(dims=64))  # another embedder is refused before the shortcut


def fulltext_rows(conn, schema):
    return conn.execute(statement(schema, "SELECT chunk_id, tsv::text FROM {fulltext} ORDER BY chunk_id")).fetchall()


def chunk_tsvs(conn, schema):
    return conn.execute(statement(schema, "SELECT chunk_id, tsv::text FROM {chunks} ORDER BY chunk_id")).fetchall()


def test_the_fulltext_copy_follows_every_write_and_an_old_schema_gets_it(table, schema, monkeypatch):
    """``fulltext`` (chunk_id, tsv) equals the chunks' through sync, edits, deletes, upserts and the bulk
    load; a schema from before it (GIN on chunks.tsv) gets it filled and the GIN moved on create."""
    chunks = make_chunks("t", [f"rotate key {i} for topic{i % 9}" for i in range(60)])
    store.sync(table, schema, chunks, HashEmbedder())
    assert len(fulltext_rows(table, schema)) == 60 and fulltext_rows(table, schema) == chunk_tsvs(table, schema)
    edited = [*chunks[:40], Chunk(chunks[40].chunk_id, "t", "T > S", 0, 9, "a wholly new sentence"), *chunks[41:50]]
    store.sync(table, schema, edited, HashEmbedder(), allow_shrink=True)
    store.upsert(table, schema, make_chunks("u", ["one more upserted"]), HashEmbedder())
    assert len(fulltext_rows(table, schema)) == 51 and fulltext_rows(table, schema) == chunk_tsvs(table, schema)
    assert [h.chunk_id for h in ts_rank.text_search(table, schema, "wholly sentence")] == [chunks[40].chunk_id]

    monkeypatch.setattr(store, "BULK_MIN", 1)
    store.sync(table, schema, [], HashEmbedder(), allow_shrink=True)
    store.sync(table, schema, chunks, HashEmbedder(), recall_target=None)  # the bulk load: GIN dropped and rebuilt
    assert fulltext_rows(table, schema) == chunk_tsvs(table, schema)
    assert any("fulltext_tsv_gin" in d for d in indexdefs(table, schema))

    with table.transaction():  # as a schema made before the copy existed
        copies.unmirror(table, schema, "fulltext")
        table.execute(statement(schema, "DROP TABLE {fulltext}"))
        table.execute(statement(schema, "CREATE INDEX chunks_tsv_gin ON {chunks} USING gin (tsv)"))
    store.create(table, schema, 256)
    assert fulltext_rows(table, schema) == chunk_tsvs(table, schema)
    assert not any("chunks_tsv_gin" in d for d in indexdefs(table, schema)) and any("fulltext_tsv_gin" in d for d in indexdefs(table, schema))
