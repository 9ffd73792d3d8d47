"""Full-text query parsing shared by both lexical lists (seed stage 03).

Contract: ``parse_query`` never raises on user text; it returns the positive terms ORed and the
negated terms ORed, as tsquery text (None when there are none), from ``websearch_to_tsquery``.
``lexemes`` lists the distinct lexemes of a tsquery text (phrases count as their words).
``PARSED`` and ``LEXEMES`` (``lexemes_of``) are the same two steps in SQL, for a search statement that
parses its own query (``%(query)s``, passed through ``clean``) instead of paying a round trip for it.
Every statement that parses user text takes it from ``clean``: NUL bytes out, and runs of negations
within what Postgres's parser holds (``params.limit_negations``).
"""

from __future__ import annotations

import logging
import re

import psycopg

from retrieval_assets.index import lexeme_rule
from retrieval_assets.params import MAX_QUERY_NEGATIONS, limit_negations

_LEXEME = re.compile(r"'((?:[^']|'')*)'")

log = logging.getLogger(__name__)


def clean(query: str) -> str:
    """``query`` as a search statement's parameter: NUL (which Postgres text cannot hold) as a space, and
    every run of negations cut to ``params.MAX_QUERY_NEGATIONS`` (the cut logged; ``pipeline.run`` has cut
    its query already). Everything else is passed through as a parameter."""
    cleaned = limit_negations(query.replace("\x00", " "))
    if len(cleaned) != len(query):
        log.info("query's runs of negations cut from %d to %d characters (limit: %d in a row)", len(query), len(cleaned),
                 MAX_QUERY_NEGATIONS)
    return cleaned


def _split_top_level(tsquery: str) -> list[str]:
    """Split the text form of a tsquery at the ``&`` and ``|`` outside quotes and parentheses."""
    parts, depth, quoted, current = [], 0, False, []
    i = 0
    while i < len(tsquery):
        ch = tsquery[i]
        if quoted:
            current.append(ch)
            if ch == "'":
                if tsquery[i + 1 : i + 2] == "'":  # a doubled quote inside a lexeme
                    current.append("'")
                    i += 1
                else:
                    quoted = False
        elif ch == "'":
            quoted = True
            current.append(ch)
        elif ch in "()":
            depth += 1 if ch == "(" else -1
            current.append(ch)
        elif ch in "&|" and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current).strip())
    return [p for p in parts if p]


def parse_query(conn: psycopg.Connection, query: str) -> tuple[str | None, str | None]:
    """(positive terms ORed, negated terms ORed) as tsquery text, from websearch_to_tsquery; a term
    repeated in the query is kept once (ts_rank_cd merges a repeated operand's positions, so its score is
    the same, and its work grows with every operand)."""
    text = conn.execute(f"SELECT {lexeme_rule.tsquery('%s')}::text", (clean(query),)).fetchone()[0]
    positive, negative = [], []
    for term in _split_top_level(text):
        if term.startswith("!"):
            negative.append(term[1:].strip())
        else:
            positive.append(term)
    join = lambda terms: " | ".join(f"( {t} )" for t in dict.fromkeys(terms)) or None  # noqa: E731
    return join(positive), join(negative)


# parse_query as a CTE ``parsed(pos, neg, starts)`` (one row; NULLs when there are no such terms), for
# ``WITH`` in a statement holding %(query)s; ``starts`` holds the quoted lexemes that can begin a match of
# a positive term (a lexeme, or a phrase's first one; every lexeme of any other term), for ts_rank's bound.
# The tsquery text is cut into tokens that put it back together: a quoted lexeme (doubled quotes inside),
# a parenthesis, & or |, or a run of anything else; a token's depth is the running count of parentheses
# (none inside a lexeme token), and the & and | at depth 0 separate the terms, as in _split_top_level; a
# repeated term is kept once, in its first place.
PARSED = """parsed AS MATERIALIZED (
    SELECT string_agg('( ' || term || ' )', ' | ' ORDER BY part) FILTER (WHERE left(term, 1) <> '!') AS pos,
           string_agg('( ' || btrim(substr(term, 2)) || ' )', ' | ' ORDER BY part) FILTER (WHERE left(term, 1) = '!') AS neg,
           string_agg(CASE WHEN regexp_replace(term, '''(?:[^'']|'''')*''', '', 'g') ~ '^[<>0-9 -]*$'
                           THEN substring(term from '^''(?:[^'']|'''')*''') ELSE term END, ' ') FILTER (WHERE left(term, 1) <> '!') AS starts
    FROM (SELECT min(part) AS part, term FROM (SELECT part, btrim(string_agg(token, '' ORDER BY i)) AS term
          FROM (SELECT token, i, sep, count(*) FILTER (WHERE sep) OVER (ORDER BY i) AS part
                FROM (SELECT m[1] AS token, i, m[1] IN ('&', '|') AND sum(CASE m[1] WHEN '(' THEN 1 WHEN ')' THEN -1 ELSE 0 END)
                                                                     OVER (ORDER BY i) = 0 AS sep
                      FROM regexp_matches(""" + lexeme_rule.tsquery("%(query)s") + """::text,
                                          '''(?:[^'']|'''')*''|[()&|]|[^''()&|]+|''', 'g') WITH ORDINALITY AS t(m, i)
                     ) AS depths
               ) AS parts
          WHERE NOT sep GROUP BY part) AS each_term
          WHERE term <> '' GROUP BY term) AS terms)"""


def lexemes_of(source: str, column: str) -> str:
    """SQL for the rows ``term``, lexemes(``column``) of the CTE ``source``: what _LEXEME finds, doubled quotes undone."""
    return (f"SELECT DISTINCT replace(m[1], '''''', '''') AS term "
            f"FROM {source}, regexp_matches({column}, '''((?:[^'']|'''')*)''', 'g') AS m")


LEXEMES = lexemes_of("parsed", "parsed.pos")  # the positive terms' lexemes, after PARSED


def lexemes(tsquery: str) -> list[str]:
    """The distinct lexemes of a tsquery text, sorted."""
    return sorted({m.replace("''", "'") for m in _LEXEME.findall(tsquery)})
