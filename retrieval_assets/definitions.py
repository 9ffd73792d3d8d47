"""Dagster entry point: ``dagster dev -m retrieval_assets.definitions`` (or workspace.yaml).

Every definition lives in ``retrieval_assets/defs/`` and is loaded from there (the ``dg``
project layout, ``[tool.dg]`` in pyproject.toml).
"""

import atexit
import gc
from pathlib import Path

import dagster as dg

# A process that loaded these definitions (dg launch, dagster asset materialize, a code server) spends
# about 1 s of its exit in the interpreter's final garbage collections, walking and freeing every object
# Dagster, SQLAlchemy and pydantic built (py-spy: gc_collect_main after the last event; the main command's
# last second). Freezing the heap at exit leaves those objects to the operating system instead. Every
# atexit handler still runs, and objects freed by reference counting are still finalised; only garbage
# in reference cycles is not collected, which no code here relies on (files are closed by `with`, and
# pg closes its idle connections at exit).
atexit.register(gc.freeze)

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
