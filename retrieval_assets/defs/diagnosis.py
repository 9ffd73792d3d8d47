"""The failure report (every golden-set miss of the default pipeline, classified, from eval_run's
own traces) and, as an optional asset off the default job, the what-if experiments."""

import socket

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.evaluation import diagnose, history

from retrieval_assets.search import pipeline
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import embedders, group, ins
from retrieval_assets.defs.resources import PostgresResource, user_errors
from retrieval_assets.evaluation.evaluate import Evaluation
from retrieval_assets.types import Chunk, Document, GoldenQuery


def _write(context: dg.AssetExecutionContext, corpus: Corpus, report: diagnose.Report, asset: str) -> tuple[str, dict]:
    """The report's text, kept in Postgres (``<history>.failure_reports``) and, as a local copy, in a file on
    this machine; with the metadata that says where (the text itself goes into the metadata too)."""
    text = diagnose.render(report)
    postgres: PostgresResource = context.resources.postgres
    with user_errors(f"{asset} {context.partition_key}"), postgres.connect() as conn:
        history.record_report(conn, postgres.history_schema, text, run_id=context.run.run_id, partition=context.partition_key,
                              corpus=corpus.name, asset=asset)
    path = context.resources.corpus.report_path(corpus.name, context.partition_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text, {"report_table": f"{postgres.history_schema}.{history.REPORTS}", "local_copy": f"{socket.gethostname()}:{path}",
                  "report": dg.MetadataValue.md(text)}


def diagnosis_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/failure_report`` and, in ``<corpus>_experiments``, ``<corpus>/what_ifs`` (per embedder)."""

    @dg.asset(
        partitions_def=embedders,
        kinds={"markdown", "postgres"},
        group_name=group(corpus), key_prefix=[corpus.name], required_resource_keys={"corpus", "postgres"},
        ins=ins(corpus, 'eval_run', 'golden_queries'),
        description="Every golden query the default pipeline misses, classified from eval_run's traces (no query is "
        "searched again), with a fix; its text kept in Postgres (<history>.failure_reports) and the metadata, with a local "
        "copy in <report_dir>/<corpus>/<partition>/RETRIEVAL_ANALYSIS.md.",
    )
    def failure_report(context: dg.AssetExecutionContext, eval_run: Evaluation | None, golden_queries: list[GoldenQuery]):
        postgres: PostgresResource = context.resources.postgres
        key = context.partition_key
        if eval_run is None:
            context.log.info(f"failure_report {key}: nothing to evaluate, no report written")
            return dg.Output(None, metadata={"status": "nothing to evaluate: the corpus has no golden queries"})
        with user_errors(f"failure_report {key}"), postgres.connect() as conn:
            misses = diagnose.explain(conn, postgres.schema(key, corpus=corpus.name), eval_run, golden_queries)
        report = diagnose.Report(key, eval_run.k, eval_run.n, len(golden_queries), misses, pipeline=eval_run.params.describe())
        _text, where = _write(context, corpus, report, "failure_report")
        by_kind = {kind: sum(d.failure == kind for d in misses) for kind in diagnose.FAILURES}
        counts = {f"failures/{kind}": n for kind, n in by_kind.items()}
        kinds = ", ".join(f"{kind} {n}" for kind, n in by_kind.items() if n) or "none"
        context.log.info(f"failure_report {key}: {len(misses)} of {len(golden_queries)} queries missed ({kinds}); report in "
                         f"{where['report_table']}, local copy {where['local_copy']}")
        return dg.Output(report, metadata={"misses": len(misses), **counts, **where})


    @dg.asset(
        partitions_def=embedders,
        kinds={"markdown", "postgres"},
        group_name=group(corpus, "experiments"), key_prefix=[corpus.name], required_resource_keys={"corpus", "postgres"},
        ins=ins(corpus, 'failure_report', 'eval_run', 'golden_queries', 'documents', 'chunks'),
        description="Optional, off the default job and schedule: re-run the golden set with each mechanical fix (fusion "
        "weights, re-chunked copies in a scratch schema, the other embedder's index of the same corpus) and add the "
        "rescued and lost queries to the failure report.",
    )
    def what_ifs(context: dg.AssetExecutionContext,
                 failure_report: diagnose.Report | None, eval_run: Evaluation | None, golden_queries: list[GoldenQuery],
                 documents: list[Document], chunks: list[Chunk]) -> dg.MaterializeResult:
        postgres: PostgresResource = context.resources.postgres
        key = context.partition_key
        if failure_report is None or eval_run is None:
            return dg.MaterializeResult(metadata={"status": "nothing to evaluate: the corpus has no golden queries"})
        with user_errors(f"what_ifs {key}"), postgres.connect() as conn:
            retriever = pipeline.retriever(conn, postgres.schema(key, corpus=corpus.name), partitions.embedder(key), eval_run.params)
            other = "minilm" if key != "minilm" else "hash"
            others = {other: pipeline.retriever(conn, postgres.schema(other, corpus=corpus.name), partitions.embedder(other), eval_run.params,
                                                reranker=retriever.reranker)
                      if partitions.get(other).available() else None}
            results = diagnose.what_if(conn, retriever, golden_queries, documents, chunks, eval_run.params,
                                       scratch=postgres.schema(key, "whatif", corpus.name, run=context.run.run_id[:8]), others=others, progress=context.log.info)
        report = diagnose.Report(failure_report.partition, failure_report.k, failure_report.n, failure_report.queries,
                                 failure_report.misses, results, failure_report.pipeline)
        _text, where = _write(context, corpus, report, "what_ifs")
        rescued = {f"rescued/{w.fix}: {w.variant}": len(w.rescued) for w in results}
        context.log.info(f"what_ifs {key}: {len(results)} experiments, best rescues {max(rescued.values(), default=0)}; report in "
                         f"{where['report_table']}, local copy {where['local_copy']}")
        return dg.MaterializeResult(metadata={**rescued, **where})

    return [failure_report, what_ifs]
