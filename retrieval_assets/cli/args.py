"""What the command line's commands share: ``UsageError``, the pipeline options' parameters, chunking, and the
command-line index of a corpus (``partitions.schema_name(embedder, "cli", corpus=...)``, never the assets' schema)."""

from __future__ import annotations

from retrieval_assets import params, partitions
from retrieval_assets.index import chunker, store
from retrieval_assets.params import RetrievalParams


class UsageError(Exception):
    """A bad command-line argument; printed as one line."""


def pipeline_params(args, base: RetrievalParams | None = None) -> RetrievalParams:
    """``base`` (default: the named pipeline ``--pipeline``, "default" being ``--embedder``'s) with the command line's overrides: every option named after
    a ``RetrievalParams`` field and given (not None), ``--vector-weight`` as the weights, ``--no-mmr``, ``--corpus-idf``."""
    changes = {name: value for name, value in vars(args).items() if name in params.FIELD_NAMES and value is not None}
    if args.vector_weight is not None:
        changes["weights"] = (args.vector_weight, round(1 - args.vector_weight, 12))
    if args.no_mmr:
        changes["mmr_lambda"] = None
    if args.corpus_idf:
        if args.rerank_idf not in (None, "corpus"):
            raise UsageError(f"--corpus-idf contradicts --rerank-idf {args.rerank_idf}")
        changes["rerank_idf"] = "corpus"
    try:
        return (base or params.named(args.pipeline, getattr(args, "embedder", None))).with_(**changes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def chunks_of(args, documents):
    return [c for d in documents for c in chunker.chunk(d, max_chars=args.max_chars, overlap=args.overlap)]


def index_corpus(conn, args, chunks):
    """Sync ``chunks`` into the embedder's command-line schema of the corpus (``cli_hash`` for the
    fixture, ``<corpus name>__cli_hash`` for another folder): (schema, embedder, sync report)."""
    embedder = partitions.embedder(args.embedder)
    schema = partitions.schema_name(args.embedder, "cli", partitions.env_prefix(), corpus=partitions.corpus_name_for(args.corpus))
    store.create(conn, schema, embedder.dims)
    return schema, embedder, store.sync(conn, schema, chunks, embedder)
