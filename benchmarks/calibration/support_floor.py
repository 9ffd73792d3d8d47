"""Calibrate answer.SUPPORT_FLOOR: the top LexicalReranker (BM25) score of each question's sources.

Run: uv run python benchmarks/support_floor.py [--dsn DSN] [--schema bench_support_floor] [--top-k 5]

Indexes the fixture corpus with HashEmbedder(256) into its own schema (store.sync, so a re-run
changes nothing), then runs answer.sources (fused top 50 -> BM25 rerank -> MMR, first top_k)
for the six off-corpus questions (fixtures/corpus/off_corpus.yaml) and the 48 golden queries,
and prints every question's top source score (MMR's first pick is the top BM25 score of the
fused pool). The suggested floor is the midpoint of the widest clean gap: above the highest
off-corpus score and below the lowest golden score that exceeds it, rounded to 0.05. It prints
the current answer.SUPPORT_FLOOR beside it and how many questions of each set clear both.
"""

from __future__ import annotations

import argparse
import math
import statistics

import yaml
from _common import CORPUS, postgres_versions, print_machine

from retrieval_assets import answer, chunker, metrics, pg, rerank, store
from retrieval_assets.embed import HashEmbedder


def top_score(conn, embedder, reranker, query: str, top_k: int) -> float:
    found = answer.sources(conn, embedder, reranker, query, top_k=top_k)
    return max((score for _, score in found), default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
    parser.add_argument("--schema", default="bench_support_floor")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args()

    documents = chunker.load_documents(CORPUS)
    golden = metrics.load_golden(CORPUS / "golden.yaml", documents)
    off_corpus = yaml.safe_load((CORPUS / "off_corpus.yaml").read_text())
    embedder, reranker = HashEmbedder(256), rerank.LexicalReranker()

    with pg.connect(args.dsn, schema=args.schema) as conn:
        print_machine(postgres_versions(conn))
        store.Schema.create(conn, embedder.dims)
        store.sync(conn, [c for d in documents for c in chunker.chunk(d)], embedder)
        off = [(q, top_score(conn, embedder, reranker, q, args.top_k)) for q in off_corpus]
        gold = [(q, top_score(conn, embedder, reranker, q.query, args.top_k)) for q in golden]

    print(f"\noff-corpus questions (top BM25 score of the top {args.top_k} sources):")
    for q, s in sorted(off, key=lambda x: -x[1]):
        print(f"  {s:7.3f}  {q}")
    print("\ngolden queries, lowest first:")
    for q, s in sorted(gold, key=lambda x: x[1]):
        print(f"  {s:7.3f}  {q.query_id}  {q.kind:<10}  {q.query}")

    off_max = max(s for _, s in off)
    golden_scores = sorted(s for _, s in gold)
    above = [s for s in golden_scores if s > off_max]
    choice = math.floor((off_max + above[0]) / 2 * 20) / 20 if above else math.ceil(off_max * 20 + 1) / 20
    print(f"\nmax off-corpus {off_max:.3f}; golden min {golden_scores[0]:.3f}, median {statistics.median(golden_scores):.3f}, "
          f"max {golden_scores[-1]:.3f}; {len(above)} of {len(gold)} golden queries score above every off-corpus question")
    for label, floor in (("suggested floor", choice), ("answer.SUPPORT_FLOOR", answer.SUPPORT_FLOOR)):
        cleared = [s for s in golden_scores if s >= floor]
        refused = sum(s < floor for _, s in off)
        below = f"{cleared[0] - floor:+.3f}" if cleared else "n/a"
        print(f"{label:<21} {floor:5.2f}: {len(cleared)} of {len(gold)} golden queries clear it, {refused} of {len(off)} off-corpus "
              f"refuse; margin {floor - off_max:+.3f} above the highest off-corpus score, {below} below the lowest cleared golden")

if __name__ == "__main__":
    main()
