"""Words of a text, English function words, content words and a light stemmer: the one owner of these rules.

Contract: ``words(text)`` is ``re.findall(r"\\w+", text.lower())`` (HashEmbedder's pinned recipe, and the BM25
reranker's words), with a faster path for ASCII text and the same result. ``STOPWORDS`` are English function
words, auxiliary verbs, quantifiers and the stems contractions leave (``don`` of don't). A content word
(``is_content``) is a word that is no stop word, holds a letter (no bare numbers or underscores) and has three
characters or more, unless it is not ASCII (a Korean or Chinese word can be one or two characters long).
``content_words(text)`` lists them in order, repeats kept; ``question_words(question)`` those of a question, without the
adjective of its "how long / old / far ..." (what kind of answer it asks for, not what it is about), and without a
corpus's own language's function words given as ``leave_out``. A corpus's ``language(df)`` is the one whose function
words (the stop-words package's lists) its chunks hold most; ``function_words(language)`` and ``stemmer(language)`` are
how its questions and texts are read: for English the words above and ``stem``, which takes one common English suffix
off so that restore, restored, restores and restoring meet (other scripts are left as they are); for another language
its function words too, and Snowball's stemmer of that language.
Imports nothing of the package, so any layer can read it.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable, Mapping

import Stemmer
from stop_words import AVAILABLE_LANGUAGES, get_stop_words

_WORD = re.compile(r"\w+")
# ASCII text (str.isascii is O(1) in CPython) is tokenised without the regex, with the same
# result: \w on ASCII characters is [A-Za-z0-9_], so one bytes.translate lowercases A-Z and
# turns every other byte into a space, and split() returns the runs of word characters.
_ASCII_WORDS = bytes(ord(chr(b).lower()) if chr(b).isalnum() or b == ord("_") else ord(" ") for b in range(128))
_ASCII_WORDS += bytes(range(128, 256))
_SNOWBALL = frozenset(Stemmer.algorithms())

STOPWORDS = frozenset("""
a about above after again against all also although always am among an and another any are as at be because been before
being below between both but by can could did didn do does doesn doing don done down during each either else etc even ever
every few for from further get gets got had hadn has hasn have haven having he hence her here hers him his how however i if
in into is isn it its itself just let many may me might more most much must my myself need neither never no nor not now of
off often on once one only or other our ours out over own per rather same shall she should since so some still such than
that the their theirs them then there therefore these they this those though three through thus to too two under until up
upon us very via was wasn we were weren what when where whether which while who whom whose why will with within without
won would wouldn yes yet you your yours
""".split())


def words(text: str) -> list[str]:
    """The lowercase ``\\w+`` words of ``text``, in order."""
    if text.isascii():
        return text.encode().translate(_ASCII_WORDS).decode().split()
    return _WORD.findall(text.lower())


def is_content(word: str) -> bool:
    """A lowercase word that carries content (see the contract)."""
    return word not in STOPWORDS and (len(word) > 2 or not word.isascii()) and any(ch.isalpha() for ch in word)


def content_words(text: str) -> list[str]:
    """The content words of ``text``, in order, repeats kept."""
    return [w for w in words(text) if is_content(w)]


# "how long", "how old", "how far" ...: the adjective names what kind of answer is asked for (asked.py), not the topic
_HOW = re.compile(r"\bhow\s+(?:long|old|far|big|large|soon|fast|often|early|late|deep|wide|high|tall|heavy|small)\b", re.IGNORECASE)


def question_words(question: str, leave_out: frozenset[str] = frozenset()) -> list[str]:
    """The content words of a question, in order, repeats kept, without the adjective of a "how long / old / far ..."
    phrase ("How long is the warranty?": warranty) and without the words of ``leave_out`` (a corpus's language's
    ``function_words``)."""
    return [w for w in content_words(_HOW.sub(" ", question)) if w not in leave_out]


@functools.cache
def _function_word_lists() -> dict[str, frozenset[str]]:
    """Language -> its function words (the stop-words package's lists), as lowercase ``words``."""
    return {language: frozenset(w for entry in get_stop_words(language) for w in words(entry)) for language in AVAILABLE_LANGUAGES}


def language(df: Mapping[str, int]) -> str:
    """The language whose function words a corpus's document frequencies (word -> chunks holding it) hold most: the
    highest sum of their frequencies; "english" on a tie or a corpus without words."""
    lists = _function_word_lists()
    held = {name: sum(df.get(w, 0) for w in listed) for name, listed in lists.items()}
    return max(held, key=lambda name: (held[name], name == "english"), default="english")


def function_words(language: str) -> frozenset[str]:
    """The words a question on a corpus in ``language`` (``language(df)``) leaves out beyond ``STOPWORDS``: that
    language's function words; none for English, whose questions keep today's words."""
    return frozenset() if language == "english" else _function_word_lists().get(language, frozenset())


_STEMMERS = threading.local()  # a PyStemmer object is not to be shared between threads


@functools.cache
def stemmer(language: str) -> Callable[[str], str]:
    """How a corpus in ``language`` stems its words: ``stem`` for English and for a language Snowball has no stemmer
    for, else Snowball's stemmer of that language (PyStemmer: French graisser and graissez meet, German erreiche and
    erreichen); one function per language."""
    if language == "english" or language not in _SNOWBALL:
        return stem

    def snowball(word: str) -> str:
        kept = getattr(_STEMMERS, language, None)
        if kept is None:
            kept = Stemmer.Stemmer(language)
            setattr(_STEMMERS, language, kept)
        return kept.stemWord(word)

    return snowball


def stem(word: str) -> str:
    """A light English stemmer: one common suffix off (-ing, -ed, -s, -ly; -ies/-ied to -y), a doubled final
    consonant after -ing/-ed made single, then a final e off, so that restore, restored, restores and restoring meet,
    and commit and committing; other scripts are left as they are."""
    if len(word) <= 3 or not word.isascii():
        return word
    for suffix in ("ingly", "edly", "ing", "ies", "ied", "ed", "ly", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not (suffix == "s" and word.endswith("ss")):
            word = word[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            if suffix in ("ing", "ed") and word[-1] == word[-2] and word[-1] not in "aeiouylsz":
                word = word[:-1]
            break
    return word[:-1] if word.endswith("e") and len(word) > 4 else word
