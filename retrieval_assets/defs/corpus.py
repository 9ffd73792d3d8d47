"""The corpus assets: documents, their chunks and the validated golden set (unpartitioned).

All three read the ``corpus`` resource; a corpus without golden.yaml indexes normally and its
evaluation assets report that there is nothing to evaluate.
"""

import statistics

import dagster as dg

from retrieval_assets.corpus import golden

from retrieval_assets.index import chunker
from retrieval_assets.defs.resources import CorpusResource, user_errors
from retrieval_assets.types import Chunk, Document


class ChunkingConfig(dg.Config):
    max_chars: int = 1200
    overlap: int = 1


def _preview(rows: list[dict], limit: int = 10) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md("(empty)")
    head = "| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]) + "\n"
    body = "".join("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")[:80] for v in r.values()) + " |\n" for r in rows[:limit])
    return dg.MetadataValue.md(head + body)


@dg.asset(kinds={"python", "markdown"}, group_name="retrieval",
          description="The corpus documents: every *.md of the corpus folder at any depth (or docs/*.md then stories/*.txt).")
def documents(context: dg.AssetExecutionContext, corpus: CorpusResource) -> list[Document]:
    with user_errors("documents"):
        name = corpus.key
        docs = chunker.load_documents(corpus.path)
    context.log.info(f"corpus {name}: {len(docs)} documents from {corpus.path}")
    context.add_output_metadata(
        {
            "corpus": name,
            "documents": len(docs),
            "characters": sum(len(d.text) for d in docs),
            "corpus_dir": corpus.path,
            "preview": _preview([{"doc_id": d.doc_id, "title": d.title, "characters": len(d.text)} for d in docs], 40),
        }
    )
    return docs


@dg.asset(kinds={"python"}, group_name="retrieval", description="Heading-aware chunks of every document (max_chars, overlap).")
def chunks(context: dg.AssetExecutionContext, config: ChunkingConfig, documents: list[Document]) -> list[Chunk]:
    if config.max_chars < 1 or config.overlap < 0:
        raise dg.Failure(description=f"chunks config: max_chars must be >= 1 and overlap >= 0 (got {config.max_chars}, {config.overlap})")
    out = [c for d in documents for c in chunker.chunk(d, max_chars=config.max_chars, overlap=config.overlap)]
    if not out:
        raise dg.Failure(description=f"chunks: the corpus's {len(documents)} files hold no text (all empty or blank); "
                         "nothing to index, and the index is left as it was")
    per_doc = [sum(1 for c in out if c.doc_id == d.doc_id) for d in documents]
    context.add_output_metadata(
        {
            "chunks": len(out),
            "characters": sum(len(c.text) for c in out),
            "oversized_chunks": sum(len(c.text) > config.max_chars for c in out),
            "median_chunks_per_document": statistics.median(per_doc) if per_doc else 0,
            "preview": _preview([{"chunk_id": c.chunk_id, "heading_path": c.heading_path, "chars": len(c.text), "text": c.text} for c in out]),
        }
    )
    return out


@dg.asset(
    kinds={"python", "yaml"},
    group_name="retrieval",
    description="The validated golden query set (golden.yaml of the corpus; none: nothing to evaluate). "
    "Validated before any index is touched.",
    check_specs=[dg.AssetCheckSpec("anchors_inside_chunks", asset="golden_queries", blocking=True,
                                   description="Every anchor lies inside a chunk of its document, so recall can reach 1.0.")],
)
def golden_queries(context: dg.AssetExecutionContext, corpus: CorpusResource, documents: list[Document], chunks: list[Chunk]):
    if not corpus.golden_path.exists():
        context.log.info(f"corpus {corpus.key}: no {corpus.golden_path}, nothing to evaluate")
        yield dg.Output([], metadata={"queries": 0, "status": f"nothing to evaluate: {corpus.golden_path} does not exist"})
        yield dg.AssetCheckResult(check_name="anchors_inside_chunks", passed=True, metadata={"unreachable": "none (no golden set)"})
        return
    with user_errors("golden_queries"):
        queries = golden.load_golden(corpus.golden_path, documents)
    unreachable = [q.query_id for q in queries if not golden.relevant(chunks, q)]
    kinds = {k: sum(q.kind == k for q in queries) for k in golden.KINDS}
    yield dg.Output(queries, metadata={"queries": len(queries), **{f"{k}_queries": v for k, v in kinds.items()}})
    yield dg.AssetCheckResult(check_name="anchors_inside_chunks", passed=not unreachable,
                              metadata={"unreachable": ", ".join(unreachable) or "none"})
