"""The offline drafter: golden-query candidates from a document's own sentences, no model, no randomness.

Contract: ``OfflineDrafter().candidates(doc, chunks, vocabulary)`` reads the prose sentences of
each chunk (paragraphs and list items; never code fences, headings or table rows; 6 to 60 words,
mostly words) and proposes, each anchored on the sentence it came from:

- ``lexical``: the sentence's rarest exact term (a code span, a flag, an identifier such as
  ``RET-658`` or ``sweep_chunks.py``, a CamelCase or upper-case name, a number, else a word that
  at most 2% of the chunks hold) with the two most specific of its other, more common words;
- ``factual``: a question from a defining sentence (``X is ...`` -> ``What is X?``; ``X means
  ...``; ``To do X, ...`` -> ``How do you do X?``; ``... because ...`` -> ``Why ...?``), else
  from the section's heading with the sentence's three most specific words;
- ``conceptual``: the sentence's content words said again without its section's vocabulary: each
  word held by at most 10% of the chunks (all but the corpus's common words) becomes a WordNet
  synonym the chunk does not hold, in the sense the chunk suggests (``thesaurus``), or is left out;
  the eight most specific words are kept, in order, at most three of them synonyms.

A document is read in at most ``MAX_SENTENCES`` sentences, spread evenly over it (one huge file
costs no more than that). The same document and vocabulary give the same candidates in every process.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from retrieval_assets.answers.citations import line_sentences
from retrieval_assets.corpus import thesaurus
from retrieval_assets.corpus.drafting import Candidate, Vocabulary
from retrieval_assets.words import STOPWORDS, is_content, words as _words
from retrieval_assets.types import Chunk, Document

MAX_SENTENCES = 400  # per document
MIN_WORDS, MAX_WORDS = 6, 60
CONCEPT_WORDS = 8  # content words of a conceptual query, at most ...
SYNONYMS = 3  # ... of them at most this many synonyms of the section's own words
_FENCE = re.compile(r"^\s*(```|~~~)")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+|^\s*>\s?")
_TERMS = (  # (category, pattern, weight): the exact terms a lexical query carries, most specific first
    ("code", re.compile(r"`([A-Za-z0-9_.:/<>#@$-]{2,40}(?:\(\))?)`"), 4.0),
    ("flag", re.compile(r"(?<![\w-])(--?[a-z][a-z0-9-]{2,})"), 4.0),
    ("identifier", re.compile(r"(?<![\w-])([A-Za-z0-9]+(?:[-_./][A-Za-z0-9]+)+)(?![\w-])"), 3.0),
    ("name", re.compile(r"(?<![\w-])([A-Z]?[a-z]+(?:[A-Z][a-z0-9]+)+|[A-Z]{2,}[0-9]*)(?![\w-])"), 3.0),
    ("number", re.compile(r"(?<![\w.-])(\d+(?:\.\d+)?)(?![\w-])"), 1.5),
)
_DEFINITION = re.compile(r"^(?:(?P<a>an?|the)\s+)?(?P<x>[^,;:()\[\]]{3,60}?)\s+(?P<v>is|are|means|refers to)\s+(?P<y>\S.{8,})$", re.I)
_PURPOSE = re.compile(r"^to\s+(?P<x>[^,]{5,80}),\s", re.I)
_CAUSE = re.compile(r"^(?P<x>[^,]{10,120}?),?\s+because\s", re.I)
_PRONOUNS = frozenset("it this that there these they which what here each its such one".split())
_NOUN_PHRASE_WORDS = frozenset("of the a an and in to on for".split())  # the only function words a defined term may hold
_OPENERS = ("how come", "why would", "what explains that", "is it true that")


@dataclass(frozen=True)
class Sentence:
    text: str
    chunk: Chunk
    heading: str
    words: tuple[str, ...]


def _prose(block: str) -> list[str]:
    """The paragraphs of a block: list items and quoted lines each their own, markers removed."""
    out: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        item = _ITEM.match(line)
        if item or not out:
            out.append(line[item.end() if item else 0:].strip())
        else:
            out[-1] += " " + line.strip()
    return out


def chunk_sentences(chunk: Chunk, title: str) -> Iterator[Sentence]:
    """The prose sentences of a chunk (see the contract)."""
    heading = _clean(chunk.heading_path.split(" > ")[-1]) or _clean(title)
    for block in re.split(r"\n[ \t\r]*\n", chunk.text):
        first = block.lstrip("\r\n").split("\n", 1)[0]
        if _FENCE.match(first) or first.lstrip().startswith(("#", "|", "<")):
            continue
        for paragraph in _prose(block):
            for s in line_sentences(paragraph):
                words = _words(s)
                alpha = sum(w.isalpha() for w in words)
                if MIN_WORDS <= len(words) <= MAX_WORDS and alpha >= 0.6 * len(words):
                    yield Sentence(s, chunk, heading, tuple(words))


def _clean(text: str) -> str:
    return " ".join(re.sub(r"[*_`#]+|^\s*\d+(?:\.\d+)*[.)]?\s+", " ", text).split())


def _pick(key: str, options: Sequence[str]) -> str:
    return options[int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % len(options)]


def _specific(words: Sequence[str], vocabulary: Vocabulary, n: int, *, skip=frozenset(), rare_ok: bool = True) -> list[str]:
    """The ``n`` most specific (fewest chunks) distinct content words, in sentence order (``rare_ok`` false: no rare word)."""
    pool = [w for w in dict.fromkeys(words) if w not in skip and is_content(w)
            and (rare_ok or not vocabulary.rare(w))]
    chosen = set(sorted(pool, key=lambda w: (vocabulary.df(w), w))[:n])
    return [w for w in pool if w in chosen]


def lexical(s: Sentence, vocabulary: Vocabulary) -> Candidate | None:
    found: list[tuple[float, str, str]] = []
    for category, pattern, weight in _TERMS:
        for m in pattern.finditer(s.text):
            term = m.group(1).strip()
            parts = _words(term)
            if not parts or (category == "identifier" and not re.search(r"[\d_./]|[a-z][A-Z]", term)):
                continue
            df = min(vocabulary.df(w) for w in parts)
            found.append((weight + 1.0 - df / max(vocabulary.chunks, 1), category, term))
    for w in dict.fromkeys(s.words):
        if w.isalpha() and len(w) >= 5 and is_content(w) and vocabulary.rare(w):
            found.append((1.0 - vocabulary.df(w) / max(vocabulary.chunks, 1), "rare word", w))
    if not found:
        return None
    score, category, term = max(found, key=lambda f: f[0])  # the first among equals
    context = _specific(s.words, vocabulary, 2, skip=frozenset(_words(term)), rare_ok=False)
    return Candidate("lexical", " ".join([term, *context]), s.chunk.doc_id, s.text, f"offline:lexical/{category}", score)


def _term(phrase: str) -> str | None:
    """A defined term as a question names it (first letter lowered unless a name like BM25), or None when the
    phrase is no noun phrase: more than five words, a pronoun, a clause word, a quote or a question mark."""
    words = phrase.split()
    lowered = [w.lower() for w in words]
    if (not 1 <= len(words) <= 5 or lowered[0] in _PRONOUNS or re.search(r"[\"“”?!]", phrase) or lowered[0] in ("if", "then", "whatever")
            or any(w in STOPWORDS and w not in _NOUN_PHRASE_WORDS for w in lowered)):
        return None
    first = words[0]
    return " ".join([first[:1].lower() + first[1:] if first[1:].islower() else first, *words[1:]])


def factual(s: Sentence, vocabulary: Vocabulary) -> Candidate | None:
    text = s.text.rstrip(" .!?")
    if (m := _DEFINITION.match(text)) and _term(m.group("x")):
        x, verb = _term(m.group("x")), m.group("v").lower()
        x = f"the {x}" if (m.group("a") or "").lower() == "the" else x
        if not any(vocabulary.rare(w) for w in _words(x)):  # a general word: the section says which one
            x = f"{x} in {s.heading}" if s.heading else x
        query = f"What does {x} mean?" if verb in ("means", "refers to") else f"What {verb} {x}?"
        return Candidate("factual", query, s.chunk.doc_id, s.text, "offline:factual/definition", 3.0)
    if m := _PURPOSE.match(text):
        return Candidate("factual", f"How do you {m.group('x').strip()}?", s.chunk.doc_id, s.text, "offline:factual/purpose", 3.0)
    if (m := _CAUSE.match(text)) and m.group("x").split()[0].lower() not in _PRONOUNS:
        return Candidate("factual", f"Why is it that {m.group('x').strip()}?", s.chunk.doc_id, s.text, "offline:factual/cause", 2.0)
    words = _specific(s.words, vocabulary, 3, skip=frozenset(_words(s.heading)))
    if len(words) < 2 or not s.heading:
        return None
    return Candidate("factual", f"{s.heading}: what about {' '.join(words)}?", s.chunk.doc_id, s.text, "offline:factual/heading", 1.0)


def _synonym(word: str, own: frozenset[str]) -> str | None:
    """The first WordNet synonym of ``word`` in the sense its chunk suggests that shares no word with the chunk,
    one word preferred over two."""
    found = [syn for syn in thesaurus.synonyms(word, own) if not set(_words(syn)) & own and len(syn.split()) <= 2
             and syn.replace(" ", "").replace("-", "").isalpha()]
    return min(found, key=lambda syn: len(syn.split()), default=None)


def conceptual(s: Sentence, vocabulary: Vocabulary) -> Candidate | None:
    """The sentence's content words without its section's own (every word but the corpus's common ones said with a
    synonym the chunk does not hold, or left out), at most ``CONCEPT_WORDS``, the most specific, in the sentence's order."""
    own = frozenset(_words(s.chunk.text))
    words = [w for w in dict.fromkeys(s.words) if w.isalpha() and is_content(w)]
    said = {w: w if vocabulary.common(w) else _synonym(w, own) for w in words}
    # the most specific words first: at most SYNONYMS said with synonyms, the rest the sentence's own common words
    specific = sorted((w for w in words if said[w]), key=lambda w: (vocabulary.df(w), w))
    swapped = [w for w in specific if said[w] != w][:SYNONYMS]
    keep = set(swapped + [w for w in specific if said[w] == w][: CONCEPT_WORDS - len(swapped)])
    out = [said[w] for w in words if w in keep]
    if sum(said[w] != w for w in keep) < 1 or len(out) < 3:
        return None
    opener = _pick(s.text, _OPENERS)
    replaced = sum(said[w] != w for w in keep)
    return Candidate("conceptual", f"{opener} {' '.join(out)}?", s.chunk.doc_id, s.text, "offline:conceptual/wordnet", float(replaced))


class OfflineDrafter:
    """Candidates of every kind from every prose sentence of a document (see the contract)."""

    name = "offline"

    def __init__(self) -> None:
        self._sentences: dict[str, int] = {}

    def sentences(self, doc: Document, chunks: Sequence[Chunk]) -> list[Sentence]:
        found = [s for c in chunks for s in chunk_sentences(c, doc.title)]
        if len(found) > MAX_SENTENCES:
            step = len(found) / MAX_SENTENCES
            found = [found[int(i * step)] for i in range(MAX_SENTENCES)]
        self._sentences[doc.doc_id] = len(found)
        return found

    def candidates(self, doc: Document, chunks: Sequence[Chunk], vocabulary: Vocabulary) -> Iterator[Candidate]:
        for s in self.sentences(doc, chunks):
            for make in (lexical, factual, conceptual):
                if (c := make(s, vocabulary)) is not None:
                    yield c

    def why_none(self, doc: Document) -> str:
        if not self._sentences.get(doc.doc_id):
            return (f"no prose sentence of {MIN_WORDS} to {MAX_WORDS} words outside code blocks, headings and tables "
                    "(only code, or text without sentences)")
        return "every candidate was dropped (see the dropped counts)"
