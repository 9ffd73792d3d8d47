"""The prose sentences of a chunk that the extractive answerer may quote (answer.extractive_answer).

Contract: ``passages(text)`` lists a chunk's sentences of prose, in order, a sentence wrapped over lines as one: no code
fences, headings, table rows, link lists, bare headings or text holding a citation marker ``[n]`` or the refusal. A
paragraph's last sentence may end with the colon that introduces a code block, list or table ("... an error like:"),
or with no mark at all when a code block follows it ("... to the last committed state with" and the command).
Each comes with what it says: itself, and for a paragraph's last sentence the code block or table rows it introduces (the
answerer scores a sentence that introduces a command by the command's words too).
"""

from __future__ import annotations

import re

from retrieval_assets.answers.citations import MARKER, is_refusal, line_sentences


_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
_QUOTE = re.compile(r"^\s*>\s?")
# A MyST directive ("```{note}", "````{tab} Linux", ":::{warning}"): the admonitions and containers below hold Markdown;
# any other ({code-block}, {math}, a project's own such as pip's {pip-cli}) stays verbatim
_DIRECTIVE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\{([\w:-]+)\}")
_PROSE = {"note", "warning", "tip", "caution", "attention", "danger", "error", "hint", "important", "seealso", "admonition",
          "versionadded", "versionchanged", "deprecated", "tab", "tab-item", "tab-set", "tabbed", "card", "dropdown",
          "sidebar", "topic", "margin", "epigraph", "pull-quote", "highlights", "div", "container"}
_DIRECTIVE_FENCE = re.compile(r"^\s*(:{3,})")
_OPTION = re.compile(r"^\s*:[\w-]+:(\s|$)")  # a directive's option line (":class: tip")


def _prose_blocks(text: str) -> list[tuple[str, str, str]]:
    """Paragraphs and list items of a chunk, their wrapped lines joined by a space, each with what it introduces: "code"
    (the next line that is not blank opens a code fence), "listing" (a list item or a table row) or ""; and the text of
    the code block or table rows that follow it. Code fences, headings and table rows left out (each ends the block
    before it, as a blank line does)."""
    blocks: list[list] = []  # [text, introduces, the listing's text]
    lines: list[str] = []
    fence = None
    last: list | None = None  # the block ended last, while only blank lines followed it
    into: list | None = None  # the block whose code fence or table is being read

    def end_block(listing: str = "") -> None:
        nonlocal last
        if lines:
            blocks.append([" ".join(lines), "", ""])
            lines.clear()
            last = blocks[-1]
        if listing and last is not None:
            last[1] = listing

    containers: list[str] = []  # the fences of the MyST directives open around this line

    for line in text.splitlines():
        opening = _FENCE.match(line)
        if fence is not None:
            closing = opening or _DIRECTIVE_FENCE.match(line)
            if closing and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= len(fence):
                fence = None
            elif into is not None:
                into[2] += line.strip() + "\n"
            continue
        directive = _DIRECTIVE.match(line)
        if directive and directive.group(2).casefold() in _PROSE:
            end_block()
            containers.append(directive.group(1))
            into = last = None
            continue
        if containers and line.strip() and set(line.strip()) == {containers[-1][0]} and len(line.strip()) >= len(containers[-1]):
            end_block()
            containers.pop()
            into = last = None
            continue
        if containers and _OPTION.match(line):
            continue
        if opening or directive:
            end_block(listing="code")
            fence, into, last = (opening or directive).group(1), last, None
            continue
        line = _QUOTE.sub("", line)
        if not line.strip():
            end_block()
            into = None
            continue
        if line.lstrip().startswith("|"):
            end_block(listing="listing")
            into = last or (into if into is not None and into[1] == "listing" else None)
            if into is not None:
                into[2] += line.strip() + "\n"
            last = None
            continue
        into = None
        if _HEADING.match(line):
            end_block()
            last = None
            continue
        if _ITEM.match(line):
            end_block(listing="listing")
            line = _ITEM.sub("", line)
        lines.append(line.strip())
        last = None
    end_block()
    return [(block, introduces, listing) for block, introduces, listing in blocks]


_LINK = re.compile(r"!?\[[^\]]*\]\([^)]*\)|<[a-z]+://[^>]*>|[a-z]+://\S+|`[^`]*`")
_CLOSE = r"[\"'”’»)\]*]*$"
_ENDS, _LEAD_IN = re.compile(r"[.!?]" + _CLOSE), re.compile(r":" + _CLOSE)


def _is_sentence(sentence: str, lead_in: str = "") -> bool:
    """A sentence of prose: ends as one (. ! ?; a ``lead_in``, the last sentence of a block that introduces a listing,
    may end with a colon: "... it fails with an error like:", and one that introduces a code block with no mark: "...
    return the working tree to the last committed state with"), five words or more, four of them words of text outside
    links, URLs and code spans (a link list or a bare heading is none)."""
    words = [w for w in _LINK.sub(" ", sentence).split() if any(ch.isalpha() for ch in w)]
    ends = _ENDS.search(sentence) or (lead_in and _LEAD_IN.search(sentence)) or (lead_in == "code" and not _OPEN_END.search(sentence))
    return bool(ends) and len(sentence.split()) >= 5 and len(words) >= 4


_OPEN_END = re.compile(r"(?:[,;(\[{-]|\b(?:and|or|but|nor))\s*$", re.I)  # a paragraph cut off mid-clause is no lead-in


def passages(text: str) -> list[tuple[str, str]]:
    """Prose sentences of a chunk (a sentence wrapped over lines is one), each with what it says: the sentence, and for
    a block's last sentence, the code block or table rows it introduces. No code fences, headings, table rows, link
    lists or marker-like text as sentences."""
    found = []
    for block, introduces, listing in _prose_blocks(text):
        sentences = line_sentences(block)
        for i, s in enumerate(sentences):
            last = i == len(sentences) - 1
            if _is_sentence(s, introduces if last else "") and not MARKER.search(s) and not is_refusal(s):
                found.append((s, f"{s}\n{listing}" if last and listing else s))
    return found
