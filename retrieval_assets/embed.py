"""The embedder protocol and the pinned hashing embedder (seed stage 02).

Contract: an ``Embedder`` has ``dims``, ``name`` and ``embed(texts) -> float32 array of shape
(len(texts), dims)``. ``HashEmbedder`` follows the seed's recipe exactly and gives the same
vector in every process; a text without tokens gives the zero vector. Model embedders live in
``fastembed_models``; which embedder a partition uses is ``partitions``' decision.
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
        word_codes, bigram_codes = self._word_codes, self._bigram_codes
        codes: list[int] = []
        lengths: list[int] = []
        for text in texts:
            words = _WORD.findall(text.lower())
            start = len(codes)
            for word in words:
                found = word_codes.get(word)
                codes.extend(found if found is not None else self._codes_of_word(word))
            for bigram in map(" ".join, zip(words, words[1:])):
                found = bigram_codes.get(bigram)
                codes.append(found if found is not None else self._codes_of_bigram(bigram))
            lengths.append(len(codes) - start)
        rows = np.repeat(np.arange(len(texts), dtype=np.int64) * width, lengths)
        codes = np.asarray(codes, dtype=np.int64) + rows
        counts = np.bincount(codes, minlength=len(texts) * width)
        counts = counts.reshape(len(texts), width)
        vectors = (counts[:, : self.dims] - counts[:, self.dims :]).astype(np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors
