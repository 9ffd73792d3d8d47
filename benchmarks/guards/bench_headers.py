"""Contextual chunk headers on the golden set: the heading path embedded with each chunk, or also indexed.

Run (from the project root): uv run python -m benchmarks.guards.bench_headers [--embedders hash minilm]

For each embedder, the fixture's chunks are indexed three ways into scratch schemas
(``bench_headers_<variant>_<embedder>``): as the chunker makes them (``plain``); with the chunk's
heading path (document title first) prepended to the text the embedder sees, BM25 and full text
reading the chunk alone (``embedded``); and with it prepended to the chunk's text, so every list
sees it (``indexed``). Every golden query runs through the default pipeline (``params.DEFAULT``,
nothing fitted here, so every query is held out); relevant chunks are the plain index's. Prints
and writes nDCG@10, recall@10 and the conceptual queries' recall@10 of each variant, and each
variant's paired difference in nDCG@10 from ``plain`` (95% bootstrap interval, 10,000 resamples).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks import common
from benchmarks.guards.cranfield import machine
from retrieval_assets import partitions, pg
from retrieval_assets.corpus import golden
from retrieval_assets.evaluation import crossval
from retrieval_assets.index import store
from retrieval_assets.search import pipeline
from retrieval_assets.evaluation.metrics import ndcg_at_k, recall_at_k
from retrieval_assets.params import DEFAULT
from retrieval_assets.types import Chunk

DEFAULT_OUT = common.RESULTS / "headers.md"
VARIANTS = ("plain", "embedded", "indexed")


def headed(chunk: Chunk) -> str:
    return f"{chunk.heading_path}\n\n{chunk.text}" if chunk.heading_path else chunk.text


class HeadedEmbedder:
    """Embeds each known chunk text with its heading path in front; any other text (a query) as it is."""

    def __init__(self, embedder, chunks: list[Chunk]):
        self.inner, self.dims, self.name = embedder, embedder.dims, embedder.name
        self.texts = {c.text: headed(c) for c in chunks}

    def embed(self, texts):
        return self.inner.embed([self.texts.get(t, t) for t in texts])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedders", nargs="+", default=["hash", "minilm"])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown report path ('-': print only)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    _, chunks, golden_set = common.fixture()
    conceptual = np.array([q.kind == "conceptual" for q in golden_set])
    conn = pg.connect(args.dsn)
    lines = ["| embedder | headers | nDCG@10 | recall@10 | conceptual recall@10 | nDCG@10 - plain [95% CI] |", "|---|---|---:|---:|---:|---|"]
    for key in args.embedders:
        embedder = partitions.embedder(key)
        relevant, scores = None, {}
        for variant in VARIANTS:
            schema = common.bench_schema(f"headers_{variant}", key)
            store.create(conn, schema, embedder.dims)
            if variant == "indexed":
                indexed = [Chunk(c.chunk_id, c.doc_id, c.heading_path, c.start_char, c.end_char, headed(c)) for c in chunks]
                store.sync(conn, schema, indexed, embedder)
            else:
                store.sync(conn, schema, chunks, HeadedEmbedder(embedder, chunks) if variant == "embedded" else embedder)
            relevant = relevant or golden.relevant_sets(conn, schema, golden_set)
            retriever = pipeline.retriever(conn, schema, embedder, DEFAULT)
            ndcg, recall = [], []
            for q in golden_set:
                ids = [r.chunk_id for r in pipeline.run(conn, retriever, q.query, DEFAULT).final]
                ndcg.append(ndcg_at_k(ids, relevant[q.query_id], 10))
                recall.append(recall_at_k(ids, relevant[q.query_id], 10))
            scores[variant] = np.array(ndcg)
            diff = ""
            if variant != "plain":
                d = scores[variant] - scores["plain"]
                lo, hi = crossval.bootstrap_interval(d)
                diff = f"{d.mean():+.3f} [{lo:+.3f}, {hi:+.3f}], better on {(d > 0).sum()}, worse on {(d < 0).sum()}"
            recall = np.array(recall)
            lines.append(f"| {key} | {variant} | {scores[variant].mean():.3f} | {recall.mean():.3f} | {recall[conceptual].mean():.3f} | {diff} |")
            print(lines[-1], file=sys.stderr, flush=True)
    text = "\n".join([
        "# Contextual chunk headers on the golden set",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine()}; total run "
        f"{time.perf_counter() - started:.0f} s; code {common.code_version()}.",
        "Reproduce: `uv run python -m benchmarks.guards.bench_headers`.",
        "",
        f"The default pipeline on the fixture's {len(golden_set)} golden queries ({conceptual.sum()} conceptual); nothing is "
        "fitted. `embedded`: the heading path (document title first) in front of the text the embedder sees; "
        "`indexed`: in front of the chunk's text, for every list.",
        "",
        *lines,
        "",
    ])
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
