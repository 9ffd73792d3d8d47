"""Run a Dagster command on this project's instance: ``python -m retrieval_assets.ui [args...]``.

The root ``dagster.yaml`` (see ``instance.py``) puts runs, events and schedules in Postgres;
this launcher points ``DAGSTER_HOME`` at the project root so that every Dagster command,
including ``dagster-daemon``, which insists on ``DAGSTER_HOME``, reads it, and adds the
workspace when none is given. ``dev`` (the default) is ``dagster dev``; ``daemon`` is
``dagster-daemon run`` (schedules without the UI); anything else goes to the ``dagster`` CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from retrieval_assets import ROOT

WORKSPACE_COMMANDS = ("dev", "daemon")


def command(argv: list[str]) -> list[str]:
    """The Dagster command line for the launcher's arguments."""
    args = list(argv) or ["dev"]
    bin_dir = Path(sys.executable).parent
    if args[0] in WORKSPACE_COMMANDS and not {"-w", "-m", "-f"} & set(args):
        args[1:1] = ["-w", str(ROOT / "workspace.yaml")]
    if args[0] == "daemon":
        return [str(bin_dir / "dagster-daemon"), "run", *args[1:]]
    return [str(bin_dir / "dagster"), *args]


def main(argv: list[str] | None = None) -> int:
    cmd = command(sys.argv[1:] if argv is None else argv)
    os.environ["DAGSTER_HOME"] = str(ROOT)
    os.chdir(ROOT)
    os.execv(cmd[0], cmd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
