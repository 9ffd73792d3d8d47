"""The failure report: every golden-set miss of the full pipeline, classified, with what-ifs."""

from pathlib import Path

import dagster as dg

from retrieval_assets import diagnose, partitions
from retrieval_assets.defs.corpus import PROJECT_ROOT
from retrieval_assets.defs.partitions import embedders
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.evaluation import Evaluation
from retrieval_assets.pipeline import Retriever
from retrieval_assets.rerank import LexicalReranker
from retrieval_assets.types import Chunk, Document, GoldenQuery


class DiagnoseConfig(dg.Config):
    what_if: bool = True  # re-run the golden set with each mechanical fix (scratch schemas)
    report_dir: str = str(PROJECT_ROOT / ".retrieval" / "reports")


@dg.asset(
    partitions_def=embedders,
    kinds={"markdown", "postgres"},
    group_name="retrieval",
    description="Every golden query the full pipeline misses, classified, with a fix and what-if results.",
)
def failure_report(context: dg.AssetExecutionContext, config: DiagnoseConfig, postgres: PostgresResource,
                   eval_run: Evaluation, golden_queries: list[GoldenQuery], documents: list[Document],
                   chunks: list[Chunk]) -> dg.MaterializeResult:
    key = context.partition_key
    retriever = Retriever(postgres.schema(key), partitions.embedder(key), LexicalReranker())
    params = eval_run.params  # the ts_rank_cd evaluation, the pipeline this report explains
    with postgres.connect() as conn:
        misses = diagnose.diagnose(conn, retriever, golden_queries, params)
        what_ifs = []
        if config.what_if:
            other = "minilm" if key != "minilm" else "hash"
            try:
                others = {other: Retriever(postgres.schema(other), partitions.embedder(other), retriever.reranker)}
            except (ValueError, RuntimeError):
                others = {other: None}
            what_ifs = diagnose.what_if(conn, retriever, golden_queries, documents, chunks, params,
                                        scratch=postgres.schema(key, "whatif"), others=others)
    report = diagnose.Report(key, eval_run.k, eval_run.n, len(golden_queries), misses, what_ifs)
    text = diagnose.render(report)
    path = Path(config.report_dir) / key / "RETRIEVAL_ANALYSIS.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    counts = {f"failures/{kind}": sum(d.failure == kind for d in misses) for kind in diagnose.FAILURES}
    rescued = {f"rescued/{w.fix}: {w.variant}": len(w.rescued) for w in what_ifs}
    return dg.MaterializeResult(metadata={"misses": len(misses), **counts, **rescued, "path": str(path),
                                          "report": dg.MetadataValue.md(text)})
