"""A sync that changes nothing: the shortcut (the table's ``synced`` fingerprint) against the full path.

Run (from the project root): uv run python -m benchmarks.guards.bench_resync [--repeats 3] [--scale-schema S]

On the fixture corpus (its own schema, ``common.bench_schema("resync")``) and, when present, the
100k schema that ``python -m benchmarks.guards.scale --keep`` leaves: ``store.sync`` of the chunks
the table already holds, timed (a) as it runs, the fingerprint matching, and (b) with the record
deleted first, so that the sync stages, compares and merges every row as it did before the
shortcut existed. Median of ``--repeats``. Prints figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import common
from retrieval_assets import pg
from retrieval_assets.index import store, tables
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.tables import statement


def timed(conn, schema, chunks, embedder, full: bool) -> float:
    if full:
        conn.execute(statement(schema, "DELETE FROM {synced}"))
    start = time.perf_counter()
    report = store.sync(conn, schema, chunks, embedder)
    seconds = time.perf_counter() - start
    assert report.unchanged == len(chunks) and report.embedded == 0, report
    return seconds


def measure(name: str, conn, schema, chunks, repeats: int) -> None:
    embedder = HashEmbedder(256)
    store.create(conn, schema, embedder.dims)
    store.sync(conn, schema, chunks, embedder)  # the table holds them, and the record says so
    full = statistics.median(timed(conn, schema, chunks, embedder, True) for _ in range(repeats))
    short = statistics.median(timed(conn, schema, chunks, embedder, False) for _ in range(repeats))
    print(f"{name}: {len(chunks)} chunks unchanged: full sync {full:.3f} s, with the shortcut {short:.3f} s ({full / short:.0f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale-schema", default=common.scale_schema(100_000))
    args = parser.parse_args(argv)
    common.print_machine({"repeats": str(args.repeats)})
    _, chunks, _ = common.fixture()
    with pg.connect(None) as conn:
        measure("fixture", conn, common.bench_schema("resync"), chunks, args.repeats)
        if tables.table_dims(conn, args.scale_schema) is None:
            print(f"scale: no {args.scale_schema}; run `python -m benchmarks.guards.scale --sizes 100000 --keep` first")
        else:
            from retrieval_assets.corpus.synthetic import Corpus

            measure("scale", conn, args.scale_schema, list(Corpus(0, topics=300).chunks(100_000)), args.repeats)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
