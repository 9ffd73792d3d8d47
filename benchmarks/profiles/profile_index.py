"""Where store.sync's time goes, statement by statement, and two candidate changes beside it.

Run: uv run python -m benchmarks.profiles.profile_index [--repeats 3] [--rows 5000]
Not the project's code: the candidates are proposals for retrieval_assets/index/store.py, measured in a
scratch schema (``bench_profile_index_hash``, common.bench_schema, dropped at the end). Prints
figures only; never asserts. store.sync is called unchanged, on a connection proxy that times
every ``execute`` (psycopg's execute returns once the server has answered, so a statement's time
includes its server work) and, for the ``prune`` candidate, rewrites one statement.

  to_tsvector  the cost of the generated column alone. Postgres computes a STORED generated column
               for every row an INSERT proposes, before ON CONFLICT finds the row already there,
               so a sync that changes nothing still parses every chunk's text into a tsvector
  prune        the upsert reads ``FROM incoming i WHERE NOT EXISTS (SELECT 1 FROM chunks o WHERE
               o.chunk_id = i.chunk_id AND <same columns> AND <same embedding>)`` instead of
               ``FROM incoming``: unchanged rows are never proposed (ON CONFLICT clause kept as is)
  hnsw-after   on an empty table: write first, then build the HNSW index

hnsw-after was adopted: store.sync loads an empty table in bulk from store.BULK_MIN chunks
(bulk.load drops HNSW and GIN and builds them after the write), so with ``--rows`` at or above
BULK_MIN the 5,000-row figures of sections 1 and 3 measure that bulk path. prune was not adopted;
section 2 says so ("NOT APPLIED") if store._merge's upsert stops matching the rewrite.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import re
import statistics
import time
from collections import defaultdict

from psycopg import sql

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.index import chunker, store
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.tables import statement
from retrieval_assets.types import Chunk

DIMS = 256
_UPSERT_SOURCE = re.compile(r'FROM "pg_temp"\."incoming"(\s+ON CONFLICT)')


def pruned_source(conn, schema: str) -> str:
    """The replacement of the upsert's ``FROM incoming``: only rows that differ from the stored ones."""
    chunks = sql.Identifier(schema, "chunks").as_string(conn)
    return rf"""FROM "pg_temp"."incoming" i WHERE NOT EXISTS (
    SELECT 1 FROM {chunks} o WHERE o.chunk_id = i.chunk_id
      AND (o.doc_id, o.heading_path, o.start_char, o.end_char, o.text)
          IS NOT DISTINCT FROM (i.doc_id, i.heading_path, i.start_char, i.end_char, i.text)
      AND o.embedding IS NOT DISTINCT FROM i.embedding)\1"""


class TimedConnection:
    """Delegates to a psycopg connection; times each ``execute`` by the first line of its SQL."""

    def __init__(self, conn, schema: str, *, prune: bool = False):
        self._conn, self.prune, self.rewrites = conn, prune, 0
        self._pruned = pruned_source(conn, schema)
        self._qualifier = sql.Identifier(schema).as_string(conn) + "."  # left out of the keys: they show the table
        self.times: dict[str, float] = defaultdict(float)

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def execute(self, query, params=None, **kwargs):
        text = query if isinstance(query, str) else query.as_string(self._conn)
        if self.prune and _UPSERT_SOURCE.search(text):
            text, n = _UPSERT_SOURCE.subn(self._pruned, text)
            self.rewrites += n
            query = text
        key = " ".join(text.split()).replace(self._qualifier, "")[:60]
        start = time.perf_counter()
        try:
            return self._conn.execute(query, params, **kwargs)
        finally:
            self.times[key] += time.perf_counter() - start


def timed(fn):
    gc.collect()
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def fmt(times):
    return f"best {min(times):6.3f} s  median {statistics.median(times):6.3f} s"


def breakdown(label: str, proxy: TimedConnection, wall: float, top: int = 8) -> None:
    sql_total = sum(proxy.times.values())
    print(f"  {label}: {wall:.3f} s wall, {sql_total:.3f} s in execute() (the rest: embedding, COPY, Python)")
    for key, seconds in sorted(proxy.times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {seconds:7.3f} s  {100 * seconds / wall:5.1f}%  {key}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--dsn", default=None)
    args = parser.parse_args(argv)
    schema = common.bench_schema("profile_index")

    documents = chunker.load_documents(common.CORPUS)
    chunks = [c for d in documents for c in chunker.chunk(d)]
    rows = [Chunk(f"{c.chunk_id}~{i // len(chunks)}", c.doc_id, c.heading_path, c.start_char, c.end_char, c.text)
            for i, c in zip(range(args.rows), itertools.cycle(chunks))]
    conn = pg.connect(args.dsn)
    common.print_machine({**common.postgres_versions(conn), "schema": schema, "BULK_MIN": str(store.BULK_MIN)})

    def fresh(hnsw=True):
        common.drop_chunks(conn, schema)
        store.create(conn, schema, DIMS)
        if not hnsw:
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, "chunks_embedding_hnsw")))

    texts = [c.text for c in rows]
    tsv, base = [], []
    for _ in range(args.repeats):
        tsv.append(timed(lambda: conn.execute(
            "SELECT sum(length(to_tsvector('english', t))) FROM unnest(%s::text[]) t", (texts,)).fetchone())[0])
        base.append(timed(lambda: conn.execute("SELECT sum(length(t)) FROM unnest(%s::text[]) t", (texts,)).fetchone())[0])
    print(f"\nto_tsvector('english', text) of {len(texts)} chunk texts: {fmt(tsv)}  (same query without it: {fmt(base)})")

    # 1. statement breakdown of store.sync as it stands
    print("\n1. store.sync, statement by statement (one run each; new HashEmbedder per sync):")
    for label, data in ((f"corpus, {len(chunks)} chunks", chunks), (f"{len(rows)} rows", rows)):
        fresh()
        proxy = TimedConnection(conn, schema)
        wall, report = timed(lambda: store.sync(proxy, schema, data, HashEmbedder(DIMS)))
        breakdown(f"{label}, empty table ({report})", proxy, wall)
        proxy = TimedConnection(conn, schema)
        wall, report = timed(lambda: store.sync(proxy, schema, data, HashEmbedder(DIMS)))
        breakdown(f"{label}, re-run, nothing changed ({report})", proxy, wall, top=5)

    # 2. prune candidate: re-runs and a small edit
    print(f"\n2. candidate prune (best/median of {args.repeats}):")
    for label, data in ((f"corpus, {len(chunks)} chunks", chunks), (f"{len(rows)} rows", rows)):
        fresh()
        store.sync(conn, schema, data, HashEmbedder(DIMS))
        current, pruned, reports = [], [], set()
        for _ in range(args.repeats):
            t, r = timed(lambda: store.sync(conn, schema, data, HashEmbedder(DIMS)))
            current.append(t)
            reports.add(("current", r))
            proxy = TimedConnection(conn, schema, prune=True)
            t, r = timed(lambda: store.sync(proxy, schema, data, HashEmbedder(DIMS)))
            pruned.append(t)
            reports.add(("pruned", r))
        edited = [*data[:-1], Chunk(*[getattr(data[-1], f) for f in ("chunk_id", "doc_id", "heading_path", "start_char",
                                                                      "end_char")], data[-1].text + " edited")]
        t_edit_cur, r_edit_cur = timed(lambda: store.sync(conn, schema, edited, HashEmbedder(DIMS)))
        store.sync(conn, schema, data, HashEmbedder(DIMS))
        proxy = TimedConnection(conn, schema, prune=True)
        t_edit_pr, r_edit_pr = timed(lambda: store.sync(proxy, schema, edited, HashEmbedder(DIMS)))
        applied = "applied" if proxy.rewrites else "NOT APPLIED (store._merge's upsert no longer matches)"
        print(f"  {label}, re-run with nothing changed: current {fmt(current)}; pruned {fmt(pruned)} [{applied}]")
        print(f"  {label}, one chunk edited: current {t_edit_cur:.3f} s {r_edit_cur}; pruned {t_edit_pr:.3f} s {r_edit_pr}")
        if len({r for _, r in reports}) != 1:
            print(f"    REPORTS DIFFER: {sorted(reports, key=str)}")

    # 3. hnsw-after candidate
    print(f"\n3. candidate hnsw-after, {len(rows)} rows into an empty table (best/median of {args.repeats}):")
    with_index, without, build = [], [], []
    for _ in range(args.repeats):
        fresh()
        with_index.append(timed(lambda: store.sync(conn, schema, rows, HashEmbedder(DIMS)))[0])
        fresh(hnsw=False)
        without.append(timed(lambda: store.sync(conn, schema, rows, HashEmbedder(DIMS)))[0])
        build.append(timed(lambda: conn.execute(statement(
            schema, "CREATE INDEX chunks_embedding_hnsw ON {chunks} USING hnsw (embedding vector_cosine_ops)")))[0])
    print(f"  store.sync with the HNSW index in place: {fmt(with_index)}")
    print(f"  store.sync without it:                   {fmt(without)}")
    print(f"  then CREATE INDEX ... USING hnsw:        {fmt(build)}")
    print(f"  sync then build (sum):                   {fmt([a + b for a, b in zip(without, build)])}")
    conn.close()
    common.drop_schema(args.dsn, schema)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
