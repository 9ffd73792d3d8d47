"""Vector search at 100k: recall@10 against exact, query p50, build time and size, per option and kind of vector.

Run (from the project root; about 10 minutes on 2 cores):

    uv run python -m benchmarks.guards.bench_vector_index [--size 100000] [--queries 100] [--out FILE]

Two kinds of vectors, each copied into a narrow table ``bench_vindex.<kind>`` (id, vector stored
inline) of the embedded Postgres (or ``$RETRIEVAL_DSN``):

- ``hash``: the HashEmbedder's 256-d vectors of the synthetic corpus, read from the schema kept
  by ``python -m benchmarks.guards.scale --sizes 100000 --keep`` (the first ``--size`` chunks).
- ``trained``: a stand-in with the geometry of all-MiniLM-L6-v2 (384-d), because MiniLM embeds
  about 5 chunks/s here (100k would take hours): document centres drawn from a Gaussian with the
  mean and covariance of MiniLM's vectors of the fixture corpus (430 chunks, the ``minilm``
  schema of the fixture, which the main command's ``--partition minilm`` fills), chunks drawn
  around their document's centre with the spread fitted so that the mean nearest-neighbour
  cosine of 430 stand-in chunks (32 documents, as the fixture) equals MiniLM's; normalised. The
  statistics printed first compare the two (mean pairwise cosine, nearest-neighbour cosine,
  variance in the top 10 principal components).

Queries: ``--queries`` of the table's own vectors (each query's own row left out), as
``vector_index.vector_recall`` checks after a bulk load; for ``hash`` also keyword queries of the
synthetic corpus (``Corpus.queries``, as scale.py). A returned row counts when its exact distance
(numpy, float64, whatever the option computed it in) is within the exact 10th distance. Options: HNSW (pgvector's defaults m 16,
ef_construction 64; ``max_parallel_maintenance_workers`` 2) at ef_search 50 (the pipeline's),
100, 200, 400 (``vector_index.EF_LADDER``) and 1000; IVFFlat at lists 316 (sqrt of the rows) with probes 10 and 40, and lists 1000
with probes 32; exact scan of float32 and of halfvec (a halfvec copy, no index); binary quantisation
as a prefilter: the top 500 or 2000 rows by Jaccard distance of sign bits (a bit per positive
coordinate and one per negative, a table of its own), reranked by the halfvec copy. The planner is
held on the index under test (``enable_seqscan`` off) and off every index for exact scans.
Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import zlib
from pathlib import Path

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql

from benchmarks import common
from retrieval_assets import partitions, pg
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.corpus.synthetic import Corpus

SCHEMA = "bench_vindex"
CHUNKS_PER_DOC = 430 / 32  # the fixture corpus: 430 chunks of 32 documents
HNSW_EF = (50, 100, 200, 400, 1000)  # 50-400: vector_index.EF_LADDER
IVF = ((316, (10, 40)), (1000, (32,)))
BITS_CANDIDATES = (500, 2000)  # the sign-bit prefilter's candidates reranked exactly


def geometry(x: np.ndarray) -> dict[str, float]:
    """Mean pairwise cosine, mean nearest-neighbour cosine, share of variance in the top 10 components."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    cos = x @ x.T
    np.fill_diagonal(cos, np.nan)
    s = np.linalg.svd(x - x.mean(0), compute_uv=False) ** 2
    return {"mean cosine": float(np.nanmean(cos)), "nearest-neighbour cosine": float(np.nanmax(cos, axis=1).mean()),
            "variance in top 10 components": float(s[:10].sum() / s.sum())}


def standin(real: np.ndarray, n: int, spread: float, rng: np.random.Generator) -> np.ndarray:
    """n vectors: document centres from N(mean, cov) of ``real``, chunks around them with ``spread`` x cov, normalised."""
    mean, cov = real.mean(0), np.cov(real.T) + 1e-6 * np.eye(real.shape[1])
    root = np.linalg.cholesky(cov)
    docs = max(1, round(n / CHUNKS_PER_DOC))
    centres = mean + rng.standard_normal((docs, real.shape[1])) @ root.T
    x = centres[rng.integers(0, docs, n)] + np.sqrt(spread) * (rng.standard_normal((n, real.shape[1])) @ root.T)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


class StandinEmbedder:
    """Texts to vectors of the stand-in's geometry: each text (by its crc32) picks one of ``docs``
    document centres drawn from MiniLM's fixture mean and covariance, and scatters around it with
    ``spread`` x that covariance; normalised float32, deterministic per text. Used by scale.py
    ``--vectors standin`` to index and query 100k synthetic chunks with trained-like vectors."""

    name = "minilm-standin"

    def __init__(self, real: np.ndarray, spread: float, docs: int = 7_500, seed: int = 2):
        self.dims = real.shape[1]
        cov = np.cov(real.T) + 1e-6 * np.eye(self.dims)
        self.root = np.linalg.cholesky(cov)
        self.centres = real.mean(0) + np.random.default_rng(seed).standard_normal((docs, self.dims)) @ self.root.T
        self.spread = spread

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        keys = [zlib.crc32(t.encode()) for t in texts]
        noise = np.stack([np.random.default_rng(k).standard_normal(self.dims) for k in keys])
        x = self.centres[np.array(keys) % len(self.centres)] + np.sqrt(self.spread) * (noise @ self.root.T)
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def minilm_fixture_vectors(conn: psycopg.Connection) -> np.ndarray:
    """MiniLM's vectors of the fixture corpus, from the fixture's ``minilm`` schema (ValueError if it is empty)."""
    schema = partitions.schema_name("minilm", prefix=partitions.env_prefix())  # the assets' fixture index
    if conn.execute("SELECT to_regclass(%s)", (f"{schema}.chunks",)).fetchone()[0] is None:
        raise ValueError(f"no {schema}.chunks: run `uv run dg launch --job evaluate_embedders --partition minilm` first")
    with conn.cursor(binary=True) as cur:
        rows = cur.execute(sql.SQL("SELECT embedding FROM {} ORDER BY chunk_id").format(sql.Identifier(schema, "chunks"))).fetchall()
    if not rows:
        raise ValueError(f"{schema}.chunks is empty: run `uv run dg launch --job evaluate_embedders --partition minilm` first")
    return np.stack([r[0].to_numpy() for r in rows])


def fit_spread(real: np.ndarray, rng_seed: int = 0) -> float:
    """The spread whose 430-chunk stand-in has MiniLM's mean nearest-neighbour cosine (bisection)."""
    target = geometry(real)["nearest-neighbour cosine"]
    lo, hi = 0.01, 10.0
    for _ in range(30):
        mid = (lo * hi) ** 0.5
        got = geometry(standin(real, len(real), mid, np.random.default_rng(rng_seed)))["nearest-neighbour cosine"]
        lo, hi = (mid, hi) if got > target else (lo, mid)
    return (lo * hi) ** 0.5


def load(conn: psycopg.Connection, kind: str, vectors: np.ndarray) -> None:
    table = sql.Identifier(SCHEMA, kind)
    dims = vectors.shape[1]
    half = sql.Identifier(SCHEMA, f"{kind}_h")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(table, half))
    conn.execute(sql.SQL("CREATE TABLE {} (id int4 PRIMARY KEY, v vector({}))").format(table, sql.Literal(dims)))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN v SET STORAGE PLAIN").format(table))
    with conn.cursor().copy(sql.SQL("COPY {} (id, v) FROM STDIN WITH (FORMAT BINARY)").format(table)) as copy:
        copy.set_types(["int4", "vector"])
        for i, v in enumerate(vectors):
            copy.write_row((i, v))
    # the halfvec copy in a table of its own, so that neither scan reads the other's column
    conn.execute(sql.SQL("CREATE TABLE {} (id int4 PRIMARY KEY, v halfvec({}))").format(half, sql.Literal(dims)))
    conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN v SET STORAGE PLAIN").format(half))
    conn.execute(sql.SQL("INSERT INTO {} SELECT id, v::halfvec FROM {}").format(half, table))
    # the sign bits: binary quantisation of v and of -v (a bit per positive, then per negative coordinate)
    bits = sql.Identifier(SCHEMA, f"{kind}_b")
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(bits))
    conn.execute(sql.SQL("""CREATE TABLE {} AS SELECT id, (binary_quantize(v) || binary_quantize(v * {}::vector))::bit({}) AS b
                            FROM {}""").format(bits, sql.Literal("[" + ",".join(["-1"] * dims) + "]"), sql.Literal(2 * dims), table))
    conn.execute(sql.SQL("ALTER TABLE {} ADD PRIMARY KEY (id)").format(bits))
    conn.execute(sql.SQL("VACUUM ANALYZE {}, {}, {}").format(table, half, bits))


def normalised(vectors: np.ndarray) -> np.ndarray:
    base = vectors.astype(np.float64)
    return base / np.linalg.norm(base, axis=1, keepdims=True)


def truth(base: np.ndarray, queries: np.ndarray, own: list[int | None], k: int = 10) -> np.ndarray:
    """The exact k-th cosine distance per query (own row left out), in float64 (``base``: normalised vectors)."""
    q = queries.astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    d = 1.0 - q @ base.T
    for j, i in enumerate(own):
        if i is not None:
            d[j, i] = np.inf
    return np.sort(d, axis=1)[:, k - 1]


def measure(conn: psycopg.Connection, search: sql.Composable, bind, queries: np.ndarray, own: list[int | None], kth: np.ndarray,
            base: np.ndarray, settings: dict[str, str], k: int = 10) -> tuple[float, float]:
    """(recall@k, p50 ms) of ``search`` (its rows: ids, best first; ``bind(query)``: its parameters but
    ``k``) under ``settings`` (transaction-local). A returned row is a hit when its exact float64
    distance (``base``: the normalised vectors) is within the exact k-th distance."""
    hits, times = 0, []
    for j, query in enumerate(queries):
        with conn.transaction():
            for name, value in settings.items():
                conn.execute("SELECT set_config(%s, %s, true)", (name, value))
            start = time.perf_counter()
            ids = [i for (i,) in conn.execute(search, {**bind(query), "k": k + 1}).fetchall()]
            times.append(time.perf_counter() - start)
        found = [i for i in ids if i != own[j]][:k]
        q = query.astype(np.float64)
        q /= np.linalg.norm(q)  # in float64, as truth() did
        hits += int(np.sum(1.0 - base[found] @ q <= kth[j] + 1e-9))
    return hits / (k * len(queries)), 1000 * statistics.median(times)


def sign_bits(vector: np.ndarray) -> str:
    """The query's sign bits as the ``_b`` table holds them: one bit per positive coordinate, then one per negative."""
    return "".join("1" if x > 0 else "0" for x in vector) + "".join("1" if x < 0 else "0" for x in vector)


def size_mb(conn: psycopg.Connection, name: str) -> float:
    return conn.execute("SELECT pg_relation_size(%s::regclass)", (f"{SCHEMA}.{name}",)).fetchone()[0] / 1e6


def frontier(conn: psycopg.Connection, kind: str, vectors: np.ndarray, query_sets: dict[str, tuple[np.ndarray, list]]) -> list[dict]:
    rows = []
    base = normalised(vectors)
    kths = {name: truth(base, q, own) for name, (q, own) in query_sets.items()}
    table = sql.Identifier(SCHEMA, kind)
    exact = {"enable_indexscan": "off", "enable_bitmapscan": "off", "enable_seqscan": "on"}
    on_index = {"enable_seqscan": "off"}

    def row(option: str, build_s: float | None, size: float, column: str, settings: dict[str, str]) -> None:
        out = {"kind": kind, "option": option, "build_s": build_s, "size_mb": size}
        if column.startswith("b"):  # the sign-bit prefilter's top candidates, reranked by the halfvec copy
            search = sql.SQL("""WITH cand AS MATERIALIZED (SELECT id FROM {b} ORDER BY b <%%> %(b)s::bit({bits}) LIMIT {n})
                                SELECT id FROM {h} JOIN cand USING (id) ORDER BY v <=> %(q)s LIMIT %(k)s""").format(
                b=sql.Identifier(SCHEMA, f"{kind}_b"), h=sql.Identifier(SCHEMA, f"{kind}_h"),
                bits=sql.Literal(2 * vectors.shape[1]), n=sql.Literal(int(column[1:])))
            bind = lambda v: {"q": HalfVector(v), "b": sign_bits(v)}  # noqa: E731
        else:
            search = sql.SQL("SELECT id FROM {t} ORDER BY v <=> %(q)s LIMIT %(k)s").format(
                t=sql.Identifier(SCHEMA, kind if column == "v" else f"{kind}_h"))
            bind = (lambda v: {"q": v}) if column == "v" else (lambda v: {"q": HalfVector(v)})
        for name, (q, own) in query_sets.items():
            out[name] = measure(conn, search, bind, q, own, kths[name], base, settings)
        rows.append(out)
        print("  ", out, flush=True)

    table_mb = lambda name: conn.execute("SELECT pg_table_size(%s::regclass)", (f"{SCHEMA}.{name}",)).fetchone()[0] / 1e6  # noqa: E731
    row("exact scan, float32", None, table_mb(kind), "v", exact)
    row("exact scan, halfvec", None, table_mb(f"{kind}_h"), "h", exact)
    for n in BITS_CANDIDATES:
        # the planner free to fetch the candidates by primary key (no index exists for the bits' distance)
        row(f"sign bits (Jaccard) top {n}, reranked by the halfvec copy", None, table_mb(f"{kind}_b") + table_mb(f"{kind}_h"), f"b{n}", {})
    conn.execute("SET max_parallel_maintenance_workers = 2")
    conn.execute("SET maintenance_work_mem = '512MB'")
    start = time.perf_counter()
    conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hnsw (v vector_cosine_ops)").format(sql.Identifier(f"{kind}_hnsw"), table))
    build = time.perf_counter() - start
    for ef in HNSW_EF:
        row(f"HNSW m 16, ef_construction 64, ef_search {ef}", build, size_mb(conn, f"{kind}_hnsw"), "v", {**on_index, "hnsw.ef_search": str(ef)})
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(SCHEMA, f"{kind}_hnsw")))
    for lists, probes in IVF:
        start = time.perf_counter()
        conn.execute(sql.SQL("CREATE INDEX {} ON {} USING ivfflat (v vector_cosine_ops) WITH (lists = {})").format(
            sql.Identifier(f"{kind}_ivf"), table, sql.Literal(lists)))
        build = time.perf_counter() - start
        for p in probes:
            row(f"IVFFlat lists {lists}, probes {p}", build, size_mb(conn, f"{kind}_ivf"), "v", {**on_index, "ivfflat.probes": str(p)})
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(SCHEMA, f"{kind}_ivf")))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--topics", type=int, default=300, help="as the kept scale schema was made")
    parser.add_argument("--source", default=common.scale_schema(100_000), help="the kept scale schema holding the hash vectors")
    parser.add_argument("--out", default=None, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    common.print_machine({"size": args.size, "queries": args.queries})
    rng = np.random.default_rng(0)
    with pg.connect(None) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(SCHEMA)))
        real = minilm_fixture_vectors(conn)
        spread = fit_spread(real)
        print(f"stand-in spread {spread:.4f} (chunk scatter around its document centre, as a multiple of MiniLM's covariance)")
        sample = standin(real, len(real), spread, np.random.default_rng(1))
        hash_rows = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(args.source, "chunks"))).fetchone()[0]
        with conn.cursor(binary=True) as cur:
            hashed = np.stack([r[0].to_numpy() for r in cur.execute(sql.SQL("SELECT embedding FROM {} ORDER BY chunk_id LIMIT %s").format(
                sql.Identifier(args.source, "chunks")), (args.size,))])
        print(f"hash vectors: {len(hashed):,} of {hash_rows:,} in {args.source}")
        print("\n| geometry (430 vectors) | MiniLM, fixture | stand-in | hash, fixture-sized sample |\n|---|---|---|---|")
        g_real, g_stand, g_hash = geometry(real), geometry(sample), geometry(hashed[rng.choice(len(hashed), len(real), replace=False)])
        for key in g_real:
            print(f"| {key} | {g_real[key]:.3f} | {g_stand[key]:.3f} | {g_hash[key]:.3f} |")
        trained = standin(real, args.size, spread, np.random.default_rng(2))
        results = []
        embedder = HashEmbedder(256)
        for kind, vectors in (("trained", trained), ("hash", hashed)):
            print(f"\n{kind}: loading {len(vectors):,} vectors", flush=True)
            load(conn, kind, vectors)
            picks = rng.choice(len(vectors), args.queries, replace=False)
            sets = {"own": (vectors[picks], [int(i) for i in picks])}
            if kind == "hash":
                words = Corpus(0, topics=args.topics).queries(args.queries)
                sets["keyword"] = (embedder.embed(words), [None] * len(words))
            results += frontier(conn, kind, vectors, sets)
            conn.execute(sql.SQL("DROP TABLE {}, {}, {}").format(*(sql.Identifier(SCHEMA, f"{kind}{suffix}") for suffix in ("", "_h", "_b"))))
    lines = ["| vectors | option | build (s) | size (MB) | recall@10, own chunks | p50 (ms) | recall@10, keyword queries | p50 (ms) |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        build = "" if r["build_s"] is None else f"{r['build_s']:.1f}"
        kw = f"{r['keyword'][0]:.3f} | {r['keyword'][1]:.1f}" if "keyword" in r else " | "
        lines.append(f"| {r['kind']} | {r['option']} | {build} | {r['size_mb']:.1f} | {r['own'][0]:.3f} | {r['own'][1]:.1f} | {kw} |")
    print("\n" + "\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
