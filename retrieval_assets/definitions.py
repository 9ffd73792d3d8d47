"""Dagster entry point: ``dagster dev -m retrieval_assets.definitions`` (or workspace.yaml).

Every definition lives in ``retrieval_assets/defs/`` and is loaded from there (the ``dg``
project layout, ``[tool.dg]`` in pyproject.toml).
"""

from pathlib import Path

import dagster as dg

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
