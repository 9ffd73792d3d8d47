"""HashEmbedder throughput on one core, against a plain per-token reference, same run, same texts.

Run: uv run python -m benchmarks.guards.bench_embed [--texts 5000] [--repeats 5] [--ref-repeats 3]
Targets: >= 3,000 chunks/s and >= 5x the reference. Prints figures only; never asserts.

Two text sets, both cycled to --texts items:
  chunks   the fixture corpus chunks (chunker defaults; mean length is printed)
  windows  consecutive 1,000-character slices of the corpus documents
Cold = a new HashEmbedder for every repeat (its token cache starts empty; because the texts are
cycled, only the first pass over the distinct texts misses the cache). Cold-distinct = a new
instance embedding each distinct text once: the honest figure for indexing a new corpus.
Warm = the same instance again after a full pass. Batches of 64, as store.sync embeds.
One core: main sets OMP/OPENBLAS/MKL_NUM_THREADS=1 and pins the process (common.single_thread)
before numpy is imported, so numpy and the embedder are imported inside the functions.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import re
import time
from typing import TYPE_CHECKING

from benchmarks import common
from retrieval_assets import chunker

if TYPE_CHECKING:
    import numpy as np

    from retrieval_assets.embed import HashEmbedder

DIMS = 256
BATCH = 64
TARGET_RATE = 3000
TARGET_SPEEDUP = 5.0


def reference_embed(text: str, dims: int = DIMS) -> np.ndarray:
    """The seed's recipe written plainly: one blake2b per token, no cache, no vectorisation."""
    import numpy as np

    words = re.findall(r"\w+", text.lower())
    tokens = list(words)
    tokens += [f"{a} {b}" for a, b in zip(words, words[1:])]
    tokens += [w[i : i + 3] for w in words for i in range(len(w) - 2)]
    vector = np.zeros(dims, dtype=np.float32)
    for token in tokens:
        h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
        vector[h % dims] += -1.0 if h >> 63 else 1.0
    norm = np.linalg.norm(vector)
    return vector / norm if norm > 0 else vector


CPU: list[float] = []  # process CPU seconds of each timed run, in order


def run_embedder(embedder: HashEmbedder, texts: list[str]) -> tuple[float, np.ndarray]:
    import numpy as np

    gc.collect()
    cpu, start = time.process_time(), time.perf_counter()
    parts = [embedder.embed(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
    seconds = time.perf_counter() - start
    CPU.append(time.process_time() - cpu)
    return seconds, np.concatenate(parts)


def run_reference(texts: list[str]) -> tuple[float, np.ndarray]:
    import numpy as np

    gc.collect()
    cpu, start = time.process_time(), time.perf_counter()
    vectors = [reference_embed(t) for t in texts]
    seconds = time.perf_counter() - start
    CPU.append(time.process_time() - cpu)
    return seconds, np.stack(vectors)


def runs(fn, repeats: int) -> tuple[list[float], list[float], np.ndarray]:
    """(wall seconds, CPU seconds, last output) of ``repeats`` calls of ``fn``."""
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        seconds, out = fn()
        walls.append(seconds)
        cpus.append(CPU[-1])
    return walls, cpus, out


def compare(name: str, got: np.ndarray, want: np.ndarray) -> str:
    import numpy as np

    same_dtype = got.dtype == want.dtype == np.float32
    equal = got.shape == want.shape and np.array_equal(got, want)
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.shape == want.shape else float("nan")
    rows = int(np.sum(np.any(got != want, axis=1))) if got.shape == want.shape else -1
    return f"{name}: array_equal={equal}, max |diff|={diff:.3g}, rows differing={rows}, both float32={same_dtype}"


def bench(label: str, distinct: list[str], n_texts: int, repeats: int, ref_repeats: int) -> dict:
    from retrieval_assets.embed import HashEmbedder

    texts = list(itertools.islice(itertools.cycle(distinct), n_texts))
    mean_len = sum(map(len, texts)) / len(texts)
    print(f"\n== {label}: {len(texts)} texts ({len(distinct)} distinct, cycled), mean {mean_len:.0f} chars")

    cold, cold_cpu, cold_out = runs(lambda: run_embedder(HashEmbedder(DIMS), texts), repeats)
    cold_distinct, cd_cpu, _ = runs(lambda: run_embedder(HashEmbedder(DIMS), distinct), repeats)
    warm_embedder = HashEmbedder(DIMS)
    run_embedder(warm_embedder, texts)
    warm, warm_cpu, warm_out = runs(lambda: run_embedder(warm_embedder, texts), repeats)
    ref, ref_cpu, ref_out = runs(lambda: run_reference(texts), ref_repeats)

    rate = lambda secs, n=len(texts): n / min(secs)  # noqa: E731
    r_cold, r_cold_distinct, r_warm, r_ref = rate(cold), rate(cold_distinct, len(distinct)), rate(warm), rate(ref)
    c_cold, c_cd, c_warm, c_ref = rate(cold_cpu), rate(cd_cpu, len(distinct)), rate(warm_cpu), rate(ref_cpu)
    print("rates from the best wall time [and from the best process CPU time, which other load on the machine "
          "inflates less]:")
    print(f"HashEmbedder cold (new instance each repeat), best of {repeats}: {min(cold):.3f} s -> {r_cold:,.0f} chunks/s "
          f"({r_cold * mean_len / 1e6:.2f} M chars/s)  [CPU: {c_cold:,.0f}/s]")
    print(f"HashEmbedder cold, distinct texts only ({len(distinct)}), best of {repeats}: {min(cold_distinct):.3f} s -> "
          f"{r_cold_distinct:,.0f} chunks/s  [CPU: {c_cd:,.0f}/s]")
    print(f"HashEmbedder warm (same instance, cache filled), best of {repeats}: {min(warm):.3f} s -> {r_warm:,.0f} chunks/s"
          f"  [CPU: {c_warm:,.0f}/s]")
    print(f"reference (per-token blake2b, no cache), best of {ref_repeats}: {min(ref):.3f} s -> {r_ref:,.0f} chunks/s"
          f"  [CPU: {c_ref:,.0f}/s]")
    print(f"speed-up over reference: cold {r_cold / r_ref:.1f}x, cold-distinct {r_cold_distinct / r_ref:.1f}x, "
          f"warm {r_warm / r_ref:.1f}x  [CPU: cold {c_cold / c_ref:.1f}x, cold-distinct {c_cd / c_ref:.1f}x, "
          f"warm {c_warm / c_ref:.1f}x]")
    print(compare("cold vs reference", cold_out, ref_out))
    print(compare("warm vs reference", warm_out, ref_out))
    print(f"targets: >= {TARGET_RATE:,} chunks/s cold: {common.verdict(r_cold >= TARGET_RATE)}; "
          f"cold-distinct: {common.verdict(r_cold_distinct >= TARGET_RATE)}; "
          f">= {TARGET_SPEEDUP:.0f}x reference cold: {common.verdict(r_cold / r_ref >= TARGET_SPEEDUP)}; "
          f"cold-distinct: {common.verdict(r_cold_distinct / r_ref >= TARGET_SPEEDUP)}")
    return {"cold": r_cold, "cold_distinct": r_cold_distinct, "warm": r_warm, "ref": r_ref}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ref-repeats", type=int, default=3)
    parser.add_argument("--only", choices=("chunks", "windows"), default=None)
    args = parser.parse_args(argv)

    threads = common.single_thread()  # before numpy is imported
    import numpy as np

    common.print_machine({"threads": threads, "numpy": np.__version__})

    documents = chunker.load_documents(common.CORPUS)
    chunk_texts = [c.text for d in documents for c in chunker.chunk(d)]
    windows = [d.text[i : i + 1000] for d in documents for i in range(0, len(d.text), 1000) if len(d.text[i : i + 1000]) >= 500]
    if args.only in (None, "chunks"):
        bench("corpus chunks", chunk_texts, args.texts, args.repeats, args.ref_repeats)
    if args.only in (None, "windows"):
        bench("1,000-char windows", windows, args.texts, args.repeats, args.ref_repeats)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
