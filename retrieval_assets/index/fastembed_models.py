"""fastembed models: the embedders of the ``minilm`` and ``bge-small`` partitions and the loader
that the cross-encoder shares (seed stage 08).

Contract: ``FastEmbedder`` and ``rerank.CrossEncoderReranker`` run fastembed's own loading code,
imported on first use only. ``load_fastembed_model`` looks in fastembed's cache first and fails
at once, with a ``ModelUnavailableError`` that says how to provide the files, when the model is
neither cached nor downloadable; a local model folder (``pypi_models``) needs no hub.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BGE_SMALL = "BAAI/bge-small-en-v1.5"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
CROSS_ENCODER = "Xenova/ms-marco-MiniLM-L-6-v2"

# Output widths of the embedding models we use, known without importing fastembed.
FASTEMBED_DIMS = {BGE_SMALL: 384, MINILM: 384}


class ModelUnavailableError(RuntimeError):
    """A model's files are neither on this machine nor downloadable; the message says how to provide them."""


def fastembed_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$FASTEMBED_CACHE_PATH``, else ``~/.cache/fastembed``.

    fastembed's own default is a directory under the system's temp dir, which may be cleared.
    """
    return Path(cache_dir or os.environ.get("FASTEMBED_CACHE_PATH") or Path.home() / ".cache" / "fastembed")


_FASTEMBED_CLASSES = {
    "embedding": ("fastembed", "TextEmbedding"),
    "cross-encoder": ("fastembed.rerank.cross_encoder", "TextCrossEncoder"),
}


def _hf_offline() -> bool:
    """HF_HUB_OFFLINE as fastembed reads it (it then loads from its cache only)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "TRUE", "YES", "ON"}


def _is_missing_files(exc: BaseException) -> bool:
    """fastembed's download_model gives up with ``ValueError("Could not load model X from any source.")``."""
    return isinstance(exc, ValueError) and "from any source" in str(exc)


def _hub_unreachable(timeout: float = 3.0) -> str | None:
    """``None`` when the model hub answers an HTTP request, else why it does not.

    fastembed retries a failed download three times and sleeps 3 + 9 + 27 s in between (39 s
    here, measured), so we ask once, with a short timeout, before handing it the download.
    ``requests`` honours the proxy variables, as huggingface_hub does.
    """
    import requests
    from huggingface_hub import constants

    try:
        requests.head(constants.ENDPOINT, timeout=timeout, allow_redirects=False)
    except requests.RequestException as exc:
        return f"{constants.ENDPOINT} did not answer ({type(exc).__name__})"
    return None


def _unavailable(kind: str, model: str, cache_dir: Path, why: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"fastembed {kind} model {model} is not available: its files are not in the fastembed cache "
        f"{cache_dir} and {why}. Provide them by setting FASTEMBED_CACHE_PATH to a directory "
        f"pre-filled with fastembed's cache for {model} (copy one from a machine that has loaded it), "
        f"or run once with network access to the model hub so fastembed downloads it into {cache_dir}."
    )


def unavailable_reason(model: str, cache_dir: str | os.PathLike | None = None) -> str | None:
    """``None`` when ``model`` can load here (an ``.onnx`` file of it in the fastembed cache, or
    the model hub answers), else the ``ModelUnavailableError`` message: a quick check, nothing loaded."""
    cache = fastembed_cache_dir(cache_dir)
    stem = model.rsplit("/", 1)[-1].lower()
    if cache.is_dir() and any(next(d.rglob("*.onnx"), None) for d in cache.iterdir() if d.is_dir() and stem in d.name.lower()):
        return None
    why = "HF_HUB_OFFLINE is set, so the model hub is not asked" if _hf_offline() else None
    why = why or (f"the model hub cannot be reached: {r}" if (r := _hub_unreachable()) else None)
    return None if why is None else str(_unavailable("embedding", model, cache, why))


@contextlib.contextmanager
def _quiet_fastembed_logs():
    """Silence fastembed's ERROR logs of a cache miss: we try the cache first, and a miss we
    cannot recover from becomes our own, clearer, error."""
    try:
        from loguru import logger
    except ImportError:  # pragma: no cover - fastembed depends on loguru
        yield
        return
    logger.disable("fastembed")
    try:
        yield
    finally:
        logger.enable("fastembed")


def _cap_length(model: Any, max_length: int) -> None:
    """Truncate the model's inputs at ``max_length`` tokens (never above the model's own limit).

    fastembed's ``load_tokenizer`` calls ``tokenizer.enable_truncation`` with the
    tokenizer_config's ``model_max_length`` (512 for MiniLM and bge-small) and pads every batch
    to its longest member, so one long text makes the whole batch 512 wide. We narrow that same
    setting on the loaded ``tokenizers.Tokenizer``, keeping stride, strategy and direction.
    """
    inner = getattr(model, "model", model)
    if getattr(inner, "tokenizer", None) is None and hasattr(inner, "_ensure_tokenizer"):
        inner._ensure_tokenizer()
    tokenizer = getattr(inner, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "enable_truncation"):
        raise RuntimeError(f"cannot cap the sequence length of {type(inner).__name__}: no tokenizer found")
    current = tokenizer.truncation or {}
    tokenizer.enable_truncation(
        max_length=min(max_length, current.get("max_length") or max_length),
        stride=current.get("stride", 0),
        strategy=current.get("strategy", "longest_first"),
        direction=current.get("direction", "right"),
    )


def load_fastembed_model(kind: str, model: str, cache_dir: str | os.PathLike | None, **kwargs: Any) -> Any:
    """A fastembed ``TextEmbedding`` (kind ``embedding``) or ``TextCrossEncoder`` (``cross-encoder``).

    ``kwargs`` go to the fastembed class (``threads`` defaults to ``os.cpu_count()``;
    ``specific_model_path`` loads a local model folder), except ``max_length``, which caps the
    tokenizer's truncation length after loading. Without ``specific_model_path`` the cache is
    tried first (no network at all when the model is there); on a miss the model hub is probed
    once and the download handed to fastembed only when the hub answers. With HF_HUB_OFFLINE set
    only the cache is used. Missing files raise ``ModelUnavailableError`` naming the model and
    how to provide it, within a few seconds.
    """
    try:
        module_name, class_name = _FASTEMBED_CLASSES[kind]
    except KeyError:
        raise ValueError(f"unknown fastembed model kind {kind!r} (known: {', '.join(_FASTEMBED_CLASSES)})") from None
    max_length = kwargs.pop("max_length", None)
    kwargs.setdefault("threads", os.cpu_count())
    cache = fastembed_cache_dir(cache_dir)
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except ImportError as exc:
        raise ModelUnavailableError(f"fastembed is needed for {model} but is not installed ({exc}): run `uv sync --extra models`") from exc

    def make(**extra: Any) -> Any:
        return cls(model_name=model, cache_dir=str(cache), **{**kwargs, **extra})

    model_dir = kwargs.get("specific_model_path")
    if model_dir:
        try:
            loaded = make()
        except Exception as exc:
            raise ModelUnavailableError(f"fastembed {kind} model {model} could not be loaded from {model_dir}: {exc}") from exc
    elif kwargs.get("local_files_only") or _hf_offline():
        try:
            with _quiet_fastembed_logs():
                loaded = make()
        except ValueError as exc:
            if not _is_missing_files(exc):
                raise
            why = "HF_HUB_OFFLINE is set" if _hf_offline() else "local_files_only is set"
            raise _unavailable(kind, model, cache, f"{why}, so the model hub is not asked") from exc
    else:
        try:
            with _quiet_fastembed_logs():
                loaded = make(local_files_only=True)
        except ValueError as exc:
            if not _is_missing_files(exc):
                raise
            reason = _hub_unreachable()
            if reason is not None:
                raise _unavailable(kind, model, cache, f"the model hub cannot be reached: {reason}") from exc
            try:
                loaded = make()
            except ValueError as exc2:
                if not _is_missing_files(exc2):
                    raise
                raise _unavailable(kind, model, cache, "the download from the model hub failed") from exc2
    if max_length:
        _cap_length(loaded, max_length)
    return loaded


class FastEmbedder:
    """A fastembed ``TextEmbedding``, created on the first non-empty ``embed`` call.

    ``batch_size`` is always passed (fastembed's default of 256 needs many GB for long texts)
    and inputs are truncated at ``max_length`` tokens (MiniLM was trained at 256). With texts in
    order of length the batch size barely matters on these 2 cores (the fixture's chunks with the
    int8 MiniLM: 18.3 to 18.9 s in batches of 2 to 16, benchmarks/guards/bench_minilm_batches.py);
    the default of 4 keeps a batch's padded inputs and activations a quarter of those at 16.
    ``model_dir`` is a local model folder handed to fastembed as ``specific_model_path``.
    """

    def __init__(
        self,
        model: str = BGE_SMALL,
        cache_dir: str | os.PathLike | None = None,
        *,
        batch_size: int = 4,
        max_length: int = 256,
        threads: int | None = None,
        model_dir: str | os.PathLike | None = None,
    ):
        if model not in FASTEMBED_DIMS:
            raise ValueError(f"unknown fastembed model '{model}' (known: {', '.join(sorted(FASTEMBED_DIMS))})")
        for option, value in (("batch_size", batch_size), ("max_length", max_length), ("threads", threads)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{option} must be a positive integer, got {value!r}")
        self.model = model
        self.dims = FASTEMBED_DIMS[model]
        self.name = f"fastembed:{model}"
        self.cache_dir = fastembed_cache_dir(cache_dir)
        self.batch_size = batch_size
        self.max_length = max_length
        self.threads = threads or os.cpu_count() or 1
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self._model: Any = None

    def _load(self) -> Any:
        if self._model is None:
            kwargs: dict[str, Any] = {"threads": self.threads, "max_length": self.max_length}
            if self.model_dir is not None:
                kwargs["specific_model_path"] = str(self.model_dir)
            self._model = load_fastembed_model("embedding", self.model, self.cache_dir, **kwargs)
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        # a batch is padded to its longest text: texts in order of length waste less (fixture chunks with
        # MiniLM: 22.9 -> 18.9 s in batches of 16, the same vectors); the rows go back to the caller's order
        order = np.argsort([len(t) for t in texts], kind="stable")
        rows = np.asarray(list(self._load().embed([texts[i] for i in order], batch_size=self.batch_size)), dtype=np.float32)
        if rows.shape != (len(texts), self.dims):
            raise RuntimeError(f"{self.name} returned shape {rows.shape} for {len(texts)} texts, expected (n, {self.dims})")
        vectors = np.empty_like(rows)
        vectors[order] = rows
        return vectors
