"""The one owner of words, stop words, content words and the stemmer (retrieval_assets.words), and its readers."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_assets import words
from retrieval_assets.answers import support
from retrieval_assets.corpus import drafting
from retrieval_assets.index import embed


def test_content_words_leave_out_function_words_numbers_and_scraps():
    assert words.content_words("How do I restore the files of 2024's backup?") == ["restore", "files", "backup"]
    assert words.content_words("Don't you think it's one of the three best?") == ["think", "best"]
    assert words.content_words("x86_64 and __init__ go to io") == ["x86_64", "__init__"]
    assert words.content_words("세금 신고 中文 日本語のテキスト") == ["세금", "신고", "中文", "日本語のテキスト"]  # short words of other scripts count


def test_every_reader_uses_the_one_rule():
    text = "How should the keeper trim the lantern wicks, and why does it matter?"
    assert embed._words is words.words  # HashEmbedder's recipe
    assert support.content_terms(text) == list(dict.fromkeys(map(words.stem, words.content_words(text))))
    assert drafting.trivial_word("the keeper", "The keeper lit it.", {"c1"}, drafting.Vocabulary([])) == "keeper"
    assert drafting.trivial_word("the of", "the of", {"c1"}, drafting.Vocabulary([])) is None  # stop words never answer


def test_stem_meets_the_forms_of_a_word():
    assert {words.stem(w) for w in ("restore", "restored", "restores", "restoring")} == {"restor"}
    assert words.stem("committing") == words.stem("commit") and words.stem("queries") == words.stem("query")
    assert words.stem("größer") == "größer" and words.stem("glass") == "glass"


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=300) | st.text(alphabet=st.characters(max_codepoint=127), max_size=300))
def test_any_text_gives_words_never_a_raise(text):
    assert words.words(text) == re.findall(r"\w+", text.lower())
    found = words.content_words(text)
    assert all(w not in words.STOPWORDS and any(c.isalpha() for c in w) for w in found)
    assert all(isinstance(words.stem(w), str) for w in found)


def test_empty_and_huge_text():
    assert words.content_words("") == [] and words.words("") == []
    huge = "restore " * 200_000 + "ẞ" * 10_000
    assert len(words.content_words(huge)) == 200_001


def test_how_long_names_the_answer_asked_for_not_the_topic():
    """The adjective of "how long / old / far ..." is what kind of answer a question asks for (asked.py), not a word of
    its topic: on a corpus that never says "long", "How long is the warranty?" is not about something it never names."""
    assert words.question_words("How long is the warranty?") == ["warranty"]
    assert words.question_words("How OLD is the lighthouse, and how far off is the long reef?") == ["lighthouse", "long", "reef"]
    assert words.question_words("Which long options does restic take?") == words.content_words("Which long options does restic take?")
    stats = support.StemStats(3, {"warranty": 1, "kettle": 1, "descale": 2}, 12.0)
    assert support.focus(support.question_idf("How long is the warranty?", stats), stats)[1] == 0.0  # nothing unknown
