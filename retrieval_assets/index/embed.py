"""The embedder protocol and the pinned hashing embedder (seed stage 02).

Contract: an ``Embedder`` has ``dims``, ``name`` and ``embed(texts) -> float32 array of shape
(len(texts), dims)``; one with a query side also has ``embed_query`` (``embed_queries`` picks it). ``HashEmbedder`` follows the seed's recipe exactly and gives the same
vector in every process; a text without tokens gives the zero vector. Model embedders live in
``fastembed_models``; which embedder a partition uses is ``partitions``' decision. The token
cache every HashEmbedder shares is a ``token_table._TokenTable``.

The recipe (pinned: the stored vectors and the golden-set figures depend on it bit for bit):
words are ``re.findall(r"\\w+", text.lower())``; the tokens of a text are its words, each pair of
consecutive words joined by one space, and every character trigram of every word; each token
is hashed with blake2b (8-byte digest, UTF-8 input, read big-endian) to ``h`` and adds +1 at
``h % dims``, -1 instead when the top bit of ``h`` is set; the float32 row is L2-normalised
(left at zero without tokens).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from itertools import chain
from typing import Protocol

import numpy as np

from retrieval_assets.index.token_table import _TokenTable
from retrieval_assets.words import words as _words  # the recipe's words: re.findall(r"\w+", text.lower())


class Embedder(Protocol):
    dims: int
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def embed_queries(embedder: Embedder, queries: Sequence[str]) -> np.ndarray:
    """Search-query vectors: ``embedder.embed_query`` where the model was trained with a query side
    (e5's ``query: `` prefix, ``wheel_models``), else ``embedder.embed``."""
    embed_query = getattr(embedder, "embed_query", None)
    return embed_query(queries) if embed_query is not None else embedder.embed(queries)


_TABLE = _TokenTable(limit=1_000_000)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_TABLE.lock.acquire, after_in_parent=_TABLE.lock.release,
                        after_in_child=_TABLE.lock.release)


def clear_cache() -> None:
    """Empty HashEmbedder's process-wide token cache (the next batches hash every token again)."""
    with _TABLE.lock:
        _TABLE.clear()


def cache_size() -> int:
    """Distinct tokens (words, trigrams, bigrams) in HashEmbedder's process-wide cache."""
    return len(_TABLE)


class HashEmbedder:
    """Signed feature hashing of words, word bigrams and character trigrams (blake2b, 8 bytes).

    Each token adds +1 at ``h % dims`` (-1 when the top bit of ``h`` is set); rows are
    L2-normalised. Every distinct token is hashed once per process, by whichever instance meets
    it first, into a cache all instances share (``_TokenTable``); an embedder holds no state
    but ``dims``. A batch is tokenised in Python (one regex, or for ASCII one translate and
    split, per text) and looked up with one dict step per word; the rest is numpy: trigram rows
    gathered through offsets, bigram rows from pairs of word ids, and one ``np.bincount`` over
    ``text * 2 * dims + signed code``. Long batches go in parts of about ``_PART_CHARS``
    characters, which bounds the temporary arrays.
    """

    _PART_CHARS = 100_000

    def __init__(self, dims: int = 256):
        if dims < 1:
            raise ValueError(f"dims must be positive, got {dims}")
        self.dims = dims
        self.name = f"hash-{dims}"

    def _code(self, token: str) -> int:
        """The signed code of one token, hashed directly (no cache): the recipe for one token."""
        h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
        return h % self.dims + (self.dims if h >> 63 else 0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        vectors = np.empty((len(texts), self.dims), dtype=np.float32)
        start = 0
        while start < len(texts):
            end, chars = start + 1, len(texts[start])
            while end < len(texts) and chars < self._PART_CHARS:
                chars += len(texts[end])
                end += 1
            vectors[start:end] = self._embed_part(texts[start:end])
            start = end
        return vectors

    def _embed_part(self, texts: list[str]) -> np.ndarray:
        width = 2 * self.dims
        per_text = list(map(_words, texts))
        counts = np.fromiter(map(len, per_text), dtype=np.int64, count=len(per_text))
        words = list(chain.from_iterable(per_text))
        with _TABLE.lock:
            flat = _TABLE.token_codes(words, counts, self.dims)
        counts = np.bincount(flat, minlength=len(texts) * width).reshape(len(texts), width)
        vectors = (counts[:, : self.dims] - counts[:, self.dims :]).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors
