"""How well a question's sources support an answer: evidence in [0, 1] that means the same on every corpus,
and the calibrated probability that the sources answer the question.

Contract: ``evidence(query, trace, stats)`` reads what one ``pipeline.run`` already has (its vector and
lexical lists and final sources) and the corpus's word statistics (``pipeline.corpus_stats``), and returns
an ``Evidence`` of numbers in [0, 1], each relative to the question itself, not to a corpus's score scale:

- ``coverage``: the share of the question's content-word idf mass that the best source contains;
- ``sentence``: the same share for the best single sentence of the sources;
- ``attained``: the best source's BM25 score over the most the question's words could score;
- ``known``: the share of the question's idf mass whose words occur anywhere in the corpus;
- ``standout``: how far the best vector cosine rises above the median of the question's vector list,
  as a share of the room above that median;
- ``agreement``: the geometric mean of the reciprocal ranks in the vector and the lexical list of the
  source both lists rank highest (1: the same chunk first in both; 0: no source in both);
- ``overlap``: chunks shared by the two lists' top 10, over 10;
- ``cosine``: the best vector cosine against the corpus's own distribution of best cosines for questions it
  cannot answer (``reference``: the off-corpus questions' best cosines on this corpus): the surprise
  ``-ln(1 - share of the reference below it) / ln(reference size + 1)``, 1 above every one of them, 0 without
  a reference.

A question's words are ``words.question_words`` (``\\w+``, lowercase, no function words, bare numbers or the "long" of "how long";
on a corpus in another language, none of that language's function words either), stemmed by ``words.stem`` (another
language: Snowball's stemmer of it; both from ``StemStats.language``, ``words.language`` of the corpus); idf is
``ln(1 + (N - df + 0.5) / (df + 0.5))`` over the corpus (a word it lacks gets the highest idf); ``idf_share`` is the one
place that measures a share of the question's idf mass (coverage, sentence, known, the extractive answerer's claims). ``SupportModel``
is a logistic regression over the evidence whose weights are never negative, so support never falls as
any evidence rises; ``probability`` is in [0, 1] and ``supports`` compares it with the model's threshold.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from retrieval_assets.search.rerank import CorpusStats
from retrieval_assets.types import Chunk, Hit
from retrieval_assets.words import function_words, language, question_words, stem, stemmer, words

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
K1, B = 1.2, 0.75  # the BM25 constants of the seed's reranker


def content_terms(question: str, leave_out: frozenset[str] = frozenset(), stem: Callable[[str], str] = stem) -> list[str]:
    """The distinct content words of ``question`` (``words.question_words``, without the words of ``leave_out``: a
    corpus's language's function words, ``StemStats.leave_out``), stemmed by ``stem``, in order."""
    return list(dict.fromkeys(map(stem, question_words(question, leave_out))))


def stems(text: str, stem: Callable[[str], str] = stem) -> Counter[str]:
    """Word counts of a text stemmed by ``stem`` (a corpus's: ``StemStats.stem``; function words kept: they only add to
    its length)."""
    return Counter(map(stem, words(text)))


@dataclass(frozen=True)
class StemStats:
    """A corpus's document frequencies by stem (a stem's df: its words' dfs added up, at most N)."""

    n: int
    df: dict[str, int]
    avg_len: float
    language: str = "english"  # words.language: how its questions and texts are read

    @property
    def leave_out(self) -> frozenset[str]:
        """The function words its questions leave out beyond English's (``words.function_words``)."""
        return function_words(self.language)

    @property
    def stem(self) -> Callable[[str], str]:
        """How its words are stemmed (``words.stemmer``)."""
        return stemmer(self.language)

    def idf(self, term: str) -> float:
        return self.idf_at(self.df.get(term, 0))

    def idf_at(self, df: int) -> float:
        """The idf of a term that ``df`` chunks hold."""
        return math.log(1 + (self.n - df + 0.5) / (df + 0.5))


def question_idf(query: str, stats: StemStats) -> dict[str, float]:
    """The question's content terms (``content_terms``) with their idf under ``stats``: the question's idf mass."""
    return {t: stats.idf(t) for t in content_terms(query, stats.leave_out, stats.stem)}


def idf_share(idf: Mapping[str, float], present: Mapping[str, int]) -> float:
    """The share of the idf mass ``idf`` (``question_idf``) whose terms ``present`` counts above 0 (a text's ``stems``,
    or a corpus's document frequencies); 0 for a question without mass."""
    mass = sum(idf.values())
    return sum(v for t, v in idf.items() if present.get(t, 0) > 0) / mass if mass > 0 else 0.0


def focus(idf: Mapping[str, float], stats: StemStats) -> tuple[dict[str, float], float]:
    """The question's focus from its idf mass (``question_idf`` under ``stats``): its content terms' shares of that mass,
    a word no chunk holds weighing as one that one chunk holds (no more); and the share of it in words no chunk holds."""
    rarest = stats.idf_at(1)
    weights = {t: v if stats.df.get(t, 0) else rarest for t, v in idf.items()}
    mass = sum(weights.values()) or 1.0
    shares = {t: v / mass for t, v in weights.items()}
    return shares, sum(v for t, v in shares.items() if not stats.df.get(t, 0))


_STEMMED: dict[int, tuple[CorpusStats, StemStats]] = {}  # id -> (the stats, kept alive so the id stays theirs)
_STEMMED_LOCK = threading.Lock()


def stem_stats(stats: CorpusStats) -> StemStats:
    """``stats`` by stem, computed once per ``CorpusStats`` object (``pipeline.corpus_stats`` caches those per index version)."""
    with _STEMMED_LOCK:
        kept = _STEMMED.get(id(stats))
    if kept is not None and kept[0] is stats:
        return kept[1]
    read = language(stats.df)
    by = stemmer(read)
    df: Counter[str] = Counter()
    for word, count in stats.df.items():
        df[by(word)] += count
    made = StemStats(stats.n, {t: min(stats.n, c) for t, c in df.items()}, stats.avg_len or 1.0, read)
    with _STEMMED_LOCK:
        while len(_STEMMED) >= 8:
            _STEMMED.pop(next(iter(_STEMMED)))
        _STEMMED[id(stats)] = (stats, made)
    return made


@dataclass(frozen=True)
class Evidence:
    coverage: float = 0.0
    sentence: float = 0.0
    attained: float = 0.0
    known: float = 0.0
    standout: float = 0.0
    agreement: float = 0.0
    overlap: float = 0.0
    cosine: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"evidence {f.name} must be a number within [0, 1], got {value!r}")

    def array(self) -> np.ndarray:
        return np.array([getattr(self, f.name) for f in fields(self)], dtype=float)


FEATURES = tuple(f.name for f in fields(Evidence))


def _unit(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


def top_cosine(vector: Sequence[Hit]) -> float:
    """The best cosine of a vector list (0 for an empty one)."""
    return max((float(h.score) for h in vector), default=0.0)


def surprise(values: np.ndarray | float, reference: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """How far each value lies in the upper tail of ``reference``, in [0, 1] (see ``cosine`` in the contract)."""
    values = np.atleast_1d(np.asarray(values, dtype=float))
    if reference is None or len(reference) == 0:
        return np.zeros(len(values))
    ref = np.sort(np.asarray(reference, dtype=float))
    above = 1 - np.searchsorted(ref, values, side="left") / len(ref)
    return np.clip(-np.log(np.maximum(above, 1 / (len(ref) + 1))) / math.log(len(ref) + 1), 0.0, 1.0)


def evidence(query: str, vector: Sequence[Hit], text: Sequence[Hit], sources: Sequence[Chunk], stats: StemStats,
             reference: Sequence[float] | np.ndarray | None = None) -> Evidence:
    """The evidence that ``sources`` (the pipeline's final chunks) answer ``query``, from the first-stage lists,
    the corpus's stem statistics and its ``reference`` cosines (see the contract). A question without content
    words has no lexical evidence."""
    idf = question_idf(query, stats)
    mass = sum(idf.values())
    standout = 0.0
    if vector:
        cosines = np.array([h.score for h in vector], dtype=float)
        middle = float(np.median(cosines))
        standout = _unit((cosines.max() - middle) / (1 - middle)) if middle < 1 else 0.0
    v_rank = {h.chunk_id: h.rank for h in vector}
    t_rank = {h.chunk_id: h.rank for h in text}
    agreement = max((math.sqrt(1 / (v_rank[c.chunk_id] * t_rank[c.chunk_id])) for c in sources
                     if c.chunk_id in v_rank and c.chunk_id in t_rank), default=0.0)
    overlap = len({h.chunk_id for h in vector[:10]} & {h.chunk_id for h in text[:10]}) / 10
    cosine = float(surprise(top_cosine(vector), reference)[0]) if vector else 0.0
    if mass <= 0:
        return Evidence(standout=standout, agreement=_unit(agreement), overlap=overlap, cosine=cosine)
    coverage = attained = sentence = 0.0
    for chunk in sources:
        tf = stems(chunk.text, stats.stem)
        norm = K1 * (1 - B + B * sum(tf.values()) / stats.avg_len)
        coverage = max(coverage, idf_share(idf, tf))
        attained = max(attained, sum(v * tf[t] * (K1 + 1) / (tf[t] + norm) for t, v in idf.items() if tf[t]) / ((K1 + 1) * mass))
        sentence = max([sentence] + [idf_share(idf, stems(part, stats.stem)) for part in _SENTENCE.split(chunk.text)])
    known = idf_share(idf, stats.df)
    return Evidence(_unit(coverage), _unit(sentence), _unit(attained), _unit(known), standout, _unit(agreement), overlap, cosine)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-np.clip(z, -60, 60)))


@dataclass(frozen=True)
class SupportModel:
    """P(the sources answer the question) = sigmoid(weights . evidence + bias); answer when it is >= threshold."""

    weights: tuple[float, ...]
    bias: float
    threshold: float = 0.5

    def __post_init__(self) -> None:
        if len(self.weights) != len(FEATURES) or any(not (w >= 0 and math.isfinite(w)) for w in self.weights):
            raise ValueError(f"a support model needs {len(FEATURES)} finite weights of 0 or more ({', '.join(FEATURES)}), got {self.weights!r}")
        if not math.isfinite(self.bias) or not 0 < self.threshold < 1:
            raise ValueError(f"a support model needs a finite bias and a threshold within (0, 1), got {self.bias!r}, {self.threshold!r}")

    def probabilities(self, X: np.ndarray) -> np.ndarray:
        return _sigmoid(np.asarray(X, dtype=float).reshape(-1, len(FEATURES)) @ np.array(self.weights) + self.bias)

    def probability(self, e: Evidence) -> float:
        return float(self.probabilities(e.array())[0])

    def supports(self, e: Evidence) -> bool:
        return self.probability(e) >= self.threshold

    def as_dict(self) -> dict:
        return {"features": list(FEATURES), **{k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}}

    @classmethod
    def from_dict(cls, data: dict) -> SupportModel:
        if list(data.get("features", FEATURES)) != list(FEATURES):
            raise ValueError(f"support model features {data.get('features')} are not this version's {list(FEATURES)}")
        return cls(tuple(float(w) for w in data["weights"]), float(data["bias"]), float(data.get("threshold", 0.5)))


def fit(X: np.ndarray, y: np.ndarray, *, prior: SupportModel | None = None, l2: float = 0.01, threshold: float = 0.5,
        steps: int = 4000) -> SupportModel:
    """A ``SupportModel`` fitted by projected gradient descent on the class-balanced logistic loss (each class
    weighs half), weights kept at 0 or more, with an L2 pull of strength ``l2`` towards ``prior``'s weights
    (towards 0 without one). ``X``: one row of evidence per question; ``y``: 1 answerable, 0 off-corpus."""
    X, y = np.asarray(X, dtype=float).reshape(-1, len(FEATURES)), np.asarray(y, dtype=float)
    if len(X) != len(y) or not (y == 1).any() or not (y == 0).any():
        raise ValueError("fitting a support model needs both answerable (1) and off-corpus (0) questions, one label per row")
    sample = np.where(y == 1, 0.5 / (y == 1).sum(), 0.5 / (y == 0).sum())
    centre = np.array(prior.weights) if prior is not None else np.zeros(len(FEATURES))
    w, b = centre.copy(), prior.bias if prior is not None else 0.0
    rate = 4.0 / (1 + float((X ** 2).sum(axis=1).max()))  # below 2 / the loss's largest curvature
    for _ in range(steps):
        residual = sample * (_sigmoid(X @ w + b) - y)
        w = np.maximum(w - rate * (X.T @ residual + l2 * (w - centre)), 0.0)
        b -= rate * residual.sum()
    return SupportModel(tuple(float(v) for v in w), float(b), threshold)
