"""One run history, as a user sees it: runs of the README's main command (no DAGSTER_HOME, the
root dagster.yaml) and of a second registered corpus's job show in the webserver's GraphQL API,
each corpus with its own assets, partitions, metadata and run tag; a second embedder's run leaves
the first one's eval_run up to date. The instance lives in its own Postgres database."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets import pg
from retrieval_assets.defs.instance import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow
PREFIX = "t_web_"  # the webserver run's schemas, never the unprefixed ones
DATABASE = "t_web_dagster"  # the Dagster instance of this test


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=json.dumps({"query": query}).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]


@pytest.fixture(scope="module")
def webserver(pg_dsn, tmp_path_factory):
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    # a first run on a fresh machine: an empty HOME, no dg.toml of the user's, no DAGSTER_HOME
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_HOME", "XDG_CONFIG_HOME", "DG_CLI_CONFIG")}
    env.update(HOME=str(tmp_path_factory.mktemp("home")), RETRIEVAL_DSN=pg_dsn, RETRIEVAL_SCHEMA_PREFIX=PREFIX,
               DAGSTER_PG_URL=sqlalchemy_url({**conninfo_to_dict(pg_dsn), "dbname": DATABASE}))
    harbour = tmp_path_factory.mktemp("harbour")
    (harbour / "tides.md").write_text("# Tides\n\nSpring tides follow the full moon and the new moon.\n")
    (harbour / "ferry.md").write_text("# Ferry\n\nThe ferry leaves the harbour at dawn every day.\n")
    (harbour / "golden.yaml").write_text("- {query_id: h1, kind: factual, query: when does the ferry leave, doc_id: ferry, anchor: at dawn}\n")
    added = subprocess.run([sys.executable, "-m", "retrieval_assets", "corpus", "add", "harbour", str(harbour)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert added.returncode == 0, added.stderr

    def launch(job: str, partition: str) -> subprocess.CompletedProcess:
        done = subprocess.run([str(BIN / "dg"), "launch", "--job", job, "--partition", partition],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    launched = launch("evaluate_embedders", "hash")  # the README's main command, on a fresh HOME
    launch("evaluate_embedders__harbour", "hash")
    launch("evaluate_embedders", "minilm")
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-m", "retrieval_assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("dagster webserver did not start")
                time.sleep(0.5)
        yield port, launched.stderr + launched.stdout, env
    finally:
        proc.terminate()
        proc.wait(30)
        with pg.connect(pg_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
            for schema in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (PREFIX + "%",)).fetchall():
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema[0])))


def test_the_main_command_prints_the_summary_not_debug_events(webserver):
    _, output, _ = webserver
    assert "DEBUG" not in output and "Warning" not in output
    assert "Telemetry" not in output and "Welcome to Dagster" not in output  # dg's first-run banner (defs/dagster_home.py)
    assert "eval_run hash (corpus fixture, 48 queries): default pipeline recall@10" in output
    assert "RETRIEVAL_ANALYSIS.md" in output


def test_a_command_line_run_shows_in_the_ui_tagged_with_its_corpus(webserver):
    port, _, _ = webserver
    data = _graphql(port, """{ runsOrError { ... on Runs { results { runId jobName status tags { key value } } } } }""")
    runs = {(r["jobName"], next(t["value"] for t in r["tags"] if t["key"] == "dagster/partition")): r
            for r in data["runsOrError"]["results"]}
    assert set(runs) == {("evaluate_embedders", "hash"), ("evaluate_embedders", "minilm"), ("evaluate_embedders__harbour", "hash")}
    assert all(r["status"] == "SUCCESS" for r in runs.values())
    corpus_tags = {job: next(t["value"] for t in r["tags"] if t["key"] == "retrieval/corpus") for (job, _), r in runs.items()}
    assert corpus_tags == {"evaluate_embedders": "fixture", "evaluate_embedders__harbour": "harbour"}
    tagged = _graphql(port, """{ runsOrError(filter: {tags: [{key: "retrieval/corpus", value: "harbour"}]}) {
                                   ... on Runs { results { jobName } } } }""")
    assert [r["jobName"] for r in tagged["runsOrError"]["results"]] == ["evaluate_embedders__harbour"]
    assert _graphql(port, "{ shouldShowNux }") == {"shouldShowNux": False}  # no community dialog over the page (dagster.yaml)


def test_graphql_lists_each_corpus_with_its_own_assets_groups_and_partitions(webserver):
    data = _graphql(webserver[0], "{ assetNodes { assetKey { path } groupName partitionKeys kinds } }")
    nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    names = ("documents", "chunks", "golden_queries", "chunk_index", "retrieval_rule", "eval_run", "failure_report", "what_ifs",
             "embedder_comparison", "eval_trend", "support_calibration", "answers")
    assert set(nodes) == {f"{c}/{n}" for c in ("fixture", "harbour") for n in names} | {"cranfield_report", "harbour/golden_drafts"}
    assert nodes["harbour/golden_drafts"]["groupName"] == "harbour"  # a user corpus's drafts, beside its golden_queries
    for corpus in ("fixture", "harbour"):
        assert nodes[f"{corpus}/eval_run"]["partitionKeys"] == ["hash", "minilm", "mpnet", "bge-small"]
        assert nodes[f"{corpus}/documents"]["partitionKeys"] == []
        groups = {n: nodes[f"{corpus}/{n}"]["groupName"] for n in names}
        assert groups == {**{n: corpus for n in names}, "answers": f"{corpus}_live", "support_calibration": f"{corpus}_live",
                          "what_ifs": f"{corpus}_experiments",
                          "eval_trend": f"{corpus}_reports"}
        assert "postgres" in nodes[f"{corpus}/chunk_index"]["kinds"]
    assert nodes["cranfield_report"]["groupName"] == "benchmark"


def _latest_metadata(port: int, corpus: str, partition: str) -> dict:
    data = _graphql(port, """{ assetOrError(assetKey: {path: ["%s", "eval_run"]}) { ... on Asset {
              assetMaterializations(partitions: ["%s"], limit: 1) { partition metadataEntries { label
                ... on FloatMetadataEntry { floatValue } ... on IntMetadataEntry { intValue } ... on TextMetadataEntry { text }
                ... on MarkdownMetadataEntry { mdStr } } } } } }""" % (corpus, partition))
    [event] = data["assetOrError"]["assetMaterializations"]
    assert event["partition"] == partition
    return {e["label"]: e for e in event["metadataEntries"]}


def test_two_corpora_have_their_own_eval_run_metadata_series(webserver):
    fixture, harbour = _latest_metadata(webserver[0], "fixture", "hash"), _latest_metadata(webserver[0], "harbour", "hash")
    assert fixture["corpus"]["text"] == "fixture" and fixture["queries"]["intValue"] == 48
    assert harbour["corpus"]["text"] == "harbour" and harbour["queries"]["intValue"] == 1
    assert fixture["ndcg@k"]["floatValue"] != harbour["ndcg@k"]["floatValue"]


def test_a_second_embedders_run_leaves_the_first_up_to_date(webserver):
    data = _graphql(webserver[0], """{ assetNodes(assetKeys: [{path: ["fixture", "eval_run"]}, {path: ["fixture", "chunk_index"]}]) {
                                         assetKey { path } staleStatus(partition: "hash") } }""")
    assert {"/".join(n["assetKey"]["path"]): n["staleStatus"] for n in data["assetNodes"]} == {
        "fixture/eval_run": "FRESH", "fixture/chunk_index": "FRESH"}


def test_graphql_shows_the_latest_eval_run_metadata(webserver):
    data = _graphql(
        webserver[0],
        """{ assetOrError(assetKey: {path: ["fixture", "eval_run"]}) { ... on Asset {
              assetMaterializations(partitions: ["hash"], limit: 1) { partition metadataEntries { label
                ... on FloatMetadataEntry { floatValue } ... on MarkdownMetadataEntry { mdStr } } } } } }""",
    )
    [event] = data["assetOrError"]["assetMaterializations"]
    assert event["partition"] == "hash"
    entries = {e["label"]: e for e in event["metadataEntries"]}
    assert list(entries)[:3] == ["recall@k", "mrr", "ndcg@k"]
    assert 0.0 < entries["mrr"]["floatValue"] <= 1.0
    assert entries["recall@k"]["floatValue"] >= 0.85 and entries["default/mmr/recall@k"]["floatValue"] == entries["recall@k"]["floatValue"]
    assert "| mmr | conceptual |" in entries["by_kind"]["mdStr"]


def test_passing_runs_show_their_checks_passed_and_no_partition_reads_skipped(webserver):
    """The partitions that ran (hash, minilm) show every check succeeded; bge-small, never requested, shows nothing."""
    data = _graphql(webserver[0], """{ assetNodes(assetKeys: [{path: ["fixture", "eval_run"]}, {path: ["fixture", "chunk_index"]}]) {
        assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name partitionStatuses {
          ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions skippedPartitions executionFailedPartitions }
        } } } } } }""")
    statuses = {(n["assetKey"]["path"][-1], c["name"]): c["partitionStatuses"]
                for n in data["assetNodes"] for c in n["assetChecksOrError"]["checks"]}
    assert set(statuses) == {("eval_run", "quality_floors"), ("eval_run", "no_regression"), ("chunk_index", "index_consistent")}
    for check, status in statuses.items():
        assert sorted(status["succeededPartitions"]) == ["hash", "minilm"], check
        assert status["failedPartitions"] == status["skippedPartitions"] == status["executionFailedPartitions"] == [], check


def test_the_main_command_exits_non_zero_when_a_blocking_check_fails(webserver):
    _, _, env = webserver
    failed = subprocess.run([str(BIN / "dg"), "launch", "--job", "evaluate_embedders", "--partition", "hash",
                             "--config-json", json.dumps({"ops": {"fixture__eval_run": {"config": {"min_recall": 1.01}}}})],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    assert "quality_floors" in failed.stdout + failed.stderr

