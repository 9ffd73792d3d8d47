"""The partition's index: the chunk table of one embedder, synced to the chunks."""

import time

import dagster as dg

from retrieval_assets import partitions, store
from retrieval_assets.defs.partitions import embedders
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.types import Chunk


@dg.asset(
    partitions_def=embedders,
    kinds={"postgres", "pgvector"},
    group_name="retrieval",
    description="The embedder's chunk table (pgvector HNSW + full-text GIN), synced to the chunks.",
    check_specs=[dg.AssetCheckSpec("index_consistent", asset="chunk_index", blocking=True,
                                   description="Row count equals the chunk count; stored dimension equals the embedder's.")],
)
def chunk_index(context: dg.AssetExecutionContext, postgres: PostgresResource, chunks: list[Chunk]):
    embedder = partitions.embedder(context.partition_key)
    schema = postgres.schema(context.partition_key)
    start = time.perf_counter()
    with postgres.connect() as conn:
        store.create(conn, schema, embedder.dims)
        report = store.sync(conn, schema, chunks, embedder)
        rows, dims = store.count(conn, schema), store.table_dims(conn, schema)
    seconds = time.perf_counter() - start
    yield dg.MaterializeResult(
        metadata={
            "rows": rows, "dims": dims, "embedder": embedder.name, "schema": schema,
            "inserted": report.inserted, "updated": report.updated, "deleted": report.deleted,
            "unchanged": report.unchanged, "embedded": report.embedded,
            "seconds": round(seconds, 3), "chunks_per_second": round(len(chunks) / seconds, 1) if seconds else 0.0,
        }
    )
    yield dg.AssetCheckResult(check_name="index_consistent", passed=rows == len(chunks) and dims == embedder.dims,
                              metadata={"rows": rows, "chunks": len(chunks), "dims": dims, "embedder_dims": embedder.dims})
