"""Hybrid retrieval over Postgres, run and measured as Dagster assets.

``ROOT`` is the project root (the checkout, or the installed tree with ``dagster.yaml`` and ``fixtures/``
beside the package), derived here alone: the fixture corpus, the default ``RETRIEVAL_HOME``, the
instance ``dg`` and ``python -m retrieval_assets.ui`` read. Only ``pathlib``: a ``dg`` process imports
this package before anything else (``retrieval_assets_dg.pth``).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
