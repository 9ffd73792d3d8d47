"""The Dagster graph of one corpus for in-process tests: its assets, jobs and step names."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from retrieval_assets import partitions
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.corpora import corpus_definitions
from retrieval_assets_tests.conftest import CORPUS


def corpus_of(corpus_dir: Path = CORPUS, name: str = "") -> Corpus:
    """The corpus at ``corpus_dir``, named ``name`` (default: the registry's rule for the folder)."""
    return Corpus(name or partitions.corpus_name_for(corpus_dir), str(Path(corpus_dir).resolve()))


def assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    return list(corpus_definitions(corpus).assets)


def selection(corpus: Corpus, *names: str) -> list[str]:
    """Asset selection strings of ``names`` in ``corpus``."""
    return [f"{corpus.name}/{n}" for n in names]


def short(key: dg.AssetKey) -> str:
    """``eval_run`` for ``fixture/eval_run``."""
    return key.path[-1]


def step(step_key: str) -> str:
    """``documents`` for the step ``fixture__documents``."""
    return step_key.split("__")[-1]
