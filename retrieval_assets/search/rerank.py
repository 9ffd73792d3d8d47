"""Second stage: BM25 or cross-encoder reranking, then MMR (seed stage 04).

Contract: a ``Reranker`` returns ``Ranked`` best first, ranks from 1, ties in input order, and
``ranks`` holding each chunk's input position. ``blend`` mixes its scores with the first
stage's (``params.rerank_weight``; 1 keeps the reranker's order, the seed's). ``mmr`` reorders
for diversity and keeps the scores it is given. ``pipeline.run`` chains them after fusion.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval_assets.search.fusion import normalise
from retrieval_assets.index.fastembed_models import CROSS_ENCODER, fastembed_cache_dir, load_fastembed_model
from retrieval_assets.params import DEFAULT
from retrieval_assets.types import Chunk, Ranked
from retrieval_assets.words import words



class Reranker(Protocol):
    name: str

    def rerank(self, query: str, chunks: Sequence[Chunk], top_k: int) -> list[Ranked]: ...


def _ranked(chunks: Sequence[Chunk], scores: np.ndarray, top_k: int) -> list[Ranked]:
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [Ranked(chunks[i].chunk_id, float(scores[i]), rank, (int(i) + 1,)) for rank, i in enumerate(order, 1)]


@functools.lru_cache(maxsize=20_000)
def _word_counts(text: str) -> Counter[str]:
    """Lowercase ``\\w+`` word counts of a chunk text (cached: candidates recur across queries; read-only)."""
    return Counter(words(text))


@dataclass(frozen=True)
class CorpusStats:
    """Document frequencies and average length of a whole corpus, in ``\\w+`` lowercase words."""

    n: int
    df: Mapping[str, int]
    avg_len: float

    @classmethod
    def from_texts(cls, texts: Sequence[str]) -> CorpusStats:
        df: Counter[str] = Counter()
        total = 0
        for text in texts:
            found = words(text)
            total += len(found)
            df.update(set(found))
        return cls(len(texts), dict(df), total / len(texts) if texts else 0.0)


class LexicalReranker:
    """BM25 over the candidate set: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), lengths in words.

    With ``corpus``, N, df and the average length come from the whole corpus instead of the
    candidates: a pool retrieved for a query holds its terms everywhere, so pool-local idf
    shrinks exactly the terms that matter.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75, corpus: CorpusStats | None = None):
        self.k1, self.b, self.corpus = k1, b, corpus
        self.name = "bm25" if corpus is None else "bm25-corpus-idf"

    def scores(self, query: str, texts: Sequence[str]) -> np.ndarray:
        terms = list(dict.fromkeys(words(query)))
        if not texts:
            return np.zeros(0)
        if not terms:
            return np.zeros(len(texts))
        counts = [_word_counts(t) for t in texts]
        tf = np.array([[c.get(term, 0) for term in terms] for c in counts], dtype=np.float64)
        lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
        if self.corpus is None:
            n, df, avg = len(texts), (tf > 0).sum(axis=0), lengths.mean() or 1.0
        else:
            n, avg = self.corpus.n, self.corpus.avg_len or 1.0
            df = np.array([self.corpus.df.get(term, 0) for term in terms], dtype=np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        norm = self.k1 * (1 - self.b + self.b * lengths / avg)
        return (idf * tf * (self.k1 + 1) / (tf + norm[:, None])).sum(axis=1)

    def rerank(self, query: str, chunks: Sequence[Chunk], top_k: int) -> list[Ranked]:
        return _ranked(chunks, self.scores(query, [c.text for c in chunks]), top_k)


class CrossEncoderReranker:
    """fastembed's TextCrossEncoder, created on the first non-empty call; scores are logits."""

    def __init__(self, model: str = CROSS_ENCODER, cache_dir: str | os.PathLike | None = None, *, batch_size: int = 32):
        self.model = model
        self.cache_dir = fastembed_cache_dir(cache_dir)
        self.batch_size = batch_size
        self.name = f"cross-encoder:{model}"
        self._encoder = None

    def _load(self):
        if self._encoder is None:
            self._encoder = load_fastembed_model("cross-encoder", self.model, self.cache_dir)
        return self._encoder

    def rerank(self, query: str, chunks: Sequence[Chunk], top_k: int) -> list[Ranked]:
        if not chunks:
            return []
        scores = np.fromiter(self._load().rerank(query, [c.text for c in chunks], batch_size=self.batch_size), dtype=np.float64)
        return _ranked(chunks, scores, top_k)


def competition_ranks(scores: Sequence[float] | np.ndarray) -> np.ndarray:
    """Rank of each score, best (highest) 1, equal scores sharing the best of their ranks: 1 + how many are higher."""
    scores = np.asarray(scores, dtype=np.float64)
    return 1 + np.searchsorted(np.sort(-scores), -scores, side="left")


def blend(reranked: Sequence[Ranked], evidence: Mapping[str, float], weight: float, method: str = "minmax",
          rrf_k: int = DEFAULT.rrf_k) -> list[Ranked]:
    """``reranked`` re-scored with the first stage's ``evidence`` (its fused score by chunk_id), best first, ties in
    fused order. ``minmax``: ``weight * reranker score + (1 - weight) * evidence``, each min-max normalised over the
    pool; ``rrf``: ``weight / (rrf_k + reranker rank) + (1 - weight) / (rrf_k + fused rank)``, equal scores sharing a
    rank (``competition_ranks``), so a reranker that ties leaves the fused order as it was."""
    if weight >= 1 or not reranked:
        return list(reranked)
    own = np.array([r.score for r in reranked], dtype=np.float64)
    first = np.array([evidence[r.chunk_id] for r in reranked], dtype=np.float64)
    if method == "rrf":
        scores = weight / (rrf_k + competition_ranks(own)) + (1 - weight) / (rrf_k + competition_ranks(first))
    elif method == "minmax":
        own, first = normalise(own, "minmax"), normalise(first, "minmax")
        scores = weight * own + (1 - weight) * first
    else:
        raise ValueError(f"unknown rerank fusion '{method}' (known: minmax, rrf)")
    order = np.lexsort((-first, -scores))
    return [Ranked(reranked[i].chunk_id, float(scores[i]), rank, reranked[i].ranks) for rank, i in enumerate(order, 1)]


def _relevance(scores: np.ndarray, query_vec: np.ndarray, unit: np.ndarray) -> np.ndarray:
    if np.all(scores == scores[0]):
        q = query_vec / (np.linalg.norm(query_vec) or 1.0)
        return unit @ q
    if scores.min() >= 0:
        return scores / scores.max()
    return (scores - scores.min()) / (scores.max() - scores.min())


def mmr(query_vec: np.ndarray, candidates: Sequence[Ranked], embeddings: Sequence[np.ndarray] | np.ndarray, *, lam: float = DEFAULT.mmr_lambda, top_k: int) -> list[Ranked]:
    """Greedy maximal marginal relevance: argmax lam * rel - (1 - lam) * max cosine to the picked."""
    if not candidates or top_k < 1:
        return []
    vectors = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    relevance = _relevance(np.array([c.score for c in candidates], dtype=np.float64), np.asarray(query_vec, dtype=np.float64), unit)
    closest = np.zeros(len(candidates))  # max cosine to any picked candidate
    available = np.ones(len(candidates), dtype=bool)
    picked: list[int] = []
    for _ in range(min(top_k, len(candidates))):
        gain = lam * relevance - (1 - lam) * closest if picked else lam * relevance
        i = int(np.argmax(np.where(available, gain, -np.inf)))
        picked.append(i)
        available[i] = False
        closest = np.maximum(closest, unit @ unit[i])
    return [Ranked(candidates[i].chunk_id, candidates[i].score, rank, candidates[i].ranks) for rank, i in enumerate(picked, 1)]
