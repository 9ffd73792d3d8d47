"""What a question asks for: the expected answer type its wh-phrase names, and whether a sentence carries one.

Contract: ``expected(question)`` is ``NUMBER`` for a question that asks for a quantity or a date ("how many / much /
long / old ...", "which / what port, version, year, size, price ...", "when was / did ..."), ``CODE`` for one that asks
for something a reader types ("which / what command, option, flag, file, variable ..."), else ``None`` (no constraint:
"how do I ...", "why ...", "what happens when ...", and "how often ...": a frequency is often said in words, "every
morning"). ``carries(sentence)`` is the set of types a sentence holds: ``NUMBER`` for a number of its own (digits not
inside a name, a number word from two up), ``CODE`` for a code-like token (a code span, a ``--flag`` or ``-f``, a path
or file name, an UPPER_CASE or snake_case name, ``$VAR``, a manual page like ``git-fsck(1)``). Both are regular
expressions over the text, deterministic and cheap; any text in any script is read without raising (and asks for nothing).
"""

from __future__ import annotations

import re

NUMBER, CODE = "number", "code"

_LEAD = r"^\W*(?:(?:and|but|so|ok|okay|please|also|tell me|do you know)\W+)*(?:(?:in|at|on|for|from|to|by|with|under)\s+)?"
_NUMBER_NOUNS = (r"port|version|release|year|date|day|month|time|number|size|length|limit|maximum|minimum|amount|count|"
                 r"percentage|ratio|rate|price|cost|fee|timeout|duration|interval|dimensions?|capacity|speed|latency|"
                 r"temperature|age|score|recall|precision|threshold|value")
_CODE_NOUNS = r"command|subcommand|option|flag|switch|file|filename|variable|environment variable|setting|parameter|function|argument|key"
_AUX = r"(?:do|does|did|is|are|was|were|can|could|should|will|would|must|has|have|had|may|might)\b"
_NOT_HEAD = r"(?!\s+(?:attribute|metadata|name|format|system|type|content|permission|mode|size|path|count|code|history)s?\b)"
# "which|what" + (a copula and "the") + up to two words that are no auxiliary verb + the noun, the phrase's head
_WH = rf"(?:which|what)\s+(?:(?:is|are|was|were)\s+(?:the|a|an|its|their)\s+)?(?:(?!{_AUX})\w+\s+){{0,2}}?"
_ASKS_NUMBER = re.compile(
    _LEAD + r"(?:how\s+(?:many|much|long|old)\b"
    rf"|{_WH}(?:{_NUMBER_NOUNS})s?\b{_NOT_HEAD}"
    r"|(?:which|what)\s+(?:is|are|was|were)\s+the\s+(?:largest|longest|smallest|shortest|biggest|highest|lowest|fastest|slowest)\b"  # a size
    r"|when\s+(?:was|were|did)\b)", re.IGNORECASE)
_ASKS_CODE = re.compile(_LEAD + rf"{_WH}(?:{_CODE_NOUNS})s?\b{_NOT_HEAD}", re.IGNORECASE)

# a number of its own (not the 3 of S3 or the 6 of L-6, not "one", an ordinal or "single": "one by one", "the first line")
_NUMBER_WORDS = (r"two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|forty|fifty|hundreds?|"
                 r"thousands?|millions?|billions?|dozens?|half|twice")
_HAS_NUMBER = re.compile(rf"(?<![\w.-])\d|\b(?:{_NUMBER_WORDS})\b", re.IGNORECASE)
_HAS_CODE = re.compile(
    r"`[^`]+`"                           # a code span
    r"|(?<![\w-])--?[A-Za-z][\w-]*"      # --flag, -f
    r"|(?<!\w)[~.]?/[\w.-]+|\w+/[\w.-]+/"  # /etc/x, ~/x, a/b/
    r"|\b[\w-]+\.(?:ya?ml|json|toml|ini|cfg|conf|txt|md|rst|py|sh|go|c|h|js|log|lock|git)\b"  # a file name
    r"|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|\$\{?\w+"   # UPPER_CASE, $VAR
    r"|\b[a-z]+_[a-z0-9_]+\b"            # snake_case
    r"|\b[\w-]+\(\d\)")                  # a manual page: git-fsck(1)


def expected(question: str) -> str | None:
    """The answer type ``question`` asks for (``NUMBER``, ``CODE``), or ``None`` when it names none."""
    number, code = _ASKS_NUMBER.search(question), _ASKS_CODE.search(question)
    if number and code:  # the one named first: "what is the largest file ...", "which option sets the timeout"
        return NUMBER if number.end() <= code.end() else CODE
    return NUMBER if number else CODE if code else None


def carries(sentence: str) -> frozenset[str]:
    """The answer types ``sentence`` holds (see the module's contract)."""
    return frozenset(kind for kind, found in ((NUMBER, _HAS_NUMBER), (CODE, _HAS_CODE)) if found.search(sentence))
