"""Stage 02: the pinned hashing recipe."""

import hashlib
import itertools
import multiprocessing
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.guards.bench_embed import PreviousHashEmbedder  # the implementation before the vectorised one, kept verbatim
from retrieval_assets.index import chunker, embed, token_table
from retrieval_assets.index.embed import HashEmbedder


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
    code = "from retrieval_assets.index.embed import HashEmbedder; import sys; sys.stdout.buffer.write(HashEmbedder().embed(['hybrid search over Postgres']).tobytes())"
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


# The vectorised embedder (issue 18) against the implementation it replaced, kept here verbatim
# (per-instance caches, one Python step per token): vectors must be bit-identical, not close.

_WORD = re.compile(r"\w+")


CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "corpus"
EDGE_CASES = [
    "", "!!! ???", " \n\t\r\x0b\x0c\x1c ", "x", "ab", "abc", "aaaa", "a b", "the the the the", "_ __ a_b 9_9",
    "ΣΊΣΥΦΟΣ ΟΔΟΣ σοφός ς", "İstanbul ǅemal ß ẞ ﬁ ﬀ Å", "①②③ ²³ ٣٤٥ ০১২ Ⅻ", "emoji 😀🎉 e\u0301 cafe\u0301",
    "\x00nul\x00byte", "日本語のテキスト 中文 한국어", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 \U0010fffd", "x" * 5000,
    ("supercalifragilistic" * 50 + " ") * 3, " ".join(["word"] * 2000), "b " * 10000, "Mixed ASCII and ümlaut",
]


def _texts() -> dict[str, list[str]]:
    documents = chunker.load_documents(CORPUS)
    return {
        "chunks": [c.text for d in documents for c in chunker.chunk(d)],
        "windows": [d.text[i : i + 1000] for d in documents for i in range(0, len(d.text), 1000)],
        "edge": EDGE_CASES,
    }


def assert_bit_identical(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want) and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("dims", [1, 8, 64, 256, 384])
def test_bit_identical_to_the_previous_implementation(dims):
    embed.clear_cache()
    for name, texts in _texts().items():
        want = PreviousHashEmbedder(dims).embed(texts)
        assert_bit_identical(HashEmbedder(dims).embed(texts), want)  # cold: every token new
        assert_bit_identical(HashEmbedder(dims).embed(texts), want)  # warm, another instance
        for batch in (1, 7, 64):
            parts = [HashEmbedder(dims).embed(texts[i : i + batch]) for i in range(0, len(texts), batch)]
            assert_bit_identical(np.concatenate(parts), want)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(max_size=200) | st.text(alphabet="ab c\nÄß_9-", max_size=60), max_size=8),
       dims=st.sampled_from([2, 8, 64, 256]), clear=st.booleans())
def test_bit_identical_on_random_text(texts, dims, clear):
    if clear:
        embed.clear_cache()
    assert_bit_identical(HashEmbedder(dims).embed(texts), PreviousHashEmbedder(dims).embed(texts))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(max_codepoint=127), max_size=200) | st.text(max_size=100))
def test_words_are_the_recipes_findall(text):
    assert embed._words(text) == re.findall(r"\w+", text.lower())


def test_every_ascii_character_tokenises_as_the_regex():
    text = "".join(chr(c) + " x" + chr(c) + "y" for c in range(128))
    assert embed._words(text) == re.findall(r"\w+", text.lower())


def test_batches_of_any_size():
    texts = _texts()["windows"]
    many = [t for t, _ in zip(itertools.cycle(texts), range(10_000))]
    for dims in (8, 256):
        empty = HashEmbedder(dims).embed([])
        assert empty.shape == (0, dims) and empty.dtype == np.float32
        assert_bit_identical(HashEmbedder(dims).embed(many[:1]), PreviousHashEmbedder(dims).embed(many[:1]))
    embed.clear_cache()
    assert_bit_identical(HashEmbedder().embed(tuple(many)), PreviousHashEmbedder().embed(many))


def test_long_batches_go_in_parts(monkeypatch):
    texts = _texts()["chunks"]
    want = PreviousHashEmbedder().embed(texts)
    monkeypatch.setattr(HashEmbedder, "_PART_CHARS", 3_000)  # a few texts per part; one text longer than a part
    assert_bit_identical(HashEmbedder().embed(texts), want)
    assert_bit_identical(HashEmbedder().embed(["y" * 10_000, *texts[:5]]), PreviousHashEmbedder().embed(["y" * 10_000, *texts[:5]]))


def test_cache_is_shared_across_instances_and_dims():
    texts = _texts()["chunks"]
    embed.clear_cache()
    assert embed.cache_size() == 0
    HashEmbedder(64).embed(texts)
    filled = embed.cache_size()
    words = [re.findall(r"\w+", t.lower()) for t in texts]
    distinct = {w for ws in words for w in ws}
    trigrams = {w[i : i + 3] for w in distinct for i in range(len(w) - 2)}
    bigrams = {f"{a} {b}" for ws in words for a, b in zip(ws, ws[1:])}
    assert filled == len(distinct) + len(trigrams) + len(bigrams)  # each hashed once (a 3-letter word as word and trigram)
    for dims in (64, 8, 256):  # a new instance of any dims finds every token: nothing is hashed again
        assert_bit_identical(HashEmbedder(dims).embed(texts), PreviousHashEmbedder(dims).embed(texts))
        assert embed.cache_size() == filled
    assert HashEmbedder(8).embed(["an unseen zyzzyva"]).shape == (1, 8) and embed.cache_size() > filled


def test_cache_is_bounded(monkeypatch):
    texts = _texts()["chunks"]
    want = PreviousHashEmbedder().embed(texts)
    embed.clear_cache()
    monkeypatch.setattr(embed._TABLE, "limit", 5_000)
    got, peak = [], 0
    for i in range(0, len(texts), 16):
        got.append(HashEmbedder().embed(texts[i : i + 16]))
        peak = max(peak, embed.cache_size())
    assert_bit_identical(np.concatenate(got), want)
    # reset once past the limit, so it holds at most the limit plus one batch's new tokens
    assert 5_000 < peak < 5_000 + 16 * 1_000 and embed.cache_size() < 20_000


def test_threads_share_the_cache():
    sets = _texts()
    jobs = [(dims, texts[i : i + 23]) for dims in (8, 256, 64) for texts in sets.values() for i in range(0, len(texts), 23)]
    want = [PreviousHashEmbedder(dims).embed(texts) for dims, texts in jobs]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, inside the cache's updates too
    try:
        for _ in range(3):
            embed.clear_cache()
            with ThreadPoolExecutor(8) as pool:
                got = list(pool.map(lambda job: HashEmbedder(job[0]).embed(job[1]), jobs))
            for g, w in zip(got, want):
                assert_bit_identical(g, w)
    finally:
        sys.setswitchinterval(interval)


def _embed_in_child(conn, texts):
    conn.send(HashEmbedder().embed(texts).tobytes())
    conn.close()


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_fork_while_another_thread_embeds():
    texts = _texts()["chunks"]
    want = PreviousHashEmbedder().embed(texts).tobytes()
    embed.clear_cache()
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            embed.clear_cache()
            HashEmbedder().embed(texts[:50])

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        context = multiprocessing.get_context("fork")
        for _ in range(3):
            parent, child = context.Pipe(duplex=False)
            process = context.Process(target=_embed_in_child, args=(child, texts))
            process.start()
            child.close()
            assert parent.poll(60), "the forked child did not answer"
            assert parent.recv() == want
            process.join(10)
            assert process.exitcode == 0
    finally:
        stop.set()
        worker.join()


def test_int_map_against_a_dict():
    rng = np.random.default_rng(0)
    table, reference = token_table._IntMap(bits=4), {}
    for size in (1, 5, 100, 3_000, 20_000):
        # keys crowding the low bits, as word-id pairs do, plus random ones
        keys = np.unique(np.concatenate([rng.integers(0, 50, size) << 32 | rng.integers(0, 50, size),
                                         rng.integers(0, 2**62, size)]))
        new = np.array([k for k in keys.tolist() if k not in reference], dtype=np.int64)
        values = rng.integers(0, 2**40, len(new))
        table.put(new, values)
        reference.update(zip(new.tolist(), values.tolist()))
        probe = np.concatenate([keys, rng.integers(0, 2**62, 500)])
        expected = [reference.get(k, -1) for k in probe.tolist()]
        assert table.get(probe).tolist() == expected
        assert table.size == len(reference) and 2 * table.size <= len(table.keys)
