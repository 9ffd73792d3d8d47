"""The partition registry (one rule from key to schema name) and the validated retrieval parameters."""

from __future__ import annotations

import re

import pytest

from retrieval_assets import partitions
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.params import DEFAULT, EF_SEARCH_MAX, LEXICAL, PIPELINES, SEED, RetrievalParams, named

# An unquoted Postgres identifier: starts with a lowercase letter or _, then letters, digits, _; at most 63 bytes.
IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}")


# --- partitions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(partitions.PARTITIONS))
@pytest.mark.parametrize("role", sorted(partitions.ROLES))
def test_every_partition_gives_a_valid_schema_name(key, role):
    for prefix in ("", "t_prefix_"):
        name = partitions.schema_name(key, role, prefix)
        assert IDENTIFIER.fullmatch(name), name
        assert name.startswith(prefix)
        assert partitions.PARTITIONS[key].schema(role, prefix) == name
    assert partitions.PARTITIONS[key].key == key


def test_known_schema_names():
    assert partitions.schema_name("hash") == "hash"
    assert partitions.schema_name("hash", "cli") == "cli_hash"
    assert partitions.schema_name("hash", "whatif") == "whatif_hash"
    assert partitions.schema_name("hash", "cranfield") == "bench_cranfield_hash"
    assert partitions.schema_name("bge-small", "cli", "t_x_") == "t_x_cli_bge_small"
    assert partitions.HISTORY == "retrieval_history"


def test_unknown_key_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown embedder 'nope'") as info:
        partitions.schema_name("nope")
    for key in partitions.PARTITIONS:
        assert key in str(info.value)
    with pytest.raises(ValueError, match="unknown embedder"):
        partitions.get("nope")


def test_unknown_role_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown schema role 'scratch'") as info:
        partitions.schema_name("hash", "scratch")
    for role in ("index", "cli", "whatif", "cranfield"):
        assert role in str(info.value)


@pytest.mark.parametrize("key", sorted(partitions.PARTITIONS))
def test_roles_give_distinct_names(key):
    names = [partitions.schema_name(key, role) for role in partitions.ROLES]
    assert len(set(names)) == len(names) == len(partitions.ROLES) >= 4


def test_schema_names_are_distinct_across_partitions():
    names = [partitions.schema_name(key, role) for key in partitions.PARTITIONS for role in partitions.ROLES]
    assert len(set(names)) == len(names)
    assert partitions.HISTORY not in names


def test_hash_partition_embedder():
    e = partitions.embedder("hash")
    assert isinstance(e, HashEmbedder) and e.dims == 256 and e.name == "hash-256"
    assert e.embed(["a query"]).shape == (1, 256)
    assert partitions.embedder("hash") is not e  # a new embedder each time
    assert not partitions.get("hash").needs_hub and partitions.get("hash").floors


# --- retrieval parameters ------------------------------------------------------------------------


def test_retrieval_params_defaults():
    p = RetrievalParams()
    assert (p.k, p.n, p.rrf_k, p.weights, p.lexical, p.mmr_lambda) == (10, 50, 60, (1.0, 1.0), "ts_rank_cd", 0.7)
    assert p.rerank is True and p.ef_search is None
    assert SEED == p and LEXICAL == ("ts_rank_cd", "bm25")
    # the product default: the cross-validated pipeline (benchmarks/results/quality.md)
    assert (DEFAULT.lexical, DEFAULT.fusion, DEFAULT.weights, DEFAULT.mmr_lambda) == ("bm25", "zscore", (0.4, 0.6), None)
    assert (DEFAULT.rerank, DEFAULT.rerank_weight, DEFAULT.rerank_idf, DEFAULT.k, DEFAULT.n) == (True, 0.4, "corpus", 10, 50)
    assert PIPELINES == ("default", "seed") and (named("default"), named("seed")) == (DEFAULT, SEED)
    assert RetrievalParams(weights=[1, 0]).weights == (1.0, 0.0)  # stored as a tuple of floats
    assert RetrievalParams(mmr_lambda=None).mmr_lambda is None
    assert RetrievalParams(ef_search=EF_SEARCH_MAX).ef_search == EF_SEARCH_MAX


def test_retrieval_params_are_frozen_and_with_validates():
    with pytest.raises(AttributeError):
        DEFAULT.k = 5  # type: ignore[misc]
    changed = DEFAULT.with_(k=5, lexical="bm25")
    assert (changed.k, changed.lexical, changed.n) == (5, "bm25", 50) and DEFAULT.k == 10
    with pytest.raises(ValueError, match="k must be"):
        DEFAULT.with_(k=0)
    with pytest.raises(ValueError, match="unknown retrieval parameter.*top_k"):
        DEFAULT.with_(top_k=5)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"k": 0}, "k"),
        ({"k": 20, "n": 10}, "n"),
        ({"n": 5}, "n"),
        ({"weights": (1.0, 1.0, 1.0)}, "weights"),
        ({"weights": (1.0, -0.5)}, "weights"),
        ({"weights": (1.5, 1.0)}, "weights"),
        ({"weights": (0, 0)}, "weights"),
        ({"lexical": "x"}, "lexical"),
        ({"fusion": "sum"}, "fusion"),
        ({"rerank_weight": 1.2}, "rerank_weight"),
        ({"rerank_weight": -0.1}, "rerank_weight"),
        ({"mmr_lambda": 1.5}, "mmr_lambda"),
        ({"ef_search": 0}, "ef_search"),
    ],
)
def test_bad_retrieval_params_name_the_field(changes, field):
    with pytest.raises(ValueError) as info:
        RetrievalParams(**changes)
    assert re.match(rf"{field}\b", str(info.value)), str(info.value)
    value = changes[field]
    assert repr(tuple(value) if isinstance(value, tuple) else value) in str(info.value) or repr(value) in str(info.value)
