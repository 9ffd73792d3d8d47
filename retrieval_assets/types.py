"""Frozen value types shared by every pipeline module, and ``as_hits``, the rows of a search as ``Hit``s."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    heading_path: str
    start_char: int
    end_char: int
    text: str


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    score: float
    rank: int


def as_hits(rows) -> list[Hit]:
    """``(chunk_id, score)`` rows, best first, as ranked ``Hit``s (ranks from 1)."""
    return [Hit(chunk_id, float(score), rank) for rank, (chunk_id, score) in enumerate(rows, 1)]


class ScoredList(list):
    """A lexical list (``Hit``s, best first) with ``ceiling``: the score of a chunk of average length holding every positive
    query term once (BM25: the terms' idf sum over 1 + k1), the scale ``fusion.lexical_evidence`` reads its top score on."""

    def __init__(self, hits=(), ceiling: float = 0.0):
        super().__init__(hits)
        self.ceiling = float(ceiling)


@dataclass(frozen=True)
class Ranked:
    chunk_id: str
    score: float
    rank: int
    ranks: tuple[int | None, ...]


@dataclass(frozen=True)
class GoldenQuery:
    query_id: str
    kind: str  # factual | conceptual | lexical
    query: str
    doc_id: str
    anchor: str


@dataclass(frozen=True)
class Metrics:
    k: int
    queries: int
    recall_at_k: float
    precision_at_k: float
    mrr: float
    ndcg_at_k: float
    by_kind: dict[str, Metrics] = field(default_factory=dict)


@dataclass(frozen=True)
class Draft:
    prompt: str
    citations: tuple[str, ...]
    refused: bool


@dataclass(frozen=True)
class Faithfulness:
    cited: tuple[int, ...]
    uncited_claims: int
    refused: bool


@dataclass(frozen=True)
class Answer:
    text: str
    faithfulness: Faithfulness
    cost_usd: float
