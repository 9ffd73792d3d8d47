"""The UI as a user sees it: the webserver's GraphQL API lists the assets, their partitions and
the metadata of the latest eval_run, after a materialisation from the command line."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from psycopg import sql

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.slow
PREFIX = "t_web_"  # the webserver run's schemas, never the unprefixed ones


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
    home = tmp_path_factory.mktemp("dagster_home")
    env = dict(os.environ, DAGSTER_HOME=str(home), RETRIEVAL_DSN=pg_dsn, RETRIEVAL_SCHEMA_PREFIX=PREFIX)
    subprocess.run(
        [sys.executable, "-m", "dagster", "asset", "materialize", "-m", "retrieval_assets.definitions", "--select", "group:retrieval", "--partition", "hash"],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=300,
    )
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster_webserver", "-m", "retrieval_assets.definitions", "-h", "127.0.0.1", "-p", str(port)],
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
        yield port
    finally:
        proc.terminate()
        proc.wait(30)
        with __import__("retrieval_assets.pg", fromlist=["connect"]).connect(pg_dsn) as conn:
            for schema in ("hash", "whatif_hash", "retrieval_history"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(PREFIX + schema)))


def test_graphql_lists_assets_and_partitions(webserver):
    data = _graphql(webserver, "{ assetNodes { assetKey { path } groupName partitionKeys kinds } }")
    nodes = {"/".join(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    assert set(nodes) == {"documents", "chunks", "golden_queries", "chunk_index", "eval_run", "failure_report", "embedder_comparison", "answers", "cranfield_report"}
    assert nodes["eval_run"]["partitionKeys"] == ["hash", "minilm", "bge-small"]
    assert nodes["documents"]["partitionKeys"] == []
    assert {n["groupName"] for k, n in nodes.items() if k not in ("answers", "cranfield_report")} == {"retrieval"}
    assert nodes["cranfield_report"]["groupName"] == "benchmark"
    assert nodes["answers"]["groupName"] == "live"
    assert "postgres" in nodes["chunk_index"]["kinds"]


def test_graphql_shows_the_latest_eval_run_metadata(webserver):
    data = _graphql(
        webserver,
        """{ assetOrError(assetKey: {path: ["eval_run"]}) { ... on Asset {
              assetMaterializations(limit: 1) { partition metadataEntries { label
                ... on FloatMetadataEntry { floatValue } ... on MarkdownMetadataEntry { mdStr } } } } } }""",
    )
    [event] = data["assetOrError"]["assetMaterializations"]
    assert event["partition"] == "hash"
    entries = {e["label"]: e for e in event["metadataEntries"]}
    assert 0.0 < entries["mmr/mrr"]["floatValue"] <= 1.0
    assert entries["mmr/recall@k"]["floatValue"] >= 0.85
    assert "| mmr | conceptual |" in entries["by_kind"]["mdStr"]
