"""Every corpus its own: the registry's bad input, and real processes launched at once on two
corpora and on one corpus, each giving the numbers of its solo run, every history row, stored
value and run tag keyed by its corpus."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from retrieval_assets import partitions, pg
from retrieval_assets.corpus import registry
from retrieval_assets.defs.instance import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFIX = "t_corp_"
DATABASE = "t_corp_dagster"


def _drop_prefixed(dsn: str) -> None:
    with pg.connect(dsn) as conn:
        for (name,) in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,)).fetchall():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _harbour(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tides.md").write_text("# Tides\n\nSpring tides follow the full moon and the new moon.\n")
    (root / "ferry.md").write_text("# Ferry\n\nThe ferry leaves the harbour at dawn every day.\n")
    (root / "golden.yaml").write_text(yaml.safe_dump([
        {"query_id": "h1", "kind": "factual", "query": "when does the ferry leave", "doc_id": "ferry", "anchor": "at dawn"},
        {"query_id": "h2", "kind": "lexical", "query": "spring tides", "doc_id": "tides", "anchor": "full moon"}]))
    return root


# --- the registry ------------------------------------------------------------------------------

@pytest.fixture
def schema(pg_dsn):
    _drop_prefixed(pg_dsn)
    yield PREFIX + partitions.HISTORY
    _drop_prefixed(pg_dsn)


def test_registering_is_idempotent_and_refuses_taken_names_folders_and_bad_names(pg_dsn, schema, tmp_path):
    a, b = _harbour(tmp_path / "a"), _harbour(tmp_path / "b")
    with pg.connect(pg_dsn) as conn:
        assert registry.add(conn, schema, "harbour", a) == (registry.Corpus("harbour", str(a.resolve())), True)
        assert registry.add(conn, schema, "harbour", a)[1] is False
        for name, path, words in [("harbour", b, "corpus harbour is registered with the folder"),
                                  ("other", a, "corpus harbour is registered with the folder"),
                                  ("Harbour", b, "use 1 to 24 lowercase letters"), ("a__b", b, "no double underscore"),
                                  ("gone", tmp_path / "nope", "is not a folder"), ("fixture", b, "fixture corpus")]:
            with pytest.raises(registry.CorpusNameError, match=words) as caught:
                registry.add(conn, schema, name, path)
            assert name in str(caught.value) and "\n" not in str(caught.value)
        assert [c.name for c in registry.listed(conn, schema)] == ["fixture", "harbour"]


def test_removing_drops_only_that_corpus(pg_dsn, schema, tmp_path):
    with pg.connect(pg_dsn) as conn:
        registry.add(conn, schema, "harbour", _harbour(tmp_path / "a"))
        registry.add(conn, schema, "harbour_two", _harbour(tmp_path / "b"))
        for name in ("harbour__hash", "harbour__cli_hash", "harbour_two__hash", "hash"):
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(PREFIX + name)))
        assert registry.remove(conn, schema, "harbour", PREFIX) == [PREFIX + "harbour__cli_hash", PREFIX + "harbour__hash"]
        left = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (PREFIX,))}
        assert {PREFIX + "harbour_two__hash", PREFIX + "hash"} <= left and PREFIX + "harbour__hash" not in left
        assert [c.name for c in registry.listed(conn, schema)] == ["fixture", "harbour_two"]
        with pytest.raises(registry.CorpusNameError, match="no corpus named 'harbour'"):
            registry.remove(conn, schema, "harbour", PREFIX)
        with pytest.raises(registry.CorpusNameError, match="cannot be removed"):
            registry.remove(conn, schema, "fixture", PREFIX)


def test_the_corpus_command_asks_before_it_drops(pg_dsn, schema, tmp_path):
    env = {**os.environ, "RETRIEVAL_DSN": pg_dsn, partitions.PREFIX_VARIABLE: PREFIX}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "retrieval_assets", "corpus", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    assert cli("add", "harbour", str(_harbour(tmp_path / "a"))).returncode == 0
    taken = cli("add", "harbour", str(tmp_path))
    assert taken.returncode == 2 and taken.stderr.count("\n") == 1 and "corpus harbour" in taken.stderr
    dry = cli("remove", "harbour")
    assert dry.returncode == 0 and "nothing dropped: add --yes" in dry.stdout
    assert "harbour" in cli("list").stdout
    assert cli("remove", "harbour", "--yes").returncode == 0
    assert "harbour" not in cli("list").stdout


# --- real processes at once ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def launcher(pg_dsn, tmp_path_factory):
    """``dg launch`` in subprocesses on this module's schemas and Dagster database, with two corpora registered."""
    _drop_prefixed(pg_dsn)
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env.update(RETRIEVAL_DSN=pg_dsn, RETRIEVAL_SCHEMA_PREFIX=PREFIX, RETRIEVAL_HOME=str(tmp_path_factory.mktemp("home")),
               DAGSTER_PG_URL=sqlalchemy_url({**conninfo_to_dict(pg_dsn), "dbname": DATABASE}))
    with pg.connect(pg_dsn) as conn:
        registry.add(conn, PREFIX + partitions.HISTORY, "harbour", _harbour(tmp_path_factory.mktemp("harbour")))

    def start(job: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "dg"), "launch", "--job", job, "--partition", "hash"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    yield start
    _drop_prefixed(pg_dsn)
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


def _finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out[-3000:]
    return out


def _runs(dsn: str) -> dict[str, tuple]:
    """Per run id of the eval_runs history: (corpus, queries, the default pipeline's recall, MRR, nDCG)."""
    with pg.connect(dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT run_id, corpus, queries, recall_at_k, mrr, ndcg_at_k FROM {} WHERE pipeline = 'mmr'").format(
            sql.Identifier(PREFIX + partitions.HISTORY, "eval_runs"))).fetchall()
    return {r[0]: r[1:] for r in rows}


def _run_id(output: str) -> str:
    return next(line.split(" - ")[4] for line in output.splitlines() if "__eval_run - " in line)


@pytest.mark.slow
def test_two_corpora_and_one_corpus_launched_at_once_each_give_their_solo_numbers(launcher, pg_dsn):
    solo = {}
    for job in ("evaluate_embedders", "evaluate_embedders__harbour"):
        run_id = _run_id(_finish(launcher(job)))
        solo[job] = _runs(pg_dsn)[run_id]
    assert solo["evaluate_embedders"][:2] == ("fixture", 48) and solo["evaluate_embedders__harbour"][:2] == ("harbour", 2)

    for jobs in (("evaluate_embedders", "evaluate_embedders__harbour"), ("evaluate_embedders", "evaluate_embedders")):
        with ThreadPoolExecutor(2) as pool:
            outputs = list(pool.map(lambda p: _finish(p), [launcher(job) for job in jobs]))
        history = _runs(pg_dsn)
        for job, output in zip(jobs, outputs):
            assert history[_run_id(output)] == solo[job], (job, output[-2000:])

    with pg.connect(pg_dsn) as conn:
        keys = [r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT asset_key FROM {}").format(
            sql.Identifier(PREFIX + partitions.IO_VALUES, partitions.IO_TABLE)))]
        assert keys and all(k.split("/")[0] in ("fixture", "harbour") for k in keys)
        queries = conn.execute(sql.SQL("SELECT DISTINCT corpus FROM {}").format(
            sql.Identifier(PREFIX + partitions.HISTORY, "eval_queries"))).fetchall()
        assert sorted(q[0] for q in queries) == ["fixture", "harbour"]
    with pg.connect(make_conninfo(pg_dsn, dbname=DATABASE)) as conn:
        tags = dict(conn.execute("SELECT r.run_id, t.value FROM runs r LEFT JOIN run_tags t ON t.run_id = r.run_id "
                                 "AND t.key = 'retrieval/corpus'").fetchall())
    assert len(tags) == 6 and all(tags.values())  # every run carries its corpus
    assert {tags[run] for run in _runs(pg_dsn)} == {"fixture", "harbour"}
    assert all(tags[run] == corpus for run, (corpus, *_) in _runs(pg_dsn).items())


@pytest.mark.slow
def test_a_registered_corpus_whose_folder_vanished_fails_in_one_line_and_changes_nothing(launcher, pg_dsn, tmp_path):
    with pg.connect(pg_dsn) as conn:
        folder = registry.get(conn, PREFIX + partitions.HISTORY, "harbour").path
    moved = tmp_path / "moved"
    os.rename(folder, moved)
    before = _runs(pg_dsn)
    try:
        process = launcher("evaluate_embedders__harbour")
        out, _ = process.communicate(timeout=300)
        assert process.returncode != 0
        assert f"corpus directory not found: {folder} (corpus harbour was registered with it" in out
        assert _runs(pg_dsn) == before
    finally:
        os.rename(moved, folder)
