"""N clients searching during syncs: throughput, p50/p95/p99, errors, peak connections, mixed results (issue 41).

Run: uv run python -m benchmarks load [--clients 1 8 32] [--seconds 20] [--chunks 20000] [--sync-every 2]
Indexes ``--chunks`` synthetic chunks (``synthetic.Corpus``, hash embedder) afresh into ``bench_load_hash``, in bulk
with recall target 1 (so the graph is dropped for the exact scan of a halfvec copy, split with a partner session). For each N, N client processes (one ``pg.connect`` connection each, ``PGAPPNAME``
bench-load) search the default pipeline (``pipeline.run``, a retriever made once) over 200 synthetic queries in
turn for ``--seconds``, while this process syncs the index every ``--sync-every`` seconds between two states
(the chunks of 5% of the documents edited and of 5% deleted, then all restored). Per N: searches, throughput,
latency p50/p95/p99, errors by kind, the peak of the clients' backends in pg_stat_activity (connections and
partner sessions, polled every 5 ms), and mixed results: a top 10 equal to neither state's list for its query
(both computed first, by retrievers made in that state). Prints and writes ``--out`` (benchmarks/results/load.md).
Prints figures only; never asserts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import threading
import time

from benchmarks import common

APP = "bench-load"


def searcher(dsn: str | None, schema: str):
    """A connection and a retriever made now: the function that searches one query, (seconds, final chunk ids or the
    error's kind); a ``ConnectError`` reconnects."""
    from retrieval_assets import pg
    from retrieval_assets.index.embed import HashEmbedder
    from retrieval_assets.params import DEFAULT
    from retrieval_assets.search import pipeline

    held = [pg.connect(dsn)]
    retriever = pipeline.retriever(held[0], schema, HashEmbedder(), DEFAULT)

    def search(query: str) -> tuple[float, object]:
        mark = time.perf_counter()
        try:
            outcome = [r.chunk_id for r in pipeline.run(held[0], retriever, query, DEFAULT).final]
        except pipeline.SearchTimeout:
            outcome = "SearchTimeout"
        except pg.ConnectError:
            outcome = "ConnectError"
            with contextlib.suppress(pg.ConnectError):
                held[0] = pg.connect(dsn)
        except Exception as exc:  # noqa: BLE001 - counted, by kind
            outcome = type(exc).__name__
        return time.perf_counter() - mark, outcome
    return search


def client(dsn: str | None, schema: str, queries: list[str], start: float, seconds: float) -> list[tuple]:
    """One client process: (query, seconds, outcome) of each search from ``start`` for ``seconds``."""
    os.environ["PGAPPNAME"] = APP
    search, done, i = searcher(dsn, schema), [], os.getpid()
    time.sleep(max(0.0, start - time.time()))
    while time.time() < start + seconds:
        query, i = queries[i % len(queries)], i + 1
        done.append((query, *search(query)))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, schema=common.bench_schema("load"))
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--sync-every", type=float, default=2.0)
    parser.add_argument("--out", default=str(common.RESULTS / "load.md"))
    args = parser.parse_args(argv)
    from retrieval_assets import pg
    from retrieval_assets.corpus.synthetic import Corpus
    from retrieval_assets.index import store, vector_index
    from retrieval_assets.index.embed import HashEmbedder

    conn = common.connect(args.dsn, args.schema)
    dsn, embedder, corpus = pg.resolve_dsn(args.dsn), HashEmbedder(), Corpus()
    before = list(corpus.chunks(args.chunks))
    docs = sorted({c.doc_id for c in before})
    edited, deleted = set(docs[::20]), set(docs[10::20])
    after = [dataclasses.replace(c, text=c.text + " revised") if c.doc_id in edited else c for c in before if c.doc_id not in deleted]
    states = [before, after]
    common.drop_schema(dsn, args.schema)
    store.create(conn, args.schema, embedder.dims)
    store.sync(conn, args.schema, before, embedder, recall_target=1.0)
    queries = corpus.queries(200)
    expected = []
    for chunks in (after, before):  # each state's lists, by retrievers made in it; the index left as it began
        store.sync(conn, args.schema, chunks, embedder, allow_shrink=True)
        search = searcher(dsn, args.schema)
        expected.insert(0, {q: search(q)[1] for q in queries})
    chosen = vector_index.vector_index(conn, args.schema)
    print(f"\nindex: {args.chunks} chunks, vector search {chosen.kind if chosen else 'hnsw'}; states differ for "
          f"{sum(expected[0][q] != expected[1][q] for q in queries)} of {len(queries)} queries")
    rows = []
    for n in args.clients:
        peak, stop = [0], threading.Event()
        watcher = threading.Thread(target=_watch, args=(dsn, peak, stop))
        watcher.start()
        start = time.time() + 5 + n * 0.5  # the processes start their interpreters first
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            running = pool.starmap_async(client, [(dsn, args.schema, queries, start, args.seconds)] * n)
            syncs = 0
            while not running.ready():
                running.wait(args.sync_every)
                if start < time.time() < start + args.seconds:
                    syncs += 1
                    store.sync(conn, args.schema, states[syncs % 2], embedder, allow_shrink=True)
            searches = [s for per_client in running.get() for s in per_client]
        stop.set()
        watcher.join()
        store.sync(conn, args.schema, before, embedder, allow_shrink=True)
        ms = [1000 * seconds for _, seconds, _ in searches]
        errors = {}
        for _, _, outcome in searches:
            if isinstance(outcome, str):
                errors[outcome] = errors.get(outcome, 0) + 1
        mixed = sum(1 for q, _, ids in searches if isinstance(ids, list) and ids not in (expected[0][q], expected[1][q]))
        rows.append(f"| {n} | {len(searches)} | {len(searches) / args.seconds:.0f} | {common.pct(ms, 50):.1f} | "
                    f"{common.pct(ms, 95):.1f} | {common.pct(ms, 99):.1f} | {_kinds(errors)} | {peak[0]} | {mixed} | {syncs} |")
        print(rows[-1], flush=True)
    report = [f"# Load: clients searching during syncs\n\n`uv run python -m benchmarks load --clients {' '.join(map(str, args.clients))} "
              f"--seconds {args.seconds:g} --chunks {args.chunks} --sync-every {args.sync_every:g}` at {common.code_version()}\n",
              f"{common.host_line()}; {common.load_average()} at the end; partner slots {pg.PARTNER_SLOTS}, "
              f"{pg.PARTNERS_MAX} per process; vector search {chosen.kind if chosen else 'hnsw'}\n",
              "| clients | searches | per s | p50 ms | p95 ms | p99 ms | errors | peak backends | mixed | syncs |",
              "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    common.write_report("\n".join(report), args.out)
    conn.close()
    return 0


def _kinds(errors: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(errors.items())) or "0"


def _watch(dsn: str, peak: list[int], stop: threading.Event) -> None:
    """The most backends the clients held at once (their connections and partners), polled every 5 ms."""
    from retrieval_assets import pg

    with pg.connect(dsn) as probe:
        while not stop.is_set():
            count = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (APP,)).fetchone()[0]
            peak[0] = max(peak[0], count)
            time.sleep(0.005)


if __name__ == "__main__":
    raise SystemExit(main())
