"""The partition's index: the chunk table of one embedder for the run's corpus, synced to the chunks."""

import time

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.index import store, tables, vector_index
from retrieval_assets.defs.partitions import embedders
from retrieval_assets.defs.resources import CorpusResource, PostgresResource, user_errors
from retrieval_assets.types import Chunk


class IndexConfig(dg.Config):
    allow_shrink: bool = False  # let a sync delete more than half of the index (the corpus really shrank)


@dg.multi_asset(
    specs=[dg.AssetSpec(
        "chunk_index",
        kinds={"postgres", "pgvector"},
        group_name="retrieval",
        deps=["chunks", "golden_queries"],  # a golden set that fails validation stops the run before any index changes
        skippable=True,  # no materialization when the partition's model is not on this machine: downstream is skipped
        description="The embedder's chunk table for the corpus (pgvector HNSW + full-text GIN + BM25 postings), synced to "
        "the chunks; after a bulk load HNSW is kept only if its recall@10 against exact search reaches vector_index.RECALL_TARGET "
        "(else vector search scans exactly; metadata vector_search says which and why). Skipped, with the reason, when the embedder's model files are not on this machine.",
    )],
    partitions_def=embedders,
    can_subset=True,  # the check's output is not required either when the step is skipped
    check_specs=[dg.AssetCheckSpec("index_consistent", asset="chunk_index", blocking=True, partitions_def=embedders,
                                   description="Row count equals the chunk count; stored dimension equals the embedder's.")],
)
def chunk_index(context: dg.AssetExecutionContext, config: IndexConfig, postgres: PostgresResource, corpus: CorpusResource,
                chunks: list[Chunk]):
    key = context.partition_key
    missing = partitions.get(key).missing()
    if missing is not None:
        context.log.warning(f"chunk_index {key}: skipped, and everything downstream of it: {missing}")
        return
    with user_errors(f"chunk_index {key}"):
        embedder = partitions.embedder(key)
        schema = postgres.schema(key, corpus=corpus.key)
        start = time.perf_counter()
        with postgres.connect() as conn:
            store.create(conn, schema, embedder.dims)
            report = store.sync(conn, schema, chunks, embedder, progress=context.log.info, allow_shrink=config.allow_shrink)
            rows, dims = tables.count(conn, schema), tables.table_dims(conn, schema)
            chosen = vector_index.vector_index(conn, schema)
    seconds = time.perf_counter() - start
    vector_search = ({"vector_search": chosen.kind, "vector_search_reason": chosen.reason} if chosen else
                     {"vector_search": "hnsw", "vector_search_reason": f"not checked: the check follows a bulk load ({store.BULK_MIN:,} "
                      "chunks or more into an empty table); at this size the planner may scan exactly anyway"})
    context.log.info(f"chunk_index {key}: {rows} rows in {schema} ({report.embedded} embedded, {report.deleted} deleted) in {seconds:.1f} s")
    yield dg.MaterializeResult(
        asset_key="chunk_index",
        metadata={
            "rows": rows, "dims": dims, "embedder": embedder.name, "schema": schema, "corpus": corpus.key,
            "inserted": report.inserted, "updated": report.updated, "deleted": report.deleted,
            "unchanged": report.unchanged, "embedded": report.embedded,
            "seconds": round(seconds, 3), "chunks_per_second": round(len(chunks) / seconds, 1) if seconds else 0.0,
            **vector_search,  # hnsw or exact: chosen after a bulk load by the HNSW index's measured recall (vector_index.choose_vector_index)
        },
    )
    yield dg.AssetCheckResult(asset_key="chunk_index", check_name="index_consistent", passed=0 < rows == len(chunks) and dims == embedder.dims,
                              metadata={"rows": rows, "chunks": len(chunks), "dims": dims, "embedder_dims": embedder.dims})
