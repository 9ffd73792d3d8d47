"""Calibrate answer.SUPPORT_FLOOR: the top LexicalReranker (BM25) score of each question's sources.

Run: uv run python -m benchmarks support_floor [--dsn DSN] [--schema bench_support_floor_hash] [--top-k 5]
     [--corpus DIR --schema SCHEMA [--off-corpus FILE]]   # your own corpus: pass the floor it suggests as
                                                          # `answer --floor` or the answers asset's support_floor

Indexes the fixture corpus with the hash partition's embedder (HashEmbedder(256)) into its own
schema (default ``bench_support_floor_hash``, common.bench_schema; store.sync, so a re-run
changes nothing), then runs answer.sources (answer.SOURCES, the default pipeline with k = top_k;
each source's support is its pool-idf BM25 score over the pool)
for the six off-corpus questions (fixtures/corpus/off_corpus.yaml) and the 48 golden queries,
and prints every question's top source score (MMR's first pick is the top BM25 score of the
fused pool). The suggested floor is the midpoint of the widest clean gap: above the highest
off-corpus score and below the lowest golden score that exceeds it, rounded to 0.05. It prints
the current answer.SUPPORT_FLOOR beside it and how many questions of each set clear both.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import yaml

from benchmarks import common
from retrieval_assets.answers import answer
from retrieval_assets.corpus import golden
from retrieval_assets.index import chunker
from retrieval_assets.search import pipeline
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import RetrievalParams


def top_score(conn, retriever: pipeline.Retriever, query: str, params: RetrievalParams) -> float:
    found = answer.sources(conn, retriever, query, params)
    return max((score for _, score in found), default=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, schema=common.bench_schema("support_floor"))
    parser.add_argument("--top-k", type=int, default=answer.SOURCES.k)
    parser.add_argument("--corpus", type=Path, default=common.CORPUS,
                        help="corpus folder with golden.yaml (default: the fixture corpus); use a --schema of its own")
    parser.add_argument("--off-corpus", type=Path, default=None,
                        help="YAML list of questions the corpus cannot answer (default: the corpus's off_corpus.yaml, "
                             "else the fixture's)")
    args = parser.parse_args(argv)
    schema = args.schema

    documents = chunker.load_documents(args.corpus)
    queries = golden.load_golden(args.corpus / "golden.yaml", documents)
    off_path = args.off_corpus or next(p for p in (args.corpus / "off_corpus.yaml", common.CORPUS / "off_corpus.yaml") if p.exists())
    off_corpus = yaml.safe_load(off_path.read_text())
    if not isinstance(off_corpus, list) or not off_corpus or not all(isinstance(q, str) and q.strip() for q in off_corpus):
        parser.error(f"{off_path}: expected a non-empty YAML list of question strings")
    embedder = HashEmbedder(256)
    params = answer.SOURCES.with_(k=args.top_k)

    with common.connect(args.dsn, schema) as conn:
        common.index(conn, schema, [c for d in documents for c in chunker.chunk(d)], embedder)
        retriever = pipeline.retriever(conn, schema, embedder, params)
        off = [(q, top_score(conn, retriever, q, params)) for q in off_corpus]
        gold = [(q, top_score(conn, retriever, q.query, params)) for q in queries]

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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
