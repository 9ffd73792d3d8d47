"""Issue 36, the files users hand us: golden.yaml (``golden.load_golden``) and a corpus folder
(``chunker.load_documents``), generated at random. Either they load, and what loaded is what the
rest of the pipeline needs (text fields, known kinds, unique ids, anchors that occur; UTF-8 text
without NUL, chunks that cut it exactly), or the error is ``GoldenError`` / ``CorpusError`` naming
the file (and the query id or field), short and printable, never another exception."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from retrieval_assets.corpus import golden
from retrieval_assets.index import chunker

SETTINGS = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MESSAGE_MAX = 600  # characters of an error message past the path it names


def _runs(alphabet) -> st.SearchStrategy[str]:
    return st.builds(lambda ch, n: ch * n, alphabet, st.integers(0, 20_000))


HUGE = st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "é", "q ", "\n"]), st.integers(1_000, 20_000))
TEXT = st.one_of(st.text(max_size=40), st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
                 _runs(st.sampled_from(["x", " ", "\n", "é", "\u0301", "'", '"', "\t", "-"])))
SCALAR = st.one_of(TEXT, st.integers(), st.integers(min_value=10**30), st.floats(), st.booleans(), st.none(),
                   st.dates(), st.datetimes(), st.binary(max_size=20))
VALUE = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=6)
# YAML written by hand for a value: tags whose constructor can fail, dates that do not exist, anchors, odd numbers
RAW = st.sampled_from(["!!int abc", "!!float x", "!!timestamp 2020-99-99", "!!timestamp x", "!!bool maybe", "2020-13-45",
                       "2021-02-29", "!!binary '@@'", "!!null x", "!!str [1]", "&a x", "*a", "!!python/object:os.system x",
                       "1e99999", "0x_", "0o9", ".nan", "~", "''", '"\\x00"', '"\\ud800"', "!!set {a}", "!!omap [a]",
                       "|\n  block", "[unclosed", "{a: 1", "@reserved", "`tick", "? complex", "- nested", "!custom x"])


@st.composite
def golden_files(draw, documents) -> bytes:
    """A golden.yaml: valid items (a real doc_id and anchor), valid items but for one field (huge, of another
    type or missing), items of fields valid or not and extra keys, dumped as YAML (a list, a mapping with
    'queries', a scalar); or fields written as raw YAML; then sometimes invalid UTF-8 or random bytes put in."""
    doc = draw(st.sampled_from(documents))
    start = draw(st.integers(0, max(len(doc.text) - 40, 0)))
    valid = {"query_id": st.from_regex(r"q[0-9]{1,3}", fullmatch=True), "kind": st.sampled_from(golden.KINDS),
             "query": st.from_regex(r"[A-Za-z][A-Za-z ?]{0,40}", fullmatch=True) | TEXT, "doc_id": st.just(doc.doc_id),
             "anchor": st.just(doc.text[start : start + draw(st.integers(1, 40))])}
    fields = {name: st.one_of(*[valid[name]] * 6, VALUE, HUGE) for name in valid}  # a whole valid item one time in four
    item = st.fixed_dictionaries(valid) | st.fixed_dictionaries({}, optional=fields) | st.fixed_dictionaries(fields) | VALUE
    items = st.lists(item, max_size=6)
    valid_items = st.lists(st.fixed_dictionaries(valid), min_size=1, max_size=6, unique_by=lambda i: i["query_id"])
    kind = draw(st.sampled_from(["valid", "one field", "list", "queries", "value", "raw"]))
    if kind == "raw":
        lines = [f"- {name}: {raw}" for name, raw in draw(st.lists(st.tuples(st.sampled_from([*valid, "x"]), RAW), min_size=1, max_size=5))]
        data = "\n".join(lines).encode()
    elif kind == "one field":  # valid items but for one field of one of them: huge, of another type, or missing
        chosen = draw(valid_items)
        item, name = draw(st.sampled_from(chosen)), draw(st.sampled_from(list(valid)))
        value = draw(st.one_of(HUGE, VALUE, st.none()))
        if value is None:  # load_golden reads a null field as a missing one
            del item[name]
        else:
            item[name] = value
        data = yaml.safe_dump(chosen, allow_unicode=True).encode()
    else:
        body = {"valid": valid_items, "list": items, "queries": st.fixed_dictionaries({"queries": items}), "value": VALUE}[kind]
        data = yaml.safe_dump(draw(body), allow_unicode=draw(st.booleans())).encode()
    mutation = draw(st.sampled_from(["none"] * 4 + ["invalid utf-8", "bytes"]))
    if mutation == "invalid utf-8":
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe9t\xe9", b"\x00"])) + data[at:]
    elif mutation == "bytes":
        data = draw(st.binary(max_size=300))
    return data


def _short_and_printable(message: str, path: Path) -> None:
    """``message`` names ``path`` (or a file under it), says little more, and prints (no lone surrogate)."""
    assert str(path) in message, message[:300]
    assert len(message) <= 2 * len(str(path)) + MESSAGE_MAX, f"{len(message)} characters: {message[:300]}"
    message.encode("utf-8")


class Corpus(tuple):
    """The fixture's documents, shown by their number in a falsifying example (not by their text)."""

    def __repr__(self) -> str:
        return f"<the fixture corpus: {len(self)} documents>"


@pytest.fixture(scope="module")
def documents(corpus_documents):
    return Corpus(corpus_documents)


@SETTINGS
@given(data=st.data())
def test_fuzz_golden_loading(documents, data):
    content = data.draw(golden_files(documents), label="golden.yaml")
    documents = documents if data.draw(st.booleans(), label="with documents") else None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "golden.yaml"
        path.write_bytes(content)
        try:
            loaded = golden.load_golden(path, documents)
        except golden.GoldenError as exc:
            event(f"GoldenError: {str(exc)[len(str(path)) + 2 :].split(' (')[0].split(':')[0][:30]}")
            assert str(exc).startswith(f"{path}: "), str(exc)[:300]
            _short_and_printable(str(exc), path)
            if "field" in str(exc):
                assert any(f"field '{name}'" in str(exc) for name in golden._FIELDS), str(exc)[:300]
            return
    event(f"loaded {min(len(loaded), 2)}+ queries")
    assert len({q.query_id for q in loaded}) == len(loaded)
    for q in loaded:
        assert q.kind in golden.KINDS and all(isinstance(v, str) and v == v.strip() and v for v in vars(q).values())
        if documents is not None:
            assert golden.normalise(q.anchor) in golden.normalise(next(d.text for d in documents if d.doc_id == q.doc_id))


_FILE_NAME = lambda b: b.replace(b"/", b"_").replace(b"\x00", b"_") + (b"_" if b in (b".", b"..") else b"")  # noqa: E731
TEXT_NAME = st.text(min_size=1, max_size=30).map(os.fsencode).map(_FILE_NAME)
NAME = st.one_of(TEXT_NAME, st.binary(min_size=1, max_size=30).map(_FILE_NAME))
CONTENT = st.one_of(
    st.binary(max_size=3000), st.just(b""), st.just(b"\xef\xbb\xbf"),
    st.text(max_size=3000).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from(["# Title\n", "## Part\n", "text words\n", "\n", "```\n", "~~~~\n", "\r\n", "|a|b|\n", "\u2028",
                              "# \n", "#" * 7 + " x\n", "- item\n", "\x00", "caf\xe9 "]), max_size=60).map(lambda ls: "".join(ls).encode()),
)


@st.composite
def corpus_trees(draw) -> list[tuple[list[bytes], bytes, bytes]]:
    """(folders, file name, content) of each file of a corpus: the seed layout (docs/*.md, stories/*.txt) or
    Markdown at any depth (down to 40 folders), names of any bytes, content of any bytes."""
    files = []
    name_of = NAME if draw(st.integers(0, 3)) == 0 else TEXT_NAME  # one tree in four holds names of any bytes
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            folders = [draw(st.sampled_from([b"docs", b"stories"]))]
            name = draw(name_of) + (b".md" if folders == [b"docs"] else b".txt")
        else:
            folders = draw(st.lists(name_of, max_size=draw(st.sampled_from([3, 3, 40]))))
            name = draw(name_of) + draw(st.sampled_from([b".md", b".md", b".txt", b""]))
        files.append((folders, name, draw(CONTENT)))
    return files


@SETTINGS
@given(tree=corpus_trees())
def test_fuzz_the_corpus_loader(tree):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "corpus"
        root.mkdir()
        for folders, name, content in tree:
            folder = os.path.join(os.fsencode(root), *folders)
            try:
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, name), "wb") as f:
                    f.write(content)
            except OSError:  # a name the file system refuses (too long; a file where a folder should be)
                continue
        try:
            documents = chunker.load_documents(root)
        except chunker.CorpusError as exc:
            event(f"CorpusError: {str(exc).split(': ', 1)[-1][:25]}")
            _short_and_printable(str(exc), root)
            return
    event("loaded")
    assert documents and len({d.doc_id for d in documents}) == len(documents)
    for d in documents:
        assert d.doc_id and "\x00" not in d.text
        (d.doc_id + d.title + d.text).encode("utf-8")  # what Postgres will be sent
        for c in chunker.chunk(d):
            assert d.text[c.start_char : c.end_char] == c.text


@pytest.mark.parametrize(("raw", "expected"), [
    ("2020-13-45", "cannot read '2020-13-45' as !!timestamp (month must be in 1..12)"),
    ("!!timestamp x", "cannot read 'x' as !!timestamp"),
    ("!!bool maybe", "cannot read 'maybe' as !!bool"),
    ("!!int abc", "cannot read 'abc' as !!int (invalid literal for int() with base 10: 'abc')"),
])
def test_a_value_yaml_cannot_build_is_named_by_file_and_place(tmp_path, raw, expected):
    """What the golden fuzz found: PyYAML's constructors raised ValueError (without the file), AttributeError
    or KeyError (a traceback) for these."""
    path = tmp_path / "golden.yaml"
    path.write_text(f"- query_id: {raw}\n")
    with pytest.raises(golden.GoldenError) as err:
        golden.load_golden(path)
    assert str(err.value).startswith(f"{path}: not valid YAML ({expected}\n")
    assert str(err.value).endswith("line 1, column 13)")


def test_a_file_name_that_is_not_utf8_is_refused_by_name(tmp_path):
    """What the corpus fuzz found: its doc_id held a lone surrogate, which no Postgres statement can send."""
    (tmp_path / "ok.md").write_text("# OK\n\ntext\n")
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.md"), "wb") as f:
        f.write(b"# Cafe\n\ntext\n")
    with pytest.raises(chunker.CorpusError, match=r"caf\\xe9\.md: the file name is not UTF-8") as err:
        chunker.load_documents(tmp_path)
    str(err.value).encode("utf-8")
