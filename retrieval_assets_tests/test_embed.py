"""Stage 02: the pinned hashing recipe."""

import hashlib
import os
import re
import subprocess
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from retrieval_assets.embed import HashEmbedder


def reference_hash_embed(text: str, dims: int = 256) -> np.ndarray:
    """The seed's recipe written out token by token, independently of the module."""
    words = re.findall(r"\w+", text.lower())
    tokens = list(words)
    tokens += [f"{a} {b}" for a, b in zip(words, words[1:])]
    tokens += [w[i : i + 3] for w in words for i in range(len(w) - 2)]
    v = np.zeros(dims, dtype=np.float32)
    for t in tokens:
        h = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
        v[h % dims] += -1.0 if h >> 63 else 1.0
    n = np.linalg.norm(v)
    return v / n if n else v


SAMPLES = [
    "Reciprocal rank fusion merges ranked lists.",
    "HNSW: ef_search=40, m=16 — Größe ÜBER alles; 日本語 テキスト",
    "a b",
    "x",
    "",
    "!!! ???",
    "the the the the",
]


def test_matches_independent_reference():
    e = HashEmbedder()
    got = e.embed(SAMPLES)
    assert got.dtype == np.float32 and got.shape == (len(SAMPLES), 256)
    for text, row in zip(SAMPLES, got):
        np.testing.assert_allclose(row, reference_hash_embed(text), rtol=0, atol=1e-7)


@settings(max_examples=100, deadline=None)
@given(texts=st.lists(st.text(max_size=300), max_size=5), dims=st.sampled_from([8, 64, 256]))
def test_matches_reference_on_random_text(texts, dims):
    got = HashEmbedder(dims).embed(texts)
    assert got.shape == (len(texts), dims)
    for text, row in zip(texts, got):
        np.testing.assert_allclose(row, reference_hash_embed(text, dims), rtol=0, atol=1e-6)


def test_unit_norm_and_zero_vector_without_tokens():
    got = HashEmbedder().embed(SAMPLES)
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms[[0, 1, 2, 3, 6]], 1.0, atol=1e-6)
    assert norms[4] == 0 and norms[5] == 0
    assert HashEmbedder().embed([]).shape == (0, 256)


def test_same_vector_across_processes_with_different_hash_seeds():
    code = "from retrieval_assets.embed import HashEmbedder; import sys; sys.stdout.buffer.write(HashEmbedder().embed(['hybrid search over Postgres']).tobytes())"
    outputs = set()
    for seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outputs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, check=True).stdout)
    assert len(outputs) == 1
    assert np.frombuffer(outputs.pop(), dtype=np.float32).tobytes() == HashEmbedder().embed(["hybrid search over Postgres"]).tobytes()


def test_cache_does_not_change_results():
    e = HashEmbedder()
    first = e.embed(SAMPLES)
    second = e.embed(list(reversed(SAMPLES)))[::-1]
    np.testing.assert_array_equal(first, second)
