"""Chunking the fixture corpus and indexing it with the hash embedder (store.create + store.sync).

Run: uv run python -m benchmarks bench_index [--repeats 5] [--schema bench_index_hash]
Targets: chunking the corpus, scaled to 300,000 characters, under 0.2 s (best of the repeats);
store.create + store.sync of the corpus (430 chunks) into a fresh table under 2 s.
Prints figures only; never asserts. Uses the embedded Postgres (or $RETRIEVAL_DSN) and drops
the chunk table (store.drop) in its own schema (default ``bench_index_hash``,
common.bench_schema) before every repeat; the corpus stays indexed there afterwards. Beside the
fresh sync: store.create and store.sync apart, embedding alone (batches of 64 through Embedder.embed,
as store.sync asks for them), and a re-sync that changes nothing.

Its second part, two client write paths on 5,000 rows (store's COPY staging against pipelined
executemany: a tie, COPY kept), is gone (last at ac5a0a5); its figures are in RESULTS.md (3b, 3c).
"""

from __future__ import annotations

from benchmarks import common
from retrieval_assets.index import chunker, store, tables
from retrieval_assets.index.embed import HashEmbedder

TARGET_S = 2.0
CHUNK_TARGET_S = 0.2  # per 300,000 characters
DIMS = 256
BATCH = 64  # store.sync's default batch


def line(label: str, times: list[float], extra: str = "") -> None:
    print(f"  {label:<50} {common.runs(times)}{extra}")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=5, schema=common.bench_schema("index"))
    args = parser.parse_args(argv)
    schema = args.schema

    documents = chunker.load_documents(common.CORPUS)
    conn = common.connect(args.dsn, schema)

    # -- 1. chunking ----------------------------------------------------------------------------
    chars = sum(len(d.text) for d in documents)
    chunking = [common.timed(lambda: [c for d in documents for c in chunker.chunk(d)]) for _ in range(args.repeats)]
    chunks = chunking[0][2]
    per_300k = min(t for t, _, _ in chunking) * 300_000 / chars
    print(f"\n1. chunk {len(documents)} documents, {chars:,} characters, into {len(chunks)} chunks (chunker defaults)")
    line("chunker.chunk, every document", [t for t, _, _ in chunking],
         f"  scaled to 300,000 characters {per_300k:.4f} s [< {CHUNK_TARGET_S} s: {common.verdict(per_300k < CHUNK_TARGET_S)}]")

    # -- 2. the corpus, fresh table: store.create + store.sync -------------------------------
    print(f"\n2. corpus: {len(chunks)} chunks of {len(documents)} documents, HashEmbedder({DIMS}) new each repeat, "
          f"table dropped before each repeat")
    total, create, sync, rerun, embed_only = [], [], [], [], []
    report = None
    for _ in range(args.repeats):
        store.drop(conn, schema)
        embedder = HashEmbedder(DIMS)  # a new instance; the token cache is the process's (warm after the first repeat)
        create.append(common.timed(lambda: store.create(conn, schema, DIMS))[0])
        seconds, _, report = common.timed(lambda: store.sync(conn, schema, chunks, embedder))
        sync.append(seconds)
        total.append(create[-1] + seconds)
        rerun.append(common.timed(lambda: store.sync(conn, schema, chunks, HashEmbedder(DIMS)))[0])
        embed_only.append(common.timed(lambda: common.embed_batches(HashEmbedder(DIMS), [c.text for c in chunks], BATCH))[0])
    line("store.create + store.sync (fresh table)", total, f"  [< {TARGET_S} s: {common.verdict(min(total) < TARGET_S)}]")
    line("  of which store.create", create)
    line("  of which store.sync", sync)
    line(f"  embedding alone (batches of {BATCH}, new embedder)", embed_only)
    line("store.sync re-run, nothing changed", rerun)
    print(f"  rows: {tables.count(conn, schema)}; report of the fresh sync: {report}")

    conn.close()
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
