"""Drafted golden queries: candidates checked, de-duplicated, balanced and flagged into a draft set.

Contract: ``draft(documents, chunks, per_doc=3, drafter=None)`` asks a drafter (default: the
offline one, ``draft_offline.OfflineDrafter``) for candidate queries of each document (``chunks``
may hold other documents' chunks too: every chunk counts in the word statistics) and keeps,
per document, at most ``per_doc`` of them, the kinds taken in turn (the first kind rotating from
one document to the next, so the set stays balanced), each the best-scored candidate of its kind
from a chunk the document has used least. A candidate is dropped, and counted under
its reason, when its anchor lies inside no chunk of its document (``golden.relevant``: the rule
``golden_queries`` checks), when its kind or text is invalid, or when its query is a near-duplicate
of an earlier candidate of its document or of a query kept from another (the same text, or cosine
>= ``DUPLICATE_COSINE`` between HashEmbedder vectors).
The kinds are then trimmed to at most ``balance_cap`` of the rarest kind. A query is flagged
``trivial`` with the word that answers it alone: a word it shares with its anchor that occurs in no
chunk without the anchor. Ids are ``d`` + 8 hex digits of a hash of doc id, kind and query, so the
same corpus drafts the same set in any process. ``drafted_items`` is the plain entry point.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from retrieval_assets.corpus.golden import KINDS, normalise
from retrieval_assets.index.embed import HashEmbedder
from retrieval_assets.words import STOPWORDS, words as _words
from retrieval_assets.types import Chunk, Document

DUPLICATE_COSINE = 0.9  # HashEmbedder cosine at or above which two queries are one
MAX_QUERY_CHARS = 300


@dataclass(frozen=True)
class Candidate:
    """A query a drafter proposes: its kind, text, document, anchor (a sentence of the document) and source."""

    kind: str
    query: str
    doc_id: str
    anchor: str
    source: str
    score: float = 0.0  # higher first within a kind


@dataclass(frozen=True)
class DraftItem:
    query_id: str
    kind: str
    query: str
    doc_id: str
    anchor: str
    source: str
    chunk_id: str  # the first chunk holding the anchor
    trivial: str | None = None  # the one word that answers the query alone, when there is one
    status: str = "draft"  # draft, accepted or rejected (``golden review``)


@dataclass
class DraftSet:
    items: list[DraftItem]
    drafter: str
    dropped: Counter = field(default_factory=Counter)  # reason -> candidates dropped
    reasons: list[str] = field(default_factory=list)  # documents that gave nothing, and why
    cost_usd: float = 0.0

    def counts(self) -> dict[str, int]:
        return {k: sum(i.kind == k for i in self.items) for k in KINDS}


class Drafter(Protocol):
    name: str

    def candidates(self, doc: Document, chunks: Sequence[Chunk], vocabulary: Vocabulary) -> Iterable[Candidate]: ...


class Vocabulary:
    """Which chunks hold each word (``\\w+`` lowercased, as HashEmbedder reads words): document frequency over chunks."""

    def __init__(self, chunks: Sequence[Chunk]):
        self.chunks = len(chunks)
        self.holders: dict[str, set[str]] = {}
        for c in chunks:
            for w in set(_words(c.text)):
                self.holders.setdefault(w, set()).add(c.chunk_id)

    def df(self, word: str) -> int:
        return len(self.holders.get(word, ()))

    def rare(self, word: str) -> bool:
        """Held by at most 2% of the chunks (at least 2): a word that names its section."""
        return self.df(word) <= max(2, self.chunks // 50)

    def common(self, word: str) -> bool:
        """Held by more than 10% of the chunks (and more than 2): the corpus's general vocabulary."""
        return self.df(word) > max(2, self.chunks / 10)


def query_id(doc_id: str, kind: str, query: str, clash: int = 0) -> str:
    """``d`` + 8 hex digits of a hash of doc id, kind and query (``clash``: the how-manyth id that clashed)."""
    salt = f"\0{clash}" if clash else ""
    return "d" + hashlib.sha256(f"{doc_id}\0{kind}\0{normalise(query)}{salt}".encode()).hexdigest()[:8]


def anchor_chunk(chunks: Sequence[Chunk], anchor: str) -> Chunk | None:
    """The first chunk whose text holds ``anchor`` (case-insensitive, whitespace-normalised)."""
    needle = normalise(anchor)
    return next((c for c in chunks if needle and needle in normalise(c.text)), None)


def trivial_word(query: str, anchor: str, holders: set[str], vocabulary: Vocabulary) -> str | None:
    """A word of both query and anchor, no stop word, found only in chunks that hold the anchor (``holders``), else None."""
    shared = sorted(set(_words(query)) & set(_words(anchor)) - STOPWORDS)  # numbers too: a ticket id alone can answer
    return next((w for w in shared if vocabulary.holders.get(w, set()) <= holders), None)


def _valid(c: Candidate) -> bool:
    return (c.kind in KINDS and all(isinstance(v, str) and v.strip() for v in (c.query, c.anchor, c.doc_id))
            and len(c.query) <= MAX_QUERY_CHARS and re.search(r"\w", c.query) is not None)


def _kind_order(i: int) -> list[str]:
    return [KINDS[(i + j) % len(KINDS)] for j in range(len(KINDS))]


def _distinct(queries: list[str], embedder: HashEmbedder) -> list[int]:
    """Indexes of the queries that are no near-duplicate of an earlier one (same text, or cosine >= DUPLICATE_COSINE)."""
    if not queries:
        return []
    vectors = embedder.embed(queries)
    similar = vectors @ vectors.T >= DUPLICATE_COSINE
    keys = [normalise(q) for q in queries]
    kept: list[int] = []
    for j in range(len(queries)):
        if not any(similar[j, i] or keys[i] == keys[j] for i in kept):
            kept.append(j)
    return kept


def balance_cap(smallest: int) -> int:
    """The most queries a kind keeps when the rarest kind has ``smallest``: 10% more, at least one more."""
    return smallest + max(1, smallest // 10)


def draft(documents: Sequence[Document], chunks: Sequence[Chunk], *, per_doc: int = 3, drafter: Drafter | None = None) -> DraftSet:
    """The draft set of a corpus (see the contract)."""
    if not isinstance(per_doc, int) or isinstance(per_doc, bool) or per_doc < 1:
        raise ValueError(f"per_doc must be a positive integer, got {per_doc!r}")
    if drafter is None:
        from retrieval_assets.corpus.draft_offline import OfflineDrafter

        drafter = OfflineDrafter()
    vocabulary = Vocabulary(chunks)
    by_doc: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_doc.setdefault(c.doc_id, []).append(c)
    embedder = HashEmbedder()
    kept: list[DraftItem] = []
    vectors = np.zeros((64, embedder.dims), dtype=np.float32)  # the kept queries' vectors, grown by doubling
    seen: set[str] = set()
    ids: set[str] = set()
    out = DraftSet([], drafter.name)
    for i, doc in enumerate(documents):
        mine = by_doc.get(doc.doc_id, [])
        if not mine:
            out.reasons.append(f"{doc.doc_id}: no text (the file is empty or blank)")
            continue
        valid: list[tuple[Candidate, Chunk]] = []
        for c in drafter.candidates(doc, mine, vocabulary):
            holder = anchor_chunk(mine, c.anchor) if _valid(c) and c.doc_id == doc.doc_id else None
            if not _valid(c) or c.doc_id != doc.doc_id:
                out.dropped["invalid item"] += 1
            elif holder is None:
                out.dropped["anchor outside every chunk"] += 1
            else:
                valid.append((c, holder))
        pools: dict[str, list[tuple[Candidate, Chunk, str | None]]] = {k: [] for k in KINDS}
        for j in _distinct([c.query for c, _ in valid], embedder):
            cand, holder = valid[j]
            holders = {h.chunk_id for h in mine if normalise(cand.anchor) in normalise(h.text)}
            pools[cand.kind].append((cand, holder, trivial_word(cand.query, cand.anchor, holders, vocabulary)))
        out.dropped["near-duplicate query"] += len(valid) - sum(map(len, pools.values()))
        for pool in pools.values():
            pool.sort(key=lambda p: -p[0].score)  # stable: the drafter's order among equals
        taken = 0
        wanted = [k for k in _kind_order(i) * per_doc][:per_doc]
        used_chunks: Counter = Counter()
        for kind in wanted:
            pool = pools[kind]
            # prefer a chunk this document has not used yet, then the best score
            pool.sort(key=lambda p: used_chunks[p[1].chunk_id])
            while pool:
                cand, holder, trivial = pool.pop(0)
                key = normalise(cand.query)
                vector = embedder.embed([cand.query])[0]
                if key in seen or (kept and float((vectors[: len(kept)] @ vector).max()) >= DUPLICATE_COSINE):
                    out.dropped["near-duplicate query"] += 1
                    continue
                seen.add(key)
                qid, clash = query_id(doc.doc_id, kind, cand.query), 0
                while qid in ids:  # two hashes alike in 8 hex digits
                    clash += 1
                    qid = query_id(doc.doc_id, kind, cand.query, clash)
                ids.add(qid)
                if len(kept) == len(vectors):
                    vectors = np.vstack([vectors, np.zeros_like(vectors)])
                vectors[len(kept)] = vector
                kept.append(DraftItem(qid, kind, " ".join(cand.query.split()), doc.doc_id, " ".join(cand.anchor.split()),
                                      cand.source, holder.chunk_id, trivial))
                used_chunks[holder.chunk_id] += 1
                taken += 1
                break
        if not taken:
            out.reasons.append(f"{doc.doc_id}: {getattr(drafter, 'why_none', lambda d: 'no usable candidate')(doc)}")
    counts = Counter(item.kind for item in kept)
    present = [counts[k] for k in KINDS if counts[k]]
    if present:
        cap = balance_cap(min(present))
        for k in KINDS:
            if counts[k] > cap:
                out.dropped["kind balance"] += counts[k] - cap
                out.reasons.append(f"kind {k}: {counts[k]} drafted, {cap} kept (the rarest kind has {min(present)})")
        mine_by_kind: Counter = Counter()
        kept = [it for it in kept if (mine_by_kind.update([it.kind]) or mine_by_kind[it.kind] <= cap)]
    for k in KINDS:
        if not counts[k] and kept:
            out.reasons.append(f"kind {k}: no candidate in any document")
    out.items = kept
    out.reasons += getattr(drafter, "notes", [])
    out.cost_usd = float(getattr(drafter, "cost_usd", 0.0))
    out.dropped.update(getattr(drafter, "dropped", Counter()))
    return out


def drafted_items(corpus_dir, *, per_doc: int = 3, max_chars: int = 1200, overlap: int = 1, drafter: Drafter | None = None) -> list[DraftItem]:
    """The drafted queries of a corpus folder (the offline drafter by default): a plain list, nothing written."""
    from retrieval_assets.index import chunker

    documents = chunker.load_documents(corpus_dir)
    chunks = [c for d in documents for c in chunker.chunk(d, max_chars=max_chars, overlap=overlap)]
    return draft(documents, chunks, per_doc=per_doc, drafter=drafter).items
