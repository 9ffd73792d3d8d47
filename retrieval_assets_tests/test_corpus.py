"""Stage 01 on the fixture corpus, and the golden-set loader."""

from collections import Counter

import pytest
import yaml

from retrieval_assets.index.chunker import chunk, load_documents
from retrieval_assets.corpus.golden import KINDS, GoldenError, load_golden, normalise, relevant
from retrieval_assets_tests.conftest import CORPUS
from retrieval_assets_tests.test_chunker import check_invariants, fence_spans

DOCS = load_documents(CORPUS)
GOLDEN = load_golden(CORPUS / "golden.yaml", DOCS)


def test_corpus_shape():
    stories = [d for d in DOCS if (CORPUS / "stories" / f"{d.doc_id}.txt").exists()]
    assert len(DOCS) == 32 and len(stories) == 3
    assert 200_000 <= sum(len(d.text) for d in DOCS) <= 400_000
    assert all(8_000 <= len(d.text) <= 20_000 for d in stories)


def test_corpus_exercises_the_chunker():
    texts = {d.doc_id: d.text for d in DOCS}
    assert any(end - start > 2000 for t in texts.values() for start, end in fence_spans(t))
    assert any("\n~~~" in t for t in texts.values())
    assert any("\r\n" in t for t in texts.values())
    assert any(not t.lstrip().startswith("#") and "\n# " in t for t in list(texts.values())[:29])
    assert any("\n###### " in t for t in texts.values())
    unclosed = [d for d in DOCS if fence_spans(d.text) and fence_spans(d.text)[-1][1] == len(d.text.rstrip("\r\n"))
                and not d.text.rstrip().endswith(("```", "~~~"))]
    assert unclosed, "no document ends inside an unclosed fence"


def test_chunks_on_the_corpus_keep_every_invariant_and_are_deterministic():
    for d in DOCS:
        chunks = chunk(d)
        check_invariants(d, chunks)
        assert chunk(d) == chunks
    assert len({c.chunk_id for d in DOCS for c in chunk(d)}) == sum(len(chunk(d)) for d in DOCS)


def test_every_anchor_lies_inside_a_chunk_of_its_document():
    chunks = [c for d in DOCS for c in chunk(d)]
    for q in GOLDEN:
        assert relevant(chunks, q), f"{q.query_id}: anchor split across chunks"


def test_golden_set_composition():
    assert len(GOLDEN) == 48
    assert Counter(q.kind for q in GOLDEN) == {k: 16 for k in KINDS}
    assert [q.query_id for q in GOLDEN] == [f"q{i:02d}" for i in range(1, 49)]
    story_ids = {p.stem for p in (CORPUS / "stories").glob("*.txt")}
    assert sum(q.doc_id in story_ids for q in GOLDEN) >= 6
    assert all(3 <= len(q.anchor.split()) <= 15 for q in GOLDEN)
    off = yaml.safe_load((CORPUS / "off_corpus.yaml").read_text())
    assert len(off) == 6 and all(isinstance(q, str) for q in off)


GOOD = {"query_id": "q01", "kind": "factual", "query": "what is x", "doc_id": "d", "anchor": "alpha beta gamma"}


@pytest.mark.parametrize(
    "entries, message",
    [
        ([{**GOOD, "kind": "vibes"}], "query q01: unknown kind 'vibes'"),
        ([{k: v for k, v in GOOD.items() if k != "anchor"}], "query q01: missing field 'anchor'"),
        ([GOOD, {**GOOD}], "query q01: duplicate query_id"),
        ([{**GOOD, "doc_id": "nope"}], "query q01: doc_id 'nope' is not a document"),
        ([{**GOOD, "anchor": "delta epsilon"}], "query q01: anchor 'delta epsilon' does not occur in d"),
        ([{**GOOD, "query": "  "}], "query q01: empty field 'query'"),
        ({"not": "a list"}, "expected a list of queries"),
    ],
)
def test_golden_loader_errors_name_the_query(tmp_path, entries, message):
    from retrieval_assets.types import Document

    path = tmp_path / "golden.yaml"
    path.write_text(yaml.safe_dump(entries))
    with pytest.raises(GoldenError) as err:
        load_golden(path, [Document("d", "D", "Alpha  BETA\ngamma text")])
    assert message in str(err.value) and str(path) in str(err.value)


def test_golden_loader_file_errors(tmp_path):
    with pytest.raises(GoldenError, match="not found"):
        load_golden(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("- [unclosed")
    with pytest.raises(GoldenError, match="not valid YAML"):
        load_golden(tmp_path / "bad.yaml")


def test_anchor_match_is_case_and_whitespace_insensitive():
    assert normalise("  A\r\n  b\tC ") == "a b c"
