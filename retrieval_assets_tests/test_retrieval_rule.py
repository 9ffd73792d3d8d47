"""The corpus's retrieval rule: the asset on the fixture, few queries, concurrent stores, the commands that read it,
and bad input. Real Postgres throughout (the session's server, this module's schema prefix)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml
from psycopg import sql

from retrieval_assets import cli, partitions, pg
from retrieval_assets.corpus import registry
from retrieval_assets.corpus.registry import FIXTURE_CORPUS
from retrieval_assets.defs.resources import CorpusResource, PostgresResource
from retrieval_assets.evaluation import crossval, retrieval_rule, staged_rule
from retrieval_assets.params import DEFAULT
from retrieval_assets_tests.conftest import CORPUS, drop_prefixed, stored_at_once
from retrieval_assets_tests.graph import assets, corpus_of, selection, short

PREFIX = "t_rule_"
HISTORY = PREFIX + partitions.HISTORY
QUERY = "why does the reranker need corpus idf"


@pytest.fixture(scope="module")
def resource(pg_dsn):
    drop_prefixed(pg_dsn, PREFIX)
    yield PostgresResource(dsn=pg_dsn, schema_prefix=PREFIX)
    drop_prefixed(pg_dsn, PREFIX)


@pytest.fixture
def prefixed(monkeypatch):
    """The command line in this module's schemas."""
    monkeypatch.setenv(partitions.PREFIX_VARIABLE, PREFIX)


def _materialize(resource, corpus, names, tmp_path):
    return dg.materialize(assets(corpus), partition_key="hash", raise_on_error=False, selection=selection(corpus, *names),
                          resources={"postgres": resource, "corpus": CorpusResource(report_dir=str(tmp_path))})


def _metadata(result, name: str) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if short(e.asset_key) == name]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def test_the_asset_materialises_for_the_fixture_and_eval_run_reads_it(resource, tmp_path):
    names = ("documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule", "eval_run")
    result = _materialize(resource, FIXTURE_CORPUS, names, tmp_path)
    assert result.success
    meta, ev = _metadata(result, "retrieval_rule"), _metadata(result, "eval_run")
    assert meta["queries"] == 48 and meta["fitted"] == "fitted now"
    # measured (docs/quality.md): on the fixture the own rule does not earn its place over params.DEFAULT for hash
    assert meta["kept_default"] is True and meta["rule"] == staged_rule.describe(staged_rule.config_of(DEFAULT))
    assert meta["held_out/ci_low"] <= 0 < meta["held_out/ci_high"] and "not above 0" in meta["reason"]
    # the inner CV's default figure is params.DEFAULT on the same index and queries, which eval_run measures too
    assert meta["held_out/default_ndcg@10"] == ev["default/mmr/ndcg@k"] == meta["in_sample_ndcg@10"]
    assert ev["calibrated_rule"].startswith("params.DEFAULT, kept by the calibration of") and "calibrated/mmr/ndcg@k" not in ev
    with resource.connect() as conn:
        rule, _ = retrieval_rule.stored(conn, resource.history_schema, "fixture", "hash")
    assert rule.kept_default and rule.reason == meta["reason"] and rule.schema == resource.schema("hash")
    again = _materialize(resource, FIXTURE_CORPUS, ("documents", "chunks", "golden_queries", "retrieval_rule"), tmp_path)
    assert _metadata(again, "retrieval_rule")["fitted"].startswith("reused: fitted")  # same index, same queries: not fitted again


def test_eval_run_evaluates_a_stored_own_rule_beside_the_default_as_in_sample(resource, tmp_path):
    own = dataclasses.replace(_own_rule(resource.schema("hash")), content="a sync before the last one")  # stale
    with resource.connect() as conn:
        retrieval_rule.store(conn, resource.history_schema, own)
    result = _materialize(resource, FIXTURE_CORPUS, ("documents", "chunks", "golden_queries", "eval_run"), tmp_path)
    assert result.success
    ev = _metadata(result, "eval_run")
    assert own.description in ev["calibrated_rule"] and "in-sample" in ev["calibrated_rule/note"]
    assert ev["calibrated_rule"].endswith("fitted before the index last changed: the retrieval_rule asset or calibrate fits it again")
    assert "+0.020 [+0.005, +0.035]" in ev["calibrated_rule/note"]
    assert {"default/mmr/ndcg@k", "calibrated/mmr/ndcg@k"} <= set(ev) and not ev["best_pipeline"].startswith("calibrated")
    assert ev["pipeline"] == DEFAULT.describe()  # the headline stays params.DEFAULT's


def _own_rule(schema: str, corpus: str = "fixture") -> retrieval_rule.Rule:
    """A rule that replaced the default (its figures invented): the readers are what is tested with it."""
    params = DEFAULT.with_(lexical="ts_rank_cd", fusion="rrf", weights=(0.7, 0.3), rerank_weight=0.8, rerank_idf="pool")
    return retrieval_rule.Rule(corpus, "hash", params, False, 48, "invented for the test", schema, 0.75, 0.73, 0.02, (0.005, 0.035), 0.8)


def _small_corpus(tmp_path, queries: int | None, name: str = "small"):
    """The fixture's documents, as corpus ``name``, with the first ``queries`` golden queries (None: no golden.yaml)."""
    folder = tmp_path / name
    shutil.copytree(CORPUS, folder, ignore=shutil.ignore_patterns("golden*.yaml"))
    if queries is not None:
        data = yaml.safe_load((CORPUS / "golden.yaml").read_text())
        items = data["queries"] if isinstance(data, dict) else data
        (folder / "golden.yaml").write_text(yaml.safe_dump(items[:queries], sort_keys=False))
    return folder


def test_a_corpus_with_fewer_than_20_queries_keeps_the_default_and_says_so(resource, tmp_path):
    folder = _small_corpus(tmp_path, 12)
    result = _materialize(resource, corpus_of(folder), ("documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule"), tmp_path)
    assert result.success
    meta = _metadata(result, "retrieval_rule")
    assert meta["kept_default"] is True and meta["queries"] == 12 and "fewer than 20" in meta["reason"] and "untried" in meta["reason"]
    assert not any(k.startswith("held_out/") for k in meta)  # no inner cross-validation was run
    bare = _materialize(resource, corpus_of(_small_corpus(tmp_path, None, "bare")),
                        ("documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule"), tmp_path)
    assert bare.success and "no judged queries (no golden.yaml" in _metadata(bare, "retrieval_rule")["reason"]


def test_calibrated_reports_the_inner_cross_validation():
    table = {crossval.config(x=1): np.full(40, 0.5), crossval.config(x=2): np.r_[np.full(20, 0.9), np.full(20, 0.7)]}
    setting = crossval.Setting("d", "e", lambda cfg: table[cfg])
    found = crossval.calibrated(setting, (lambda _: list(table),), crossval.config(x=1), np.arange(40))
    assert found.choice == crossval.config(x=2) and not found.kept_default and found.queries == 40
    mean, low, high = found.difference
    assert mean == pytest.approx(0.3) and 0 < low <= mean <= high and "above 0" in found.reason
    assert found.difference == (float((found.own - found.base).mean()), *crossval.bootstrap_interval(found.own - found.base))
    few = crossval.calibrated(setting, (lambda _: list(table),), crossval.config(x=1), np.arange(19))
    assert few.kept_default and few.difference is None and "fewer than 20" in few.reason


def test_stores_at_once_all_succeed_and_one_whole_rule_is_kept(pg_dsn, resource):
    """Six connections store at the same moment into a history schema without the table (or schema) yet."""
    history = PREFIX + "race_history"
    for _ in range(3):
        with pg.connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(history)))
        assert stored_at_once(pg_dsn, lambda other, i: retrieval_rule.store(
            other, history, dataclasses.replace(_own_rule("s"), reason=f"launch {i}", queries=i))) == []
        with pg.connect(pg_dsn) as conn:
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(history, retrieval_rule.TABLE))).fetchone()[0] == 1
            rule, _ = retrieval_rule.stored(conn, history, "fixture", "hash")
        assert rule.reason == f"launch {rule.queries}" and rule.params == _own_rule("s").params


def test_search_and_answer_use_the_stored_rule_and_the_flag_ignores_it(pg_dsn, resource, prefixed, capsys, tmp_path):
    own = _own_rule("anywhere")
    with pg.connect(pg_dsn) as conn:
        retrieval_rule.store(conn, HISTORY, own)
    base = ["--dsn", pg_dsn, "--k", "3"]
    assert cli.run(["search", QUERY, *base]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"pipeline: {retrieval_rule.applied(own, DEFAULT.with_(k=3)).describe()}"
    assert len(out.splitlines()) == 4 and "calibrated rule" in err and "+0.020 nDCG@10" in err
    assert cli.run(["search", QUERY, *base, "--ignore-rule"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"pipeline: {DEFAULT.with_(k=3).describe()}" and "ignored" in err
    assert cli.run(["search", QUERY, *base, "--rerank-weight", "0.5"]) == 0  # an option still overrides the rule
    assert capsys.readouterr()[0].splitlines()[0] == f"pipeline: {retrieval_rule.applied(own, DEFAULT).with_(k=3, rerank_weight=0.5).describe()}"
    assert cli.run(["answer", QUERY, "--dsn", pg_dsn, "--floor", "0"]) == 0
    assert "calibrated rule" in capsys.readouterr()[1]
    assert cli.run(["search", QUERY, *base, "--corpus", str(_small_corpus(tmp_path, 0, "unruled"))]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"pipeline: {DEFAULT.with_(k=3).describe()}" and "no calibrated rule stored for corpus unruled" in err


def test_a_rule_fitted_before_the_index_changed_is_used_and_said_stale(pg_dsn, resource, prefixed, capsys):
    base = ["--dsn", pg_dsn, "--k", "3", "--ignore-rule"]
    assert cli.run(["search", QUERY, *base]) == 0  # the command line's index of the fixture
    capsys.readouterr()
    schema = partitions.schema_name("hash", "cli", PREFIX)
    with pg.connect(pg_dsn) as conn:
        now = retrieval_rule.content(conn, schema)
        assert now  # a synced index has a content fingerprint
        for content, stale in ((now, False), ("a sync before this one", True), ("", False)):  # "": a row stored before the field
            retrieval_rule.store(conn, HISTORY, dataclasses.replace(_own_rule(schema), content=content))
            assert cli.run(["search", QUERY, *base[:-1]]) == 0
            out, err = capsys.readouterr()
            assert "calibrated rule" in err and ("fitted before the index last changed" in err) == stale, (content, err)
            assert out.splitlines()[0] == f"pipeline: {retrieval_rule.applied(_own_rule(schema), DEFAULT.with_(k=3)).describe()}"


def test_in_force_says_which_rule_and_whether_its_index_changed(pg_dsn, resource, prefixed):
    """None stored, the default kept, an own rule fitted on this index, and one fitted before the index last changed."""
    assert cli.run(["index", "--dsn", pg_dsn]) == 0  # the command line's index of the fixture: a content fingerprint
    schema, history, base = partitions.schema_name("hash", "cli", PREFIX), PREFIX + "in_force_history", DEFAULT.with_(k=4)
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(history)))
        now = retrieval_rule.content(conn, schema)
        none = retrieval_rule.in_force(conn, history, "fixture", "hash", base, schema=schema)
        assert (none.rule, none.params, none.stale) == (None, None, False) and "no calibrated rule stored for corpus fixture" in none.line
        kept = dataclasses.replace(_own_rule(schema), params=DEFAULT, kept_default=True, content=now, reason="the default held")
        retrieval_rule.store(conn, history, kept)
        found = retrieval_rule.in_force(conn, history, "fixture", "hash", base, schema=schema)
        assert found.params is None and found.rule == kept and not found.stale
        assert found.line.startswith("params.DEFAULT, kept by the calibration of") and found.line.endswith("(the default held)")
        for content, stale in ((now, False), ("a sync before this one", True)):
            own = dataclasses.replace(_own_rule(schema), content=content)
            retrieval_rule.store(conn, history, own)
            found = retrieval_rule.in_force(conn, history, "fixture", "hash", base, schema=schema)
            assert found.rule == own and found.params == retrieval_rule.applied(own, base) and found.params.k == 4
            assert found.stale == stale and ("fitted before the index last changed" in found.line) == stale
            assert "calibrated rule" in found.line and "+0.020 nDCG@10 over params.DEFAULT" in found.line
            assert retrieval_rule.for_search(conn, history, "fixture", "hash", base, schema=schema) == (found.params, f"retrieval rule: {found.line}")
        # the index of another schema: the rule is not said stale for it
        assert not retrieval_rule.in_force(conn, history, "fixture", "hash", base, schema=schema + "_other").stale
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(history)))


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--embedder", "nope"], partitions.unknown("nope")),
    (["search", "  ", "--embedder", "hash"], "the query is empty"),
])
def test_bad_arguments_are_one_line(pg_dsn, prefixed, capsys, argv, message):
    assert cli.main([*argv, "--dsn", pg_dsn]) == 2
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_calibrate_without_golden_yaml_is_one_line_and_stores_nothing(pg_dsn, prefixed, capsys, tmp_path):
    folder = _small_corpus(tmp_path, None, "nogolden")
    assert cli.main(["calibrate", "--corpus", str(folder), "--dsn", pg_dsn]) == 2
    err = capsys.readouterr()[1]
    assert err == f"error: {folder / 'golden.yaml'}: no golden.yaml in the corpus folder; calibration needs the corpus's judged queries " \
                  "(python -m retrieval_assets golden draft and golden review write one)\n"
    with pg.connect(pg_dsn) as conn:
        assert retrieval_rule.stored(conn, HISTORY, partitions.corpus_name_for(folder), "hash") is None


def test_calibrate_command_stores_what_the_asset_would(pg_dsn, prefixed, capsys, tmp_path, monkeypatch):
    folder = _small_corpus(tmp_path, 12, "few")
    assert cli.run(["calibrate", "--corpus", str(folder), "--dsn", pg_dsn]) == 0
    out = capsys.readouterr()[0]
    name = partitions.corpus_name_for(folder)
    assert out.startswith(f"{name}/hash: params.DEFAULT kept (12 judged queries, fewer than 20") and f"{HISTORY}.retrieval_rules" in out
    with pg.connect(pg_dsn) as conn:
        rule, _ = retrieval_rule.stored(conn, HISTORY, name, "hash")
    assert rule.queries == 12 and rule.schema == partitions.schema_name("hash", "cli", PREFIX, corpus=name)
    seen = []  # a stored rule of other inputs: the fingerprint compared with it is the one the refit stores, computed once
    monkeypatch.setattr(retrieval_rule, "fingerprint", lambda *a, real=retrieval_rule.fingerprint: seen.append(real(*a)) or seen[-1])
    with pg.connect(pg_dsn) as conn:
        retrieval_rule.store(conn, HISTORY, dataclasses.replace(rule, fingerprint="other inputs"))
    assert cli.run(["calibrate", "--corpus", str(folder), "--dsn", pg_dsn]) == 0
    assert "reused" not in capsys.readouterr()[0] and seen == [rule.fingerprint]
    with pg.connect(pg_dsn) as conn:  # removing the corpus removes its rule with its history
        registry.add(conn, HISTORY, name, folder)
        registry.remove(conn, HISTORY, name, PREFIX)
        assert retrieval_rule.stored(conn, HISTORY, name, "hash") is None


KILLED = """
import sys, time
import psycopg
from retrieval_assets import cli
from retrieval_assets.evaluation import retrieval_rule

fit, execute = retrieval_rule.fit, psycopg.Connection.execute
def fitting(*args, **kwargs):
    print("fitting", flush=True)
    return fit(*args, **kwargs)
def paused(self, query, params=None, **kwargs):  # stops inside store's transaction, its row written, not committed
    cursor = execute(self, query, params, **kwargs)
    text = query.as_string(self) if hasattr(query, "as_string") else str(query)
    if sys.argv[1] == "store" and text.startswith("INSERT INTO") and retrieval_rule.TABLE in text:
        print("inserted", flush=True)
        time.sleep(600)
    return cursor
retrieval_rule.fit, psycopg.Connection.execute = fitting, paused
sys.exit(cli.main(["calibrate", "--dsn", sys.argv[2], "--refit"]))
"""


@pytest.mark.slow
def test_a_client_killed_while_fitting_or_storing_stores_nothing_and_the_next_run_stores(pg_dsn, monkeypatch, capsys):
    """SIGKILL of a ``calibrate`` process in the middle of the fit, then in store's transaction after its row is
    written: no rule, table or history schema is left (its backend gone), and the next ``calibrate`` stores one whole rule."""
    prefix = PREFIX + "killed_"
    history = prefix + partitions.HISTORY
    drop_prefixed(pg_dsn, prefix)
    env = {**os.environ, partitions.PREFIX_VARIABLE: prefix, "PGAPPNAME": "t-rule-killed"}
    try:
        for moment, lines, wait in (("fit", ["fitting"], 1.0), ("store", ["fitting", "inserted"], 0.0)):
            child = subprocess.Popen([sys.executable, "-c", KILLED, moment, pg_dsn], cwd=Path(__file__).resolve().parents[1], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                said = [child.stdout.readline().strip() for _ in lines]
                time.sleep(wait)
                alive = child.poll() is None
            finally:
                child.kill()
                child.wait(timeout=30)
            assert said == lines and alive, f"{moment}: {said}, the child {'alive' if alive else 'ended'}: {child.stderr.read()[-2000:]}"
            with pg.connect(pg_dsn) as conn:
                deadline = time.monotonic() + 20  # the killed client's backend ends, and its transaction with it
                while time.monotonic() < deadline and conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 't-rule-killed'").fetchone()[0]:
                    time.sleep(0.1)
                assert conn.execute("SELECT to_regnamespace(%s)", (history,)).fetchone()[0] is None, moment
                assert retrieval_rule.stored(conn, history, "fixture", "hash") is None
        monkeypatch.setenv(partitions.PREFIX_VARIABLE, prefix)
        capsys.readouterr()
        assert cli.run(["calibrate", "--dsn", pg_dsn]) == 0
        assert "reused" not in capsys.readouterr()[0]
        with pg.connect(pg_dsn) as conn:
            rule, _ = retrieval_rule.stored(conn, history, "fixture", "hash")
            rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(history, retrieval_rule.TABLE))).fetchone()[0]
            schema = partitions.schema_name("hash", "cli", prefix)
            assert rows == 1 and rule.queries == 48 and rule.schema == schema
            assert rule.content == retrieval_rule.content(conn, schema) and rule.fingerprint
    finally:
        drop_prefixed(pg_dsn, prefix)
