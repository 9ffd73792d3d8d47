"""The regression gate's statistics against independent computations, and the history's migration."""

import numpy as np
import pytest
from psycopg import sql
from scipy import stats

from retrieval_assets import pg

from retrieval_assets.evaluation import history, regression
from retrieval_assets.evaluation.evaluate import Evaluation, QueryResult
from retrieval_assets.params import DEFAULT
from retrieval_assets.types import Metrics

DIFFS = np.array([-0.31, -0.12, 0.0, 0.05, -0.4, -0.22, 0.1, -0.05, -0.18, 0.0, -0.27, 0.02])


def test_paired_bootstrap_mean_and_interval_match_numpy_and_scipy():
    mean, low, high = regression.paired_bootstrap(DIFFS, resamples=20_000, seed=7)
    assert mean == pytest.approx(np.mean(DIFFS), abs=1e-12)
    # the same resampling written as a plain loop over the same generator: identical figures
    rng = np.random.default_rng(7)
    idx = rng.integers(0, len(DIFFS), size=(20_000, len(DIFFS)))
    loop = [np.mean([DIFFS[i] for i in row]) for row in idx]
    assert (low, high) == pytest.approx(tuple(np.percentile(loop, [2.5, 97.5])), abs=1e-12)
    # scipy's percentile bootstrap (its own resampling): the same interval within Monte Carlo error
    ref = stats.bootstrap((DIFFS,), np.mean, n_resamples=20_000, method="percentile", confidence_level=0.95,
                          random_state=np.random.default_rng(1)).confidence_interval
    assert low == pytest.approx(ref.low, abs=0.01) and high == pytest.approx(ref.high, abs=0.01)
    assert high < 0  # these fixed numbers are a real drop
    assert regression.paired_bootstrap(np.array([])) == (0.0, 0.0, 0.0)
    assert regression.paired_bootstrap(np.zeros(5)) == (0.0, 0.0, 0.0)


def _evaluation(ndcg_hits: dict[str, int | None], k: int = 10) -> Evaluation:
    """An evaluation whose queries have one relevant chunk 'r' at the given rank (None: missed)."""
    queries = []
    for qid, rank in ndcg_hits.items():
        ranked = [f"x{i}" for i in range(k)]
        if rank is not None:
            ranked[rank - 1] = "r"
        queries.append(QueryResult(qid, "factual", ("r",), {p: tuple(ranked) for p in ("hybrid", "rerank", "mmr")}, rank, rank, 0.01,
                                   {"vector": rank, "text": rank, "fused": rank, "reranked": rank, "final": rank}))
    m = Metrics(k, len(queries), 0.5, 0.05, 0.5, 0.5)
    return Evaluation(DEFAULT.with_(k=k), {"hybrid": m, "rerank": m, "mmr": m}, 0.9, queries)


@pytest.fixture()
def schema(pg_dsn):
    name = "t_regression_history"
    with pg.connect(pg_dsn) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
        yield conn, name
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _record(conn, schema, run_id, ranks, corpus="fixture", hashes=None):
    history.record_run(conn, schema, _evaluation(ranks), run_id=run_id, partition="hash", embedder="hash-256", corpus_hash="c",
                       code_version="2", corpus=corpus, doc_hashes=hashes or {q: "same" for q in ranks})


def test_compare_names_worse_and_better_queries_with_their_ranks(schema):
    conn, name = schema
    before = {f"q{i}": 1 for i in range(12)}
    _record(conn, name, "run-a", before)
    verdict = regression.compare(conn, name, "run-a", partition="hash", corpus="fixture")
    assert verdict.passed and verdict.reason.startswith("no baseline")
    after = {**before, **{f"q{i}": None for i in range(8)}, "q11": 1}
    _record(conn, name, "run-b", after)
    verdict = regression.compare(conn, name, "run-b", partition="hash", corpus="fixture")
    assert not verdict.passed and verdict.baseline == "run-a" and verdict.paired == 12
    assert verdict.mean == pytest.approx(-8 / 12)
    assert [(c.query_id, c.rank_before, c.rank_after) for c in verdict.worse] == [(f"q{i}", 1, None) for i in range(8)]
    assert "| q0 | factual | 1 | - | 1.000 | 0.000 | -1.000 |" in regression.render_changes(verdict.worse)
    assert verdict.better == []
    # another corpus never serves as baseline
    _record(conn, name, "run-c", before, corpus="handbook")
    assert regression.compare(conn, name, "run-c", partition="hash", corpus="handbook").reason.startswith("no baseline")
    # changed documents are left out, and said so
    _record(conn, name, "run-d", before, hashes={**{q: "same" for q in before}, "q0": "edited"})
    verdict = regression.compare(conn, name, "run-d", partition="hash", corpus="fixture")
    assert verdict.passed and verdict.paired == 11 and verdict.excluded == ("q0",) and "1 left out" in verdict.reason
    assert [c.query_id for c in verdict.better] == [f"q{i}" for i in range(1, 8)]


def test_an_old_history_table_is_migrated_and_read(schema):
    conn, name = schema
    conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
    old = {c: t for c, t in history.COLUMNS.items() if c != "corpus"}  # the table as the first version wrote it
    conn.execute(sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, {}, created_at timestamptz DEFAULT now())").format(
        sql.Identifier(name, "eval_runs"), sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t)) for c, t in old.items())))
    conn.execute(sql.SQL("INSERT INTO {} (run_id, partition, embedder, pipeline, k, mrr, recall_at_k, ndcg_at_k, precision_at_k, pool_recall) "
                         "VALUES ('old', 'hash', 'hash-256', 'mmr', 10, 0.6, 0.8, 0.7, 0.1, 0.9)").format(sql.Identifier(name, "eval_runs")))
    [row] = history.latest_runs(conn, name)
    assert row["run_id"] == "old" and row["mrr"] == 0.6  # read as the fixture's
    _record(conn, name, "new", {"q1": 1})
    assert regression.compare(conn, name, "new", partition="hash", corpus="fixture").reason.startswith("no baseline")
    assert {r["run_id"] for r in history.trend(conn, name)} == {"old", "new"}
