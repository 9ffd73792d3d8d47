"""Chunker throughput on the fixture corpus (~310,000 characters of Markdown and stories).

Run: uv run python -m benchmarks.guards.bench_chunker [--repeats 5]
Target: chunking ~300k characters in under 0.2 s (best of 5). Prints figures only; never asserts.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from benchmarks import common
from retrieval_assets.index import chunker

TARGET_S = 0.2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    start = time.perf_counter()
    documents = chunker.load_documents(common.CORPUS)
    load_s = time.perf_counter() - start
    chars = sum(len(d.text) for d in documents)
    md_chars = sum(len(d.text) for d in documents if (common.CORPUS / "docs" / f"{d.doc_id}.md").exists())

    times, n_chunks = [], 0
    for _ in range(args.repeats):
        gc.collect()
        start = time.perf_counter()
        chunks = [c for d in documents for c in chunker.chunk(d)]
        times.append(time.perf_counter() - start)
        n_chunks = len(chunks)
    best = min(times)

    common.print_machine()
    print(f"corpus: {common.CORPUS} - {len(documents)} documents, {chars:,} characters "
          f"({md_chars:,} in docs/*.md, the rest in stories/*.txt), {n_chunks} chunks (max_chars=1200, overlap=1)")
    print(f"load_documents (read + decode + titles), one run: {1000 * load_s:.1f} ms")
    print(f"chunk all documents, best of {args.repeats}: {best:.4f} s  -> {chars / best:,.0f} chars/s")
    print(f"  all runs (s): {', '.join(f'{t:.4f}' for t in times)}; median {statistics.median(times):.4f} s")
    per_300k = best * 300_000 / chars
    print(f"scaled to 300,000 characters: {per_300k:.4f} s  (target < {TARGET_S} s: {common.verdict(per_300k < TARGET_S)})")
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
