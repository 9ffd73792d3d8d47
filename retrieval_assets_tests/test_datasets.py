"""Benchmark loaders (Cranfield SMART, BEIR folders, datasets.py) and their evaluation (benchmark.py).

Small fixture files are written in tmp_path; the real Cranfield data is read in place from
``$CRANFIELD_DIR`` or ``../shared/benchmarks/cranfield`` and those tests skip when it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from retrieval_assets.corpus import datasets

from retrieval_assets.evaluation import benchmark
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.types import Document

CRANFIELD = datasets.DEFAULT_CRANFIELD  # $CRANFIELD_DIR, else ../shared/benchmarks/cranfield

DOCS = """\
.I 1
.T
flow past a flat
plate .
.A
smith,j.
.B
j. ae. sci. 1, 1958, 1.
.W
flow past a flat
plate .
  the boundary layer on a flat plate
is computed .
  results agree with
experiment .
.I 2
.T
heat transfer in slabs .
.A
jones,k.
.B
naca tn 1.
.W
heat transfer in slabs .
  composite slabs conduct heat .
.A
this line lost its field marker .
.I 3
.T
.A
.B
.W
"""

QUERIES = """\
.I 001
.W
what is the boundary layer
on a flat plate .
.I 002
.W
how do slabs conduct heat .
.I 004
.W
experiments on plates .
"""

# positions 1..3, not the .I labels 001, 002, 004; -1 = no interest
QRELS = """\
1 1 1
1 2 -1
2 2 2
3 1 4
3 2 -1

"""


def write_cranfield(root: Path, docs: str = DOCS, queries: str = QUERIES, qrels: str = QRELS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cran.all.1400").write_text(docs)
    (root / "cran.qry").write_text(queries)
    (root / "cranqrel").write_text(qrels)
    return root


def test_cranfield_fixture_documents(tmp_path):
    bench = datasets.load_cranfield(write_cranfield(tmp_path / "cran"), strip_title=True)
    assert [d.doc_id for d in bench.documents] == ["1", "2", "3"]
    first = bench.documents[0]
    assert first.title == "flow past a flat plate ."
    # strip_title drops the abstract's repeat of the title; indented lines open paragraphs
    assert first.text == (
        "# flow past a flat plate .\n\nthe boundary layer on a flat plate is computed .\n\nresults agree with experiment ."
    )
    # as distributed (the default): the abstract keeps its first line, the title again
    distributed = datasets.load_cranfield(write_cranfield(tmp_path / "cran2")).documents[0]
    assert distributed.text.startswith("# flow past a flat plate .\n\nflow past a flat plate")
    assert distributed.text.endswith("results agree with experiment .")
    # a stray field marker after .W: its text stays in the abstract, the marker line is dropped
    assert bench.documents[1].text.endswith("composite slabs conduct heat . this line lost its field marker .")
    assert ".A" not in bench.documents[1].text
    assert bench.documents[2] == Document("3", "", "")
    # the documents go through our chunker
    chunks = benchmark.chunk_documents(bench.documents)
    assert {c.doc_id for c in chunks} == {"1", "2"}


def test_cranfield_query_numbering_trap(tmp_path):
    bench = datasets.load_cranfield(write_cranfield(tmp_path / "cran"))
    # queries are keyed by position, as cranqrel numbers them; the .I labels are kept aside
    assert list(bench.queries) == ["1", "2", "3"]
    assert bench.labels == {"1": "001", "2": "002", "3": "004"}
    assert bench.queries["1"] == "what is the boundary layer on a flat plate ."
    assert bench.queries["3"] == "experiments on plates ."  # .I 004 is the third query
    # grades: code c -> 5 - c; -1 -> 0 (judged, not relevant)
    assert bench.qrels == {"1": {"1": 4, "2": 0}, "2": {"2": 3}, "3": {"1": 1, "2": 0}}
    assert bench.relevant() == {"1": {"1"}, "2": {"2"}, "3": {"1"}}
    assert bench.relevant(min_grade=2) == {"1": {"1"}, "2": {"2"}}


def test_missing_cranfield_names_the_expected_path(tmp_path):
    missing = tmp_path / "nowhere" / "cranfield"
    with pytest.raises(datasets.DatasetError, match="expected .*nowhere/cranfield"):
        datasets.load_cranfield(missing)
    root = write_cranfield(tmp_path / "partial")
    (root / "cranqrel").unlink()
    with pytest.raises(datasets.DatasetError, match=f"expected {root / 'cranqrel'}"):
        datasets.load_cranfield(root)


@pytest.mark.parametrize(
    ("qrels", "message"),
    [
        ("1 1 1\n9 1 2\n", r"cranqrel:2: query position 9 is not in cran\.qry \(1\.\.3\)"),
        ("1 77 1\n", r"cranqrel:1: document 77 is not in cran\.all\.1400"),
        ("1 1\n", r"cranqrel:1: expected 'query_position doc_id code'"),
        ("1 1 x\n", r"cranqrel:1: relevance code 'x'"),
    ],
)
def test_bad_cranfield_qrels_name_file_and_line(tmp_path, qrels, message):
    with pytest.raises(datasets.DatasetError, match=message):
        datasets.load_cranfield(write_cranfield(tmp_path / "cran", qrels=qrels))


def test_text_before_first_record_is_an_error(tmp_path):
    with pytest.raises(datasets.DatasetError, match=r"cran\.all\.1400:1: text before the first \.I"):
        datasets.load_cranfield(write_cranfield(tmp_path / "cran", docs="stray\n" + DOCS))


def write_beir(root: Path) -> Path:
    (root / "qrels").mkdir(parents=True)
    corpus = [
        {"_id": "d1", "title": "Flat plates", "text": "Boundary layers on flat plates."},
        {"_id": "d2", "title": "", "text": "Heat in composite slabs."},
        {"_id": "d3", "title": "Rockets", "text": "Jet effects on surfaces.", "metadata": {}},
    ]
    queries = [{"_id": "q1", "text": "boundary layer"}, {"_id": "q2", "text": "slab  heat"}, {"_id": "q9", "text": "unjudged"}]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t2\nq1\td3\t0\nq2\td2\t1\nq2\tgone\t1\n")
    return root


def test_beir_folder(tmp_path):
    bench = datasets.load_beir(write_beir(tmp_path / "mini"))
    assert bench.name == "mini"
    assert [(d.doc_id, d.title, d.text) for d in bench.documents] == [
        ("d1", "Flat plates", "# Flat plates\n\nBoundary layers on flat plates."),
        ("d2", "", "Heat in composite slabs."),
        ("d3", "Rockets", "# Rockets\n\nJet effects on surfaces."),
    ]
    assert bench.queries == {"q1": "boundary layer", "q2": "slab heat"}  # only judged queries
    assert bench.qrels == {"q1": {"d1": 2, "d3": 0}, "q2": {"d2": 1, "gone": 1}}
    assert bench.relevant() == {"q1": {"d1"}, "q2": {"d2", "gone"}}


def test_beir_errors_name_the_path(tmp_path):
    with pytest.raises(datasets.DatasetError, match="expected .*absent"):
        datasets.load_beir(tmp_path / "absent")
    root = write_beir(tmp_path / "mini")
    with pytest.raises(datasets.DatasetError, match=f"expected {root / 'qrels' / 'dev.tsv'}"):
        datasets.load_beir(root, split="dev")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq7\td1\t1\n")
    with pytest.raises(datasets.DatasetError, match=r"test\.tsv:2: query q7 is not in queries\.jsonl"):
        datasets.load_beir(root)
    (root / "corpus.jsonl").write_text('{"_id": "d1"}\n{oops\n')
    with pytest.raises(datasets.DatasetError, match=r"corpus\.jsonl:2: not valid JSON"):
        datasets.load_beir(root)


def test_to_documents_keeps_each_document_at_its_best_chunk():
    chunk_doc = {"a#000": "a", "a#001": "a", "b#000": "b", "c#000": "c"}
    assert benchmark.to_documents(["a#001", "b#000", "a#000", "zz", "c#000"], chunk_doc, 10) == ["a", "b", "c"]
    assert benchmark.to_documents(["a#001", "b#000", "c#000"], chunk_doc, 2) == ["a", "b"]


def test_evaluate_rankers_matches_pytrec_eval_on_fixed_runs(tmp_path):
    bench = datasets.load_cranfield(write_cranfield(tmp_path / "cran"))
    runs = {"1": ["2", "1"], "2": [], "3": ["3", "2", "1"]}
    scores = benchmark.evaluate_rankers(bench, {"fixed": lambda q: runs[{v: k for k, v in bench.queries.items()}[q]]}, k=2, depth=3)
    s = scores["fixed"]
    assert s.queries == 3
    assert s.mrr == pytest.approx((1 / 2 + 0 + 1 / 3) / 3)
    assert s.recall == pytest.approx(2 / 3)
    assert benchmark.trec_eval_check(bench, scores, k=2, depth=3) == {"fixed": pytest.approx(0.0, abs=1e-12)}


# --- the real Cranfield data -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cranfield():
    if not (CRANFIELD / "cran.all.1400").is_file():
        pytest.skip(f"Cranfield data not found at {CRANFIELD} (set CRANFIELD_DIR to its folder)")
    return datasets.load_cranfield(CRANFIELD)


def test_real_cranfield_counts_and_ids(cranfield):
    assert len(cranfield.documents) == 1400
    assert [d.doc_id for d in cranfield.documents[:3]] == ["1", "2", "3"]
    assert len(cranfield.queries) == 225
    assert sum(len(j) for j in cranfield.qrels.values()) == 1837
    rel = cranfield.relevant()
    assert len(rel) == 225 and sum(map(len, rel.values())) == 1612
    # the trap: the third query in cran.qry is .I 004, and cranqrel's "3" judges it
    assert cranfield.labels["1"] == "001" and cranfield.labels["3"] == "004" and cranfield.labels["225"] == "365"
    assert cranfield.queries["3"].startswith("what problems of heat conduction in composite slabs")
    assert rel["3"] == {"5", "6", "90", "91", "119", "144", "181", "399"}
    docs = {d.doc_id: d for d in cranfield.documents}
    assert "heat conduction into a double-layer slab" in docs["5"].title
    title = "experimental investigation of the aerodynamics of a wing in a slipstream ."
    assert docs["1"].text.startswith(f"# {title}\n\n{title}")  # as distributed: the abstract repeats the title
    stripped = {d.doc_id: d for d in datasets.load_cranfield(CRANFIELD, strip_title=True).documents}
    assert stripped["1"].text.startswith(f"# {title}\n\nan experimental study")
    assert sum(stripped[i].text != docs[i].text for i in docs) == 1396  # 4 abstracts do not repeat their title
    assert all(doc in docs for judged in cranfield.qrels.values() for doc in judged)


def test_pipeline_and_peer_on_a_cranfield_slice_agree_with_pytrec_eval(cranfield, conn, schema):
    """Index 200 documents with the hash embedder, run all rankers, recompute with pytrec_eval."""
    slice_docs = [d.doc_id for d in cranfield.documents[:200]]
    qids = [q for q, judged in cranfield.relevant().items() if judged & set(slice_docs)][:20]
    bench = cranfield.subset(slice_docs, qids)
    assert len(bench.documents) == 200 and len(bench.queries) == 20
    embedder = HashEmbedder()  # the module's schema is fresh (conftest drops it first)
    chunks, report = benchmark.index_benchmark(conn, schema, bench, embedder)
    assert {c.doc_id for c in chunks} <= set(slice_docs) and report.inserted == len(chunks)
    params = benchmark.CRANFIELD.with_(k=100, n=100)
    rankers = {**benchmark.our_rankers(conn, schema, embedder, chunks, params=params, depth=50),
               "bm25s": benchmark.bm25s_ranker(bench.documents, depth=50)}
    scores = benchmark.evaluate_rankers(bench, rankers, k=10, depth=50)
    names = [*benchmark.pipeline_names("ts_rank_cd"), *benchmark.pipeline_names("bm25", vector=False), "bm25s"]
    assert list(scores) == names == ["vector", "ts_rank_cd", "hybrid(ts_rank_cd)", "hybrid(ts_rank_cd) + rerank",
                                     "hybrid(ts_rank_cd) + rerank + MMR", "bm25", "hybrid(bm25)", "hybrid(bm25) + rerank",
                                     "hybrid(bm25) + rerank + MMR", "bm25s"]
    for s in scores.values():
        assert s.queries == 20 and 0 < s.ndcg <= 1 and 0 < s.recall <= 1 and 0 < s.mrr <= 1
        assert all(len(run) == len(set(run)) <= 50 for run in s.runs.values())
    diffs = benchmark.trec_eval_check(bench, scores, k=10, depth=50)
    assert max(diffs.values()) <= 1e-9, diffs
    # a re-index embeds nothing
    assert benchmark.index_benchmark(conn, schema, bench, embedder)[1].embedded == 0


def test_cranfield_report_asset_on_fixture_files(tmp_path, pg_dsn):
    import dagster as dg

    from retrieval_assets import pg
    from retrieval_assets.defs.benchmark import cranfield_report
    from retrieval_assets.defs.resources import PostgresResource

    root = write_cranfield(tmp_path / "cran")
    prefix = "t_datasets_asset_"
    try:
        result = dg.materialize(
            [cranfield_report], partition_key="hash",
            resources={"postgres": PostgresResource(dsn=pg_dsn, schema_prefix=prefix)},
            run_config={"ops": {"cranfield_report": {"config": {"data_dir": str(root), "n": 20, "depth": 3}}}},
        )
        assert result.success
        [event] = result.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
        assert meta["schema"] == prefix + "bench_cranfield_hash"
        assert meta["documents"] == 3 and meta["queries"] == 3 and meta["chunks"] == 2
        assert "| peer | bm25s | 3 |" in meta["table"] and "| hash | hybrid(bm25) + rerank + MMR | 3 |" in meta["table"]
        for name in (*benchmark.pipeline_names("ts_rank_cd"), *benchmark.pipeline_names("bm25", vector=False), "bm25s"):
            assert 0 <= meta[f"{name}/ndcg@10"] <= 1
        assert meta["max_diff_vs_pytrec_eval"] <= 1e-9
        # a missing data folder fails the run with a message naming the path
        bad = dg.materialize(
            [cranfield_report], partition_key="hash", raise_on_error=False,
            resources={"postgres": PostgresResource(dsn=pg_dsn, schema_prefix=prefix)},
            run_config={"ops": {"cranfield_report": {"config": {"data_dir": str(tmp_path / "missing")}}}},
        )
        assert not bad.success
        [failure] = [e for e in bad.all_events if e.is_step_failure]
        assert f"expected {tmp_path / 'missing'}" in failure.step_failure_data.error.to_string()
    finally:
        with pg.connect(pg_dsn) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{prefix}bench_cranfield_hash" CASCADE')
