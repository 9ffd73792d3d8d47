"""Helpers shared by the benchmark scripts: machine description, schemas, summary statistics.

Scripts import it as ``from benchmarks import common``. Not a test module: the scripts print
figures and never assert timings.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "corpus"
RESULTS = ROOT / "benchmarks" / "results"


def bench_schema(name: str, key: str = "hash") -> str:
    """The scratch schema of benchmark ``name`` for partition ``key``: ``bench_<name>_<key>``
    (``partitions.schema_name`` with the prefix ``bench_<name>_``, so no benchmark ever writes
    into a partition's own schema)."""
    from retrieval_assets import partitions

    return partitions.schema_name(key, prefix=f"bench_{name}_")


def scale_schema(size: int, key: str = "hash") -> str:
    """The schema ``guards/scale.py`` indexes ``size`` synthetic chunks into (kept with ``--keep``); ``key``
    ``minilm`` for its MiniLM stand-in vectors (``--vectors standin``)."""
    return bench_schema(f"scale_{size}", key)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS")


def single_thread() -> str:
    """Set the BLAS/OpenMP thread variables to 1 and pin the process to one CPU; returns what was done.

    Call it first in ``main``, before numpy is imported (scripts that use it import numpy and the
    library inside their functions): numpy reads the variables when it loads.
    """
    for name in THREAD_VARIABLES:
        os.environ[name] = "1"
    done = "OMP/OPENBLAS/MKL_NUM_THREADS=1" + (" (numpy was loaded before: not in effect)" if "numpy" in sys.modules else "")
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"{done}, process pinned to CPU {cpu}"
    return f"{done}, process not pinned"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, str]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cores": f"{os.cpu_count()} logical ({affinity} usable by this process)",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "platform": platform.platform(),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load": load_average(),
        "code": code_version(),
    }


def code_version() -> str:
    """The commit measured, and whether retrieval_assets/ had uncommitted changes at the time."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "retrieval_assets"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    changed = sorted(line[3:] for line in dirty if line.strip())
    return f"{head}" + (f" + uncommitted changes in {', '.join(changed)}" if changed else " (clean)")


def fixture():
    """The fixture corpus: (documents, their chunks, the golden queries checked against them)."""
    from retrieval_assets.corpus import golden
    from retrieval_assets.index import chunker

    documents = chunker.load_documents(CORPUS)
    chunks = [c for d in documents for c in chunker.chunk(d)]
    return documents, chunks, golden.load_golden(CORPUS / "golden.yaml", documents)


def drop_schema(dsn: str | None, schema: str) -> None:
    """Drop a benchmark's schema and everything in it."""
    from psycopg import sql

    from retrieval_assets import pg

    with pg.connect(dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def drop_chunks(conn, schema: str) -> None:
    """Drop the chunk table and the BM25 statistics beside it in ``schema`` (the schema stays)."""
    from retrieval_assets.index import store

    store.drop(conn, schema)


def load_numbers() -> str:
    """1/5/15-minute load averages: other work on the machine skews every figure printed."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def load_average() -> str:
    return "loadavg " + load_numbers()


def postgres_versions(conn) -> dict[str, str]:
    server = conn.execute("SHOW server_version").fetchone()[0]
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    return {"postgres": server, "pgvector": row[0] if row else "absent"}


def print_machine(extra: dict[str, str] | None = None) -> None:
    print("machine:")
    for key, value in {**machine(), **(extra or {})}.items():
        print(f"  {key:<9} {value}")


def print_load_end() -> None:
    """Load at the end of the run: a high figure means other work overlapped this measurement."""
    print(f"\nload at end: {load_average()}")


def pct(samples, p: float) -> float:
    """Percentile by linear interpolation between closest ranks (numpy's default method)."""
    data = sorted(samples)
    if not data:
        return float("nan")
    pos = (len(data) - 1) * p / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summary_ms(seconds) -> str:
    ms = [1000 * s for s in seconds]
    return (
        f"p50 {pct(ms, 50):7.2f} ms  p95 {pct(ms, 95):7.2f} ms  mean {statistics.fmean(ms):7.2f} ms  "
        f"max {max(ms):7.2f} ms  (n={len(ms)})"
    )


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"
