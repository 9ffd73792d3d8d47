"""`pipeline.run` per golden query, for the default pipeline and the seed's, on the fixture's hash index.

Run (from the project root, after the README's main command has filled the `hash` partition):

    uv run python -m benchmarks.guards.bench_pipeline [--passes 5]

One unmeasured pass over the 48 golden queries per pipeline (prepared statements, caches), then
``--passes`` timed passes; the figure is the median over passes of the mean time per query, with
every pass listed. One connection, as ``eval_run`` uses. To time another revision's library with
this script, put its checkout first on the path and name this checkout's server:
``RETRIEVAL_DSN=... PYTHONPATH=/path/to/checkout uv run python benchmarks/guards/bench_pipeline.py``
(the revision must have ``pipeline.retriever`` and ``params.PIPELINES``; without the DSN it would
start the other checkout's own embedded server). Prints figures only.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import common


def main(argv: list[str] | None = None) -> int:
    from retrieval_assets import params, partitions, pg
    from retrieval_assets.corpus import golden
    from retrieval_assets.search import pipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5)
    args = parser.parse_args(argv)
    common.print_machine({"library": pipeline.__file__, "passes": args.passes})
    queries = [q.query for q in golden.load_golden(common.ROOT / "fixtures" / "corpus" / "golden.yaml")]
    with pg.connect(None) as conn:  # $RETRIEVAL_DSN, else the embedded server of the library's checkout
        schema = partitions.schema_name("hash", prefix=partitions.env_prefix())  # the assets' fixture index
        embedder = partitions.embedder("hash")
        for name, p in params.PIPELINES.items():
            retriever = pipeline.retriever(conn, schema, embedder, p)
            for q in queries:
                pipeline.run(conn, retriever, q, p)
            per_query = []
            for _ in range(args.passes):
                start = time.perf_counter()
                for q in queries:
                    pipeline.run(conn, retriever, q, p)
                per_query.append(1000 * (time.perf_counter() - start) / len(queries))
            print(f"{name}: {statistics.median(per_query):.2f} ms per query (median of {args.passes} passes: "
                  f"{', '.join(f'{t:.2f}' for t in per_query)}); {p.describe()}")
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
