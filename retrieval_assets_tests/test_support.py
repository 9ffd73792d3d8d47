"""Calibrated support: the evidence and the support model on invented examples, calibration and calibrated
answers on a small corpus this module writes, the support_calibration asset on the fixture, bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import dagster as dg
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from retrieval_assets.answers import answer, asked, calibration, reliability, respond, support
from retrieval_assets.answers.citations import REFUSAL
from retrieval_assets.answers.support import Evidence, SupportModel
from retrieval_assets.corpus.questions import own_questions
from retrieval_assets.corpus.registry import FIXTURE_CORPUS, Corpus
from retrieval_assets.defs import answers as answers_defs
from retrieval_assets.defs.corpora import corpus_definitions
from retrieval_assets.defs.resources import CorpusResource
from retrieval_assets.index import chunker, store
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.search import pipeline
from retrieval_assets.types import Chunk, Faithfulness, Hit
from retrieval_assets_tests.conftest import stored_at_once
from retrieval_assets_tests.test_answer import ScriptedQuery, resource  # noqa: F401 (a fixture)

# --- evidence and model on invented examples -------------------------------------------------------------------------


def chunk(i: int, text: str) -> Chunk:
    return Chunk(f"doc#{i:03d}", "doc", "Doc", 0, len(text), text)


STATS = support.StemStats(100, {"lantern": 3, "wick": 5, "trim": 20, "oil": 40, "keeper": 60}, 50.0)
VECTOR = [Hit("doc#001", 0.9, 1), Hit("doc#002", 0.4, 2), Hit("doc#003", 0.35, 3)]
TEXT = [Hit("doc#001", 7.0, 1), Hit("doc#003", 2.0, 2)]


def test_evidence_is_in_the_unit_interval_and_rises_with_the_evidence():
    question = "How should the keeper trim the lantern wick?"
    weak = support.evidence(question, VECTOR, TEXT, [chunk(1, "The keeper climbs the stair at dusk.")], STATS)
    strong = support.evidence(question, VECTOR, TEXT, [chunk(1, "The keeper must trim the lantern wick. The keeper climbs at dusk.")], STATS)
    for e in (weak, strong):
        assert all(0.0 <= v <= 1.0 for v in e.array())
    assert strong.coverage > weak.coverage and strong.sentence > weak.sentence and strong.attained > weak.attained
    assert strong.coverage == pytest.approx(1.0)
    # a word the corpus lacks takes the highest idf: the question is then partly unknown
    unknown = support.evidence("How should the keeper trim the zeppelin wick?", VECTOR, TEXT, [chunk(1, "trim the wick")], STATS)
    assert unknown.known < 1.0 and unknown.coverage < strong.coverage
    assert support.evidence("the of and", VECTOR, TEXT, [chunk(1, "the of and")], STATS).coverage == 0.0  # no content words
    # agreement: the same chunk first in both lists; overlap: shared top-10 members
    assert strong.agreement == 1.0 and strong.overlap == pytest.approx(0.2)
    assert support.evidence(question, VECTOR, [], [chunk(1, "x")], STATS).agreement == 0.0
    # the cosine against a reference of off-corpus best cosines: the further above it, the higher
    reference = [0.2, 0.3, 0.4, 0.5]
    cos = [support.evidence(question, [Hit("doc#001", c, 1)], TEXT, [chunk(1, "x")], STATS, reference).cosine for c in (0.1, 0.35, 0.45, 0.9)]
    assert cos == sorted(cos) and cos[0] == 0.0 and cos[-1] == 1.0


def test_evidence_refuses_numbers_outside_the_unit_interval():
    with pytest.raises(ValueError, match="coverage must be a number within"):
        Evidence(coverage=1.5)


def test_support_is_a_probability_and_monotone_in_every_feature():
    rng = np.random.default_rng(7)
    X = rng.random((300, len(support.FEATURES)))
    y = (X @ rng.normal(size=len(support.FEATURES)) > 0).astype(float)  # some features count against: weights stay >= 0
    y[:2] = [0, 1]
    models = [support.fit(X, y), support.fit(X, y, l2=1.0), calibration.defaults("hash")[0], calibration.defaults("no-such")[0]]
    for model in models:
        assert all(w >= 0 for w in model.weights)
        base = rng.random((50, len(support.FEATURES)))
        p = model.probabilities(base)
        assert ((p >= 0) & (p <= 1)).all()
        for j in range(len(support.FEATURES)):
            raised = base.copy()
            raised[:, j] = np.minimum(1.0, raised[:, j] + 0.3)
            assert (model.probabilities(raised) >= p).all()
    with pytest.raises(ValueError, match="weights of 0 or more"):
        SupportModel((-1.0,) + (0.0,) * (len(support.FEATURES) - 1), 0.0)
    with pytest.raises(ValueError, match="both answerable"):
        support.fit(X, np.zeros(len(X)))


def test_a_calibration_that_cannot_separate_says_so_and_keeps_no_threshold_of_its_own():
    rng = np.random.default_rng(3)
    same = lambda n: calibration.Measured(rng.random((n, len(support.FEATURES))), rng.random(n))  # noqa: E731
    off = calibration.off_corpus()
    default = SupportModel((1.0,) * len(support.FEATURES), -4.0)
    cal = calibration.calibrate_measured(same(40), same(len(off)), calibration.domain_folds(off), default, "the test's default")
    assert cal.separates is False and cal.source == "default" and dataclasses.replace(cal.model, threshold=0.5) == default
    assert cal.note.startswith("cannot separate") and "the test's default" in cal.note
    meta = answers_defs.calibration_metadata(cal, "golden.yaml")
    assert "threshold" not in meta and meta["note"] == cal.note


def test_the_threshold_lets_at_most_five_percent_of_the_off_corpus_questions_through():
    """Where the model's own threshold would answer many off-corpus questions, the guard raises it; where it refuses
    more than 95% already, the guard leaves it."""
    rng = np.random.default_rng(5)
    off = calibration.off_corpus()
    m_off = calibration.Measured(rng.random((len(off), len(support.FEATURES))) * 0.6, rng.random(len(off)))
    m_q = calibration.Measured(0.4 + rng.random((60, len(support.FEATURES))) * 0.6, rng.random(60))
    lax = SupportModel((1.0,) * len(support.FEATURES), -2.0, threshold=0.3)  # answers nearly every off-corpus question
    cal = calibration.calibrate_measured(m_q, m_off, calibration.domain_folds(off), lax, "a lax default")
    assert cal.model.threshold > lax.threshold and cal.refusal_rate >= 0.9  # held out by domain: near the guard's 95%
    supports = cal.model.probabilities(m_off.features(np.sort(m_off.top)))
    assert (supports < cal.model.threshold).mean() >= calibration.OFF_CORPUS_REFUSAL - 0.01
    strict = SupportModel((1.0,) * len(support.FEATURES), -2.0, threshold=0.999)
    assert calibration.guarded(strict, supports).threshold == 0.999
    assert calibration.guarded(strict, np.ones(10)).threshold < 1 and calibration.guarded(lax, np.array([])) == lax


# --- a small corpus this module writes -----------------------------------------------------------------------------

DOCS = {
    "lamp": """# The lamp room
        The lamp room sits at the top of the tower, above the watch room and below the lantern gallery.

        ## Cleaning the lens
        The keeper cleans the Fresnel lens every morning with a chamois leather and spirit, working from the top prism down.
        Salt haze left on the lens overnight cuts the beam's reach by a third, so no morning is skipped.

        ## Trimming the wick
        The wick of the paraffin burner is trimmed flat every four hours while the light is lit.
        A wick trimmed crooked smokes the mantle and blackens the glass chimney.""",
    "fog": """# The fog signal
        When the far buoy can no longer be seen from the gallery, the keeper starts the fog signal.
        The signal sounds two blasts every ninety seconds until the buoy is seen again.

        ## The compressor
        The compressor engine is started from cold with the decompression lever held open for ten turns.""",
    "log": """# The station log
        Every entry in the station log gives the hour, the wind, the state of the sea and the keeper's initials.
        The log is sent to the district superintendent on the first day of each quarter.""",
    "stores": """# Stores and supplies
        Paraffin for the burner is delivered by the relief boat every six weeks in sealed drums.
        The keeper counts the drums against the delivery note before the boat leaves the landing.""",
}
ANSWERABLE = {"How often does the keeper clean the Fresnel lens?": "lamp#", "How often is the burner wick trimmed?": "lamp#",
              "When does the keeper start the fog signal?": "fog#", "How often is the station log sent to the superintendent?": "log#"}
OFF = ["How do I replace the oil filter on a motorcycle?", "What is the offside rule in association football?",
       "Wie reicht ein Freiberufler in Deutschland die jährliche Steuererklärung ein?", "红烧肉怎么做才好吃？"]


@pytest.fixture(scope="module")
def small(tmp_path_factory, conn, schema):
    folder = tmp_path_factory.mktemp("lighthouse")
    (folder / "docs").mkdir()
    for name, text in DOCS.items():
        (folder / "docs" / f"{name}.md").write_text(textwrap.dedent("        " + text) + "\n")
    chunks = [c for d in chunker.load_documents(folder) for c in chunker.chunk(d)]
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    store.sync(conn, schema, chunks, HashEmbedder())
    retriever = pipeline.retriever(conn, schema, HashEmbedder(), answer.SOURCES)
    return folder, retriever


def test_small_corpus_answers_the_answerable_and_refuses_the_rest(conn, small):
    folder, retriever = small
    cal, made = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash")
    assert made and cal.source == "default" and cal.note.startswith("no answerable questions of its own")
    assert cal.answer_rate is None and cal.off_corpus == len(calibration.off_corpus()) and cal.refusal_rate >= 0.9
    assert calibration.for_index(conn, retriever, [], answer.SOURCES, "hash") == (cal, False)  # stored, read back
    for question, doc in ANSWERABLE.items():
        r = respond.respond(conn, retriever, question, answer.SOURCES, cal)
        assert r.supported and not r.result.faithfulness.refused, (question, r.support, r.evidence)
        cited = [r.sources[n - 1][0].chunk_id for n in r.result.faithfulness.cited]
        assert cited and cited[0].startswith(doc) and r.result.faithfulness.uncited_claims == 0
    for question in OFF:
        r = respond.respond(conn, retriever, question, answer.SOURCES, cal)
        assert not r.supported and r.result.text == REFUSAL, (question, r.support)
    # a corpus without golden questions: its calibration says it uses the default, and the answers asset's metadata too
    questions, origin = own_questions(Corpus("lighthouse", str(folder)).path)
    assert (questions, origin) == ([], "none")
    meta = answers_defs.calibration_metadata(cal, origin)
    assert meta["questions_from"] == "none" and meta["source"] == "default" and meta["note"].startswith("no answerable questions of its own: the cross-corpus default")
    assert "answer_rate" not in meta and "cross-corpus default" in reliability.summary(cal)


# on topic (the fog signal's compressor, the relief boat) but the corpus never says: a maker, an insurer
UNANSWERABLE = ["Which manufacturer supplies the compressor's spare pistons?", "Which insurer covers the relief boat against storm damage?"]


def test_small_corpus_refuses_on_topic_questions_it_cannot_answer(conn, small):
    _, retriever = small
    cal, _ = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash")
    stats = support.stem_stats(pipeline.corpus_stats(conn, retriever.schema))
    old = dataclasses.replace(answer.PICKING, unknown=1.0, quoted=0.0)
    for question in UNANSWERABLE:
        r = respond.respond(conn, retriever, question, answer.SOURCES, cal)
        assert r.result.text == REFUSAL, (question, r.support, r.result.text)
        found = answer.sources(conn, retriever, question)
        chunks, scores = [c for c, _ in found], [s for _, s in found]
        assert answer.extractive_answer(question, chunks, scores=scores, floor=0.0, stats=stats).faithfulness.refused
        # the picking without the focus rule quotes a compressor or boat sentence
        assert not answer.extractive_answer(question, chunks, scores=scores, floor=0.0, stats=stats, picking=old).faithfulness.refused
    # on eight chunks the support model refuses these too; "What voltage does the fog signal compressor use?" passes both
    # (the corpus's idf cannot weigh "voltage" above "fog signal compressor": measured, not asserted, on the manuals instead)


def test_claude_path_refuses_an_unnamed_focus_without_a_call(conn, small):
    _, retriever = small
    cal, _ = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash")
    cal = dataclasses.replace(cal, model=dataclasses.replace(cal.model, threshold=1e-9))  # every question "supported"
    stats = support.stem_stats(pipeline.corpus_stats(conn, retriever.schema))
    old = dataclasses.replace(answer.PICKING, unknown=1.0, quoted=0.0)
    for question in UNANSWERABLE:
        chunks = [c for c, _ in answer.sources(conn, retriever, question)]
        assert respond.unnamed(question, chunks, stats) and not respond.unnamed(question, chunks, stats, old)
        fake = ScriptedQuery("Acme supplies them [1].")
        r = respond.respond(conn, retriever, question, answer.SOURCES, cal, answerer="claude", query_fn=fake)
        assert r.supported and r.result.text == REFUSAL and fake.calls == [], question
    # a question asking for a name to type that no source holds (the lighthouse pages name no command): no call either
    question = "Which command starts the compressor engine?"
    chunks = [c for c, _ in answer.sources(conn, retriever, question)]
    assert asked.expected(question) == asked.CODE and not any(asked.carries(c.text) & {asked.CODE} for c in chunks)
    assert respond.untyped(question, chunks) and not respond.untyped(question, chunks, dataclasses.replace(answer.PICKING, asked=False))
    fake = ScriptedQuery("Run compressor-start [1].")
    r = respond.respond(conn, retriever, question, answer.SOURCES, cal, answerer="claude", query_fn=fake)
    assert r.supported and r.result.text == REFUSAL and fake.calls == []
    for question in ANSWERABLE:
        fake = ScriptedQuery("It is in the sources [1].")
        respond.respond(conn, retriever, question, answer.SOURCES, cal, answerer="claude", query_fn=fake)
        assert len(fake.calls) == 1, question


def test_no_model_call_for_a_refused_question(conn, small):
    _, retriever = small
    cal, _ = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash")
    fake = ScriptedQuery("never sent [1].")
    r = respond.respond(conn, retriever, OFF[0], answer.SOURCES, cal, answerer="claude", query_fn=fake)
    assert r.result.text == REFUSAL and r.result.cost_usd == 0.0 and fake.calls == []
    fake = ScriptedQuery("The keeper cleans it every morning [1].")
    r = respond.respond(conn, retriever, "How often does the keeper clean the Fresnel lens?", answer.SOURCES, cal, answerer="claude", query_fn=fake)
    assert len(fake.calls) == 1 and r.result.faithfulness.cited == (1,)


@pytest.mark.parametrize("question", ["", "   ", "?", "-", '"', "\x00 lens", "the " * 3000 + "lens", "🙂" * 50, "ფარი როდის ინთება?",
                                      "متى يتم تنظيف العدسة؟", "lens -wick OR \"fog signal\" & | ! <->", "x" * 10_000])
def test_any_question_gets_an_answer_or_the_refusal(conn, small, question):
    _, retriever = small
    cal, _ = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash")
    r = respond.respond(conn, retriever, question, answer.SOURCES, cal)
    assert 0.0 <= r.support <= 1.0
    assert r.result.faithfulness.refused or (r.result.faithfulness.cited and r.result.faithfulness.uncited_claims == 0)


# --- two launches at once ---------------------------------------------------------------------------------------------

def _drop_calibration(conn, schema: str) -> None:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(schema, "support_calibration")))
    conn.commit()


def test_calibrations_stored_at_once_all_succeed(pg_dsn, conn, small):
    """Six connections store at the same moment into a schema without the table yet (each round failed with a
    UniqueViolation on pg_type before store took its advisory lock)."""
    schema = small[1].schema
    cal = calibration.Calibration(SupportModel((1.0,) * len(support.FEATURES), -3.0), (0.1, 0.2), "default", "test", 0, 2, None, 1.0, None)
    for _ in range(3):
        _drop_calibration(conn, schema)
        assert stored_at_once(pg_dsn, lambda other, i: calibration.store(other, schema, f"launch-{i}",
                                                                         dataclasses.replace(cal, note=f"launch {i}"))) == []
        kept = [i for i in range(6) if calibration.stored(conn, schema, f"launch-{i}") is not None]
        assert len(kept) == 1 and calibration.stored(conn, schema, f"launch-{kept[0]}").note == f"launch {kept[0]}"


LAUNCH = """
import sys
from retrieval_assets import pg
from retrieval_assets.answers import answer, calibration, reliability
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.search import pipeline
dsn, schema, png = sys.argv[1:]
with pg.connect(dsn) as conn:
    retriever = pipeline.retriever(conn, schema, HashEmbedder(), answer.SOURCES)
    cal, made = calibration.for_index(conn, retriever, [], answer.SOURCES, "hash", refresh=True)
    reliability.plot(cal, png)
print(made, cal.refusal_rate)
"""


def test_two_processes_calibrate_one_corpus_at_once(pg_dsn, conn, small, tmp_path):
    """Two real processes calibrate the same corpus and write the same plot at once, as two launches of
    ``<corpus>/support_calibration`` would: both succeed, one calibration is stored, the plot is whole."""
    schema, png = small[1].schema, tmp_path / "support_calibration.png"
    _drop_calibration(conn, schema)
    runs = [subprocess.Popen([sys.executable, "-c", LAUNCH, pg_dsn, schema, str(png)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert {out.split()[0] for out, _ in outputs} == {"True"}
    cal, made = calibration.for_index(conn, small[1], [], answer.SOURCES, "hash")
    assert not made and f"{cal.refusal_rate}" in outputs[0][0]  # stored, and the same calibration both made
    assert png.read_bytes().startswith(b"\x89PNG") and list(tmp_path.iterdir()) == [png]  # whole, no temporary file left


# --- the extractive answerer's picking ----------------------------------------------------------------------------------

PUSH = [chunk(1, "Pushes and pulls are described in general terms in this chapter of the manual."),
        chunk(2, "### What to do when a push fails\n\nIf a push would not fast-forward the remote branch, it is rejected with "
                 "an error like:\n\n```\n ! [rejected]  master -> master\n```\n\nThe errors listed next are followed by:"),
        chunk(3, "The keeper trims the wick of the lantern at dusk.")]


def test_extractive_quotes_one_sentence_of_each_source_with_the_strongest_claim():
    every = answer.Picking((1.0, 2.0, 1.0), 3, 0.0)  # every source with a sentence sharing a word earns a place
    result = answer.extractive_answer("Why would a push be rejected?", PUSH, scores=[1.0, 9.0, 0.5], floor=0.0, stats=STATS, picking=every)
    lines = result.text.splitlines()
    # the lead-in of a listing is a sentence; its source carries the question's words and the best score, so it comes first;
    # a colon that introduces nothing ("followed by:" at the end) is no sentence's end; a source without the words is left out
    assert lines == ["If a push would not fast-forward the remote branch, it is rejected with an error like: [2]",
                     "Pushes and pulls are described in general terms in this chapter of the manual. [1]"]
    assert result.faithfulness == Faithfulness((1, 2), 0, False)
    shipped = answer.extractive_answer("Why would a push be rejected?", PUSH, scores=[1.0, 9.0, 0.5], floor=0.0, stats=STATS)
    assert shipped.text.splitlines() == lines[:1]  # answer.PICKING: source 1's sentence (one word of the question) does not earn it
    one = answer.extractive_answer("Why would a push be rejected?", PUSH, floor=0.0, picking=answer.Picking((1.0, 0.0, 0.0), 1, 0.0))
    assert one.text.endswith("[1]") and len(one.text.splitlines()) == 1  # rank alone, one source: the first source's sentence
    assert answer.extractive_answer("zeppelin quagga", PUSH, floor=0.0).faithfulness.refused  # no sentence shares a content word



RESTORE = [chunk(1, "Merges combine the changes of two branches, and uncommitted changes in the working tree can block a merge."),
           chunk(2, "### Fixing mistakes\n\nIf you have messed up the working tree but not yet committed, you can return the "
                    "entire working tree to the last committed state with\n\n```\n$ git restore --staged --worktree :/\n```\n\n"
                    "Keep the index and the tree apart, and\n\n```\n$ git status\n```\n")]


def test_a_sentence_that_introduces_a_command_is_read_with_it():
    lead = ("If you have messed up the working tree but not yet committed, you can return the entire working tree to the last "
            "committed state with")
    # a paragraph's last sentence with no mark before a code block is a sentence, and it says the command too; one cut off
    # mid-clause ("..., and") is none
    assert answer.prose.passages(RESTORE[1].text) == [(lead, f"{lead}\n$ git restore --staged --worktree :/\n")]
    # the question's words are in the command only: the lead-in is scored with them, so its source answers
    question = "What does restore --staged --worktree do?"
    assert answer.extractive_answer(question, RESTORE, scores=[9.0, 4.0], floor=0.0, stats=STATS).text == f"{lead} [2]"
    # the type a question asks for must be in the sentence the reader sees, not only in the code after it
    typed = "Which command runs restore with --staged and --worktree?"
    assert answer.extractive_answer(typed, RESTORE, scores=[9.0, 4.0], floor=0.0, stats=STATS).faithfulness.refused
    assert not answer.extractive_answer(typed, RESTORE, scores=[9.0, 4.0], floor=0.0, stats=STATS,
                                        picking=dataclasses.replace(answer.PICKING, asked=False)).faithfulness.refused



def test_myst_directives_hold_prose_and_code_directives_do_not():
    """Sphinx projects write Markdown with MyST directives (pip's own user guide): a note, a tab or a colon-fenced
    warning holds prose the answerer may quote; a code directive or one it does not know (pip's {pip-cli}) does not,
    and an option line is no sentence."""
    text = ("## Default paths\n\n````{tab} Linux\n```\n~/.cache/pip\n```\n\npip will also respect the cache home variable.\n````\n\n"
            "```{note}\n:class: tip\nThe cache is safe to delete at any time.\n```\n\n:::{warning}\nDeleting it slows the next install down.\n:::\n\n"
            ":::{code-block} shell\nrm -rf the cache. Then run it again.\n:::\n\n```{code} python\nprint('No prose here at all.')\n```\n\n"
            "```{pip-cli}\n$ pip install the package now [regular pip output] ERROR: Cannot install it.\n```\n")
    assert [s for s, _ in answer.prose.passages(text)] == ["pip will also respect the cache home variable.", "The cache is safe to delete at any time.",
                                            "Deleting it slows the next install down."]



_PIECES = ["Some prose sentence here.", "A lead-in with no mark", "It ends with a colon:", "```", "````", ":::", "```{note}",
           "````{tab} Linux", ":::{warning}", "```{code} python", "```{pip-cli}", ":class: tip", "| a | b |", "- an item of a list.",
           "# A heading", "", "x = 1. y = 2.", "> A quoted sentence of prose.", "and", "ფარი 中文 sentence ends here.", "\t", "~~~"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES) | st.text(max_size=40), max_size=30))
def test_prose_passages_take_any_markdown(lines):
    """Any chunk text, fences and directives left open or closed in any order: ``passages`` never raises, each passage
    starts with its sentence, and each sentence's words are the chunk's, in order."""
    text = "\n".join(lines)
    for sentence, says in answer.prose.passages(text):
        remaining = iter(support.words(text))  # the sentence's words are the text's, in order (markers and line breaks aside)
        assert says.startswith(sentence) and all(w in remaining for w in support.words(sentence))


SIGNING = [chunk(1, "To rotate the signing key, run the keys rotate command and restart the server."),
           chunk(2, "Each key in the store has a name and a creation date."),
           chunk(3, "The signing service reads its configuration when it starts.")]


def test_a_further_source_is_quoted_only_when_it_earns_it():
    question = "How do I rotate the signing key?"
    # sources 2 and 3 share one word of the question each: their sentences score under half the best one's and their
    # claims under half the first's, so the answer is the one sentence that answers (main's picking, weights (1, 2, 1),
    # three sources, keep 0, quoted all three)
    result = answer.extractive_answer(question, SIGNING, scores=[9.0, 4.0, 3.0], floor=0.0)
    assert result.text == "To rotate the signing key, run the keys rotate command and restart the server. [1]"
    assert len(answer.extractive_answer(question, SIGNING, scores=[9.0, 4.0, 3.0], floor=0.0,
                                        picking=answer.Picking((1.0, 2.0, 1.0), 3, 0.0)).text.splitlines()) == 3
    # a second source that holds the answer as well earns its place
    also = [*SIGNING[:2], chunk(3, "Rotating the signing key also means copying the new key to every client.")]
    lines = answer.extractive_answer(question, also, scores=[9.0, 4.0, 8.0], floor=0.0).text.splitlines()
    assert [line[-3:] for line in lines] == ["[1]", "[3]"]


def test_the_first_source_is_quoted_whatever_its_sentence_scores_and_the_others_by_both_rules():
    table = answer.SentenceTable([("a", 1), ("b", 2), ("c", 3), ("d", 4)], np.array([1.0, 5.0, 4.0, 3.0]),
                                 np.array([[1.0, 1.0, 1.0], [0.5, 0.2, 0.4], [0.33, 0.9, 0.9], [0.25, 0.1, 0.2]]))
    rule = answer.Picking((1.0, 1.0, 1.0), sources=3, keep=0.5, claim=0.5)  # claims 3.0, 1.1, 2.13, 0.55
    assert answer.pick(table, rule) == [0, 2]  # 1: the highest claim (its sentence under keep); 3: both rules met
    assert answer.pick(table, dataclasses.replace(rule, claim=0.0)) == [0, 2, 1]  # by claim; 4 passes keep too, but three is all
    assert answer.pick(table, dataclasses.replace(rule, keep=0.0, claim=0.8)) == [0]  # no further claim reaches 2.4
    assert answer.pick(table, dataclasses.replace(rule, sources=1, claim=0.0, keep=0.0)) == [0]


def focus_table(unknown: float, quoted: float) -> answer.SentenceTable:
    """One source, one sentence holding ``quoted`` of the question's idf mass, on a corpus that lacks ``unknown`` of it."""
    return answer.SentenceTable([("a", 1)], np.array([1.0]), np.array([[1.0, 1.0, 1.0]]), [{"lamp": quoted}], unknown)


@settings(max_examples=200, deadline=None)
@given(unknown=st.floats(0, 1), quoted=st.floats(0, 1), more=st.floats(0, 1))
def test_the_focus_rule_is_monotone_in_the_evidence(unknown, quoted, more):
    refused = lambda u, q: answer.pick(focus_table(u, q)) == []  # noqa: E731
    # more of the question unknown to the corpus never turns a refusal into an answer; more of it quoted never the reverse
    assert refused(min(1.0, unknown + more), quoted) >= refused(unknown, quoted)
    assert refused(unknown, min(1.0, quoted + more)) <= refused(unknown, quoted)
    assert answer.pick(focus_table(unknown, quoted), dataclasses.replace(answer.PICKING, unknown=1.0, quoted=0.0)) == [0]  # the rule off


def test_the_focus_rule_refuses_what_the_corpus_never_names_and_the_old_picking_answered():
    assert answer.pick(focus_table(0.6, 0.3)) == []  # most of the question is words the corpus lacks, and the sentence holds little
    assert answer.pick(focus_table(0.6, 0.7)) == [0]  # the sentence holds most of the question: answered
    assert answer.pick(focus_table(0.2, 0.1)) == [0]  # the corpus knows the question's words: the sentence answers as before
    assert answer.pick(focus_table(0.6, 0.3), answer.Picking((1.0, 2.0, 0.0), sources=3, keep=0.5, claim=0.5)) == [0]  # the old picking
    # from text: "zeppelin" and "hangar" are no word of STATS's corpus; the sentence holds only "lantern"
    question, lamp = "Which zeppelin hangar stores the lantern?", [chunk(1, "The lantern is stored in the keeper's room at night.")]
    assert answer.sentence_table(question, lamp, [1.0], STATS).unknown > 0.6
    assert answer.extractive_answer(question, lamp, scores=[1.0], floor=0.0, stats=STATS).faithfulness.refused
    assert not answer.extractive_answer(question, lamp, scores=[1.0], floor=0.0).faithfulness.refused  # no corpus stats: no rule
    assert not answer.extractive_answer("Where is the lantern stored?", lamp, scores=[1.0], floor=0.0, stats=STATS).faithfulness.refused


@settings(max_examples=150, deadline=None)
@given(question=st.text(max_size=300), texts=st.lists(st.text(max_size=400), max_size=4), weights=st.tuples(*[st.floats(0, 5)] * 3),
       n=st.integers(0, 6), keep=st.floats(0, 1), unknown=st.floats(0, 1), quoted=st.floats(0, 1))
def test_extractive_answers_any_text_in_sentences_or_refuses(question, texts, weights, n, keep, unknown, quoted):
    chunks = [chunk(i, t) for i, t in enumerate(texts, 1)]
    result = answer.extractive_answer(question, chunks, scores=[float(i) for i in range(len(chunks))], floor=0.0, stats=STATS,
                                      picking=answer.Picking(weights, n, keep, unknown=unknown, quoted=quoted))
    assert result.faithfulness.refused or (result.faithfulness.uncited_claims == 0 and len(result.text.splitlines()) <= n)


def test_extractive_on_empty_and_huge_questions():
    assert answer.extractive_answer("", PUSH, floor=0.0).faithfulness.refused
    assert answer.extractive_answer("", [], floor=0.0).faithfulness.refused
    huge = answer.extractive_answer("push rejected " * 20_000, PUSH, floor=0.0, stats=STATS)
    assert huge.faithfulness.cited and huge.faithfulness.uncited_claims == 0
    # none of its words is in STATS (all weigh as words one chunk holds); the two in other scripts are half the question's
    # idf mass and the quoted sentence holds the other half: under answer.PICKING (quoted 0.6) the focus rule refuses, and
    # with quoted 0 that sentence is cited
    mixed = "push rejected " * 20_000 + "ფარი 中文"
    assert answer.extractive_answer(mixed, PUSH, floor=0.0, stats=STATS).faithfulness.refused
    unfocused = answer.extractive_answer(mixed, PUSH, floor=0.0, stats=STATS, picking=dataclasses.replace(answer.PICKING, quoted=0.0))
    assert huge.text in unfocused.text and unfocused.faithfulness.uncited_claims == 0


# --- the calibration asset on the fixture (in test_answer's schemas: its ``resource`` fixture) -----------------------------


def test_calibration_asset_materialises_for_the_fixture(resource, tmp_path):
    defs = corpus_definitions(FIXTURE_CORPUS)
    result = dg.materialize(list(defs.assets), partition_key="hash", raise_on_error=False,
                            selection=[f"fixture/{a}" for a in ("documents", "chunks", "chunk_index", "support_calibration")],
                            resources={"postgres": resource, "corpus": CorpusResource(report_dir=str(tmp_path))})
    assert result.success
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(["fixture", "support_calibration"])]
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert meta["answerable_questions"] == 48 and meta["off_corpus_questions"] == len(calibration.off_corpus()) and meta["language"] == "english"
    assert 0 <= meta["answer_rate"] <= 1 and 0 <= meta["refusal_rate"] <= 1
    assert meta["plot"].startswith("![reliability](data:image/png;base64,") and (tmp_path / "fixture" / "hash" / "support_calibration.png").exists()
    assert ("threshold" in meta) == (meta["source"] == "corpus")
    with resource.connect() as conn:
        stored = conn.execute(f'SELECT calibration FROM "{resource.schema("hash")}".support_calibration').fetchone()[0]
    assert stored["answerable"] == 48 and dataclasses.asdict(calibration.Calibration.from_dict(stored))["note"] == meta["note"]
