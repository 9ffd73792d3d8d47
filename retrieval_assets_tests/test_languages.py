"""Answers on a corpus that is not in English: its language read from its function words (words.language), a question's
content words without them and stemmed by Snowball's stemmer of that language (words.function_words, words.stemmer,
support.StemStats.language); a German corpus this module writes answers German questions from the right source and
refuses off-corpus ones, where English words and stems alone refused every question."""

from __future__ import annotations

import textwrap

import pytest

from retrieval_assets import words
from retrieval_assets.answers import answer, calibration, respond, support
from retrieval_assets.answers.citations import REFUSAL
from retrieval_assets.index import chunker, store
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.search import pipeline
from retrieval_assets.search.rerank import CorpusStats
from retrieval_assets.types import Chunk

TEXTS = {
    "german": "Die Garantie beträgt zwei Jahre ab dem Kaufdatum. Bewahren Sie den Kassenbon auf, denn ohne ihn gibt es keinen Ersatz.",
    "french": "La garantie est de deux ans à partir de la date d'achat. Conservez le ticket de caisse, car sans lui il n'y a pas d'échange.",
    "spanish": "La garantía es de dos años desde la fecha de compra. Guarde el recibo, porque sin él no hay cambio.",
    "english": "The warranty lasts two years from the date of purchase. Keep the receipt, because without it there is no exchange.",
}


@pytest.mark.parametrize("language", list(TEXTS))
def test_a_corpus_language_is_the_one_whose_function_words_it_holds_most(language):
    df = CorpusStats.from_texts([TEXTS[language]] * 3).df
    assert words.language(df) == language
    extra = words.function_words(language)
    assert (extra == frozenset()) == (language == "english")  # an English corpus's questions keep today's words
    assert (words.stemmer(language) is words.stem) == (language == "english")  # ... and today's stems
    assert words.language({}) == "english" and words.function_words("klingon") == frozenset()
    assert words.stemmer("vietnamese") is words.stem  # no Snowball stemmer: the light English one, as before


def test_a_question_leaves_out_its_corpus_languages_function_words():
    german = words.function_words(words.language(CorpusStats.from_texts([TEXTS["german"]]).df))
    assert {"ich", "wie", "den", "sollte"} <= german
    question = "Wie oft sollte ich den Wasserkocher entkalken?"
    assert words.question_words(question) == ["wie", "oft", "sollte", "ich", "den", "wasserkocher", "entkalken"]
    assert words.question_words(question, german) == ["oft", "wasserkocher", "entkalken"]
    english = "How long is the warranty on the kettle?"
    assert words.question_words(english, german) == words.question_words(english) == ["warranty", "kettle"]
    # the stem statistics carry the language, so the question's idf mass is its topic's, stemmed as German
    stats = support.StemStats(10, {"wasserkoch": 2, "entkalk": 3}, 20.0, "german")
    assert list(support.question_idf(question, stats)) == ["oft", "wasserkoch", "entkalk"]
    assert words.stemmer("german")("erreiche") == words.stemmer("german")("erreichen") != words.stem("erreichen")
    assert words.stemmer("french")("graisser") == words.stemmer("french")("graissez")


# --- a German corpus this module writes --------------------------------------------------------------------------------

DOCS = {
    "entkalken": """# Den Wasserkocher entkalken
        Kalk lagert sich mit der Zeit am Boden des Wasserkochers ab. Entkalken Sie das Gerät alle vier Wochen, bei hartem Wasser alle zwei Wochen.

        ## Mit Essig
        Füllen Sie den Kocher zur Hälfte mit Wasser und geben Sie eine Tasse Essig dazu. Lassen Sie die Mischung einmal aufkochen und dann eine Stunde stehen.

        ## Mit Zitronensäure
        Zitronensäure riecht weniger stark als Essig. Lösen Sie zwei Esslöffel Zitronensäure in einem Liter kaltem Wasser auf.""",
    "garantie": """# Garantie und Reparatur
        Die Garantie beträgt zwei Jahre ab dem Kaufdatum. Bewahren Sie den Kassenbon als Nachweis auf.

        ## Kundendienst
        Den Kundendienst erreichen Sie werktags von 8 bis 18 Uhr unter der Telefonnummer 0800 123 456.""",
    "sicherheit": """# Sicherheitshinweise
        Stellen Sie den Wasserkocher nur auf eine ebene, trockene Fläche. Füllen Sie mindestens 0,5 Liter und höchstens 1,7 Liter Wasser ein.

        Das Gerät schaltet sich automatisch ab, wenn das Wasser kocht oder wenn es ohne Wasser eingeschaltet wird.""",
}
ANSWERABLE = {"Wie oft sollte ich den Wasserkocher entkalken?": "entkalken#",
              "Wie viel Wasser muss mindestens eingefüllt werden?": "sicherheit#",
              "Wie viel Essig brauche ich zum Entkalken?": "entkalken#",
              "Unter welcher Nummer erreiche ich den Kundendienst?": "garantie#"}  # erreiche: erreichen, stemmed as German
OFF = ["Wie wechsle ich den Ölfilter an einem Motorrad?", "Wer war der erste Bundeskanzler?",
       "How do I replace the oil filter on a motorcycle?", "Comment remplacer le filtre à huile d'une moto ?", "红烧肉怎么做才好吃？"]


@pytest.fixture(scope="module")
def kettle(tmp_path_factory, conn, schema):
    folder = tmp_path_factory.mktemp("wasserkocher")
    for name, text in DOCS.items():
        (folder / f"{name}.md").write_text(textwrap.dedent("        " + text) + "\n", encoding="utf-8")
    chunks = [c for d in chunker.load_documents(folder) for c in chunker.chunk(d)]
    store.drop(conn, schema)
    store.create(conn, schema, 256)
    store.sync(conn, schema, chunks, HashEmbedder())
    return pipeline.retriever(conn, schema, HashEmbedder(), answer.SOURCES)


def test_a_german_corpus_answers_german_questions_and_refuses_the_rest(conn, kettle):
    stats = support.stem_stats(pipeline.corpus_stats(conn, kettle.schema))
    assert stats.language == "german" and {"ich", "wie"} <= stats.leave_out
    cal, _ = calibration.for_index(conn, kettle, [], answer.SOURCES, "hash")
    assert cal.source == "default" and cal.refusal_rate >= 0.9
    for question, doc in ANSWERABLE.items():
        r = respond.respond(conn, kettle, question, answer.SOURCES, cal)
        assert r.supported and not r.result.faithfulness.refused and r.language == "german", (question, r.support, r.evidence)
        cited = [r.sources[n - 1][0].chunk_id for n in r.result.faithfulness.cited]
        assert cited[0].startswith(doc), (question, r.result.text)
    for question in OFF:
        r = respond.respond(conn, kettle, question, answer.SOURCES, cal)
        assert r.result.text == REFUSAL, (question, r.support, r.result.text)


def test_the_answer_command_says_how_it_read_a_german_corpus(pg_dsn, tmp_path, capsys, cli_schemas):
    """``answer`` on a German folder: the answer from the right page, and its last line says the corpus was read as German."""
    from retrieval_assets import cli, partitions
    from retrieval_assets_tests.conftest import drop_prefixed

    folder = tmp_path / "kocher"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / f"{name}.md").write_text(textwrap.dedent("        " + text) + "\n", encoding="utf-8")
    try:
        assert cli.main(["answer", "Wie oft sollte ich den Wasserkocher entkalken?", "--corpus", str(folder), "--dsn", pg_dsn]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith("Entkalken Sie das Gerät alle vier Wochen") and out[-1].endswith("; the corpus read as German)")
    finally:
        drop_prefixed(pg_dsn, partitions.schema_name("hash", "cli", cli_schemas[0].removesuffix("cli_hash"), corpus="kocher"))


def test_read_as_english_every_german_question_was_refused(conn, kettle, monkeypatch):
    """What the corpus language changed: read as English, "wie", "ich", "den" ... are words the corpus barely holds
    and carry the question's idf mass; each answerable question is refused."""
    monkeypatch.setattr(support, "language", lambda df: "english")
    monkeypatch.setattr(support, "_STEMMED", {})
    cal, _ = calibration.for_index(conn, kettle, [], answer.SOURCES, "hash")
    for question in ANSWERABLE:
        assert respond.respond(conn, kettle, question, answer.SOURCES, cal).result.text == REFUSAL, question


def test_sources_without_corpus_statistics_read_their_own_language():
    """The seed's path (no corpus statistics): the sources' own words say which function words to leave out."""
    chunks = [Chunk(f"entkalken#00{i}", "entkalken", "", 0, 1, text) for i, text in enumerate(
        ["Entkalken Sie das Gerät alle vier Wochen, bei hartem Wasser alle zwei Wochen.", "Die Garantie beträgt zwei Jahre ab dem Kaufdatum."])]
    table = answer.sentence_table("Wie oft sollte ich das Gerät entkalken?", chunks)
    assert table.terms is not None and not any({"wie", "ich"} & set(t) for t in table.terms)
    result = answer.extractive_answer("Wie oft sollte ich das Gerät entkalken?", chunks, floor=0.0)
    assert result.text.startswith("Entkalken Sie das Gerät alle vier Wochen") and result.faithfulness.cited == (1,)
    # French, the same way: "remplacer" meets the page's "Remplacez" only under French stems
    velo = [Chunk("freins#000", "freins", "", 0, 1, "Remplacez les patins de frein lorsque les rainures ne sont plus visibles."),
            Chunk("pneus#000", "pneus", "", 0, 1, "Gonflez les pneus à une pression entre 4 et 6 bars pour un vélo de ville.")]
    assert words.language(CorpusStats.from_texts([c.text for c in velo]).df) == "french"
    french = answer.extractive_answer("Quand faut-il remplacer les patins de frein ?", velo, floor=0.0)
    assert french.text.startswith("Remplacez les patins") and french.faithfulness.cited == (1,)
    held = answer.sentence_table("Quand faut-il remplacer les patins de frein ?", velo).terms[0]
    assert {"remplac", "patin", "frein"} <= set(held)  # Snowball's French stems; the English light stemmer kept "remplacer"
