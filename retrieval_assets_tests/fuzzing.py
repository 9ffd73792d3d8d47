"""What the fuzz tests and ``python -m benchmarks fuzz`` share: hypothesis strategies for hostile query
text, and the properties the query path keeps under any of it (SPEC, "Behaviour under bad input").

Not a test module: ``test_fuzz_queries`` runs a bounded, derandomized number of examples in CI; the
benchmark runs as many as asked and prints the failures and the slowest calls.

Properties of one query (``check_query``): ``pipeline.run`` (with the given parameters) and the answer
path (``answer.sources`` + ``extractive_answer``) never raise; each call returns within the
parameters' ``statement_timeout_ms``; a query holding a plain corpus word (``plain_words``) gets hits
(and a lexical list, when it negates nothing); and the index is unchanged (``fingerprint``).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from hypothesis import strategies as st
from psycopg import sql

from retrieval_assets.answers import answer
from retrieval_assets.index import tables
from retrieval_assets.params import RetrievalParams, limit_query
from retrieval_assets.search import pipeline

# -- the generator -----------------------------------------------------------------------------------

OPERATORS = ['"', "-", "--", "(", ")", "&", "|", "!", "<->", "<2>", "<", ">", ":", ":*", "*", "\\", "'", "''", "OR", "or",
             " OR ", "AND", "NOT", "-(", ")-", '"-', '-"', "&!", "|-", "!-"]
CONTROLS = ["\x00", "\t", "\n", "\r", "\x0b", "\x0c", "\x1b", "\x1c", "\x1f", "\x7f", "\x85", "\xa0", "\u2028", "\u3000"]
MARKS = ["\u0301", "\u0308", "\u0327", "\u20dd", "\u200b", "\u200d", "\u200e", "\u202e", "\ufeff", "\ufe0f"]
SCRIPTS = ["поиск", "検索", "بحث", "חיפוש", "ψάξε", "खोज", "검색", "ﬁnd", "Straße", "İstanbul", "🔍", "👩‍💻", "e\u0301te\u0301"]
RUN_CHARACTERS = list("-!&|()<>:*\"'\\ \x00\tée\u0301") + ["-!", "- ", "(-", '-"', "\u0301"]
STOP_WORDS = ["the", "a", "of", "and", "not", "is", "to", "in"]


def query_text(vocabulary: list[str]) -> st.SearchStrategy[str]:
    """Random mixes of corpus words (any case), stop words, operators and quotes, control characters,
    combining marks and other scripts, random text, and runs of one character (up to 3,000)."""
    word = st.sampled_from(vocabulary)
    atom = st.one_of(
        word, word.map(str.upper), word.map(str.title),
        st.sampled_from(STOP_WORDS), st.sampled_from(OPERATORS), st.sampled_from(CONTROLS),
        st.sampled_from(MARKS), st.sampled_from(SCRIPTS),
        st.builds(lambda ch, n: ch * n, st.sampled_from(RUN_CHARACTERS), st.integers(1, 3000)),
        st.text(max_size=12),
        st.text(alphabet=st.characters(codec="utf-8"), max_size=12),
    )
    separator = st.sampled_from(["", " ", " ", "  ", "\t", "\n"])
    parts = st.lists(st.tuples(atom, separator), max_size=30)
    return parts.map(lambda pairs: "".join(a + s for a, s in pairs))


# -- the properties ----------------------------------------------------------------------------------

_PG_SPACE = " \t\n\r\x0b\x0c"  # what Postgres's text-search parsers split on (C.UTF-8; Python's \s is wider)
_PLAIN = re.compile(rf"(?<![^{_PG_SPACE}])[A-Za-z]+(?![^{_PG_SPACE}])")
_SKIPPED_BEFORE = re.compile(r"[\s\x00!&|()<]*\Z")  # what websearch_to_tsquery skips between a '-' and a word


def plain_words(query: str, vocabulary: set[str]) -> list[str]:
    """The words of ``query`` (as searched: ``params.limit_query``) the lexical list must find: a run of
    ASCII letters between Postgres whitespace, in the corpus vocabulary (not a stop word: those have no
    lexeme), not negated (no '-' before it but skipped characters) and with no quote or backslash
    anywhere before it (a quote opens a phrase; a backslash can join it to the word before)."""
    searched = limit_query(query).replace("\x00", " ")
    found = []
    for m in _PLAIN.finditer(searched):
        before = searched[: m.start()]
        if any(c in before for c in "\"'\\"):
            break
        if m.group().lower() in vocabulary and not before[: _SKIPPED_BEFORE.search(before).start()].endswith("-"):
            found.append(m.group().lower())
    return found


def vocabulary(conn, schema: str, texts: list[str]) -> list[str]:
    """The lowercase ASCII words of ``texts`` whose English lexeme is one the index holds (so no stop word)."""
    words = sorted({w for t in texts for w in re.findall(r"[a-z]+", t.lower())})
    rows = conn.execute(tables.statement(schema, """
        SELECT w FROM unnest(%s::text[]) AS w, LATERAL tsvector_to_array(to_tsvector('english', w)) AS l(lexemes)
        WHERE cardinality(l.lexemes) = 1 AND EXISTS (SELECT 1 FROM {term_df} d WHERE d.term = l.lexemes[1] AND d.df > 0)
        ORDER BY w"""), (words,)).fetchall()
    return [w for (w,) in rows]


def fingerprint(conn, schema: str) -> dict[str, object]:
    """The row count of every table of the schema and an md5 of every row of ``chunks`` (vectors and tsv included)."""
    names = [n for (n,) in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", (schema,))]
    counts = {n: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, n))).fetchone()[0] for n in names}
    digest = conn.execute(tables.statement(schema, "SELECT md5(string_agg(md5(c::text), '' ORDER BY c.chunk_id)) FROM {chunks} c")).fetchone()[0]
    return {**counts, "chunks md5": digest}


@dataclass
class Checked:
    """What ``check_query`` saw: each call's wall time, by name."""

    seconds: dict[str, float] = field(default_factory=dict)


def _timed(checked: Checked, name: str, limit_s: float, call):
    started = time.perf_counter()
    result = call()
    checked.seconds[name] = elapsed = time.perf_counter() - started
    assert elapsed < limit_s, f"{name} took {elapsed:.2f} s, past the statement timeout ({limit_s:g} s)"
    return result


def check_query(conn, retrievers: dict[str, tuple[pipeline.Retriever, RetrievalParams]], answer_retriever: pipeline.Retriever,
                query: str, words: set[str]) -> Checked:
    """Run ``query`` through every named pipeline and the answer path; AssertionError on a broken property
    (any other exception is the query path raising, itself the failure)."""
    checked = Checked()
    plain = plain_words(query, words)
    for name, (retriever, params) in retrievers.items():
        trace = _timed(checked, name, params.statement_timeout_ms / 1000, lambda: pipeline.run(conn, retriever, query, params))
        if plain:
            assert trace.final, f"{name}: no hits for a query holding the corpus word(s) {plain}"
            if "-" not in limit_query(query):
                assert trace.text, f"{name}: no lexical hits for the corpus word(s) {plain} (nothing negated)"
    found = _timed(checked, "answer", answer.SOURCES.statement_timeout_ms / 1000, lambda: answer.sources(conn, answer_retriever, query))
    result = answer.extractive_answer(query, [c for c, _ in found], scores=[s for _, s in found])
    assert result.text and (result.faithfulness.refused or result.faithfulness.cited)
    if plain:
        assert found, f"answer: no sources for a query holding the corpus word(s) {plain}"
    return checked
