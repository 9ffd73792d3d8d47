"""Second stage: BM25 or cross-encoder reranking, then MMR (seed stage 04).

Contract: a ``Reranker`` returns ``Ranked`` best first, ranks from 1, ties in input order, and
``ranks`` holding each chunk's input position. ``mmr`` reorders for diversity and keeps the
reranker's scores. ``pipeline`` = fused top ``n`` -> rerank all of it -> first ``top_k`` of MMR;
``trace`` returns every intermediate list of that pipeline for evaluation and diagnosis.
"""

from __future__ import annotations

import functools
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import psycopg

from retrieval_assets import hybrid
from retrieval_assets.embed import Embedder, fastembed_cache_dir
from retrieval_assets.types import Chunk, Hit, Ranked

_WORD = re.compile(r"\w+")


class Reranker(Protocol):
    name: str

    def rerank(self, query: str, chunks: Sequence[Chunk], top_k: int) -> list[Ranked]: ...


def _ranked(chunks: Sequence[Chunk], scores: np.ndarray, top_k: int) -> list[Ranked]:
    order = np.argsort(-scores, kind="stable")[:top_k]
    return [Ranked(chunks[i].chunk_id, float(scores[i]), rank, (int(i) + 1,)) for rank, i in enumerate(order, 1)]


@functools.lru_cache(maxsize=20_000)
def _word_counts(text: str) -> Counter[str]:
    """Lowercase ``\\w+`` word counts of a chunk text (cached: candidates recur across queries; read-only)."""
    return Counter(_WORD.findall(text.lower()))


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
            words = _WORD.findall(text.lower())
            total += len(words)
            df.update(set(words))
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
        terms = list(dict.fromkeys(_WORD.findall(query.lower())))
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

    def __init__(self, model: str = "Xenova/ms-marco-MiniLM-L-6-v2", cache_dir: str | os.PathLike | None = None, *, batch_size: int = 32):
        self.model = model
        self.cache_dir = fastembed_cache_dir(cache_dir)
        self.batch_size = batch_size
        self.name = f"cross-encoder:{model}"
        self._encoder = None

    def _load(self):
        if self._encoder is None:
            from retrieval_assets.embed import load_fastembed_model

            self._encoder = load_fastembed_model("cross-encoder", self.model, self.cache_dir)
        return self._encoder

    def rerank(self, query: str, chunks: Sequence[Chunk], top_k: int) -> list[Ranked]:
        if not chunks:
            return []
        scores = np.fromiter(self._load().rerank(query, [c.text for c in chunks], batch_size=self.batch_size), dtype=np.float64)
        return _ranked(chunks, scores, top_k)


def _relevance(scores: np.ndarray, query_vec: np.ndarray, unit: np.ndarray) -> np.ndarray:
    if np.all(scores == scores[0]):
        q = query_vec / (np.linalg.norm(query_vec) or 1.0)
        return unit @ q
    if scores.min() >= 0:
        return scores / scores.max()
    return (scores - scores.min()) / (scores.max() - scores.min())


def mmr(query_vec: np.ndarray, candidates: Sequence[Ranked], embeddings: Sequence[np.ndarray] | np.ndarray, *, lam: float = 0.7, top_k: int) -> list[Ranked]:
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


def fetch(conn: psycopg.Connection, chunk_ids: Sequence[str]) -> dict[str, tuple[Chunk, np.ndarray]]:
    """``{chunk_id: (Chunk, embedding)}`` for the ids present in the table."""
    rows = conn.cursor(binary=True).execute(  # binary: vectors arrive as float32 bytes, not text to parse
        """SELECT chunk_id, doc_id, heading_path, start_char, end_char, text, embedding
           FROM chunks WHERE chunk_id = ANY(%s)""",
        (list(chunk_ids),),
    ).fetchall()
    return {r[0]: (Chunk(*r[:6]), r[6].to_numpy()) for r in rows}


@dataclass(frozen=True)
class Trace:
    """Every list one query passes through: the two first-stage lists, fusion, rerank, MMR."""

    vector: list[Hit]
    text: list[Hit]
    fused: list[Ranked]
    reranked: list[Ranked]
    final: list[Ranked]


def trace(
    conn: psycopg.Connection,
    embedder: Embedder,
    reranker: Reranker | None,
    query: str,
    *,
    n: int = 50,
    top_k: int = 10,
    mmr_lambda: float | None = 0.7,
    weights: tuple[float, float] | None = None,
    lexical: str = "ts_rank_cd",
    first_stage: tuple[list[Hit], list[Hit]] | None = None,
) -> Trace:
    """Run the pipeline for one query and keep the intermediate lists (``weights``: vector, lexical).

    ``first_stage`` = (vector, lexical) lists of an earlier trace of the same query and ``n``, to
    re-run fusion and the second stage alone (what-if experiments on the fusion weights).
    """
    if first_stage is None:
        vector, text = hybrid.vector_search(conn, embedder, query, n), hybrid.lexical_search(conn, query, n, lexical)
    else:
        vector, text = first_stage
    fused = hybrid.rrf([vector, text], weights=weights)[:n]
    if reranker is None or not fused:
        return Trace(vector, text, fused, fused, fused[:top_k])
    rows = fetch(conn, [r.chunk_id for r in fused])
    pool = [r for r in fused if r.chunk_id in rows]
    reranked = reranker.rerank(query, [rows[r.chunk_id][0] for r in pool], len(pool))
    if mmr_lambda is None:
        return Trace(vector, text, fused, reranked, reranked[:top_k])
    final = mmr(embedder.embed([query])[0], reranked, [rows[r.chunk_id][1] for r in reranked], lam=mmr_lambda, top_k=top_k)
    return Trace(vector, text, fused, reranked, final)


def pipeline(
    conn: psycopg.Connection,
    embedder: Embedder,
    reranker: Reranker,
    query: str,
    *,
    n: int = 50,
    top_k: int = 10,
    mmr_lambda: float = 0.7,
) -> list[Ranked]:
    """Fused top ``n``, reranked in full, then the first ``top_k`` of MMR."""
    return trace(conn, embedder, reranker, query, n=n, top_k=top_k, mmr_lambda=mmr_lambda).final
