"""Stage 01 on invented documents, plus properties on generated Markdown."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_assets import cli

from retrieval_assets.index import chunker
from retrieval_assets.index.chunker import CorpusError, chunk, load_documents
from retrieval_assets.types import Document


def doc(text: str, doc_id: str = "d") -> Document:
    return Document(doc_id=doc_id, title="t", text=text)


def fence_spans(text: str) -> list[tuple[int, int]]:
    """Independent fence finder: (start, end) of every fenced block, unclosed ones to the end."""
    spans, pos, opened = [], 0, None
    for raw in text.splitlines(keepends=True):
        line = raw.rstrip("\r\n")
        if opened is None:
            m = re.match(r"(`{3,}|~{3,})", line)
            if m:
                opened = (pos, m.group(1))
        elif line.rstrip() and set(line.rstrip()) == {opened[1][0]} and len(line.rstrip()) >= len(opened[1]):
            spans.append((opened[0], pos + len(line)))
            opened = None
        pos += len(raw)
    if opened:
        spans.append((opened[0], len(text.rstrip("\r\n"))))
    return spans


def check_invariants(d: Document, chunks) -> None:
    for i, c in enumerate(chunks):
        assert c.chunk_id == f"{d.doc_id}#{i:03d}"
        assert d.text[c.start_char : c.end_char] == c.text
        assert c.doc_id == d.doc_id
    covered = bytearray(len(d.text))
    for c in chunks:
        covered[c.start_char : c.end_char] = b"\x01" * (c.end_char - c.start_char)
    missing = [i for i, ch in enumerate(d.text) if not ch.isspace() and not covered[i]]
    assert not missing, f"uncovered characters at {missing[:5]}"
    for start, end in fence_spans(d.text):
        assert any(c.start_char <= start and end <= c.end_char for c in chunks), "a fence was split"


def test_heading_paths_follow_open_headings():
    text = "intro line\n\n# Title\n\npara\n\n## Section A\n\na\n\n### Sub A.1\n\nx\n\n## Section B\n\nb\n"
    chunks = chunk(doc(text), max_chars=1200)
    paths = [c.heading_path for c in chunks]
    assert paths == ["", "Title", "Title > Section A", "Title > Section A > Sub A.1", "Title > Section B"]
    assert chunks[0].text == "intro line"
    assert chunks[2].text == "## Section A\n\na"


def test_heading_needs_a_space_and_six_levels_nest():
    text = "# T\n\n#hashtag is text\n\n###### Deep\n\nleaf\n\n####### seven is text\n"
    chunks = chunk(doc(text))
    assert [c.heading_path for c in chunks] == ["T", "T > Deep"]
    assert "#hashtag is text" in chunks[0].text
    assert "####### seven is text" in chunks[1].text


def test_greedy_packing_without_overlap():
    blocks = ["a" * 40, "b" * 40, "c" * 40, "d" * 40]
    text = "\n\n".join(blocks)
    chunks = chunk(doc(text), max_chars=100, overlap=0)
    assert [c.text for c in chunks] == ["a" * 40 + "\n\n" + "b" * 40, "c" * 40 + "\n\n" + "d" * 40]


def test_overlap_carries_one_block_when_room_remains():
    blocks = ["a" * 30, "b" * 30, "c" * 30, "d" * 30]
    text = "\n\n".join(blocks)
    chunks = chunk(doc(text), max_chars=70, overlap=1)
    # [a b] then carry b: [b c] then carry c: [c d]
    assert [c.text.replace("\n\n", "|") for c in chunks] == ["a" * 30 + "|" + "b" * 30, "b" * 30 + "|" + "c" * 30, "c" * 30 + "|" + "d" * 30]


def test_overlap_is_dropped_when_carried_block_leaves_no_room():
    text = "a" * 30 + "\n\n" + "b" * 60 + "\n\n" + "c" * 60
    chunks = chunk(doc(text), max_chars=100, overlap=1)
    # [a b]; carrying b (60) + c (60) would not fit, so the next chunk starts with c
    assert [c.text[:1] for c in chunks] == ["a", "c"]


def test_a_chunk_never_spans_two_sections():
    text = "# A\n\nshort\n\n# B\n\nshort too\n"
    chunks = chunk(doc(text), max_chars=1200)
    assert [c.heading_path for c in chunks] == ["A", "B"]


def test_long_fence_is_one_oversized_chunk_with_blank_and_hash_lines():
    body = "\n".join(f"# comment {i}\n\nSELECT {i};" for i in range(120))
    text = f"# T\n\nbefore\n\n```sql\n{body}\n```\n\nafter\n"
    assert len(body) > 2000
    chunks = chunk(doc(text), max_chars=1200)
    fences = [c for c in chunks if c.text.startswith("```sql")]
    assert len(fences) == 1 and fences[0].text.endswith("```") and len(fences[0].text) > 2000
    assert all(c.heading_path == "T" for c in chunks)
    check_invariants(doc(text), chunks)


def test_tilde_fence_and_unclosed_fence_at_end():
    text = "# T\n\n~~~\n# not a heading\n```\nstill inside\n~~~\n\n```python\n\n# open to the end\nx = 1\n"
    chunks = chunk(doc(text), max_chars=20)
    assert [c.heading_path for c in chunks] == ["T", "T", "T"]
    assert chunks[1].text.startswith("~~~") and chunks[1].text.endswith("~~~")
    assert chunks[2].text == "```python\n\n# open to the end\nx = 1"


def test_long_block_is_never_split():
    text = "# T\n\n" + "word " * 500 + "\n\nshort\n"
    chunks = chunk(doc(text), max_chars=200)
    assert len(chunks[1].text) > 200 and chunks[1].text.startswith("word")


def test_crlf_keeps_exact_offsets():
    text = "# Title\r\n\r\npara one\r\nline two\r\n\r\n## Next\r\n\r\n```\r\ncode\r\n\r\nmore\r\n```\r\n"
    d = doc(text)
    chunks = chunk(d, max_chars=25)
    check_invariants(d, chunks)
    assert [c.heading_path for c in chunks][-1] == "Title > Next"
    assert all(not c.text.endswith("\r") for c in chunks)


def test_empty_and_blank_documents_have_no_chunks():
    assert chunk(doc("")) == []
    assert chunk(doc("\n \n\t\n")) == []


def test_bad_parameters_are_rejected():
    with pytest.raises(ValueError, match="max_chars"):
        chunk(doc("x"), max_chars=0)
    with pytest.raises(ValueError, match="overlap"):
        chunk(doc("x"), overlap=-1)


def test_load_documents_order_titles_bom_and_errors(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "stories").mkdir()
    (tmp_path / "docs" / "b.md").write_text("```\n# fenced\n```\n\n# Real Title\n\ntext\n")
    (tmp_path / "docs" / "a.md").write_bytes("\ufeff# Alpha\r\n\r\nbody\r\n".encode())
    (tmp_path / "stories" / "s.txt").write_text("\n\nThe Story\n\nOnce.\n")
    (tmp_path / "docs" / "empty.md").write_text("")
    docs = load_documents(tmp_path)
    assert [d.doc_id for d in docs] == ["a", "b", "empty", "s"]
    assert [d.title for d in docs] == ["Alpha", "Real Title", "empty", "The Story"]
    assert docs[0].text.startswith("# Alpha\r\n")
    assert chunk(docs[2]) == []

    (tmp_path / "docs" / "latin1.md").write_bytes("# caf\xe9\n".encode("latin-1"))
    with pytest.raises(CorpusError, match="latin1.md"):
        load_documents(tmp_path)
    with pytest.raises(CorpusError, match="nowhere"):
        load_documents(tmp_path / "nowhere")


def test_chunk_stats_command_prints_the_corpus_statistics(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n" + "\n\n".join("word " * 30 for _ in range(6)) + "\n")
    (tmp_path / "docs" / "b.md").write_text("# B\n\nshort\n\n```\n" + "x = 1\n" * 80 + "```\n")
    assert cli.main(["chunk-stats", "--corpus", str(tmp_path), "--max-chars", "200", "--overlap", "0"]) == 0
    printed = json.loads(capsys.readouterr().out)
    documents = load_documents(tmp_path)
    assert printed == chunker.stats(documents, max_chars=200, overlap=0)
    assert printed["documents"] == 2 and printed["oversized_chunks"] == 1
    assert printed["chunks"] == sum(len(chunk(d, max_chars=200, overlap=0)) for d in documents)

    assert cli.main(["chunk-stats", "--corpus", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "corpus directory not found" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["chunk-stats", "--corpus", str(tmp_path), "--max-chars", "0"]) == 2
    assert "max_chars" in capsys.readouterr().err


# --- properties on generated Markdown -------------------------------------------------------

_word = st.text(alphabet="abcdefghij #*`~-", min_size=1, max_size=12)
_para = st.lists(_word, min_size=1, max_size=30).map(" ".join)
_heading = st.tuples(st.integers(1, 6), _para).map(lambda t: "#" * t[0] + " " + t[1])
_fence = st.tuples(st.sampled_from(["```", "~~~", "````"]), st.lists(st.one_of(_para, _heading, st.just("")), max_size=8)).map(
    lambda t: "\n".join([t[0] + "py", *t[1], t[0]])
)
_unclosed = st.lists(st.one_of(_para, st.just("")), max_size=4).map(lambda lines: "\n".join(["```", *lines]))
_markdown = st.tuples(
    st.lists(st.one_of(_para, _heading, _fence), max_size=25),
    st.one_of(st.just(""), _unclosed),
    st.sampled_from(["\n", "\r\n"]),
    st.sampled_from(["\n\n", "\n", "\n\n\n"]),
).map(lambda t: (t[3].join(t[0]) + ("\n\n" + t[1] if t[1] else "")).replace("\n", t[2]))


@settings(max_examples=300, deadline=None)
@given(text=_markdown, max_chars=st.integers(20, 400), overlap=st.integers(0, 2))
def test_properties_on_generated_markdown(text, max_chars, overlap):
    d = doc(text, doc_id="gen")
    chunks = chunk(d, max_chars=max_chars, overlap=overlap)
    check_invariants(d, chunks)
    assert chunk(d, max_chars=max_chars, overlap=overlap) == chunks
    for c in chunks:
        if len(c.text) > max_chars:  # only a single block may exceed the budget
            assert "\n\n" not in c.text.replace("\r\n", "\n") or c.text.lstrip().startswith(("```", "~~~", "````"))
