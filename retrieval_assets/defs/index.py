"""The partition's index: the chunk table of one embedder for one corpus, synced to the corpus's chunks."""

import time

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.index import store, tables, vector_index
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import embedders, group, key
from retrieval_assets.defs.resources import PostgresResource, user_errors
from retrieval_assets.types import Chunk


class IndexConfig(dg.Config):
    allow_shrink: bool = False  # let a sync delete more than half of the index (the corpus really shrank)


def index_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/chunk_index``, one partition per embedder."""
    this = key(corpus, "chunk_index")

    @dg.multi_asset(
        name=f"{corpus.name}__chunk_index",  # the op's name, unique across corpora like the other assets' steps
        specs=[dg.AssetSpec(
            this,
            kinds={"postgres", "pgvector"},
            group_name=group(corpus),
            deps=[key(corpus, "chunks"), key(corpus, "golden_queries")],  # a golden set that fails validation stops the run before any index changes
            description="The embedder's chunk table for the corpus (pgvector HNSW + full-text GIN + BM25 postings), synced to "
            "the chunks; after a bulk load HNSW is kept only if its recall@10 against exact search reaches vector_index.RECALL_TARGET "
            "(else vector search scans exactly; metadata vector_search says which and why). Fails at once, naming the files, "
            "when the embedder's model files are not on this machine (the schedule does not request it).",
        )],
        partitions_def=embedders,
        ins={"chunks": dg.AssetIn(key(corpus, "chunks"))},
        check_specs=[dg.AssetCheckSpec("index_consistent", asset=this, blocking=True, partitions_def=embedders,
                                       description="Row count equals the chunk count; stored dimension equals the embedder's.")],
    )
    def chunk_index(context: dg.AssetExecutionContext, config: IndexConfig, postgres: PostgresResource, chunks: list[Chunk]):
        partition = context.partition_key
        missing = partitions.get(partition).missing()
        if missing is not None:  # fails at once: the schedule never requests such a partition
            raise dg.Failure(description=f"chunk_index {partition}: {missing}",
                             metadata={"error": "ModelUnavailableError", "step": f"chunk_index {partition}", "partition": partition})
        with user_errors(f"chunk_index {partition}"):
            embedder = partitions.embedder(partition)
            schema = postgres.schema(partition, corpus=corpus.name)
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
        context.log.info(f"chunk_index {partition}: {rows} rows in {schema} ({report.embedded} embedded, {report.deleted} deleted) in {seconds:.1f} s")
        yield dg.MaterializeResult(
            asset_key=this,
            metadata={
                "rows": rows, "dims": dims, "embedder": embedder.name, "schema": schema, "corpus": corpus.name,
                "inserted": report.inserted, "updated": report.updated, "deleted": report.deleted,
                "unchanged": report.unchanged, "embedded": report.embedded,
                "seconds": round(seconds, 3), "chunks_per_second": round(len(chunks) / seconds, 1) if seconds else 0.0,
                **vector_search,  # hnsw or exact: chosen after a bulk load by the HNSW index's measured recall (vector_index.choose_vector_index)
            },
        )
        yield dg.AssetCheckResult(asset_key=this, check_name="index_consistent", passed=0 < rows == len(chunks) and dims == embedder.dims,
                                  metadata={"rows": rows, "chunks": len(chunks), "dims": dims, "embedder_dims": embedder.dims})

    return [chunk_index]
