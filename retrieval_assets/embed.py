"""Embedders: the pinned hashing embedder and fastembed models (seed stages 02 and 08).

Contract: an ``Embedder`` has ``dims``, ``name`` and ``embed(texts) -> float32 array of shape
(len(texts), dims)``. ``HashEmbedder`` follows the seed's recipe exactly and gives the same
vector in every process; a text without tokens gives the zero vector.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

_WORD = re.compile(r"\w+")


class Embedder(Protocol):
    dims: int
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class HashEmbedder:
    """Signed feature hashing of words, word bigrams and character trigrams (blake2b, 8 bytes).

    Each token adds +1 at ``h % dims`` (-1 when the top bit of ``h`` is set); rows are
    L2-normalised. Token hashes are cached as signed codes (``index`` or ``index + dims`` for a
    negative sign) so one ``np.bincount`` per batch does the accumulation.
    """

    _CACHE_LIMIT = 2_000_000

    def __init__(self, dims: int = 256):
        if dims < 1:
            raise ValueError(f"dims must be positive, got {dims}")
        self.dims = dims
        self.name = f"hash-{dims}"
        self._word_codes: dict[str, tuple[int, ...]] = {}
        self._bigram_codes: dict[str, int] = {}

    def _code(self, token: str) -> int:
        h = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "big")
        return h % self.dims + (self.dims if h >> 63 else 0)

    def _codes_of_word(self, word: str) -> tuple[int, ...]:
        codes = self._word_codes.get(word)
        if codes is None:
            if len(self._word_codes) > self._CACHE_LIMIT:
                self._word_codes.clear()
            codes = (self._code(word), *(self._code(word[i : i + 3]) for i in range(len(word) - 2)))
            self._word_codes[word] = codes
        return codes

    def _codes_of_bigram(self, bigram: str) -> int:
        code = self._bigram_codes.get(bigram)
        if code is None:
            if len(self._bigram_codes) > self._CACHE_LIMIT:
                self._bigram_codes.clear()
            code = self._bigram_codes[bigram] = self._code(bigram)
        return code

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        width = 2 * self.dims
        codes: list[int] = []
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            offset = row * width
            start = len(codes)
            for word in words:
                codes.extend(self._codes_of_word(word))
            codes.extend(self._codes_of_bigram(f"{a} {b}") for a, b in zip(words, words[1:]))
            if offset:
                codes[start:] = [c + offset for c in codes[start:]]
        counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=len(texts) * width)
        counts = counts.reshape(len(texts), width)
        vectors = (counts[:, : self.dims] - counts[:, self.dims :]).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors


EMBEDDERS = {
    "hash": lambda: HashEmbedder(256),
}


def get_embedder(key: str) -> Embedder:
    """The embedder of a partition key (``hash``, ``minilm``, ``bge-small``)."""
    try:
        return EMBEDDERS[key]()
    except KeyError:
        raise ValueError(f"unknown embedder '{key}' (known: {', '.join(sorted(EMBEDDERS))})") from None


def schema_for(key: str) -> str:
    """The Postgres schema that holds a partition's chunk table."""
    return key.replace("-", "_")
