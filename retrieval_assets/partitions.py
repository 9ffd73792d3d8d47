"""The embedder partitions: name, embedder, schema and quality floors, owned here alone.

Contract: ``PARTITIONS`` maps each partition key (``hash``, ``minilm``, ``bge-small``) to a
``Partition``; ``get(key)`` raises ``ValueError`` naming the known keys; ``schema_name`` is the
only rule that turns a key into a Postgres schema name (for the partition's index and for the
scratch and command-line schemas beside it). Assets, the command line, benchmarks and the
schedule read this module; nothing else builds a schema name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from retrieval_assets.embed import Embedder, HashEmbedder

HISTORY = "retrieval_history"  # the schema of the eval_runs history (after the prefix)
PREFIX_VARIABLE = "RETRIEVAL_SCHEMA_PREFIX"  # put before every schema name by the assets and the command line

# What a schema is for: the partition's own index, or a scratch index beside it.
ROLES = {
    "index": "{key}",  # the Dagster assets' index
    "cli": "cli_{key}",  # `python -m retrieval_assets index/evaluate/diagnose`
    "whatif": "whatif_{key}",  # diagnose's what-if experiments (re-chunked copies)
    "cranfield": "bench_cranfield_{key}",  # the Cranfield benchmark
}


def _minilm() -> Embedder:
    from retrieval_assets.fastembed_models import MINILM, FastEmbedder
    from retrieval_assets.pypi_models import minilm_model_dir

    return FastEmbedder(MINILM, model_dir=minilm_model_dir())


def _bge_small() -> Embedder:
    from retrieval_assets.fastembed_models import BGE_SMALL, FastEmbedder

    return FastEmbedder(BGE_SMALL)


@dataclass(frozen=True)
class Partition:
    key: str
    make_embedder: Callable[[], Embedder]
    # The full pipeline's measured numbers on the fixture corpus, rounded down to 0.05
    # (fixtures/corpus/README.md); a partition without measured floors has none.
    floors: Mapping[str, float] = field(default_factory=dict)
    needs_hub: bool = False  # its model files come from a model hub or a pre-filled fastembed cache

    def schema(self, role: str = "index", prefix: str = "") -> str:
        return schema_name(self.key, role, prefix)


PARTITIONS: dict[str, Partition] = {
    p.key: p
    for p in (
        Partition("hash", lambda: HashEmbedder(256), {"recall_at_k": 0.85, "mrr": 0.65, "ndcg_at_k": 0.70}),
        Partition("minilm", _minilm, {"recall_at_k": 0.80, "mrr": 0.65, "ndcg_at_k": 0.70}),
        Partition("bge-small", _bge_small, needs_hub=True),
    )
}


def get(key: str) -> Partition:
    """The partition of ``key``; ``ValueError`` naming the known keys otherwise."""
    try:
        return PARTITIONS[key]
    except KeyError:
        raise ValueError(f"unknown embedder '{key}' (known: {', '.join(PARTITIONS)})") from None


def embedder(key: str) -> Embedder:
    """A new embedder of partition ``key``."""
    return get(key).make_embedder()


def env_prefix() -> str:
    """The schema prefix of this process: ``$RETRIEVAL_SCHEMA_PREFIX``, else none."""
    return os.environ.get(PREFIX_VARIABLE, "")


def schema_name(key: str, role: str = "index", prefix: str = "") -> str:
    """``prefix`` + the ``role``'s schema for partition ``key`` (``-`` becomes ``_``): ``hash``, ``cli_bge_small``."""
    get(key)
    if role not in ROLES:
        raise ValueError(f"unknown schema role '{role}' (known: {', '.join(ROLES)})")
    return prefix + ROLES[role].format(key=key.replace("-", "_"))
