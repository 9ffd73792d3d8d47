"""HashEmbedder throughput on one core, against the code it replaced and a plain per-token reference.

Run: uv run python -m benchmarks bench_embed [--texts 5000] [--repeats 7] [--ref-repeats 3]
     [--batches 64,5000] [--only chunks|windows]
Targets: the current embedder >= 2x the previous one (cold and warm) and >= 10x the reference;
>= 3,000 chunks/s cold. Prints figures only; never asserts.

Three embedders, timed in one run on the same texts, interleaved:
  current    retrieval_assets.index.embed.HashEmbedder: a process-wide token cache shared by every
             instance, numpy bookkeeping (issue 18)
  previous   PreviousHashEmbedder below, the code of ab757c6 verbatim: per-instance caches, one
             Python step per token occurrence (test_embed compares the current one with it too)
  reference  reference_embed below: one blake2b per token, no cache, no vectorisation
Two text sets, both cycled to --texts items:
  chunks   the fixture corpus chunks (chunker defaults; mean length is printed)
  windows  consecutive 1,000-character slices of the corpus documents (slices under 500 dropped)
Runs, for current and previous alike:
  cold           an empty cache at the start of every repeat (current: embed.clear_cache();
                 previous: a new instance); the texts are cycled, so only the first pass over
                 the distinct texts misses
  cold-distinct  an empty cache, each distinct text once: the cost of indexing a new corpus
  warm           every token cached (current: a new instance, as each Dagster asset builds one,
                 the process-wide cache filled; previous: the same instance after a full pass)
Batches of 64 (what store.sync embeds) and of 5,000 (the bulk load's, bulk.BULK_BATCH) by default.
Figures are medians over the repeats (best in brackets), wall time and process CPU time; the
ratios are of medians. One core: main sets OMP/OPENBLAS/MKL_NUM_THREADS=1 and pins the process
(common.single_thread) before numpy is imported, so numpy and the embedders are imported inside
the functions.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

from benchmarks import common
from retrieval_assets.index import chunker

if TYPE_CHECKING:
    import numpy as np

DIMS = 256
BATCHES = (64, 5000)
TARGET_RATE = 3000
TARGET_VS_PREVIOUS = 2.0
TARGET_VS_REFERENCE = 10.0


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


_WORD = re.compile(r"\w+")


class PreviousHashEmbedder:
    """HashEmbedder as of ab757c6, before the process-wide cache (kept verbatim as the baseline)."""

    _CACHE_LIMIT = 2_000_000

    def __init__(self, dims: int = 256):
        self.dims = dims
        self.name = f"hash-{dims}"
        self._word_codes: dict[str, tuple[int, ...]] = {}
        self._bigram_codes: dict[str, int] = {}

    def _code(self, token: str) -> int:
        h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
        return h % self.dims + (self.dims if h >> 63 else 0)

    def _codes_of_word(self, word: str) -> tuple[int, ...]:
        codes = self._word_codes.get(word)
        if codes is None:
            if len(self._word_codes) > self._CACHE_LIMIT:
                self._word_codes.clear()
            codes = (self._code(word), *(self._code(word[i : i + 3]) for i in range(len(word) - 2)))
            self._word_codes[word] = codes
        return codes

    def _codes_of_bigram(self, bigram: str) -> int:
        code = self._bigram_codes.get(bigram)
        if code is None:
            if len(self._bigram_codes) > self._CACHE_LIMIT:
                self._bigram_codes.clear()
            code = self._bigram_codes[bigram] = self._code(bigram)
        return code

    def embed(self, texts) -> np.ndarray:
        import numpy as np

        width = 2 * self.dims
        word_codes, bigram_codes = self._word_codes, self._bigram_codes
        codes: list[int] = []
        lengths: list[int] = []
        for text in texts:
            words = _WORD.findall(text.lower())
            start = len(codes)
            for word in words:
                found = word_codes.get(word)
                codes.extend(found if found is not None else self._codes_of_word(word))
            for bigram in map(" ".join, zip(words, words[1:])):
                found = bigram_codes.get(bigram)
                codes.append(found if found is not None else self._codes_of_bigram(bigram))
            lengths.append(len(codes) - start)
        rows = np.repeat(np.arange(len(texts), dtype=np.int64) * width, lengths)
        codes = np.asarray(codes, dtype=np.int64) + rows
        counts = np.bincount(codes, minlength=len(texts) * width)
        counts = counts.reshape(len(texts), width)
        vectors = (counts[:, : self.dims] - counts[:, self.dims :]).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


def compare(name: str, got: np.ndarray, want: np.ndarray) -> str:
    import numpy as np

    same_dtype = got.dtype == want.dtype == np.float32
    same_shape = got.shape == want.shape
    equal = same_shape and np.array_equal(got, want) and got.tobytes() == want.tobytes()
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0)) if same_shape else float("nan")
    rows = int(np.sum(np.any(got != want, axis=1))) if same_shape else -1
    return f"{name}: bit-identical={equal}, max |diff|={diff:.3g}, rows differing={rows}, both float32={same_dtype}"


def variants(texts: list[str], distinct: list[str], batch: int) -> dict[str, tuple[int, Callable[[], None], Callable[[], np.ndarray]]]:
    """name -> (texts embedded, untimed preparation, the timed run) for one text set and batch size."""
    from retrieval_assets.index import embed
    from retrieval_assets.index.embed import HashEmbedder

    previous_warm = PreviousHashEmbedder(DIMS)
    common.embed_batches(previous_warm, texts, batch)

    def nothing() -> None:
        pass

    def fill() -> None:  # a cold run before emptied the process-wide cache
        if embed.cache_size() == 0:
            common.embed_batches(HashEmbedder(DIMS), texts, batch)

    return {
        "previous cold": (len(texts), nothing, lambda: common.embed_batches(PreviousHashEmbedder(DIMS), texts, batch)),
        "current cold": (len(texts), embed.clear_cache, lambda: common.embed_batches(HashEmbedder(DIMS), texts, batch)),
        "previous cold-distinct": (len(distinct), nothing, lambda: common.embed_batches(PreviousHashEmbedder(DIMS), distinct, batch)),
        "current cold-distinct": (len(distinct), embed.clear_cache, lambda: common.embed_batches(HashEmbedder(DIMS), distinct, batch)),
        "previous warm": (len(texts), nothing, lambda: common.embed_batches(previous_warm, texts, batch)),
        "current warm": (len(texts), fill, lambda: common.embed_batches(HashEmbedder(DIMS), texts, batch)),
    }


def bench(label: str, distinct: list[str], n_texts: int, repeats: int, ref_repeats: int, batches: tuple[int, ...]) -> None:
    import numpy as np

    from retrieval_assets.index import embed

    texts = list(itertools.islice(itertools.cycle(distinct), n_texts))
    mean_len = sum(map(len, texts)) / len(texts)
    print(f"\n== {label}: {len(texts)} texts ({len(distinct)} distinct, cycled), mean {mean_len:.0f} chars")

    ref_wall, ref_cpu = [], []
    ref_out = None
    results: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    outputs: dict[tuple[int, str], np.ndarray] = {}
    for batch in batches:
        runs = variants(texts, distinct, batch)
        for name in runs:
            results[batch, name] = ([], [])
        for repeat in range(repeats):  # interleaved: load that comes and goes hits every variant alike
            for name, (n, prepare, run) in runs.items():
                prepare()
                wall, cpu, out = common.timed(run)
                results[batch, name][0].append(n / wall)
                results[batch, name][1].append(n / cpu)
                outputs[batch, name] = out
            if batch == batches[0] and repeat < ref_repeats:
                wall, cpu, ref_out = common.timed(lambda: np.stack([reference_embed(t) for t in texts]))
                ref_wall.append(len(texts) / wall)
                ref_cpu.append(len(texts) / cpu)
    embed.clear_cache()
    embed.HashEmbedder(DIMS).embed(distinct)
    tokens = embed.cache_size()

    med = statistics.median
    r_ref, c_ref = med(ref_wall), med(ref_cpu)
    print(f"distinct tokens in the text set (words + trigrams + bigrams, each hashed once cold): {tokens:,}")
    print(f"reference (per-token blake2b, no cache), median of {len(ref_wall)}: {r_ref:,.0f} chunks/s "
          f"(best {max(ref_wall):,.0f})  [CPU: {c_ref:,.0f}/s]")
    print("rates: median of the repeats in chunks/s from wall time (best in brackets) [and from process CPU time, "
          "which other load on the machine inflates less]")
    for batch in batches:
        print(f"-- batches of {batch}:")
        for name in results:
            if name[0] != batch:
                continue
            walls, cpus = results[name]
            print(f"  {name[1]:<24} {med(walls):>8,.0f}/s ({max(walls):,.0f})  [CPU {med(cpus):,.0f}/s]  "
                  f"= {med(walls) / r_ref:.1f}x reference [CPU {med(cpus) / c_ref:.1f}x]")
        verdicts = []
        for run in ("cold", "cold-distinct", "warm"):
            cur, prev = results[batch, f"current {run}"], results[batch, f"previous {run}"]
            ratio, cpu_ratio = med(cur[0]) / med(prev[0]), med(cur[1]) / med(prev[1])
            print(f"  current / previous, {run:<13}: {ratio:.2f}x [CPU {cpu_ratio:.2f}x]")
            verdicts.append(f">= {TARGET_VS_PREVIOUS:.0f}x previous {run}: {common.verdict(ratio >= TARGET_VS_PREVIOUS)}")
        for run in ("cold", "cold-distinct", "warm"):
            ratio = med(results[batch, f"current {run}"][0]) / r_ref
            verdicts.append(f">= {TARGET_VS_REFERENCE:.0f}x reference {run}: {common.verdict(ratio >= TARGET_VS_REFERENCE)}")
        cold = med(results[batch, "current cold"][0])
        verdicts.append(f">= {TARGET_RATE:,} chunks/s cold: {common.verdict(cold >= TARGET_RATE)}")
        print("  targets (wall-time medians): " + "; ".join(verdicts))
        for name in ("current cold", "current warm", "previous cold"):
            print("  " + compare(f"{name} vs reference", outputs[batch, name], ref_out))
        print("  " + compare("current cold vs previous cold", outputs[batch, "current cold"], outputs[batch, "previous cold"]))


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=7, dsn=False)
    parser.add_argument("--texts", type=int, default=5000)
    parser.add_argument("--ref-repeats", type=int, default=3)
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    parser.add_argument("--only", choices=("chunks", "windows"), default=None)
    args = parser.parse_args(argv)

    threads = common.single_thread()  # before numpy is imported
    import numpy as np

    common.print_machine({"threads": threads, "numpy": np.__version__})

    documents = chunker.load_documents(common.CORPUS)
    chunk_texts = [c.text for d in documents for c in chunker.chunk(d)]
    windows = [d.text[i : i + 1000] for d in documents for i in range(0, len(d.text), 1000) if len(d.text[i : i + 1000]) >= 500]
    batches = tuple(int(b) for b in args.batches.split(","))
    if args.only in (None, "chunks"):
        bench("corpus chunks", chunk_texts, args.texts, args.repeats, args.ref_repeats, batches)
    if args.only in (None, "windows"):
        bench("1,000-char windows", windows, args.texts, args.repeats, args.ref_repeats, batches)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
