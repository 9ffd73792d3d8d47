"""Fuzz the query path with hostile query text: both pipelines and the answer path never raise, return within the statement timeout, find hits for a plain corpus word, and leave the index unchanged.

Run: uv run python -m benchmarks fuzz [--examples 5000] [--seed N] [--slowest 10]
Target: no failure (SPEC, "Behaviour under bad input": user query text never raises). The longer run of
retrieval_assets_tests/test_fuzz_queries.py, which runs 300 examples with a fixed seed in CI: the same
generator and properties (retrieval_assets_tests/fuzzing.py), hypothesis with a seed of its own (printed;
``--seed`` repeats a run). Every query goes through pipeline.run with params.DEFAULT and params.SEED and
through answer.sources + extractive_answer; a failure is recorded with its query and the run goes on, so
the report lists every one (not one shrunk example). Prints the examples run, the failures, the index
fingerprint before and after, and the slowest calls; exit status 1 when a property failed. Uses the embedded Postgres (or $RETRIEVAL_DSN) and
indexes the fixture corpus (hash) in its own schema (default ``bench_fuzz_hash``).
"""

from __future__ import annotations

import random
import time
from collections import Counter

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from psycopg import pq

from benchmarks import common
from retrieval_assets.answers import answer
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import DEFAULT, SEED, limit_query
from retrieval_assets.search import pipeline
from retrieval_assets_tests import fuzzing


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, schema=common.bench_schema("fuzz"))
    parser.add_argument("--examples", type=int, default=5000, help="queries to generate (default 5000)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, printed)")
    parser.add_argument("--slowest", type=int, default=10, help="slowest calls to list (default 10)")
    args = parser.parse_args(argv)
    run_seed = random.randrange(2**32) if args.seed is None else args.seed

    _, chunks, _ = common.fixture()
    conn = common.connect(args.dsn, args.schema)
    embedder = HashEmbedder()
    common.index(conn, args.schema, chunks, embedder)
    retrievers = {name: (pipeline.retriever(conn, args.schema, embedder, p), p) for name, p in (("default", DEFAULT), ("seed", SEED))}
    answers = pipeline.retriever(conn, args.schema, embedder, answer.SOURCES)
    words = fuzzing.vocabulary(conn, args.schema, [c.text for c in chunks])
    vocabulary = set(words)
    before = fuzzing.fingerprint(conn, args.schema)
    print(f"\nfuzz: {args.examples} examples, seed {run_seed}; {len(chunks)} chunks, {len(words)} corpus words; "
          f"statement timeout {DEFAULT.statement_timeout_ms} ms")

    calls: list[tuple[float, str, str]] = []  # (seconds, call, query)
    failures: list[tuple[str, str]] = []  # (query, what went wrong)
    seen = Counter()

    @settings(max_examples=args.examples, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(run_seed)
    @given(data=st.data())
    def one(data):
        query = data.draw(fuzzing.query_text(words))
        seen["examples"] += 1
        seen["cut"] += limit_query(query) != query
        seen["with a plain corpus word"] += bool(fuzzing.plain_words(query, vocabulary))
        try:
            checked = fuzzing.check_query(conn, retrievers, answers, query, vocabulary)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the run
            failures.append((query, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"))
            if conn.info.transaction_status != pq.TransactionStatus.IDLE:  # a failed statement left a transaction open
                conn.rollback()
            return
        calls.extend((s, name, query) for name, s in checked.seconds.items())

    started = time.perf_counter()
    one()
    elapsed = time.perf_counter() - started
    after = fuzzing.fingerprint(conn, args.schema)

    print(f"  examples run: {seen['examples']} in {elapsed:.1f} s ({seen['cut']} cut by params.limit_query, "
          f"{seen['with a plain corpus word']} holding a plain corpus word)")
    print(f"  failures: {len(failures)} [none expected: {common.verdict(not failures)}]")
    for query, what in failures[:20]:
        print(f"    {what}\n      query ({len(query)} characters): {query[:160]!r}")
    print(f"  index unchanged: {common.verdict(before == after)} ({', '.join(f'{k} {v}' for k, v in after.items())})")
    for name in ("default", "seed", "answer"):
        seconds = [s for s, call, _ in calls if call == name]
        if seconds:
            print(f"  {name:<8} {common.summary_ms(seconds)}")
    limit_s = DEFAULT.statement_timeout_ms / 1000
    print(f"  slowest calls (the property: each under the statement timeout, {limit_s:g} s):")
    for s, name, query in sorted(calls, key=lambda c: -c[0])[: args.slowest]:
        print(f"    {s * 1000:8.1f} ms  {name:<8} {len(query):>5} characters  {query[:80]!r}")
    conn.close()
    common.print_load_end()
    return 1 if failures or before != after else 0


if __name__ == "__main__":
    raise SystemExit(main())
