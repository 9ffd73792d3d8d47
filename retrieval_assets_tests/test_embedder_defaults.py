"""An embedder partition's own default pipeline (``params.default_for``): one owner, read by eval_run, the retrieval
rule, the command line and the answers' sources. Real Postgres and the real mpnet model (installed by ``uv sync``)."""

from __future__ import annotations

import argparse

import pytest
from psycopg import sql

from retrieval_assets import cli, params, partitions, pg
from retrieval_assets.answers import answer
from retrieval_assets.cli.args import pipeline_params
from retrieval_assets.defs.evaluation import EvalConfig, default_pipeline
from retrieval_assets.defs.resources import PostgresResource
from retrieval_assets.evaluation import retrieval_rule, staged_rule
from retrieval_assets.params import DEFAULT, EMBEDDER_DEFAULTS, default_for, default_name, named
from retrieval_assets_tests.conftest import drop_prefixed
from retrieval_assets_tests.test_dagster import _own_corpus, metadata, run

PREFIX = "t_edef_"
MPNET = EMBEDDER_DEFAULTS["mpnet"]


@pytest.fixture(scope="module")
def resource(pg_dsn):
    drop_prefixed(pg_dsn, PREFIX)
    yield PostgresResource(dsn=pg_dsn, schema_prefix=PREFIX)
    drop_prefixed(pg_dsn, PREFIX)


def test_each_own_default_belongs_to_a_partition_and_differs_only_in_what_eval_run_can_leave_to_it():
    assert set(EMBEDDER_DEFAULTS) <= set(partitions.PARTITIONS) and MPNET != DEFAULT
    rule_fields = set(staged_rule.FIELDS) - {"mmr_lambda"}  # eval_run's config leaves these to the partition (None)
    for own in EMBEDDER_DEFAULTS.values():
        changed = {f for f in params.FIELD_NAMES if getattr(own, f) != getattr(DEFAULT, f)}
        assert changed and changed <= rule_fields
    assert default_for("mpnet") == named("default", "mpnet") == MPNET
    assert default_for("hash") == default_for(None) == named("default", "minilm") == named("default") == DEFAULT
    assert named("seed", "mpnet") == params.SEED
    assert default_name("mpnet") == "params.EMBEDDER_DEFAULTS['mpnet']" and default_name("hash") == "params.DEFAULT"
    assert answer.sources_for("mpnet") == MPNET.with_(k=answer.SOURCES_K) and answer.sources_for("hash") == answer.SOURCES


def test_eval_runs_config_leaves_each_unset_field_to_the_partition_and_overrides_the_set_ones():
    assert default_pipeline(EvalConfig(), "mpnet") == MPNET and default_pipeline(EvalConfig(), "hash") == DEFAULT
    mine = default_pipeline(EvalConfig(vector_weight=0.3, rerank_weight=0.2, k=5), "mpnet")
    assert mine == MPNET.with_(weights=(0.3, MPNET.weights[1]), rerank_weight=0.2, k=5)
    assert default_pipeline(EvalConfig(evidence_shift=0.0, fusion="rrf"), "mpnet") == MPNET.with_(evidence_shift=0.0, fusion="rrf")
    assert default_pipeline(EvalConfig(mmr_lambda=0.5), "hash") == DEFAULT.with_(mmr_lambda=0.5)
    with pytest.raises(ValueError, match="evidence_shift must be a number within"):
        default_pipeline(EvalConfig(evidence_shift=3.0), "mpnet")


def _args(**given):
    blank = {name: None for name in params.FIELD_NAMES} | {"vector_weight": None, "no_mmr": False, "corpus_idf": False}
    return argparse.Namespace(**(blank | {"pipeline": "default", "embedder": "hash"} | given))


def test_the_command_lines_default_pipeline_is_the_embedders_and_its_options_still_override_it():
    assert pipeline_params(_args(embedder="mpnet")) == MPNET and pipeline_params(_args()) == DEFAULT
    assert pipeline_params(_args(embedder="mpnet", vector_weight=0.8)) == MPNET.with_(weights=(0.8, 0.2))
    assert pipeline_params(_args(embedder="mpnet", pipeline="seed")) == params.SEED


def test_the_retrieval_rule_falls_back_to_the_embedders_default_and_names_it(pg_dsn):
    history = PREFIX + "history"
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(history)))
        none = retrieval_rule.in_force(conn, history, "fixture", "mpnet")
        assert none.params is None and none.line.startswith("params.EMBEDDER_DEFAULTS['mpnet'] (no calibrated rule stored")
        assert retrieval_rule.for_search(conn, history, "fixture", "mpnet") == (MPNET, f"retrieval rule: {none.line}")
        base = answer.sources_for("mpnet")
        assert retrieval_rule.for_search(conn, history, "fixture", "mpnet", base)[0] == base
        assert retrieval_rule.for_search(conn, history, "fixture", "mpnet", ignore=True) == (
            MPNET, "retrieval rule: params.EMBEDDER_DEFAULTS['mpnet'] (a stored calibrated rule, if any, ignored)")
        kept = retrieval_rule.Rule("fixture", "mpnet", MPNET, True, 12, "fewer than 20 judged queries", "mpnet")
        retrieval_rule.store(conn, history, kept)
        found = retrieval_rule.in_force(conn, history, "fixture", "mpnet")
        assert found.params is None and found.line.startswith("params.EMBEDDER_DEFAULTS['mpnet'], kept by the calibration of")
        assert "params.EMBEDDER_DEFAULTS['mpnet'] kept" in kept.summary()
        # the fingerprint of a fit depends on the embedder's own default: another default, another fit
        assert retrieval_rule.in_force(conn, history, "fixture", "hash").line.startswith("params.DEFAULT (no calibrated rule stored")
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(history)))


@pytest.fixture(scope="module")
def mpnet_installed():
    if partitions.get("mpnet").missing() is not None:
        pytest.skip("the all-mpnet-base-v2 parts are not installed here (uv sync)")


def test_eval_run_and_search_on_mpnet_run_its_own_default(resource, tmp_path, mpnet_installed, pg_dsn, capsys, monkeypatch):
    """A small corpus of its own, materialised with the mpnet partition, and the command line's search of it."""
    folder = _own_corpus(tmp_path / "harbour")
    steps = ["documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule", "eval_run"]
    result = run(resource, corpus_dir=folder, partition="mpnet", selection=steps)
    assert result.success
    meta = metadata(result, "eval_run")
    assert meta["pipeline"] == MPNET.describe() != DEFAULT.describe()
    assert metadata(result, "retrieval_rule")["kept_default"] is True
    overridden = run(resource, corpus_dir=folder, partition="mpnet", selection=steps, eval_config={"evidence_shift": 0.0})
    assert overridden.success and metadata(overridden, "eval_run")["pipeline"] == MPNET.with_(evidence_shift=0.0).describe()
    monkeypatch.setenv(partitions.PREFIX_VARIABLE, PREFIX)
    assert cli.main(["search", "when does the ferry leave", "--embedder", "mpnet", "--corpus", str(folder), "--dsn", pg_dsn]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"pipeline: {MPNET.describe()}" and "intro#" in out.splitlines()[1]
    # the rule the asset stored for this corpus and embedder (fewer than 20 queries: the default kept) is the one read
    assert err.splitlines()[-1].startswith("retrieval rule: params.EMBEDDER_DEFAULTS['mpnet'], kept by the calibration of")
