"""The corpus assets of one registered corpus: documents, their chunks and the validated golden
set (not partitioned by embedder, so every embedder's run reads the same values).

Each carries a data version, a hash of its content: an embedder's run that materialises them
again from unchanged files leaves the other embedders' assets up to date ("Unsynced" only when
the corpus really changed). A corpus without golden.yaml indexes normally and its evaluation
assets report that there is nothing to evaluate.
"""

import hashlib
import pickle
import statistics
import warnings
from pathlib import Path

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.corpus import golden

from retrieval_assets.index import chunker
from retrieval_assets.corpus import registry
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import group, ins, key
from retrieval_assets.defs.resources import CorpusResource, PostgresResource, user_errors
from retrieval_assets.types import Chunk, Document

CORPUS_TAG = "retrieval/corpus"  # every run of a corpus's assets carries it: the Runs list filters by corpus


class ChunkingConfig(dg.Config):
    max_chars: int = 1200
    overlap: int = 1


def _preview(rows: list[dict], limit: int = 10) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md("(empty)")
    head = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
    body = "".join("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")[:80] for v in r.values()) + " |\n" for r in rows[:limit])
    return dg.MetadataValue.md(head + body)


def versioned(value: object, metadata: dict) -> dg.Output:
    """``value`` as an output whose data version is a hash of its content: equal values, equal versions.
    (``Output(data_version=...)`` is marked beta in Dagster 1.13, knowingly used: the staleness it drives
    keeps one embedder's assets up to date when another embedder's run materialises the corpus again.)"""
    version = dg.DataVersion(hashlib.sha256(pickle.dumps(value, protocol=5)).hexdigest()[:16])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.Output(value, data_version=version, metadata=metadata)


def check_requested_corpus(context: dg.AssetExecutionContext, corpus: Corpus) -> None:
    """Tag the run with its corpus. A run config naming another corpus folder (``resources.corpus.config``)
    registers that folder under its name and stops the run at once, naming the job to launch for it."""
    context.instance.add_run_tags(context.run.run_id, {CORPUS_TAG: corpus.name})
    requested: CorpusResource = context.resources.corpus
    if not (requested.name or requested.path):
        return
    path = str(Path(requested.path).expanduser().resolve()) if requested.path else corpus.path
    if requested.name in ("", corpus.name) and path == corpus.path:
        return
    with user_errors("documents"):
        if not (requested.name and requested.path):
            raise registry.CorpusNameError("resources.corpus.config: give both name and path to register a corpus")
        postgres: PostgresResource = context.resources.postgres
        with postgres.connect() as conn:
            other, new = registry.add(conn, postgres.history_schema, requested.name, requested.path)
    raise dg.Failure(description=f"corpus {other.name} ({other.path}) is {'registered now' if new else 'registered'}; this job "
                     f"evaluates corpus {corpus.name}. Launch the corpus's own job (the definitions list it once reloaded): "
                     f"dg launch --job {partitions.job_name('evaluate_embedders', other.name)} --partition PARTITION")


def corpus_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/documents``, ``<corpus>/chunks`` and ``<corpus>/golden_queries``."""

    @dg.asset(kinds={"python", "markdown"}, group_name=group(corpus), key_prefix=[corpus.name],
              required_resource_keys={"corpus", "postgres"},
              description="The corpus documents: every *.md of the corpus folder at any depth (or docs/*.md then stories/*.txt). "
              "A bad golden.yaml fails this first step, so a run with bad input stores nothing.")
    def documents(context: dg.AssetExecutionContext) -> dg.Output[list[Document]]:
        check_requested_corpus(context, corpus)
        with user_errors("documents"):
            docs = chunker.load_documents(corpus.check().path)
        if corpus.golden_path.exists():  # a bad golden set stops the run here, before any value is stored
            with user_errors("golden_queries"):
                golden.load_golden(corpus.golden_path, docs)
        context.log.info(f"corpus {corpus.name}: {len(docs)} documents from {corpus.path}")
        return versioned(docs, {
            "corpus": corpus.name,
            "documents": len(docs),
            "characters": sum(len(d.text) for d in docs),
            "corpus_dir": corpus.path,
            "preview": _preview([{"doc_id": d.doc_id, "title": d.title, "characters": len(d.text)} for d in docs], 40),
        })

    @dg.asset(kinds={"python"}, group_name=group(corpus), key_prefix=[corpus.name], ins=ins(corpus, "documents"),
              description="Heading-aware chunks of every document (max_chars, overlap).")
    def chunks(context: dg.AssetExecutionContext, config: ChunkingConfig, documents: list[Document]) -> dg.Output[list[Chunk]]:
        if config.max_chars < 1 or config.overlap < 0:
            raise dg.Failure(description=f"chunks config: max_chars must be >= 1 and overlap >= 0 (got {config.max_chars}, {config.overlap})")
        out = [c for d in documents for c in chunker.chunk(d, max_chars=config.max_chars, overlap=config.overlap)]
        if not out:
            raise dg.Failure(description=f"chunks: the corpus's {len(documents)} files hold no text (all empty or blank); "
                             "nothing to index, and the index is left as it was")
        per_doc = [sum(1 for c in out if c.doc_id == d.doc_id) for d in documents]
        return versioned(out, {
            "corpus": corpus.name,
            "chunks": len(out),
            "characters": sum(len(c.text) for c in out),
            "oversized_chunks": sum(len(c.text) > config.max_chars for c in out),
            "median_chunks_per_document": statistics.median(per_doc) if per_doc else 0,
            "preview": _preview([{"chunk_id": c.chunk_id, "heading_path": c.heading_path, "chars": len(c.text), "text": c.text} for c in out]),
        })

    @dg.asset(
        kinds={"python", "yaml"},
        group_name=group(corpus), key_prefix=[corpus.name], ins=ins(corpus, "documents", "chunks"),
        description="The validated golden query set (golden.yaml of the corpus; none: nothing to evaluate). "
        "Validated before any index is touched.",
        check_specs=[dg.AssetCheckSpec("anchors_inside_chunks", asset=key(corpus, "golden_queries"), blocking=True,
                                       description="Every anchor lies inside a chunk of its document, so recall can reach 1.0.")],
    )
    def golden_queries(context: dg.AssetExecutionContext, documents: list[Document], chunks: list[Chunk]):
        if not corpus.golden_path.exists():
            context.log.info(f"corpus {corpus.name}: no {corpus.golden_path}, nothing to evaluate")
            yield versioned([], {"corpus": corpus.name, "queries": 0, "status": f"nothing to evaluate: {corpus.golden_path} does not exist"})
            yield dg.AssetCheckResult(check_name="anchors_inside_chunks", passed=True, metadata={"unreachable": "none (no golden set)"})
            return
        with user_errors("golden_queries"):
            queries = golden.load_golden(corpus.golden_path, documents)
        unreachable = [q.query_id for q in queries if not golden.relevant(chunks, q)]
        kinds = {k: sum(q.kind == k for q in queries) for k in golden.KINDS}
        yield versioned(queries, {"corpus": corpus.name, "queries": len(queries), **{f"{k}_queries": v for k, v in kinds.items()}})
        yield dg.AssetCheckResult(check_name="anchors_inside_chunks", passed=not unreachable,
                                  metadata={"unreachable": ", ".join(unreachable) or "none"})

    return [documents, chunks, golden_queries]
