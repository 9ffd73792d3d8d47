"""Dagster entry point: ``dagster dev -m retrieval_assets.definitions`` (or workspace.yaml).

Every definition lives in ``retrieval_assets/defs/`` and is loaded from there (the ``dg``
project layout, ``[tool.dg]`` in pyproject.toml).
"""

import warnings
from pathlib import Path

import dagster as dg

# The checks of chunk_index and eval_run are evaluated per partition (AssetCheckSpec.partitions_def),
# which Dagster 1.13 marks as a preview; we rely on it knowingly and keep the console quiet.
warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec", category=dg.PreviewWarning)

defs = dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
