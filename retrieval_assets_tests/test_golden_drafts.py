"""Drafted golden sets (issue 38): the offline drafter on an invented corpus, the Claude drafter against a
scripted stand-in, the review into golden.yaml, the golden_drafts asset, and bad input."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest
import yaml

from retrieval_assets import cli
from retrieval_assets.corpus import draft_file, drafting, golden, thesaurus
from retrieval_assets.corpus.draft_claude import CALL_BUDGET_USD, ClaudeDrafter
from retrieval_assets.corpus.draft_file import Decision, DraftFileError
from retrieval_assets.defs.corpora import corpus_definitions
from retrieval_assets.defs.golden_drafts import golden_drafts_assets
from retrieval_assets.defs.resources import CorpusResource, PostgresResource
from retrieval_assets.index import chunker
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.types import GoldenQuery
from retrieval_assets.words import content_words
from retrieval_assets_tests.conftest import CORPUS
from retrieval_assets_tests.graph import assets, corpus_of
from retrieval_assets_tests.test_answer import ScriptedQuery

ROOT = Path(__file__).resolve().parents[1]
DOCS = {
    "tides.md": """# Tides of Carrow Bay

A spring tide is a tide of unusually large range that follows the full moon and the new moon.
The harbour master posts the tide tables every Monday, and ticket HB-2041 records the flooding of the quay in March.

## Reading the tables

To read the tables correctly, add the local offset of twelve minutes to every printed time.
Boats with a draught above 2.4 metres wait for the high water mark because the bar is shallow.
""",
    "ferry.md": """# The Ferry

The ferry leaves the harbour at dawn every day and returns before the evening bell rings.
Tickets are sold by the `ferry_office` booth, which opens half an hour before each crossing.

## Weather

In a northerly gale the crossing is cancelled, and passengers receive a voucher for the next fair day.
A voucher is a paper slip stamped with the date of the cancelled crossing and the captain's mark.
""",
    "guides/lighthouse.md": """# The Lighthouse

The lighthouse keeper trims the wick at dusk and records the oil used in the logbook.
Its lamp burns paraffin, and the lens was ground in Glasgow in 1871 by the Stevenson workshop.

```python
def beam(hours):
    return hours * 0.4  # litres of paraffin
```

Visitors may climb the tower on Sundays, when the keeper shows them how the clockwork turns the lens.
""",
}


def write_corpus(root: Path, docs: dict[str, str] = DOCS, golden_items: list | None = None) -> Path:
    for name, text in docs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    if golden_items is not None:
        (root / "golden.yaml").write_text("# hand-written, keep this comment\n" + yaml.safe_dump(golden_items, sort_keys=False))
    return root


def load(root: Path):
    documents = chunker.load_documents(root)
    return documents, [c for d in documents for c in chunker.chunk(d)]


HAND = [{"query_id": "h1", "kind": "factual", "query": "when does the ferry leave", "doc_id": "ferry", "anchor": "at dawn every day"}]


def test_offline_drafts_are_anchored_unique_balanced_and_capped(tmp_path):
    documents, chunks = load(write_corpus(tmp_path))
    drafted = drafting.draft(documents, chunks, per_doc=3)
    items = drafted.items
    assert len(items) == 9 and drafted.drafter == "offline"
    assert len({i.query_id for i in items}) == len(items)
    assert drafted.counts() == {"factual": 3, "conceptual": 3, "lexical": 3}
    for d in documents:
        assert sum(i.doc_id == d.doc_id for i in items) <= 3
    for i in items:  # the rule golden_queries checks: the anchor inside a chunk of its document
        assert golden.relevant(chunks, GoldenQuery(i.query_id, i.kind, i.query, i.doc_id, i.anchor)), i
        assert i.chunk_id in golden.relevant(chunks, GoldenQuery(i.query_id, i.kind, i.query, i.doc_id, i.anchor))
        assert i.source.startswith(f"offline:{i.kind}/") and i.status == "draft"
        assert "def beam" not in i.anchor  # never a sentence of a code block
    vectors = HashEmbedder().embed([i.query for i in items])
    cosines = vectors @ vectors.T - 2 * np.eye(len(items))
    assert cosines.max() < drafting.DUPLICATE_COSINE
    lexical = {i.doc_id: i for i in items if i.kind == "lexical"}
    assert "HB-2041" in lexical["tides"].query and lexical["tides"].trivial == "2041"  # the ticket id alone finds it
    # written, the draft loads under golden.yaml's rules against the documents
    path = draft_file.write_draft(tmp_path / "golden.draft.yaml", drafted, per_doc=3)
    assert len(golden.load_golden(path, documents, statuses=golden.DRAFT_STATUSES)) == 9
    assert draft_file.read_draft(path)[1] == items
    assert drafting.drafted_items(tmp_path) == items  # the plain entry point, nothing written


def test_conceptual_queries_leave_out_the_sections_rare_words(tmp_path):
    documents, chunks = load(write_corpus(tmp_path))
    vocabulary = drafting.Vocabulary(chunks)
    assert thesaurus.available()
    for item in drafting.draft(documents, chunks, per_doc=3).items:
        if item.kind == "conceptual":
            rare_in_anchor = {w for w in content_words(item.anchor) if vocabulary.rare(w)}
            assert not rare_in_anchor & set(content_words(item.query)), item


def test_drafts_are_the_same_in_every_process(tmp_path):
    write_corpus(tmp_path)
    code = ("import sys, dataclasses, json; from retrieval_assets.corpus import drafting\n"
            "print(json.dumps([dataclasses.asdict(i) for i in drafting.drafted_items(sys.argv[1], per_doc=4)]))")
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and len(json.loads(runs[0].stdout)) >= 9


def test_a_sentence_repeated_in_two_documents_drafts_once(tmp_path):
    repeated = "The harbour master posts the tide tables every Monday, and ticket HB-2041 records the flooding of the quay."
    docs = {"a.md": f"# A\n\n{repeated}\n", "b.md": f"# B\n\n{repeated}\n"}
    documents, chunks = load(write_corpus(tmp_path, docs))
    drafted = drafting.draft(documents, chunks, per_doc=3)
    assert drafted.dropped["near-duplicate query"] >= 1
    assert len({golden.normalise(i.query) for i in drafted.items}) == len(drafted.items)


def _claude_reply(items) -> str:
    return "```json\n" + json.dumps({"queries": items}) + "\n```"


def test_the_claude_drafter_drops_and_counts_bad_anchors_invalid_json_and_duplicates(tmp_path, monkeypatch):
    documents, chunks = load(write_corpus(tmp_path))
    good = {"kind": "factual", "query": "When does the ferry leave the harbour?", "anchor": "The ferry leaves the harbour at dawn every day"}
    fake = ScriptedQuery(
        _claude_reply([good, {"kind": "lexical", "query": "ferry_office hours", "anchor": "a sentence that is in no chunk at all"},
                       dict(good), {"kind": "lexical", "query": "ferry_office booth"}, {"kind": "conceptual", "query": "how can I get "
                       "my money back when bad weather stops the boat?", "anchor": "passengers receive a voucher for the next fair day"}]),
        "I could not find three good queries, sorry.",  # lighthouse: not JSON
        _claude_reply([{"kind": "lexical", "query": "HB-2041 flooding", "anchor": "ticket HB-2041 records the flooding of the quay in March"}]),
    )
    monkeypatch.setattr(drafting, "DUPLICATE_COSINE", 0.9)
    drafter = ClaudeDrafter(3, query_fn=fake, model="claude-test")
    drafted = drafting.draft(documents, chunks, per_doc=3, drafter=drafter)  # documents in load order: ferry, lighthouse, tides
    assert [(i.doc_id, i.kind) for i in drafted.items] == [("ferry", "factual"), ("ferry", "conceptual"), ("tides", "lexical")]
    assert dict(drafted.dropped) == {"anchor outside every chunk": 1, "near-duplicate query": 1, "invalid item": 1, "invalid JSON": 1}
    assert all(i.source == "claude:claude-test" for i in drafted.items)
    assert drafted.cost_usd == pytest.approx(0.03)
    assert any(r.startswith("guides/lighthouse: ") for r in drafted.reasons)
    options = fake.calls[0]["options"]
    assert (options.tools, options.max_turns, options.max_budget_usd, options.model) == ([], 1, CALL_BUDGET_USD, "claude-test")
    assert "The ferry leaves the harbour at dawn" in fake.calls[0]["prompt"] and '"queries"' in fake.calls[0]["prompt"]
    for name in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "RETRIEVAL_CLAUDE_AUTH"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY"):
        ClaudeDrafter(3)


def _umask() -> int:
    """This process's umask, read without setting it (Linux's /proc/self/status)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("Umask:"))
    return int(line.split()[1], 8)


def test_review_appends_accepted_queries_and_golden_yaml_stays_valid(tmp_path):
    root = write_corpus(tmp_path, golden_items=HAND)
    documents, chunks = load(root)
    path = draft_file.write_draft(root / draft_file.DRAFT_NAME, drafting.draft(documents, chunks, per_doc=3))
    items = draft_file.read_draft(path)[1]
    a, b, c, d = (i.query_id for i in items[:4])
    before = (root / "golden.yaml").read_bytes()
    (root / "golden.yaml").chmod(0o640)  # the user's permissions survive the review's replace (mkstemp makes 0600)
    for bad, words in (({"nope": Decision("accept")}, "no query 'nope'"), ({a: Decision("accept", kind="vague")}, "kind 'vague'")):
        with pytest.raises(DraftFileError, match=words):
            draft_file.review(root, path, bad, documents)
    assert (root / "golden.yaml").read_bytes() == before
    assert draft_file.review(root, path, {a: Decision("accept"), b: Decision("accept", "an edited query"), c: Decision("reject")},
                             documents) == (2, 1)
    text = (root / "golden.yaml").read_text()
    assert (root / "golden.yaml").stat().st_mode & 0o777 == 0o640 and path.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert text.startswith(before.decode())  # appended: the hand-written part and its comment untouched
    loaded = golden.load_golden(root / "golden.yaml", documents)
    assert [q.query_id for q in loaded] == ["h1", a, b] and loaded[2].query == "an edited query"
    raw = yaml.safe_load(text)
    assert [q.get("status") for q in raw] == [None, "reviewed", "reviewed"] and raw[2]["source"].endswith("(edited)")
    assert [i.status for i in draft_file.read_draft(path)[1][:4]] == ["accepted", "accepted", "rejected", "draft"]
    with pytest.raises(DraftFileError, match=f"query {a} was already accepted"):
        draft_file.review(root, path, {a: Decision("accept")}, documents)
    # drafting again keeps the decisions; a golden.yaml holding a draft's status is refused, naming the query
    draft_file.write_draft(path, drafting.draft(documents, chunks, per_doc=3))
    assert [i.status for i in draft_file.read_draft(path)[1][:4]] == ["accepted", "accepted", "rejected", "draft"]
    assert sum(draft_file.status_counts(path, root / "golden.yaml")[k, "reviewed"] for k in golden.KINDS) == 2
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump([{**HAND[0], "status": "draft"}]))
    with pytest.raises(golden.GoldenError, match="query h1: status 'draft'"):
        golden.load_golden(tmp_path / "bad.yaml")
    assert len(golden.load_golden(CORPUS / "golden.yaml")) == 48  # the hand-written sets are as valid as before


def test_two_reviews_at_once_keep_both_decisions(tmp_path):
    """Two processes review one draft at once: the first stops after it has read the draft and golden.yaml (at
    the check of its new golden.yaml) until the second has finished or 10 s have passed. Without the corpus lock
    the second finishes first and the first's replace drops its decision; with it the second waits."""
    root = write_corpus(tmp_path, golden_items=HAND)
    documents, chunks = load(root)
    path = draft_file.write_draft(root / draft_file.DRAFT_NAME, drafting.draft(documents, chunks, per_doc=3))
    a, b = (i.query_id for i in draft_file.read_draft(path)[1][:2])
    code = """import sys, time
from pathlib import Path
from retrieval_assets.corpus import draft_file, golden
from retrieval_assets.index import chunker
root, qid, done = sys.argv[1], sys.argv[2], Path(sys.argv[1] + "/../second-done")
load = golden.load_golden
def held(path, *args, **kwargs):
    if str(path).endswith(".check") and qid == sys.argv[3]:
        print("holding", flush=True)
        deadline = time.monotonic() + 10
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return load(path, *args, **kwargs)
golden.load_golden = held
draft_file.review(root, root + "/golden.draft.yaml", {qid: draft_file.Decision("accept")}, chunker.load_documents(root))
if qid != sys.argv[3]:
    done.touch()
"""
    first = subprocess.Popen([sys.executable, "-c", code, str(root), a, a], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert first.stdout.readline().strip() == "holding"
    second = subprocess.run([sys.executable, "-c", code, str(root), b, a], capture_output=True, text=True, timeout=120, cwd=ROOT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0 and second.returncode == 0, err[-2000:] + second.stderr[-2000:]
    assert [q.query_id for q in golden.load_golden(root / "golden.yaml", documents)] == ["h1", a, b]
    assert [i.status for i in draft_file.read_draft(path)[1][:2]] == ["accepted", "accepted"]


def test_drafts_never_go_to_golden_yaml_nor_over_another_file(tmp_path):
    root = write_corpus(tmp_path, golden_items=HAND)
    documents, chunks = load(root)
    drafted = drafting.draft(documents, chunks)
    before = (root / "golden.yaml").read_bytes()
    with pytest.raises(DraftFileError, match="drafts never go to golden.yaml"):
        draft_file.write_draft(root / "golden.yaml", drafted)
    (root / "notes.yaml").write_text("shopping: [bread]\n")
    with pytest.raises(DraftFileError, match="exists and is not a draft file"):
        draft_file.write_draft(root / "notes.yaml", drafted)
    assert (root / "golden.yaml").read_bytes() == before and (root / "notes.yaml").read_text() == "shopping: [bread]\n"


def test_the_command_line_drafts_and_reviews_interactively(tmp_path, monkeypatch):
    root = write_corpus(tmp_path / "harbour", golden_items=HAND)
    out = io.StringIO()
    assert cli.run(["golden", "draft", "--corpus", str(root), "--per-doc", "2"], out=out) == 0
    assert "6 queries drafted by offline from 3 documents" in out.getvalue()
    pending = draft_file.read_draft(root / draft_file.DRAFT_NAME)[1]
    answers = iter(["a", "e", "how do tides work", "conceptual", "r", "s", "q"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(answers))
    out = io.StringIO()
    assert cli.run(["golden", "review", "--corpus", str(root)], out=out) == 0
    shown = out.getvalue()
    assert f"[1/6] {pending[0].query_id}" in shown and ">>>" in shown and "2 accepted" in shown and "1 rejected" in shown
    loaded = golden.load_golden(root / "golden.yaml", chunker.load_documents(root))
    assert [(q.query_id, q.kind) for q in loaded[1:]] == [(pending[0].query_id, pending[0].kind), (pending[1].query_id, "conceptual")]
    out = io.StringIO()
    cli.run(["golden", "review", "--corpus", str(root), "--list"], out=out)
    assert len(out.getvalue().splitlines()) == 3  # rejected, accepted and skipped-then-quit: three left of six


@pytest.mark.parametrize("case", ["empty", "not utf-8", "only code", "no sentences", "one huge file"])
def test_bad_input_is_one_line_or_an_empty_draft_with_the_reason(tmp_path, capsys, case):
    root = tmp_path / "c"
    root.mkdir()
    if case == "not utf-8":
        (root / "ok.md").write_text(DOCS["ferry.md"])
        (root / "latin.md").write_bytes("# Caf\xe9\n\nLe caf\xe9 est ferm\xe9 le lundi matin pour nettoyage.\n".encode("latin-1"))
    elif case == "only code":
        (root / "code.md").write_text("```python\nprint('hello')\n```\n\n    indented = True\n")
    elif case == "no sentences":
        (root / "wall.md").write_text(" ".join(f"word{i}" for i in range(20_000)))
    elif case == "one huge file":
        (root / "huge.md").write_text("# Huge\n\n" + "\n\n".join(f"Paragraph {i} says that the pier number {i} is painted "
                                                                f"blue and stands near the fish market." for i in range(30_000)))
    code = cli.main(["golden", "draft", "--corpus", str(root)])
    err = capsys.readouterr()
    if case in ("empty", "not utf-8"):
        assert code == 2 and len(err.err.strip().splitlines()) == 1
        assert (f"{root}: no Markdown files" if case == "empty" else f"{root / 'latin.md'}: not UTF-8") in err.err
        assert not (root / draft_file.DRAFT_NAME).exists()
        return
    assert code == 0
    data, items = draft_file.read_draft(root / draft_file.DRAFT_NAME)
    if case == "one huge file":
        # one document: at most --per-doc queries (3), each anchored in the file (every pier's sentence is alike, so no
        # word is rare there and no conceptual paraphrase can leave one out)
        documents, chunks = load(root)
        assert 1 <= len(items) <= 3 and all(golden.relevant(chunks, GoldenQuery(i.query_id, i.kind, i.query, i.doc_id, i.anchor))
                                             for i in items)
        return
    doc = "code" if case == "only code" else "wall"
    assert items == [] and data["notes"][0].startswith(f"no query drafted: {doc}: no prose sentence")
    assert f"note: {doc}: no prose sentence" in err.out


def test_the_golden_drafts_asset_materialises_on_a_user_corpus(tmp_path, pg_dsn):
    root = write_corpus(tmp_path / "harbour", golden_items=HAND)
    corpus = corpus_of(root, "harbour")
    assert golden_drafts_assets(corpus_of(CORPUS, "fixture")) == []  # the fixture has none
    resources = {"corpus": CorpusResource(), "postgres": PostgresResource(dsn=pg_dsn, schema_prefix="t_drafts_")}
    selection = ["harbour/documents", "harbour/chunks", "harbour/golden_drafts"]

    def materialise(config: dict | None = None):
        result = dg.materialize(assets(corpus), selection=selection, resources=resources, raise_on_error=False,
                                run_config={"ops": {"harbour__golden_drafts": {"config": config or {}}}})
        return result, [e for e in result.get_asset_materialization_events() if e.asset_key.path[-1] == "golden_drafts"]

    result, [event] = materialise({"per_doc": 3})
    assert result.success
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["queries"], meta["factual_queries"], meta["status_draft"], meta["status_hand-written"]) == (9, 3, 9, 1)
    items = draft_file.read_draft(root / draft_file.DRAFT_NAME)[1]
    draft_file.review(root, root / draft_file.DRAFT_NAME, {items[0].query_id: Decision("accept")}, chunker.load_documents(root))
    result, [event] = materialise()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["status_draft"], meta["status_accepted"], meta["status_reviewed"]) == (8, 1, 1)
    defs = dg.Definitions.merge(corpus_definitions(corpus), dg.Definitions(resources=resources))
    job_keys = defs.resolve_job_def("evaluate_embedders__harbour").asset_layer.selected_asset_keys
    assert dg.AssetKey(["harbour", "golden_drafts"]) not in job_keys and dg.AssetKey(["harbour", "eval_run"]) in job_keys
    bad, _ = materialise({"drafter": "oracle"})
    assert not bad.success
    [failure] = [e for e in bad.all_events if e.is_step_failure]
    assert "unknown drafter 'oracle'" in failure.step_failure_data.error.to_string()


@pytest.mark.parametrize("start", ["missing", "empty", "mapping"])
def test_review_into_a_missing_an_empty_or_a_mapping_golden_yaml(tmp_path, start):
    root = write_corpus(tmp_path)
    if start != "missing":
        (root / "golden.yaml").write_text("# nothing yet\n" if start == "empty" else yaml.safe_dump({"queries": HAND}))
    documents, chunks = load(root)
    path = draft_file.write_draft(root / draft_file.DRAFT_NAME, drafting.draft(documents, chunks))
    first = draft_file.read_draft(path)[1][0]
    assert draft_file.review(root, path, {first.query_id: Decision("accept")}, documents) == (1, 0)
    loaded = golden.load_golden(root / "golden.yaml", documents)
    assert [q.query_id for q in loaded] == (["h1"] if start == "mapping" else []) + [first.query_id]


def test_a_corpus_with_drafts_only_calibrates_its_answers_on_them(tmp_path):
    """questions.own_questions (read by the answer command and the support_calibration and answers assets): golden.yaml's
    queries when there is one; else the drafts review has not rejected, said to be unreviewed; else none."""
    from retrieval_assets.corpus.questions import own_questions

    root = write_corpus(tmp_path)
    assert own_questions(root) == ([], "none")
    documents, chunks = load(root)
    path = draft_file.write_draft(root / draft_file.DRAFT_NAME, drafting.draft(documents, chunks, per_doc=3))
    items = draft_file.read_draft(path)[1]
    draft_file.review(root, path, {items[0].query_id: Decision("reject")}, documents)  # no golden.yaml yet: nothing accepted
    (root / "golden.yaml").unlink(missing_ok=True)
    questions, origin = own_questions(root, documents)
    assert questions == [i.query for i in items[1:]] and origin == f"{len(items) - 1} drafted questions of golden.draft.yaml, not reviewed"
    (root / "golden.yaml").write_text(yaml.safe_dump(HAND, sort_keys=False))
    assert own_questions(root, documents) == ([q["query"] for q in HAND], "golden.yaml")
