"""Where HashEmbedder.embed spends its time: cold (every text new to the instance) and warm.

Run: uv run python -m benchmarks.profiles.profile_embed [--repeats 5] [--cprofile]
One core (OMP/OPENBLAS threads 1, process pinned: common.single_thread, before numpy and the
embedder are imported, so they are imported inside main); figures from process CPU time, which
other load on the machine inflates less than wall time. Prints figures only; never asserts.
Behind 5c8fad1 (HashEmbedder: row offsets added in numpy, local cache lookups), adopted.

"Cold-distinct" embeds each distinct corpus text once on a new instance: every token is hashed
once (blake2b through hashlib, one call per distinct token), so it is the indexing cost of a new
corpus. "Warm" re-embeds texts whose tokens are all cached. The components are timed alone:
tokenising (lower + findall), and hashing the distinct token set with the embedder's own _code
(the embedder's private tokeniser pattern and hash: what is profiled has no public twin).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time

from benchmarks import common
from retrieval_assets.index import chunker


def cpu(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def batches(embedder, texts, batch=64):
    for i in range(0, len(texts), batch):
        embedder.embed(texts[i : i + batch])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cprofile", action="store_true", help="also print cProfile's top functions, cold and warm")
    args = parser.parse_args(argv)
    threads = common.single_thread()  # before numpy is imported
    from retrieval_assets.index.embed import _WORD, HashEmbedder, clear_cache

    common.print_machine({"threads": threads})

    documents = chunker.load_documents(common.CORPUS)
    distinct = [c.text for d in documents for c in chunker.chunk(d)]
    words = [_WORD.findall(t.lower()) for t in distinct]
    uniq_words = {w for ws in words for w in ws}
    trigrams = {w[i : i + 3] for w in uniq_words for i in range(len(w) - 2)}
    bigrams = {f"{a} {b}" for ws in words for a, b in zip(ws, ws[1:])}
    tokens = len(uniq_words) + len(trigrams) + len(bigrams)
    n_codes = sum(len(ws) + sum(max(len(w) - 2, 0) for w in ws) + max(len(ws) - 1, 0) for ws in words)
    print(f"\ncorpus chunks: {len(distinct)} texts, {n_codes:,} token occurrences, {tokens:,} distinct tokens "
          f"({len(uniq_words):,} words, {len(trigrams):,} trigrams, {len(bigrams):,} bigrams)")

    e = HashEmbedder(256)
    cold = cpu(lambda: (clear_cache(), batches(HashEmbedder(256), distinct)), args.repeats)  # the token cache is process-wide
    batches(e, distinct)
    warm = cpu(lambda: batches(e, distinct), args.repeats)
    tokenise = cpu(lambda: [_WORD.findall(t.lower()) for t in distinct], args.repeats)
    all_tokens = [*uniq_words, *trigrams, *bigrams]
    hashing = cpu(lambda: [e._code(t) for t in all_tokens], args.repeats)
    print(f"  cold-distinct embed (new instance): {cold:.3f} s CPU -> {len(distinct) / cold:,.0f} chunks/s")
    print(f"  warm embed (all tokens cached):     {warm:.3f} s CPU -> {len(distinct) / warm:,.0f} chunks/s")
    print(f"  of these, alone: lower + findall {tokenise:.3f} s; hashing the {tokens:,} distinct tokens with _code "
          f"{hashing:.3f} s ({1e6 * hashing / tokens:.2f} us per token)")
    print(f"  cold minus warm = {cold - warm:.3f} s, against {hashing:.3f} s of hashing: the cache-miss path is "
          f"{100 * hashing / cold:.0f}% of a cold embed; tokenising is {100 * tokenise / warm:.0f}% of a warm one")

    if args.cprofile:
        for label, fn in (("cold-distinct", lambda: (clear_cache(), batches(HashEmbedder(256), distinct))), ("warm", lambda: batches(e, distinct))):
            prof = cProfile.Profile()
            prof.enable()
            fn()
            prof.disable()
            print(f"\ncProfile, {label}:")
            pstats.Stats(prof).sort_stats("tottime").print_stats(8)
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
