"""Sentences and citations of an answer (seed stage 06): the faithfulness check.

Contract: ``check`` splits the answer into sentences (after ``.``, ``!``, ``?`` followed by
whitespace, or a line break; never after Mr. Mrs. Ms. Mme. Dr. St. vs. e.g. i.e. etc.; a marker
that opens a sentence belongs to the one before) and counts the sentences without a valid
``[n]`` (1 <= n <= number of sources); the refusal sentence needs no marker.

Beyond the seed, the splitter is quote-aware: a ``.``, ``!`` or ``?`` inside a quotation on the
same line ("a sign that read 'Closed by order of Sofronie.' hung on the door") does not end the
sentence; at the closing quote the sentence ends only when the next word starts like a new
sentence (capital letter, digit, opening quote) or the line ends. Inline code spans
(```[6]```) are mentions, not citations. Comma lists ``[1, 3]`` cite both numbers.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from retrieval_assets.types import Faithfulness

REFUSAL = "I cannot answer from the sources."

ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "mme.", "dr.", "st.", "vs.", "e.g.", "i.e.", "etc."})

MARKER = re.compile(r"\[(\d+(?:\s*,\s*\d+)*)\]")
_LEADINGMARKERS = re.compile(r"^(?:\s*\[\d+(?:\s*,\s*\d+)*\])+")
# A sentence end: terminators, closing quotes/brackets, markers glued to them, then whitespace.
_END = re.compile(r"[.!?]+(?P<close>[\"'”’»)]*)(?P<marks>(?:[ \t]*\[\d+(?:\s*,\s*\d+)*\])*)(?=\s|$)")
_CODE = re.compile(r"`+[^`]*`+")
_WORD = re.compile(r"\w")
_OPENERS = "([{\"'“‘«"



def _quote_spans(line: str, code: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(open, close) index pairs of the quotations closed on this line (straight and curly quotes).

    A ``'`` opens a quote only at the start of a word (after whitespace or an opening bracket)
    and closes one only at the end of a word, so apostrophes (Sofronie's, Tinsmiths' Lane) never
    count. Unclosed quotes protect nothing.
    """
    in_code = lambda i: any(a <= i < b for a, b in code)  # noqa: E731
    stack: list[tuple[str, int]] = []  # (closing char expected, open index)
    pairs: list[tuple[int, int]] = []

    def close(i: int, chars: str) -> bool:
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth][0] in chars:
                pairs.append((stack[depth][1], i))
                del stack[depth:]
                return True
        return False

    for i, c in enumerate(line):
        if c not in "\"“”‘’'" or in_code(i):
            continue
        prev = line[i - 1] if i else " "
        nxt = line[i + 1] if i + 1 < len(line) else " "
        if c == '"':
            if not close(i, '"') and not nxt.isspace():
                stack.append(('"', i))
        elif c == "“":
            stack.append(("”", i))
        elif c == "”":
            close(i, "”")
        elif c == "‘":
            stack.append(("’", i))
        else:  # ' or ’: a closing quote at a word's end, an opening ' at a word's start, else an apostrophe
            at_word_end = not prev.isspace() and not nxt.isalnum()
            if at_word_end and close(i, "'’"):
                continue
            if c == "'" and (prev.isspace() or prev in _OPENERS or prev in "—–-") and not nxt.isspace():
                stack.append(("'", i))
    # keep the outermost pairs only
    return [(a, b) for a, b in pairs if not any(x < a and b < y for x, y in pairs)]


def line_sentences(line: str) -> list[str]:
    code = [(m.start(), m.end()) for m in _CODE.finditer(line)]
    spans = _quote_spans(line, code) + [(a, b - 1) for a, b in code]
    cuts = [0]
    for m in _END.finditer(line):
        t = m.start("close") - 1  # the last terminator
        start = max(line.rfind(" ", 0, t), line.rfind("\t", 0, t)) + 1
        if line[start : t + 1].lstrip(_OPENERS).lower() in ABBREVIATIONS:
            continue
        inside = next(((a, b) for a, b in spans if a < t < b), None)
        if inside is not None:
            a, b = inside
            closes_here = m.start("close") <= b < m.end("close") and line[t + 1 : b].strip(".!?\"'”’»)") == ""
            if not closes_here or (a, b + 1) in code:
                continue  # a terminator inside the quotation (or code) does not end the sentence
            rest = line[m.end() :].lstrip()
            if rest and not (rest[0].isupper() or rest[0].isdigit() or rest[0] in "\"“‘'«("):
                continue  # 'Closed by order of Sofronie.' hung on the door: the sentence goes on
        cuts.append(m.end())
    cuts.append(len(line))
    return [line[a:b].strip() for a, b in zip(cuts, cuts[1:]) if line[a:b].strip()]


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``; markers opening a sentence are moved to the end of the one before."""
    sentences: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        for sentence in line_sentences(line):
            lead = _LEADINGMARKERS.match(sentence)
            if lead and sentences:
                sentences[-1] = f"{sentences[-1]} {lead.group().strip()}"
                sentence = sentence[lead.end() :].strip()
            if sentence:
                sentences.append(sentence)
    return sentences


def markers(text: str) -> list[int]:
    """Every ``[n]`` number of ``text`` in order (``[1, 3]`` gives 1 and 3); code spans excluded."""
    return [int(n) for m in MARKER.finditer(_CODE.sub(" ", text)) for n in m.group(1).split(",")]


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold().rstrip(".")


def is_refusal(text: str) -> bool:
    return _normalise(REFUSAL) in _normalise(text)


def check(text: str, citations: Sequence[str]) -> Faithfulness:
    """Valid source numbers used, sentences without a valid marker (refusal excepted), refusal."""
    n = len(citations)
    cited: set[int] = set()
    uncited = 0
    for sentence in split_sentences(text):
        valid = [k for k in markers(sentence) if 1 <= k <= n]
        cited.update(valid)
        bare = MARKER.sub(" ", sentence)
        if valid or _normalise(bare) == _normalise(REFUSAL) or not _WORD.search(bare):
            continue
        uncited += 1
    return Faithfulness(tuple(sorted(cited)), uncited, is_refusal(text))


def invalid_citations(text: str, citations: Sequence[str]) -> list[int]:
    """Marker numbers outside 1..len(citations), once each, in order of appearance."""
    return list(dict.fromkeys(k for k in markers(text) if not 1 <= k <= len(citations)))
