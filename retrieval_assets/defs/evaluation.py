"""Golden-set evaluation of every pipeline, its history, and the comparison across embedders."""

import hashlib

import dagster as dg
from pydantic import Field

from retrieval_assets import params, partitions

from retrieval_assets.evaluation import evaluate, history, regression, retrieval_rule

from retrieval_assets.search import pipeline
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import embedders, group, ins, key
from retrieval_assets.defs.resources import PostgresResource, user_errors
from retrieval_assets.params import DEFAULT
from retrieval_assets.types import Chunk, Document, GoldenQuery

EVAL_VERSION = "3"  # the eval_run asset's code_version, recorded with every history row
DEFAULT_PIPELINE = "mmr"  # the default pipeline's final list: what the floors judge and the headline reports
HEADLINE = {"recall@k": "recall_at_k", "mrr": "mrr", "ndcg@k": "ndcg_at_k"}
CALIBRATED = "calibrated"  # the corpus's own retrieval rule (retrieval_rule asset), recorded as calibrated:<stage>


def _rule(what: str):
    """A rule field of ``EvalConfig``: unset (None) is the partition's default, and the launchpad says so."""
    return Field(default=None, description=f"{what}; unset: the embedder's default pipeline (params.default_for)")


class EvalConfig(dg.Config):
    """The default pipeline's parameters and the named pipelines evaluated beside it. A rule field left None is the
    partition's default (``params.default_for``: ``params.DEFAULT``, or the embedder's own); a value overrides it."""

    k: int = DEFAULT.k
    n: int = DEFAULT.n
    fusion: str | None = _rule("rrf, minmax or zscore")
    vector_weight: float | None = _rule("fusion weight of the vector list, within [0, 1]")
    lexical_weight: float | None = _rule("fusion weight of the lexical list, within [0, 1]")
    lexical: str | None = _rule("the lexical list: ts_rank_cd or bm25")
    evidence_shift: float | None = _rule("share of the lexical weight moved to the vector list as its evidence is weak, within [0, 1]")
    rerank: bool | None = _rule("the rerank stage (false: the fused list goes on as it is)")
    rerank_weight: float | None = _rule("the reranker's share of the rerank score, within [0, 1]")
    rerank_fusion: str | None = _rule("minmax (scores) or rrf (ranks)")
    rerank_idf: str | None = _rule("pool or corpus")
    doc_weight: float | None = _rule("document evidence after the rerank, within [0, 1]; 0: none")
    mmr_lambda: float | None = DEFAULT.mmr_lambda  # None: no MMR (every partition's default has none)
    prf_docs: int = DEFAULT.prf_docs  # pseudo-relevance feedback from the first search's top chunks; 0: none
    prf_terms: int = DEFAULT.prf_terms  # RM3 expansion terms kept
    prf_weight: float = DEFAULT.prf_weight  # RM3's share of the expanded query, within [0, 1]
    prf_beta: float = DEFAULT.prf_beta  # Rocchio weight of the feedback chunks' mean vector; 0: none
    compare: list[str] = ["seed"]  # named pipelines (params.PIPELINES) also evaluated and recorded as <name>:<stage>
    max_drop: float = 0.02  # no_regression fails when mean nDCG@k drops more than this and the 95% interval excludes 0
    min_recall: float | None = None  # None: the partition's measured floor (fixture corpus only)
    min_mrr: float | None = None
    min_ndcg: float | None = None


def default_pipeline(config: EvalConfig, partition: str) -> params.RetrievalParams:
    """The partition's default (``params.default_for``) with the config's values; ``ValueError`` naming a bad one."""
    base = params.default_for(partition)
    given = {name: value for name, value in config.model_dump().items()
             if name in params.FIELD_NAMES and (value is not None or name == "mmr_lambda")}  # mmr_lambda None: no MMR
    weights = (base.weights[0] if config.vector_weight is None else config.vector_weight,
               base.weights[1] if config.lexical_weight is None else config.lexical_weight)
    return base.with_(weights=weights, **given)


def _corpus_hash(chunks: list[Chunk]) -> str:
    digest = hashlib.sha256()
    for c in chunks:
        digest.update(f"{c.chunk_id}\0{c.text}\0".encode())
    return digest.hexdigest()[:16]


def _doc_hashes(golden_queries: list[GoldenQuery], documents: list[Document]) -> dict[str, str]:
    """Per query, a hash of its document's text, its query text and its anchor: what decides its relevant chunks."""
    texts = {d.doc_id: d.text for d in documents}
    return {q.query_id: hashlib.sha256(f"{texts.get(q.doc_id, '')}\0{q.query}\0{q.anchor}".encode()).hexdigest()[:16]
            for q in golden_queries}


def _regression_check(conn, postgres: PostgresResource, run_id: str, key: str, corpus: str, max_drop: float) -> dg.AssetCheckResult:
    verdict = regression.compare(conn, postgres.history_schema, run_id, partition=key, corpus=corpus,
                                 pipeline=DEFAULT_PIPELINE, max_drop=max_drop)
    return dg.AssetCheckResult(
        check_name="no_regression", passed=verdict.passed,
        metadata={"reason": verdict.reason, "baseline_run": verdict.baseline or "none", "paired_queries": verdict.paired,
                  "mean_change": _r(verdict.mean), "ci_low": _r(verdict.low), "ci_high": _r(verdict.high),
                  "left_out": ", ".join(verdict.excluded) or "none",
                  "worse": dg.MetadataValue.md(regression.render_changes(verdict.worse)),
                  "better": dg.MetadataValue.md(regression.render_changes(verdict.better))},
    )


def _r(value: float) -> float:
    return round(float(value), 4)


def _grouped_metadata(evaluations: dict[str, evaluate.Evaluation]) -> dict:
    """``<pipeline>/<stage>/<metric>`` for every named pipeline and stage, then the pool and latency figures."""
    out: dict = {}
    for name, ev in evaluations.items():
        for stage, m in ev.metrics.items():
            out.update({f"{name}/{stage}/recall@k": _r(m.recall_at_k), f"{name}/{stage}/precision@k": _r(m.precision_at_k),
                        f"{name}/{stage}/mrr": _r(m.mrr), f"{name}/{stage}/ndcg@k": _r(m.ndcg_at_k)})
    for name, ev in evaluations.items():
        out.update({f"{name}/fused_recall@n": _r(ev.pool_recall), f"{name}/latency_p50_ms": round(ev.latency_ms["p50"], 2),
                    f"{name}/latency_p95_ms": round(ev.latency_ms["p95"], 2)})
    return out


def _by_kind_table(evaluations: dict[str, evaluate.Evaluation]) -> str:
    rows = ["| pipeline | stage | kind | queries | recall@k | precision@k | MRR | nDCG@k |", "|---|---|---|---|---|---|---|---|"]
    for variant, ev in evaluations.items():
        for stage, m in ev.metrics.items():
            for kind, row in [("all", m), *m.by_kind.items()]:
                rows.append(f"| {variant} | {stage} | {kind} | {row.queries} | {row.recall_at_k:.3f} | {row.precision_at_k:.3f} "
                            f"| {row.mrr:.3f} | {row.ndcg_at_k:.3f} |")
    return "\n".join(rows)


def _floors(config: EvalConfig, partition: str, corpus: Corpus) -> dict[str, float]:
    """The partition's measured floors on the fixture corpus (none elsewhere), overridden by config."""
    floors = dict(partitions.get(partition).floors) if corpus.is_fixture else {}
    for name, override in (("recall_at_k", config.min_recall), ("mrr", config.min_mrr), ("ndcg_at_k", config.min_ndcg)):
        if override is not None:
            floors[name] = override
    return floors


def _calibrated(conn, postgres: PostgresResource, corpus: Corpus, partition: str, config: EvalConfig) -> tuple:
    """The corpus's stored own rule at the config's k and n (None: none stored, or the partition's default kept), and metadata saying
    which (``retrieval_rule.in_force``'s line, its stale note included)."""
    found = retrieval_rule.in_force(conn, postgres.history_schema, corpus.name, partition,
                                    params.default_for(partition).with_(k=config.k, n=config.n),
                                    schema=postgres.schema(partition, corpus=corpus.name))
    if found.params is None:
        return None, {"calibrated_rule": found.line}
    rule = found.rule
    return found.params, {
        "calibrated_rule": found.line,
        "calibrated_rule/note": f"the {CALIBRATED}/* figures are in-sample: the rule was fitted on these {rule.queries} golden queries. "
        f"Held out (inner {retrieval_rule.FOLDS}-fold CV within them): own rule {rule.held_out:.3f} against {params.default_name(partition)}'s "
        f"{rule.default_ndcg:.3f}, paired difference {rule.difference:+.3f} [{rule.interval[0]:+.3f}, {rule.interval[1]:+.3f}]"}


def evaluation_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/eval_run`` (per embedder) with its checks, ``<corpus>/embedder_comparison`` and ``<corpus>/eval_trend``."""
    this = key(corpus, "eval_run")

    @dg.asset(
        partitions_def=embedders,
        kinds={"postgres", "python"},
        group_name=group(corpus), key_prefix=[corpus.name],
        deps=[key(corpus, "chunk_index"), key(corpus, "retrieval_rule")],
        ins=ins(corpus, 'golden_queries', 'chunks', 'documents'),
        code_version=EVAL_VERSION,
        description="Golden-set evaluation of the embedder's default pipeline (params.default_for: params.DEFAULT, or the "
        "embedder's own; chosen by cross-validation, docs/quality.md) and of the named pipelines in config.compare (the seed's by "
        "default), each at its stages hybrid, rerank and mmr (the final list), and the corpus's calibrated rule (retrieval_rule) "
        "when it replaced the default: its figures are in-sample, its held-out ones in calibrated_rule/note; appended to the eval_runs history. "
        "Headline metadata: the default pipeline's final list.",
        check_specs=[
            dg.AssetCheckSpec("quality_floors", asset=this, blocking=True, partitions_def=embedders,
                              description="recall@k, MRR and nDCG@k of the default pipeline stay above the partition's floors "
                              "(measured on the fixture corpus; other corpora: the configured min_* only)."),
            dg.AssetCheckSpec("no_regression", asset=this, blocking=True, partitions_def=embedders,
                              description="Per-query nDCG@k of the default pipeline against the latest earlier run of this partition "
                              "and corpus (queries whose document, text and anchor are unchanged): fails when the mean drops by more "
                              "than max_drop and the paired bootstrap's 95% interval excludes 0; names the worse and better queries."),
        ],
    )
    def eval_run(context: dg.AssetExecutionContext, config: EvalConfig, postgres: PostgresResource,
                 golden_queries: list[GoldenQuery], chunks: list[Chunk], documents: list[Document]):
        partition = context.partition_key
        if not golden_queries:
            status = f"nothing to evaluate: corpus {corpus.name} has no golden queries ({corpus.golden_path})"
            context.log.info(f"eval_run {partition}: {status}")
            yield dg.Output(None, metadata={"status": status})
            yield dg.AssetCheckResult(check_name="quality_floors", passed=True, metadata={"status": status})
            yield dg.AssetCheckResult(check_name="no_regression", passed=True, metadata={"reason": status})
            return
        try:
            variants = {"default": default_pipeline(config, partition)}
            variants.update({name: params.named(name).with_(k=config.k, n=config.n) for name in config.compare if name != "default"})
        except ValueError as exc:
            raise dg.Failure(description=f"eval_run config: {exc}") from None
        evaluations = {}
        with user_errors(f"eval_run {partition}"), postgres.connect() as conn:
            embedder = partitions.embedder(partition)
            schema = postgres.schema(partition, corpus=corpus.name)
            calibrated, calibrated_meta = _calibrated(conn, postgres, corpus, partition, config)
            context.log.info(f"eval_run {partition}: retrieval rule: {calibrated_meta['calibrated_rule']}")
            if calibrated is not None:
                variants[CALIBRATED] = calibrated
            for name, variant in variants.items():
                context.log.info(f"eval_run {partition}: pipeline {name}: {variant.describe()}")
                evaluations[name] = evaluate.evaluate_pipelines(conn, pipeline.retriever(conn, schema, embedder, variant),
                                                                  golden_queries, variant, progress=context.log.info)
            for name, ev in evaluations.items():
                history.record_run(conn, postgres.history_schema, ev, run_id=context.run.run_id, partition=partition, embedder=embedder.name,
                                   corpus_hash=_corpus_hash(chunks), code_version=EVAL_VERSION, corpus=corpus.name,
                                   variant="" if name == "default" else f"{name}:",
                                   doc_hashes=_doc_hashes(golden_queries, documents))
            no_regression = _regression_check(conn, postgres, context.run.run_id, partition, corpus.name, config.max_drop)
        ev = evaluations["default"]
        head = ev.metrics[DEFAULT_PIPELINE]
        scored = {f"{name}:{p}": m.ndcg_at_k for name, e in evaluations.items() for p, m in e.metrics.items() if name != CALIBRATED}
        best = max(scored, key=scored.get)
        floors = _floors(config, partition, corpus)
        below = {name: _r(getattr(head, name)) for name, floor in floors.items() if getattr(head, name) < floor}
        context.log.info(
            f"eval_run {partition} (corpus {corpus.name}, {len(golden_queries)} queries): default pipeline "
            f"recall@{ev.k} {head.recall_at_k:.4f}, MRR {head.mrr:.4f}, nDCG@{ev.k} {head.ndcg_at_k:.4f}; "
            f"best pipeline {best} (nDCG@{ev.k} {scored[best]:.4f}); history in {postgres.history_schema}.eval_runs")
        metadata = {
            **{label: _r(getattr(head, field)) for label, field in HEADLINE.items()},
            "pipeline": ev.params.describe(), "queries": len(golden_queries), "k": ev.k, "n": ev.n,
            "corpus": corpus.name, "best_pipeline": best, "best_ndcg@k": _r(scored[best]), **calibrated_meta,
            **_grouped_metadata(evaluations),
            "by_kind": dg.MetadataValue.md(_by_kind_table(evaluations)),
        }
        yield dg.Output(ev, metadata=metadata)
        yield dg.AssetCheckResult(
            check_name="quality_floors", passed=not below,
            metadata={"floors": str(floors or f"none for corpus {corpus.name}"), "below": str(below or "none")},
        )
        context.log.info(f"eval_run {partition}: no_regression {'passed' if no_regression.passed else 'FAILED'}: {no_regression.metadata['reason'].value}")
        yield no_regression


    @dg.asset(
        kinds={"postgres"},
        group_name=group(corpus), key_prefix=[corpus.name],
        deps=[dg.AssetDep(this, partition_mapping=dg.AllPartitionMapping())],
        description="The latest numbers of every embedder side by side, from the eval_runs history of the corpus; one "
        "metadata series per partition (<partition>/ndcg@k, ...) for the Plots view.",
    )
    def embedder_comparison(context: dg.AssetExecutionContext, postgres: PostgresResource) -> dg.MaterializeResult:
        with user_errors("embedder_comparison"), postgres.connect() as conn:
            latest = history.latest_runs(conn, postgres.history_schema, corpus.name)
        rows = ["| embedder | pipeline | recall@k | precision@k | MRR | nDCG@k | fused recall@n | run |", "|---|---|---|---|---|---|---|---|"]
        meta: dict = {}
        for r in latest:
            rows.append(f"| {r['partition']} | {r['pipeline']} | {r['recall_at_k']:.3f} | {r['precision_at_k']:.3f} | {r['mrr']:.3f} "
                        f"| {r['ndcg_at_k']:.3f} | {r['pool_recall']:.3f} | {r['run_id'][:8]} |")
            if r["pipeline"] == DEFAULT_PIPELINE:
                meta.update({f"{r['partition']}/{label}": _r(r[field]) for label, field in HEADLINE.items()})
        partitions_seen = sorted({r["partition"] for r in latest})
        context.log.info(f"embedder_comparison (corpus {corpus.name}): latest runs of {', '.join(partitions_seen) or 'no partition yet'}")
        return dg.MaterializeResult(metadata={**dict(sorted(meta.items())), "partitions": len(partitions_seen), "corpus": corpus.name,
                                              "comparison": dg.MetadataValue.md("\n".join(rows))})


    @dg.asset(
        kinds={"postgres", "python"},
        group_name=group(corpus, "reports"), key_prefix=[corpus.name], required_resource_keys={"corpus", "postgres"},
        deps=[dg.AssetDep(this, partition_mapping=dg.AllPartitionMapping())],
        description="Each partition's headline metrics (default pipeline) over its last runs on the corpus: a table and a "
        "PNG plot (matplotlib), from the eval_runs history. Off the main job (matplotlib costs seconds): the "
        "reports_after_evaluation sensor materialises it after any eval_run, or launch it on its own.",
    )
    def eval_trend(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        postgres: PostgresResource = context.resources.postgres
        import base64

        from retrieval_assets.evaluation import trend

        with user_errors("eval_trend"), postgres.connect() as conn:
            rows = history.trend(conn, postgres.history_schema, corpus.name, DEFAULT_PIPELINE)
        meta: dict = {"runs": len(rows), "corpus": corpus.name, "table": dg.MetadataValue.md(trend.table(rows))}
        if rows:
            path = trend.plot(rows, context.resources.corpus.report_path(corpus.name, "trend").with_name("eval_trend.png"),
                              f"corpus {corpus.name}: the default pipeline")
            image = base64.b64encode(path.read_bytes()).decode()
            meta.update(plot=dg.MetadataValue.md(f"![eval trend](data:image/png;base64,{image})"), path=dg.MetadataValue.path(str(path)))
            context.log.info(f"eval_trend (corpus {corpus.name}): {len(rows)} runs plotted in {path}")
        return dg.MaterializeResult(metadata=meta)

    return [eval_run, embedder_comparison, eval_trend]
