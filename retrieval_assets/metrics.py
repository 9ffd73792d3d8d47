"""Golden set, retrieval metrics and evaluation of the pipelines (seed stage 05).

Contract: a chunk is relevant to a golden query when it belongs to the query's ``doc_id`` and
its text contains the anchor (case-insensitive, whitespace-normalised). ``recall_at_k``,
``precision_at_k``, ``mrr`` and ``ndcg_at_k`` (binary gains, ideal DCG over
``min(k, relevant)`` ranks) score one ranked list; ``evaluate`` averages them over a golden set.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psycopg
import yaml

from retrieval_assets import rerank
from retrieval_assets.embed import CachedEmbedder
from retrieval_assets.types import Chunk, Document, GoldenQuery, Metrics

KINDS = ("factual", "conceptual", "lexical")
PIPELINES = ("hybrid", "rerank", "mmr")
_FIELDS = ("query_id", "kind", "query", "doc_id", "anchor")


class GoldenError(ValueError):
    """An invalid golden set; the message names the file and the query id at fault."""


def normalise(text: str) -> str:
    return " ".join(text.split()).lower()


def load_golden(path: str | Path, documents: Sequence[Document] | None = None) -> list[GoldenQuery]:
    """Read and validate golden.yaml (fields, kinds, unique ids, doc ids and anchors when given documents)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GoldenError(f"{path}: golden set not found") from None
    except yaml.YAMLError as exc:
        raise GoldenError(f"{path}: not valid YAML ({exc})") from None
    items = data.get("queries") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise GoldenError(f"{path}: expected a list of queries (or a mapping with 'queries')")
    texts = {d.doc_id: normalise(d.text) for d in documents} if documents is not None else None
    seen: set[str] = set()
    golden = []
    for i, item in enumerate(items, 1):
        qid = str(item.get("query_id", f"#{i}")) if isinstance(item, dict) else f"#{i}"
        where = f"{path}: query {qid}"
        if not isinstance(item, dict):
            raise GoldenError(f"{where}: expected a mapping with {', '.join(_FIELDS)}")
        for name in _FIELDS:
            if not isinstance(item.get(name), str) or not item[name].strip():
                raise GoldenError(f"{where}: missing or empty field '{name}'")
        if item["kind"] not in KINDS:
            raise GoldenError(f"{where}: unknown kind '{item['kind']}' (expected one of {', '.join(KINDS)})")
        if qid in seen:
            raise GoldenError(f"{where}: duplicate query_id")
        seen.add(qid)
        if texts is not None:
            if item["doc_id"] not in texts:
                raise GoldenError(f"{where}: doc_id '{item['doc_id']}' is not a document of the corpus")
            if normalise(item["anchor"]) not in texts[item["doc_id"]]:
                raise GoldenError(f"{where}: anchor '{item['anchor']}' does not occur in {item['doc_id']}")
        golden.append(GoldenQuery(*(item[name].strip() for name in _FIELDS)))
    return golden


def relevant(chunks: Iterable[Chunk], q: GoldenQuery) -> set[str]:
    anchor = normalise(q.anchor)
    return {c.chunk_id for c in chunks if c.doc_id == q.doc_id and anchor in normalise(c.text)}


def recall_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    return len(rel.intersection(ranked[:k])) / len(rel) if rel else 0.0


def precision_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    return sum(1 for cid in ranked[:k] if cid in rel) / k


def mrr(ranked: Sequence[str], rel: set[str], k: int | None = None) -> float:
    for rank, cid in enumerate(ranked[:k] if k else ranked, 1):
        if cid in rel:
            return 1.0 / rank
    return 0.0


def ndcg_at_k(ranked: Sequence[str], rel: set[str], k: int) -> float:
    dcg = sum(1.0 / math.log2(rank + 1) for rank, cid in enumerate(ranked[:k], 1) if cid in rel)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(rel)) + 1))
    return dcg / ideal if ideal else 0.0


def first_relevant_rank(ranked: Sequence[str], rel: set[str]) -> int | None:
    return next((rank for rank, cid in enumerate(ranked, 1) if cid in rel), None)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def aggregate(rows: Sequence[tuple[str, float, float, float, float]], k: int) -> Metrics:
    """Metrics from per-query (kind, recall, precision, rr, ndcg) rows, split by kind."""

    def means(part) -> Metrics:
        return Metrics(k, len(part), *(_mean([r[i] for r in part]) for i in range(1, 5)))

    by_kind = {kind: means([r for r in rows if r[0] == kind]) for kind in KINDS if any(r[0] == kind for r in rows)}
    overall = means(rows)
    return Metrics(k, overall.queries, overall.recall_at_k, overall.precision_at_k, overall.mrr, overall.ndcg_at_k, by_kind)


def score_query(ranked: Sequence[str], rel: set[str], k: int) -> tuple[float, float, float, float]:
    return recall_at_k(ranked, rel, k), precision_at_k(ranked, rel, k), mrr(ranked, rel, k), ndcg_at_k(ranked, rel, k)


def relevant_sets(conn: psycopg.Connection, golden: Sequence[GoldenQuery]) -> dict[str, set[str]]:
    """The relevant chunk ids of every golden query, from the indexed chunks."""
    doc_ids = sorted({q.doc_id for q in golden})
    rows = conn.execute(
        "SELECT chunk_id, doc_id, heading_path, start_char, end_char, text FROM chunks WHERE doc_id = ANY(%s)", (doc_ids,)
    ).fetchall()
    by_doc: dict[str, list[Chunk]] = {}
    for r in rows:
        by_doc.setdefault(r[1], []).append(Chunk(*r))
    return {q.query_id: relevant(by_doc.get(q.doc_id, []), q) for q in golden}


@dataclass(frozen=True)
class QueryResult:
    query_id: str
    kind: str
    relevant: tuple[str, ...]
    ranked: dict[str, tuple[str, ...]]  # pipeline -> chunk ids of its top k
    best_rank: int | None  # first relevant rank in the full reranked pool
    pool_rank: int | None  # first relevant rank in the fused pool
    seconds: float


@dataclass(frozen=True)
class Evaluation:
    """Hybrid, + rerank and + MMR measured from one trace per query."""

    k: int
    n: int
    metrics: dict[str, Metrics]
    pool_recall: float  # recall@n of the fused pool, the ceiling of every reranker over it
    queries: list[QueryResult] = field(repr=False)

    @property
    def latency_ms(self) -> dict[str, float]:
        seconds = sorted(q.seconds for q in self.queries)
        pick = lambda p: 1000 * seconds[min(len(seconds) - 1, int(p * len(seconds)))] if seconds else 0.0  # noqa: E731
        return {"p50": pick(0.5), "p95": pick(0.95)}

    def failures(self, pipeline: str = "mmr") -> list[QueryResult]:
        return [q for q in self.queries if not set(q.ranked[pipeline]) & set(q.relevant)]


def evaluate_pipelines(conn, embedder, reranker, golden: Sequence[GoldenQuery], *, k: int = 10, n: int = 50,
                       mmr_lambda: float = 0.7, weights: tuple[float, float] | None = None,
                       lexical: str = "ts_rank_cd", first_stage_cache: dict | None = None) -> Evaluation:
    """Score hybrid, hybrid + rerank and hybrid + rerank + MMR in one pass over the golden set.

    ``first_stage_cache`` (a dict owned by the caller) keeps each query's vector and lexical lists
    so that later evaluations with other fusion weights skip the searches.
    """
    embedder = CachedEmbedder(embedder)  # each query is embedded once, for the vector list and MMR
    rel = relevant_sets(conn, golden)
    per_pipeline: dict[str, list] = {p: [] for p in PIPELINES}
    pool_recall, results = [], []
    for q in golden:
        start = time.perf_counter()
        key = (q.query, n, lexical)
        cached = first_stage_cache.get(key) if first_stage_cache is not None else None
        t = rerank.trace(conn, embedder, reranker, q.query, n=n, top_k=k, mmr_lambda=mmr_lambda, weights=weights,
                         lexical=lexical, first_stage=cached)
        if first_stage_cache is not None:
            first_stage_cache[key] = (t.vector, t.text)
        seconds = time.perf_counter() - start
        lists = {
            "hybrid": [r.chunk_id for r in t.fused],
            "rerank": [r.chunk_id for r in t.reranked],
            "mmr": [r.chunk_id for r in t.final],
        }
        for p in PIPELINES:
            per_pipeline[p].append((q.kind, *score_query(lists[p], rel[q.query_id], k)))
        pool_recall.append(recall_at_k(lists["hybrid"], rel[q.query_id], n))
        results.append(
            QueryResult(
                q.query_id, q.kind, tuple(sorted(rel[q.query_id])), {p: tuple(lists[p][:k]) for p in PIPELINES},
                first_relevant_rank(lists["rerank"], rel[q.query_id]), first_relevant_rank(lists["hybrid"], rel[q.query_id]), seconds,
            )
        )
    return Evaluation(k, n, {p: aggregate(per_pipeline[p], k) for p in PIPELINES}, _mean(pool_recall), results)


def evaluate(conn, embedder, reranker, golden: Sequence[GoldenQuery], *, k: int = 10, n: int = 50, mmr_lambda: float = 0.7) -> Metrics:
    """Metrics of ``rerank.pipeline`` on the golden set; ``reranker=None`` means hybrid.search alone."""
    embedder = CachedEmbedder(embedder)
    rel = relevant_sets(conn, golden)
    rows = []
    for q in golden:
        t = rerank.trace(conn, embedder, reranker, q.query, n=n, top_k=k, mmr_lambda=mmr_lambda)
        rows.append((q.kind, *score_query([r.chunk_id for r in t.final], rel[q.query_id], k)))
    return aggregate(rows, k)


def report(m: Metrics, *, title: str = "all", file=None) -> None:
    """Print one row for all queries and one per kind."""
    out = file or sys.stdout
    print(f"{'':<12} {'queries':>7} {'recall@' + str(m.k):>10} {'prec@' + str(m.k):>8} {'MRR':>6} {'nDCG@' + str(m.k):>8}", file=out)
    for name, row in [(title, m), *m.by_kind.items()]:
        print(f"{name:<12} {row.queries:>7} {row.recall_at_k:>10.3f} {row.precision_at_k:>8.3f} {row.mrr:>6.3f} {row.ndcg_at_k:>8.3f}", file=out)


def _as_dict(ev: Evaluation) -> dict:
    return {
        "k": ev.k,
        "n": ev.n,
        "pool_recall_at_n": ev.pool_recall,
        "latency_ms": ev.latency_ms,
        "pipelines": {p: asdict(m) for p, m in ev.metrics.items()},
        "failures": [{"query_id": q.query_id, "kind": q.kind, "best_rank": q.best_rank} for q in ev.failures()],
    }


def main(argv: list[str] | None = None) -> int:
    """Index a corpus with one embedder into its own schema and print the golden-set report."""
    from retrieval_assets import chunker, pg, store
    from retrieval_assets.embed import EMBEDDERS, get_embedder

    parser = argparse.ArgumentParser(prog="python -m retrieval_assets.metrics", description=main.__doc__)
    parser.add_argument("--corpus", default="fixtures/corpus", help="corpus directory (docs/, stories/, golden.yaml)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--n", type=int, default=50, help="fused candidate pool size")
    parser.add_argument("--mmr-lambda", type=float, default=0.7)
    parser.add_argument("--embedder", default="hash", choices=sorted(EMBEDDERS))
    parser.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
    parser.add_argument("--schema", default=None, help="schema to index into (default: metrics_<embedder>)")
    parser.add_argument("--lexical", default="ts_rank_cd", choices=["ts_rank_cd", "bm25"], help="lexical list fused with vectors")
    parser.add_argument("--corpus-idf", action="store_true", help="BM25 rerank with corpus-level idf instead of the pool's")
    parser.add_argument("--failures", action="store_true", help="print query_id, kind, best_rank of every miss instead")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers as JSON ('-' for stdout)")
    args = parser.parse_args(argv)
    if args.k < 1 or args.n < args.k:
        parser.error(f"need 1 <= k <= n, got k={args.k} n={args.n}")
    if not 0 <= args.mmr_lambda <= 1:
        parser.error(f"--mmr-lambda must be within [0, 1], got {args.mmr_lambda}")
    corpus = Path(args.corpus)
    try:
        documents = chunker.load_documents(corpus)
        golden = load_golden(corpus / "golden.yaml", documents)
        embedder = get_embedder(args.embedder)
        schema = args.schema or "metrics_" + re.sub(r"\W", "_", args.embedder)
        with pg.connect(args.dsn, schema=schema) as conn:
            store.Schema.create(conn, embedder.dims)
            chunks = [c for d in documents for c in chunker.chunk(d)]
            store.sync(conn, chunks, embedder)
            corpus_stats = rerank.CorpusStats.from_texts([c.text for c in chunks]) if args.corpus_idf else None
            ev = evaluate_pipelines(conn, embedder, rerank.LexicalReranker(corpus=corpus_stats), golden, k=args.k, n=args.n,
                                    mmr_lambda=args.mmr_lambda, lexical=args.lexical)
    except (chunker.CorpusError, GoldenError, pg.ConnectError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.failures:
        print("query_id\tkind\tbest_rank")
        for q in ev.failures():
            print(f"{q.query_id}\t{q.kind}\t{q.best_rank if q.best_rank is not None else 'none'}")
    else:
        print(f"embedder {embedder.name}, lexical list {args.lexical}, k={args.k}, n={args.n}: fused recall@{args.n} = {ev.pool_recall:.3f}")
        for name, label in (("hybrid", "hybrid (RRF)"), ("rerank", "+ BM25 rerank"), ("mmr", f"+ MMR ({args.mmr_lambda})")):
            print(f"\n{label}")
            report(ev.metrics[name])
    if args.json:
        text = json.dumps(_as_dict(ev), indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# --- run history ------------------------------------------------------------------------------

def record_run(conn: psycopg.Connection, ev: Evaluation, *, run_id: str, partition: str, embedder: str, corpus_hash: str,
               code_version: str, variant: str = "") -> None:
    """Append one row per pipeline of ``ev`` to ``eval_runs`` (created if missing) in the current schema.

    ``variant`` prefixes the pipeline names (``bm25:mmr``) of a non-default configuration.
    """
    with conn.transaction():
        conn.execute(
            """CREATE TABLE IF NOT EXISTS eval_runs (
                 id bigserial PRIMARY KEY, run_id text, partition text, embedder text, pipeline text,
                 k int, n int, queries int, recall_at_k float8, precision_at_k float8, mrr float8,
                 ndcg_at_k float8, pool_recall float8, p50_ms float8, p95_ms float8,
                 corpus_hash text, code_version text, created_at timestamptz DEFAULT now())"""
        )
        latency = ev.latency_ms
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO eval_runs (run_id, partition, embedder, pipeline, k, n, queries, recall_at_k,
                     precision_at_k, mrr, ndcg_at_k, pool_recall, p50_ms, p95_ms, corpus_hash, code_version)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
                [
                    (run_id, partition, embedder, variant + pipeline, ev.k, ev.n, m.queries, m.recall_at_k, m.precision_at_k,
                     m.mrr, m.ndcg_at_k, ev.pool_recall, latency["p50"], latency["p95"], corpus_hash, code_version)
                    for pipeline, m in ev.metrics.items()
                ],
            )


def latest_runs(conn: psycopg.Connection) -> list[dict]:
    """The newest row of every (partition, pipeline) in ``eval_runs``; [] before the first run."""
    if conn.execute("SELECT to_regclass('eval_runs')").fetchone()[0] is None:
        return []
    cur = conn.execute(
        """SELECT DISTINCT ON (partition, pipeline) partition, embedder, pipeline, k, recall_at_k, precision_at_k,
                  mrr, ndcg_at_k, pool_recall, run_id, created_at
           FROM eval_runs ORDER BY partition, pipeline, created_at DESC, id DESC"""
    )
    names = [c.name for c in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]
