"""The README's main command against the same CLI launching a trivial 4-asset graph, same run.

Run: uv run python -m benchmarks.guards.bench_overhead [--pairs 5] [--partition hash]
Target: the cold main command takes at most 1.4x the wall time of a trivial graph launched the
same way, measured in the same run. Prints figures only.

A = `dg launch --job evaluate_embedders --partition <key>` (the README's main command).
B = `dg launch --job trivial --partition <key> -m trivial_defs`: four chained no-op assets
    (a -> b -> c -> d, each returning a small int, key prefix `bench_overhead`) with the same
    static partition keys and the in-process executor, written at run time into a temporary
    directory put on PYTHONPATH.

Both are cold processes (the `dg` next to this interpreter) started from the project root, so
both read the root `dagster.yaml` and record their runs into the same Postgres instance; the
trivial graph's values go to the default filesystem IO manager (under .retrieval/dagster). Each
is run once before timing (not counted): the embedded Postgres is then running and the
partition's index exists. The timed runs alternate A B A B ..., one pair at a time; the figures
are the medians of A and of B and the median of the per-pair ratios A/B, and the median time A
takes from its last line of output to its exit (what the interpreter's shutdown costs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

TARGET = 1.4
KEYS = ["hash", "minilm", "bge-small"]

TRIVIAL_DEFS = f'''"""Four chained no-op assets: the trivial graph of benchmarks/guards/bench_overhead.py."""

import dagster as dg

parts = dg.StaticPartitionsDefinition({KEYS!r})


@dg.asset(partitions_def=parts, key_prefix="bench_overhead")
def a() -> int:
    return 1


@dg.asset(partitions_def=parts, key_prefix="bench_overhead")
def b(a: int) -> int:
    return a + 1


@dg.asset(partitions_def=parts, key_prefix="bench_overhead")
def c(b: int) -> int:
    return b + 1


@dg.asset(partitions_def=parts, key_prefix="bench_overhead")
def d(c: int) -> int:
    return c + 1


trivial = dg.define_asset_job("trivial", selection=dg.AssetSelection.assets(a, b, c, d))

defs = dg.Definitions(assets=[a, b, c, d], jobs=[trivial], executor=dg.in_process_executor)
'''


class CommandFailed(Exception):
    pass


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall time of one cold process run from the project root, and the time from its last line of
    output to its exit (the process's shutdown); CommandFailed if it exits non-zero."""
    start = time.perf_counter()
    last, lines = start, []
    with subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            last = time.perf_counter()
            lines.append(line)
    end = time.perf_counter()
    if proc.returncode != 0:
        tail = "".join(lines[-40:])
        raise CommandFailed(f"{' '.join(cmd)} exited {proc.returncode} after {end - start:.1f} s; output tail:\n{tail}")
    return end - start, end - last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="timed A/B pairs (default 5)")
    parser.add_argument("--partition", default="hash", choices=KEYS, help="partition key of both commands (default hash)")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")

    dg_cli = str(Path(sys.executable).with_name("dg"))
    main_cmd = [dg_cli, "launch", "--job", "evaluate_embedders", "--partition", args.partition]
    trivial_cmd = [dg_cli, "launch", "--job", "trivial", "--partition", args.partition, "-m", "trivial_defs"]
    common.print_machine({"partition": args.partition, "pairs": str(args.pairs)})
    print(f"A: {' '.join(['dg', *main_cmd[1:]])}")
    print(f"B: {' '.join(['dg', *trivial_cmd[1:]])}  (4 no-op assets)")

    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        Path(tmp, "trivial_defs.py").write_text(TRIVIAL_DEFS)
        main_env = dict(os.environ)
        trivial_env = dict(os.environ)
        trivial_env["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)
        try:
            warm_a, _ = wall(main_cmd, main_env)
            warm_b, _ = wall(trivial_cmd, trivial_env)
            print(f"warm-up (not counted): A {warm_a:.2f} s, B {warm_b:.2f} s\n")
            times_a, times_b, ratios, tails = [], [], [], []
            for i in range(1, args.pairs + 1):
                a, tail = wall(main_cmd, main_env)
                b, _ = wall(trivial_cmd, trivial_env)
                times_a.append(a)
                times_b.append(b)
                ratios.append(a / b)
                tails.append(tail)
                print(f"pair {i}: A {a:6.2f} s  B {b:6.2f} s  A/B {a / b:.2f}  (load {common.load_numbers()})", flush=True)
        except CommandFailed as failure:
            print(failure, file=sys.stderr)
            return 1

    ratio = statistics.median(ratios)
    print(f"\nmedian A (main command):  {statistics.median(times_a):.2f} s  (min {min(times_a):.2f}, max {max(times_a):.2f})")
    print(f"median B (trivial graph): {statistics.median(times_b):.2f} s  (min {min(times_b):.2f}, max {max(times_b):.2f})")
    print(f"median A - B: {statistics.median(times_a) - statistics.median(times_b):.2f} s")
    print(f"median time A spends after its last line of output (its summary) until it exits: {statistics.median(tails):.2f} s")
    print(f"median of per-pair ratios A/B: {ratio:.2f}")
    print(f"target: ratio <= {TARGET}")
    print(f"ratio {ratio:.2f}: {common.verdict(ratio <= TARGET)}")
    common.print_load_end()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
