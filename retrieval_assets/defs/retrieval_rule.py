"""The corpus's retrieval rule per embedder: its default (``params.default_for``), or the rule its own golden queries earn
(``evaluation.retrieval_rule``), stored for eval_run, answers and the command line's search and answer."""

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import embedders, group, ins, key
from retrieval_assets.defs.resources import PostgresResource, user_errors
from retrieval_assets.evaluation import retrieval_rule
from retrieval_assets.types import Chunk, GoldenQuery


class RuleConfig(dg.Config):
    refit: bool = False  # fit again even when the stored rule was fitted on this index version and these golden queries


def rule_metadata(rule: retrieval_rule.Rule) -> dict:
    """The rule as asset metadata: which, why, and the inner cross-validation's held-out figures."""
    meta = {"rule": rule.description, "kept_default": rule.kept_default, "queries": rule.queries, "reason": rule.reason,
            "corpus": rule.corpus, "schema": rule.schema, "params": dg.MetadataValue.json(rule.as_dict()["params"])}
    if rule.difference is not None:
        meta.update({"held_out/own_rule_ndcg@10": round(rule.held_out, 4), "held_out/default_ndcg@10": round(rule.default_ndcg, 4),
                     "held_out/difference": round(rule.difference, 4), "held_out/ci_low": round(rule.interval[0], 4),
                     "held_out/ci_high": round(rule.interval[1], 4)})
    if rule.in_sample is not None:
        meta["in_sample_ndcg@10"] = round(rule.in_sample, 4)  # on the queries the rule was fitted on: not a held-out figure
    return meta


def retrieval_rule_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/retrieval_rule``, one partition per embedder, in the corpus's evaluated chain."""

    @dg.asset(
        name="retrieval_rule",
        partitions_def=embedders,
        kinds={"postgres", "python"},
        group_name=group(corpus), key_prefix=[corpus.name],
        deps=[key(corpus, "chunk_index")],
        ins=ins(corpus, "golden_queries", "chunks"),
        description="The retrieval rule of this corpus and embedder: the staged rule (fusion, BM25 rerank, MMR) fitted on the "
        f"corpus's golden queries against the index replaces the embedder's default (params.default_for) only when {retrieval_rule.FOLDS}-fold cross-validation "
        "within those queries puts the 95% interval of the paired held-out nDCG@10 difference above 0 (crossval.calibrated); with "
        f"fewer than {retrieval_rule.MIN_QUERIES} golden queries, or no golden.yaml, the default untried. Stored in the history "
        "schema's retrieval_rules table: eval_run evaluates it beside the default, answers and the command line's search and "
        "answer use it. A stored rule fitted on the same index version and golden queries is reused (the fit is deterministic).",
    )
    def retrieval_rule_asset(context: dg.AssetExecutionContext, config: RuleConfig, postgres: PostgresResource,
                             golden_queries: list[GoldenQuery], chunks: list[Chunk]) -> dg.MaterializeResult:
        partition = context.partition_key
        with user_errors(f"retrieval_rule {partition}"), postgres.connect() as conn:
            rule, when = retrieval_rule.for_index(conn, postgres.history_schema, postgres.schema(partition, corpus=corpus.name),
                                                  partitions.embedder(partition), chunks, golden_queries, corpus.name, partition,
                                                  refit=config.refit)
        fitted = f"reused: fitted {when} UTC on this index version and these golden queries" if when else "fitted now"
        context.log.info(f"retrieval_rule {rule.summary()}; {fitted}")
        return dg.MaterializeResult(metadata={**rule_metadata(rule), "fitted": fitted})
    return [retrieval_rule_asset]
