"""What the benchmark scripts share: the machine block, scratch schemas, the command line, timing loops,
percentiles, reports and older library code loaded from git.

Scripts import it as ``from benchmarks import common``. Not a test module: the scripts print figures and
never assert timings. Nothing here imports numpy at module level (``single_thread`` must run first).
"""

from __future__ import annotations

import argparse
import ast
import datetime as _dt
import gc
import importlib
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "fixtures" / "corpus"
RESULTS = ROOT / "benchmarks" / "results"


# -- scratch schemas -----------------------------------------------------------------------------------


def bench_schema(name: str, key: str = "hash") -> str:
    """The scratch schema of benchmark ``name`` for partition ``key``: ``bench_<name>_<key>``
    (``partitions.schema_name`` with the prefix ``bench_<name>_``, so no benchmark ever writes
    into a partition's own schema)."""
    from retrieval_assets import partitions

    return partitions.schema_name(key, prefix=f"bench_{name}_")


def embedder(key: str):
    """A new embedder of partition ``key``, or of wheel model ``key`` (``index.wheel_models``, compared but no partition)."""
    from retrieval_assets import partitions
    from retrieval_assets.index import wheel_models

    return wheel_models.make(key) if key in wheel_models.WHEEL_MODELS and key not in partitions.PARTITIONS else partitions.embedder(key)


def embed_profile(key: str, texts: list[str]) -> tuple[float, float, float]:
    """(load seconds, texts/s, peak resident MB) of embedder ``key`` on ``texts``, in a fresh process (its own peak)."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_embed_profile, (key, texts))


def _embed_profile(key: str, texts: list[str]) -> tuple[float, float, float]:
    e = embedder(key)
    start = time.perf_counter()
    e.embed(texts[:1])
    loaded = time.perf_counter()
    e.embed(texts)
    rate = len(texts) / (time.perf_counter() - loaded)
    return loaded - start, rate, peak_mb()


def peak_mb() -> float:
    """This process's peak resident memory in MB: VmHWM, not ru_maxrss (Linux keeps ru_maxrss across exec, so a
    spawned child would report its parent's peak)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def scale_schema(size: int) -> str:
    """The schema ``scale`` indexes ``size`` synthetic chunks into (kept with ``--keep``)."""
    return bench_schema(f"scale_{size}")


def drop_schema(dsn: str | None, schema: str) -> None:
    """Drop a benchmark's schema and everything in it."""
    from psycopg import sql

    from retrieval_assets import pg

    with pg.connect(dsn) as admin:
        admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def fixture():
    """The fixture corpus: (documents, their chunks, the golden queries checked against them)."""
    from retrieval_assets.corpus import golden
    from retrieval_assets.index import chunker

    documents = chunker.load_documents(CORPUS)
    chunks = [c for d in documents for c in chunker.chunk(d)]
    return documents, chunks, golden.load_golden(CORPUS / "golden.yaml", documents)


def index(conn, schema: str, chunks, embedder):
    """``store.create`` + ``store.sync`` of ``chunks`` into ``schema`` (a re-run embeds and writes nothing);
    returns the sync's report."""
    from retrieval_assets.index import store

    store.create(conn, schema, embedder.dims)
    return store.sync(conn, schema, chunks, embedder)


# -- the command line and the machine ------------------------------------------------------------------


def parser(doc: str, *, repeats: int | None = None, schema: str | None = None, dsn: bool = True) -> argparse.ArgumentParser:
    """A script's parser: its docstring as help, ``--dsn`` (unless ``dsn`` is false), and ``--repeats`` /
    ``--schema`` when given their defaults."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if dsn:
        made.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
    if repeats is not None:
        made.add_argument("--repeats", type=int, default=repeats)
    if schema is not None:
        made.add_argument("--schema", default=schema, help="scratch schema")
    return made


def connect(dsn: str | None, schema: str | None = None):
    """A connection (``pg.connect``), after printing the machine block with the server's versions."""
    from retrieval_assets import pg

    conn = pg.connect(dsn)
    print_machine({**postgres_versions(conn), "server": pg.mask_dsn(pg.resolve_dsn(dsn)), **({"schema": schema} if schema else {})})
    return conn


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


def host() -> dict:
    """The machine as the written reports state it (``scale``'s JSON keeps these keys)."""
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        kib = float("nan")
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "ram_gib": round(kib / 1024 / 1024), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "date": f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC"}


def host_line(info: dict | None = None) -> str:
    info = info or host()
    return f"{info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM, {info['os']}, Python {info['python']}"


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


NEAREST = "SELECT chunk_id, embedding <=> %(q)s FROM {chunks} ORDER BY embedding <=> %(q)s LIMIT %(k)s"


def exact_nearest(conn, schema: str, vector, k: int = 10) -> list[tuple[str, float]]:
    """The ``k`` nearest chunks of ``schema`` to ``vector`` by an exact scan (index scans off): (chunk_id, distance).

    Never a prepared statement: a plan psycopg prepared and Postgres cached would keep the scan it was planned
    with whatever ``enable_*`` says later (the same text run with the index forced would scan exactly too)."""
    from retrieval_assets.index.tables import statement

    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        return conn.execute(statement(schema, NEAREST), {"q": vector, "k": k}, prepare=False).fetchall()


# -- timing ----------------------------------------------------------------------------------------------


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, process CPU seconds, result) of one call of ``fn``, after a garbage collection."""
    gc.collect()
    cpu, start = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def per_query(fn, queries, repeats: int) -> list[float]:
    """Seconds per call of ``fn(q)``: one untimed pass over ``queries``, then ``repeats`` timed ones (gc off)."""
    for q in queries:
        fn(q)
    samples = []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            for q in queries:
                start = time.perf_counter()
                fn(q)
                samples.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return samples


def pairwise(ours, theirs, queries, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds per call of ``ours`` and ``theirs``, each query timed back to back, the order alternating,
    so that load drift hits both alike."""
    for q in queries:  # warm-up, untimed
        ours(q), theirs(q)
    a, b = [], []
    gc.collect()
    gc.disable()
    try:
        for r in range(repeats):
            for i, q in enumerate(queries):
                for fn, out in ((ours, a), (theirs, b)) if (r + i) % 2 == 0 else ((theirs, b), (ours, a)):
                    start = time.perf_counter()
                    fn(q)
                    out.append(time.perf_counter() - start)
    finally:
        gc.enable()
    return a, b


def compare(label: str, ours: list[float], theirs: list[float], peer_label: str = "peer (one SQL statement, RRF in SQL)",
            ratio: str = "ours/peer", target: float | None = 0.8) -> None:
    """Both summaries and the ratio ours/theirs at p50, p95 and per query (median), against ``target``."""
    per_query_ratio = statistics.median(x / y for x, y in zip(ours, theirs))
    p50 = pct(ours, 50) / pct(theirs, 50)
    p95 = pct(ours, 95) / pct(theirs, 95)
    print(f"{label:<46} {summary_ms(ours)}")
    print(f"{'  ' + peer_label:<46} {summary_ms(theirs)}")
    verdict_text = f"  [<= {target}x: {verdict(p50 <= target)}]" if target else ""
    print(f"{'  ratio ' + ratio:<46} p50 {p50:.2f}x  p95 {p95:.2f}x  per-query median {per_query_ratio:.2f}x{verdict_text}")


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


def runs(seconds: list[float]) -> str:
    """Best and median of whole runs, and every run."""
    return f"best {min(seconds):7.3f} s  median {statistics.median(seconds):7.3f} s  (runs: {', '.join(f'{s:.3f}' for s in seconds)})"


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def embed_batches(embedder, texts: list[str], batch: int):
    """Every text's vector, in order, embedded ``batch`` texts at a time (``store.sync`` embeds 64)."""
    import numpy as np

    return np.concatenate([embedder.embed(texts[i : i + batch]) for i in range(0, len(texts), batch)])


# -- reports -----------------------------------------------------------------------------------------------


def paired_difference(ours, peer, resamples: int = 10_000) -> tuple[float, float, float, int, int]:
    """Per-query scores of ``ours`` minus the peer's, paired: (mean, 95% bootstrap low, high, wins, losses)."""
    import numpy as np

    diff = np.asarray(ours, dtype=float) - np.asarray(peer, dtype=float)
    means = diff[np.random.default_rng(0).integers(0, len(diff), size=(resamples, len(diff)))].mean(axis=1)
    return float(diff.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)), int((diff > 0).sum()), int((diff < 0).sum())


def write_report(text: str, out: str) -> None:
    """Print a Markdown report and write it to ``out`` (``-``: print only)."""
    print(text)
    if out != "-":
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
        print(f"wrote {out}", file=sys.stderr)


# -- older library code, from git ---------------------------------------------------------------------------


def today(name: str) -> types.ModuleType:
    """This tree's library module called ``name`` wherever it lives (``hybrid``: ``retrieval_assets.search.hybrid``)."""
    found = sorted((ROOT / "retrieval_assets").rglob(f"{name}.py"), key=lambda p: (len(p.parts), p))
    found += sorted((ROOT / "retrieval_assets").rglob(f"{name}/__init__.py"), key=lambda p: (len(p.parts), p))
    if not found:
        raise LookupError(f"no module {name} under retrieval_assets/")
    parts = found[0].relative_to(ROOT).with_suffix("").parts
    return importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))


def path_at(commit: str, name: str) -> str:
    """The file of library module ``name`` at ``commit``: this tree's path of it (``retrieval_assets/search/hybrid.py``,
    or that module as a single file if it is a package now), else the flat layout's from before the
    subpackages (``retrieval_assets/hybrid.py``), else the one file of that name under retrieval_assets/ at the
    commit (a layout in between); LookupError naming the paths tried."""
    module = today(name)
    tried = list(dict.fromkeys([Path(module.__file__).resolve().relative_to(ROOT).as_posix(),
                                module.__name__.replace(".", "/") + ".py", f"retrieval_assets/{name}.py"]))
    for path in tried:
        if subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True).returncode == 0:
            return path
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "retrieval_assets/"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    named = [f for f in files if f.endswith(f"/{name}.py")]
    if len(named) == 1:
        return named[0]
    raise LookupError(f"{commit} has none of {', '.join(tried)}" + (f" and {len(named)} files {name}.py" if named else ""))


def _library_imports(source: str) -> set[str]:
    """The second part of every ``retrieval_assets.<x>`` a source imports (``from retrieval_assets import x`` too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "retrieval_assets":
            parts = node.module.split(".")
            found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("retrieval_assets."))
    return found


def modules_at(commit: str, names) -> dict[str, types.ModuleType]:
    """Library modules as they were at ``commit``, by name (``tsquery``, ``bm25``, ``hybrid``, ``embed``), each
    loaded from ``git show COMMIT:PATH`` (``path_at``: this tree's path, else the flat layout's, else the one file
    of that name) as a module of its own (``at_<commit>_<name>``) beside this tree's.

    While they load, a name given earlier stands for its older version: a later module that imports it
    (``from retrieval_assets.search.tsquery import ...``, or the flat ``from retrieval_assets.tsquery import ...``)
    gets the older one. Any other flat name the older code imports that no longer exists
    (``retrieval_assets.embed``) is this tree's module of that name; everything else is this tree's. Afterwards
    this tree's modules are as they were. A module split since the commit is loaded from its own file only.
    """
    import retrieval_assets

    loaded: dict[str, types.ModuleType] = {}
    swapped: dict[str, tuple] = {}  # dotted name -> (sys.modules entry, parent attribute) to put back

    def stand_in(dotted: str, module: types.ModuleType) -> None:
        parent_name, _, short = dotted.rpartition(".")
        parent = sys.modules[parent_name]
        swapped.setdefault(dotted, (sys.modules.get(dotted), getattr(parent, short, None)))
        sys.modules[dotted] = module
        setattr(parent, short, module)

    try:
        for name in names:
            path = path_at(commit, name)
            source = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
            for flat in _library_imports(source) - set(retrieval_assets.__dict__) - set(loaded):
                if importlib.util.find_spec(f"retrieval_assets.{flat}") is None:
                    stand_in(f"retrieval_assets.{flat}", today(flat))
            module = types.ModuleType(f"at_{commit}_{name}")
            module.__file__ = f"{commit}:{path}"
            sys.modules[module.__name__] = module  # dataclasses look their module up
            exec(compile(source, module.__file__, "exec"), module.__dict__)
            loaded[name] = module
            stand_in(today(name).__name__, module)
            stand_in(f"retrieval_assets.{name}", module)
    finally:
        for dotted, (entry, attribute) in swapped.items():
            parent_name, _, short = dotted.rpartition(".")
            if entry is None:
                del sys.modules[dotted]
            else:
                sys.modules[dotted] = entry
            if attribute is None:
                delattr(sys.modules[parent_name], short)
            else:
                setattr(sys.modules[parent_name], short, attribute)
    return loaded


# -- a Celery worker on a second copy of the project (benchmarks/guards/executors.py, test_celery.py) ---------


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str, log: Path | None = None) -> None:
    """Poll ``predicate`` until true; TimeoutError naming ``what`` (and the tail of ``log``) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise TimeoutError(f"{what} not ready after {timeout_s:g} s\n{tail}")
        time.sleep(0.2)


def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    """Debian's redis-server on a free loopback port, nothing saved: (process, broker URL without a database)."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "redis.log"
    process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(folder)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    import socket

    def listening() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited: {log.read_text()[-2000:]}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 30, "redis-server", log)
    return process, f"redis://127.0.0.1:{port}"


def second_copy(dest: Path) -> Path:
    """A ``git clone`` of this project at ``dest`` holding this working tree's files (tracked and new), with a
    virtual environment of its own from the lock file (``uv sync --frozen --all-extras``): what a second host has."""
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True)
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source, target = ROOT / name, dest / name
        if source.is_file() and (not target.exists() or target.read_bytes() != source.read_bytes()):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    uv = os.environ.get("UV") or "uv"
    done = subprocess.run([uv, "sync", "--frozen", "--all-extras", "--quiet"], cwd=dest, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"uv sync in the second copy failed: {done.stderr[-2000:]}")
    return dest


def start_worker(copy: Path, env: dict[str, str], broker: str, name: str, log: Path) -> subprocess.Popen:
    """A Celery worker of dagster-celery's app from ``copy``'s environment, consuming the ``dagster`` queue of
    ``broker`` in its own process (``--pool solo``: every step runs in the worker's pid), once it is ready."""
    command = [str(copy / ".venv" / "bin" / "celery"), "-A", "dagster_celery.app", "-b", broker, "--result-backend", broker,
               "worker", "-Q", "dagster", "--pool", "solo", "-n", f"{name}@%h", "--without-mingle", "--without-gossip", "-l", "INFO"]
    process = subprocess.Popen(command, cwd=copy, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the Celery worker exited: {log.read_text()[-3000:]}")
        return " ready." in log.read_text()

    wait_for(ready, 120, "the Celery worker", log)
    return process


def stop(process: subprocess.Popen) -> None:
    """End a process this module started (SIGTERM, then SIGKILL after 20 s)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
