"""The prose sentences of a chunk that the extractive answerer may quote (answer.extractive_answer).

Contract: ``sentences(text)`` lists a chunk's sentences of prose, in order, a sentence wrapped over lines as one: no code
fences, headings, table rows, link lists, bare headings or text holding a citation marker ``[n]`` or the refusal. A
paragraph's last sentence may end with the colon that introduces a code block, list or table ("... an error like:").
"""

from __future__ import annotations

import re

from retrieval_assets.answers.citations import MARKER, is_refusal, line_sentences


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_QUOTE = re.compile(r"^\s*>\s?")


def _prose_blocks(text: str) -> list[tuple[str, bool]]:
    """Paragraphs and list items of a chunk, their wrapped lines joined by a space, each with whether it introduces
    a listing (the next line that is not blank opens a code fence, a list item or a table row); code fences,
    headings and table rows left out (each ends the block before it, as a blank line does)."""
    blocks: list[list] = []  # [text, introduces a listing]
    lines: list[str] = []
    fence = None
    last: list | None = None  # the block ended last, while only blank lines followed it

    def end_block(listing: bool = False) -> None:
        nonlocal last
        if lines:
            blocks.append([" ".join(lines), False])
            lines.clear()
            last = blocks[-1]
        if listing and last is not None:
            last[1] = True

    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            continue
        if opening:
            end_block(listing=True)
            fence, last = opening.group(1), None
            continue
        line = _QUOTE.sub("", line)
        if not line.strip():
            end_block()
            continue
        if _HEADING.match(line) or line.lstrip().startswith("|"):
            end_block(listing=not _HEADING.match(line))
            last = None
            continue
        if _ITEM.match(line):
            end_block(listing=True)
            line = _ITEM.sub("", line)
        lines.append(line.strip())
        last = None
    end_block()
    return [(block, introduces) for block, introduces in blocks]


_LINK = re.compile(r"!?\[[^\]]*\]\([^)]*\)|<[a-z]+://[^>]*>|[a-z]+://\S+|`[^`]*`")
_CLOSE = r"[\"'”’»)\]*]*$"
_ENDS, _LEAD_IN = re.compile(r"[.!?]" + _CLOSE), re.compile(r":" + _CLOSE)


def _is_sentence(sentence: str, lead_in: bool = False) -> bool:
    """A sentence of prose: ends as one (. ! ?; a ``lead_in``, the last sentence of a block that introduces a listing,
    may end with a colon: "... it fails with an error like:"), five words or more, four of them words of text outside
    links, URLs and code spans (a link list or a bare heading is none)."""
    words = [w for w in _LINK.sub(" ", sentence).split() if any(ch.isalpha() for ch in w)]
    ends = _ENDS.search(sentence) or (lead_in and _LEAD_IN.search(sentence))
    return bool(ends) and len(sentence.split()) >= 5 and len(words) >= 4


def sentences(text: str) -> list[str]:
    """Prose sentences of a chunk (a sentence wrapped over lines is one): no code fences, headings,
    table rows, link lists or marker-like text."""
    found = []
    for block, introduces in _prose_blocks(text):
        sentences = line_sentences(block)
        found += [s for i, s in enumerate(sentences) if _is_sentence(s, introduces and i == len(sentences) - 1)
                  and not MARKER.search(s) and not is_refusal(s)]
    return found
