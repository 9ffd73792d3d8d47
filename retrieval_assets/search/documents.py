"""Document evidence in the second stage: a chunk's score blended with its document's lexical evidence.

Contract: ``blend(ranked, chunks, lexical, weight)`` re-scores ``ranked`` (the pool after the rerank) as
``(1 - weight) * minmax(score) + weight * minmax(evidence of its document)``, where a document's evidence is the
sum of the lexical-list scores (``lexical``: the first stage's lexical hits) of its chunks in the pool, a chunk
outside the lexical list adding 0: a document matching the query in more of its chunks rises with all of
them (passage plus document evidence, as Callan, SIGIR 1994). Best first, ties in ``ranked``'s order; ``weight``
0 returns ``ranked`` unchanged. ``chunks`` maps chunk_id to its ``Chunk`` (its ``doc_id``: the source it was cut from).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from retrieval_assets.search.fusion import normalise
from retrieval_assets.types import Chunk, Hit, Ranked


def evidence(ranked: Sequence[Ranked], chunks: Mapping[str, Chunk], lexical: Sequence[Hit]) -> np.ndarray:
    """Per item of ``ranked``: the summed lexical score of the pool's chunks of its document."""
    score = {h.chunk_id: h.score for h in lexical}
    docs, of = np.unique([chunks[r.chunk_id].doc_id for r in ranked], return_inverse=True)
    own = np.fromiter((score.get(r.chunk_id, 0.0) for r in ranked), dtype=np.float64, count=len(ranked))
    return np.bincount(of, weights=own, minlength=len(docs))[of]


def blend(ranked: Sequence[Ranked], chunks: Mapping[str, Chunk], lexical: Sequence[Hit], weight: float) -> list[Ranked]:
    """``ranked`` re-scored with its documents' lexical evidence (module docstring), best first."""
    if weight <= 0 or not ranked:
        return list(ranked)
    own = normalise(np.array([r.score for r in ranked], dtype=np.float64), "minmax")
    scores = (1 - weight) * own + weight * normalise(evidence(ranked, chunks, lexical), "minmax")
    order = np.lexsort((np.arange(len(ranked)), -scores))
    return [Ranked(ranked[i].chunk_id, float(scores[i]), rank, ranked[i].ranks) for rank, i in enumerate(order, 1)]
