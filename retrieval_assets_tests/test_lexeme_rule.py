"""The text rule of the tsv column and the query parse (index.lexeme_rule): words joined by '/' or '.' are
searchable, numbers stay whole, and a table made under the earlier rule is rewritten by store.create."""

from __future__ import annotations

import pytest
from psycopg import sql

from retrieval_assets.index import bm25, lexeme_rule, store
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.tables import statement
from retrieval_assets.search import bm25_rank, ts_rank
from retrieval_assets.types import Chunk

TEXTS = {"a": "the lift/drag ratio of a slender wing", "b": "edit /etc/fstab and docs/setup.md, then run os.path.join",
         "c": "a wing at mach 5.8 in version 1.2.3", "d": "drag of a body of revolution"}
CHUNKS = [Chunk(f"doc{k}#000", f"doc{k}", "", 0, len(t), t) for k, t in TEXTS.items()]


@pytest.fixture(scope="module")
def table(conn, schema):
    store.create(conn, schema, 16)
    store.sync(conn, schema, CHUNKS, HashEmbedder(dims=16))
    conn.commit()
    return schema


def lexemes_of(conn, schema, chunk_id):
    return set(conn.execute(statement(schema, "SELECT tsvector_to_array(tsv) FROM {chunks} WHERE chunk_id = %s"), (chunk_id,)).fetchone()[0])


@pytest.mark.parametrize(("query", "found"), [("lift", "doca#000"), ("fstab", "docb#000"), ("setup", "docb#000"), ("path", "docb#000")])
def test_a_word_joined_by_a_slash_or_dot_is_found_by_both_lists(conn, table, query, found):
    """Postgres reads lift/drag or docs/setup.md as one file token; under the rule each word is a lexeme too."""
    assert found in [h.chunk_id for h in bm25_rank.bm25_search(conn, table, query)]
    assert found in [h.chunk_id for h in ts_rank.text_search(conn, table, query)]


def test_the_whole_and_its_parts_are_lexemes_and_numbers_stay_whole(conn, table):
    assert {"lift-drag", "lift", "drag"} <= lexemes_of(conn, table, "doca#000")
    assert {"5.8", "1.2.3"} <= lexemes_of(conn, table, "docc#000")
    # a quoted path is a phrase of its parts, and a negated one excludes the chunk holding it
    assert [h.chunk_id for h in bm25_rank.bm25_search(conn, table, '"docs/setup.md"')] == ["docb#000"]
    assert "docb#000" not in [h.chunk_id for h in bm25_rank.bm25_search(conn, table, "wing edit -docs/setup.md")]


def test_a_table_of_the_earlier_rule_is_rewritten(conn, schema, table):
    """A chunk table whose tsv is Postgres's plain to_tsvector (before the rule) gets the rule's lexemes, its
    full-text copy and BM25 postings built again from them, on store.create; a second create changes nothing."""
    conn.execute(statement(table, "ALTER TABLE {chunks} DROP COLUMN tsv, ADD COLUMN tsv tsvector "
                                  "GENERATED ALWAYS AS (to_tsvector('english', text)) STORED"))
    conn.execute(statement(table, "DELETE FROM {fulltext}"))
    conn.execute(statement(table, "INSERT INTO {fulltext} SELECT chunk_id, tsv FROM {chunks}"))
    conn.execute(statement(table, "DROP TABLE {postings}"))
    bm25.create(conn, table)  # the copy and the postings of the old lexemes
    conn.commit()
    assert "lift" not in lexemes_of(conn, table, "doca#000")
    assert bm25_rank.bm25_search(conn, table, "lift") == []
    store.create(conn, table, 16)
    conn.commit()
    assert "lift" in lexemes_of(conn, table, "doca#000")
    assert [h.chunk_id for h in bm25_rank.bm25_search(conn, table, "lift")] == ["doca#000"]
    assert [h.chunk_id for h in ts_rank.text_search(conn, table, "lift")] == ["doca#000"]
    stats = conn.execute(statement(table, "SELECT n FROM {bm25_stats}")).fetchone()[0]
    assert stats == len(CHUNKS)
    assert not lexeme_rule.migrate(conn, table)
    assert store.sync(conn, table, CHUNKS, HashEmbedder(dims=16)).embedded == 0  # a full sync, nothing embedded again
    conn.commit()
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table, "fulltext"))).fetchone()[0] == len(CHUNKS)
