"""Where the time of the main job goes: Dagster start-up, Postgres start, indexing, evaluation.

Run: uv run python -m benchmarks.guards.bench_dagster
Targets (issue 6): the README's main command for `hash` from a cold process under 30 s; the
in-process materialisation of the hash partition under 10 s. Prints figures only.

1. `import dagster` in a fresh interpreter (best of 3).
2. The embedded Postgres: first start in an empty data directory (initdb + start), a start of an
   existing stopped one, and a reuse of a running one (a throwaway RETRIEVAL_HOME).
3. The README main command as a subprocess (cold process, warm embedded server), its wall time
   and each step's time as Dagster logs it.
4. The same graph materialised in process (dg.materialize), per step from the step events.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

MAIN = ["dagster", "asset", "materialize", "-m", "retrieval_assets.definitions", "--select", "group:retrieval", "--partition", "hash"]


def wall(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=common.ROOT, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, out.stdout + out.stderr


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    common.print_machine()
    bin_dir = Path(sys.executable).parent
    best = min(wall([sys.executable, "-c", "import dagster"])[0] for _ in range(3))
    print(f"import dagster: {best:.2f} s")

    home = Path(tempfile.mkdtemp(prefix="bench-dagster-"))
    env = dict(os.environ, RETRIEVAL_HOME=str(home))
    env.pop("RETRIEVAL_DSN", None)
    probe = [sys.executable, "-c", "from retrieval_assets import pg; pg.connect().close()"]
    first, _ = wall(probe, env)
    reuse, _ = wall(probe, env)
    subprocess.run([sys.executable, "-m", "retrieval_assets.pg", "stop"], cwd=common.ROOT, env=env, check=True, capture_output=True)
    restart, _ = wall(probe, env)
    subprocess.run([sys.executable, "-m", "retrieval_assets.pg", "stop"], cwd=common.ROOT, env=env, check=True, capture_output=True)
    print(f"embedded Postgres (process start + connect): first start {first:.2f} s, restart {restart:.2f} s, reuse {reuse:.2f} s")

    seconds, log = wall([str(bin_dir / MAIN[0]), *MAIN[1:]])
    steps = re.findall(r'Finished execution of step "(\w+)" in ([\d.]+)(ms|s)', log)
    step_s = {name: float(v) / (1000 if unit == "ms" else 1) for name, v, unit in steps}
    print(f"main command, cold process: {seconds:.1f} s wall; steps: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in step_s.items()) + f"; outside the steps {seconds - sum(step_s.values()):.1f} s")

    import dagster as dg

    from retrieval_assets.definitions import defs

    assets = [a for a in defs.assets if a.group_names_by_key and "retrieval" in a.group_names_by_key.values()]
    resources = {"postgres": defs.resources["postgres"]}
    start = time.perf_counter()
    result = dg.materialize(assets, partition_key="hash", resources=resources)
    total = time.perf_counter() - start
    durations = {}
    for event in result.all_events:
        if event.event_type_value == "STEP_SUCCESS":
            durations[event.step_key] = event.event_specific_data.duration_ms / 1000
    print(f"in-process materialisation: {total:.1f} s; steps: " + ", ".join(f"{k} {v:.2f} s" for k, v in durations.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
