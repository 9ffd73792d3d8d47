"""The support model of one corpus and embedder: fitted on its own questions against off-corpus ones, or the
cross-corpus default, with its held-out reliability.

Contract: ``measure(conn, retriever, questions, params)`` runs any list of questions through the pipeline and
returns their evidence (``support.evidence``) and best cosines: golden questions, drafts from ``golden
draft`` or the shipped off-corpus set (``off_corpus()``, off_corpus.yaml beside this file) alike.
``calibrate(conn, retriever, questions, params, key)`` measures the off-corpus set (its best cosines become the
corpus's ``reference``) and the corpus's answerable ``questions``. With questions it fits a ``SupportModel``
pulled towards the default and reports held-out reliability from ``FOLDS`` folds (questions by position,
off-corpus questions by domain): the share of answerable questions answered, of off-corpus ones refused.
When the held-out scores of the two sets overlap (``separates``), it keeps no threshold of its own: the
answers use the default, and ``note`` says why. Whichever model answers, its threshold is ``guarded``: raised, where
needed, so that at most 5% of the corpus's own off-corpus questions clear it (held out by domain when measured). Without questions it is the default (``defaults``, fitted
across corpora by ``python -m benchmarks answer_support --write-default``), its refusal rate measured here
and no answer rate. ``for_index`` reads a stored calibration whose ``fingerprint`` matches (index, questions,
off-corpus set, default, parameters) from the schema's ``support_calibration`` table, else calibrates and stores.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import psycopg
import yaml

from retrieval_assets.answers import answer, support
from retrieval_assets.answers.support import Evidence, SupportModel
from retrieval_assets.index.tables import statement
from retrieval_assets.params import RetrievalParams
from retrieval_assets.search import pipeline
from retrieval_assets.types import Chunk

HERE = Path(__file__).resolve().parent
OFF_CORPUS = HERE / "off_corpus.yaml"
DEFAULTS = HERE / "support_defaults.json"
VERSION = 5  # of the evidence and the stored form: a stored calibration of another version is made again
FOLDS = 5
L2_CORPUS = 0.1  # a corpus's own fit is pulled towards the default this strongly (benchmarks/calibration/answer_support.py)
SEPARATES = 0.9  # held-out answer and refusal rates a corpus's own fit must both reach to keep its threshold
OFF_CORPUS_REFUSAL = 0.95  # the goal, not tuned: the threshold never lets more than 5% of the off-corpus questions through


@dataclass(frozen=True)
class OffCorpusQuestion:
    question: str
    lang: str
    domain: str


@functools.cache
def off_corpus() -> tuple[OffCorpusQuestion, ...]:
    """The shipped questions no corpus here can answer (off_corpus.yaml)."""
    return tuple(OffCorpusQuestion(r["question"], r["lang"], r["domain"]) for r in yaml.safe_load(OFF_CORPUS.read_text(encoding="utf-8")))


def domain_folds(questions: Sequence[OffCorpusQuestion]) -> np.ndarray:
    """Each off-corpus question's fold: its domain's place among the sorted domains, modulo ``FOLDS``."""
    domains = sorted({q.domain for q in questions})
    return np.array([domains.index(q.domain) % FOLDS for q in questions], dtype=int)


@functools.cache
def _defaults() -> dict:
    return json.loads(DEFAULTS.read_text()) if DEFAULTS.exists() else {"models": {}}


def defaults(key: str) -> tuple[SupportModel, str]:
    """The cross-corpus default model for embedder partition ``key`` (else the one pooled over embedders), and
    where it comes from."""
    data = _defaults()
    models = data.get("models", {})
    if not models:
        return SupportModel((1.0,) * len(support.FEATURES), -3.5), "no fitted default shipped: equal weights"
    chosen = key if key in models else "*"
    return SupportModel.from_dict(models[chosen]), (f"the cross-corpus default for {chosen} (fitted on {', '.join(data.get('corpora', []))})"
                                                   if chosen != "*" else "the cross-corpus default pooled over embedders")


@dataclass(frozen=True)
class Measured:
    """Evidence rows of a list of questions on one corpus (``cosine`` not yet set) and their best cosines."""

    X: np.ndarray
    top: np.ndarray

    def features(self, reference: np.ndarray) -> np.ndarray:
        X = self.X.copy()
        X[:, support.FEATURES.index("cosine")] = support.surprise(self.top, reference)
        return X


def measure(conn: psycopg.Connection, retriever: pipeline.Retriever, questions: Sequence[str], params: RetrievalParams) -> Measured:
    """The evidence of each question's sources (``pipeline.run`` with ``params``) on the retriever's corpus."""
    stats = support.stem_stats(pipeline.corpus_stats(conn, retriever.schema))
    rows, top = [], []
    for question in questions:
        trace = pipeline.run(conn, retriever, question, params)
        sources = [c for c, _ in answer.sources_of(conn, retriever, question, trace)]
        rows.append(support.evidence(question, trace.vector, trace.text, sources, stats).array())
        top.append(support.top_cosine(trace.vector))
    return Measured(np.array(rows, dtype=float).reshape(-1, len(support.FEATURES)), np.array(top, dtype=float))


@dataclass(frozen=True)
class Calibration:
    model: SupportModel
    reference: tuple[float, ...]  # the off-corpus questions' best cosines on this corpus, sorted
    source: str  # "corpus": fitted on its own questions; "default": the cross-corpus default
    note: str
    answerable: int  # questions of the corpus's own that it was calibrated with
    off_corpus: int
    answer_rate: float | None  # held-out share of answerable questions answered (None: none to measure)
    refusal_rate: float  # held-out share of off-corpus questions refused
    separates: bool | None  # whether the corpus's own held-out scores separate (None: no questions of its own)
    held_out: dict = field(default_factory=dict, repr=False)  # {"answerable": [...], "off_corpus": [...]} support scores

    def evidence(self, query: str, trace: pipeline.Trace, sources: Sequence[Chunk], stats: support.StemStats) -> Evidence:
        """``support.evidence`` of ``sources`` (the trace's final chunks) against this corpus's reference cosines."""
        return support.evidence(query, trace.vector, trace.text, sources, stats, self.reference)

    def as_dict(self) -> dict:
        return {"version": VERSION, **asdict(self), "model": self.model.as_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        fields_ = {k: v for k, v in data.items() if k != "version"}
        return cls(**{**fields_, "model": SupportModel.from_dict(data["model"]), "reference": tuple(data["reference"])})


def _rates(p_answerable: np.ndarray, p_off: np.ndarray, t_answerable, t_off) -> tuple[float | None, float]:
    """Shares answered and refused (thresholds: one number, or one per question)."""
    answered = float((p_answerable >= t_answerable).mean()) if len(p_answerable) else None
    return answered, float((p_off < t_off).mean()) if len(p_off) else 1.0


def calibrate(conn: psycopg.Connection, retriever: pipeline.Retriever, questions: Sequence[str], params: RetrievalParams,
              key: str) -> Calibration:
    """The corpus's calibration (see the contract); ``questions``: its answerable questions (may be empty)."""
    off = off_corpus()
    m_off = measure(conn, retriever, [q.question for q in off], params)
    m_q = measure(conn, retriever, [q for q in questions if q.strip()], params)
    return calibrate_measured(m_q, m_off, domain_folds(off), *defaults(key))


def guarded(model: SupportModel, p_off: np.ndarray) -> SupportModel:
    """``model`` with its threshold raised, where needed, to the support that ``OFF_CORPUS_REFUSAL`` of this corpus's
    off-corpus questions (``p_off``: their supports under ``model``) stay below."""
    if not len(p_off):
        return model
    return replace(model, threshold=min(max(model.threshold, float(np.quantile(p_off, OFF_CORPUS_REFUSAL))), 1 - 1e-9))


def calibrate_measured(m_q: Measured, m_off: Measured, off_folds: np.ndarray, default: SupportModel, origin: str) -> Calibration:
    """``calibrate`` on evidence already measured (``off_folds``: each off-corpus question's fold)."""
    reference = np.sort(m_off.top)
    n_q, n_off = len(m_q.top), len(m_off.top)
    q_folds = np.arange(n_q) % FOLDS
    p_q, p_off, t_q, t_off = np.zeros(n_q), np.zeros(n_off), np.zeros(n_q), np.zeros(n_off)
    for f in range(FOLDS):  # held out: the fold's off-corpus questions never shape the reference, the fit or the guard
        ref = m_off.top[off_folds != f]
        X_off, X_q = m_off.features(ref), m_q.features(ref)
        if n_q:
            X = np.vstack([X_q[q_folds != f], X_off[off_folds != f]])
            y = np.r_[np.ones(int((q_folds != f).sum())), np.zeros(int((off_folds != f).sum()))]
            model = support.fit(X, y, prior=default, l2=L2_CORPUS, threshold=default.threshold) if y.any() else default
        else:
            model = default
        supports = model.probabilities(X_off)
        model = guarded(model, supports[off_folds != f])
        p_q[q_folds == f], t_q[q_folds == f] = (model.probabilities(X_q[q_folds == f]) if n_q else []), model.threshold
        p_off[off_folds == f], t_off[off_folds == f] = supports[off_folds == f], model.threshold
    answered, refused = _rates(p_q, p_off, t_q, t_off)
    held_out = {"answerable": p_q.round(4).tolist(), "off_corpus": p_off.round(4).tolist()}
    if n_q and answered >= SEPARATES and refused >= SEPARATES:
        X = np.vstack([m_q.features(reference), m_off.features(reference)])
        model = support.fit(X, np.r_[np.ones(n_q), np.zeros(n_off)], prior=default, l2=L2_CORPUS, threshold=default.threshold)
        return Calibration(guarded(model, model.probabilities(m_off.features(reference))), tuple(reference.tolist()), "corpus",
                           f"fitted on {n_q} questions of its own and {n_off} off-corpus questions, pulled towards {origin}", n_q, n_off,
                           answered, refused, True, held_out)
    fallback = guarded(default, default.probabilities(m_off.features(reference)))  # only a corpus that keeps no fit of its own needs it
    if not n_q:
        return Calibration(fallback, tuple(reference.tolist()), "default", f"no answerable questions of its own: {origin}", 0, n_off,
                           None, refused, None, held_out)
    a_default, r_default = _rates(*(fallback.probabilities(m.features(reference)) for m in (m_q, m_off)), fallback.threshold, fallback.threshold)
    note = (f"cannot separate: held out, a fit on its {n_q} questions answers {answered:.0%} of them and refuses {refused:.1%} of "
            f"{n_off} off-corpus questions (both must reach {SEPARATES:.0%}); no threshold of its own, answers use {origin} "
            f"(here it answers {a_default:.0%} and refuses {r_default:.1%})")
    return Calibration(fallback, tuple(reference.tolist()), "default", note, n_q, n_off, answered, refused, False, held_out)


# -- stored per schema ------------------------------------------------------------------------------------------------

_TABLE = "CREATE TABLE IF NOT EXISTS {table} (one bool PRIMARY KEY DEFAULT true CHECK (one), fingerprint text NOT NULL, calibration jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
_INDEX_VERSION = "SELECT s.xmin::text, s.n, s.total_len, (SELECT fingerprint FROM {synced}) FROM {bm25_stats} s"


def fingerprint(conn: psycopg.Connection, schema: str, questions: Sequence[str], params: RetrievalParams, key: str) -> str:
    """What a calibration depends on: the index's version, the questions, the off-corpus set, the default, the pipeline."""
    version = conn.execute(statement(schema, _INDEX_VERSION)).fetchone()
    parts = [VERSION, key, list(version or ()), list(questions), OFF_CORPUS.read_text(encoding="utf-8"), _defaults(), repr(params)]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _table(schema: str):
    from psycopg import sql

    return sql.Identifier(schema, "support_calibration")


def stored(conn: psycopg.Connection, schema: str, fingerprint_: str) -> Calibration | None:
    """The calibration stored in ``schema`` for ``fingerprint_``, else None (none stored, or another's)."""
    from psycopg import sql

    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_table(schema).as_string(conn),)).fetchone()[0]:
        return None
    row = conn.execute(sql.SQL("SELECT calibration FROM {} WHERE fingerprint = %s").format(_table(schema)), (fingerprint_,)).fetchone()
    return Calibration.from_dict(row[0]) if row and row[0].get("version") == VERSION else None


def store(conn: psycopg.Connection, schema: str, fingerprint_: str, calibration: Calibration) -> None:
    """Keep ``calibration`` as the schema's one calibration (two launches storing at once: the later one's is kept;
    they take turns on an advisory lock, as two ``CREATE TABLE IF NOT EXISTS`` at once would fail)."""
    from psycopg import sql
    from psycopg.types.json import Jsonb

    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.support_calibration:' || %s))", (schema,))
        conn.execute(sql.SQL(_TABLE).format(table=_table(schema)))
        conn.execute(sql.SQL("INSERT INTO {} (fingerprint, calibration) VALUES (%s, %s) ON CONFLICT (one) DO UPDATE SET "
                             "fingerprint = EXCLUDED.fingerprint, calibration = EXCLUDED.calibration, created_at = now()")
                     .format(_table(schema)), (fingerprint_, Jsonb(calibration.as_dict())))


def for_index(conn: psycopg.Connection, retriever: pipeline.Retriever, questions: Sequence[str], params: RetrievalParams, key: str,
              *, refresh: bool = False) -> tuple[Calibration, bool]:
    """The schema's stored calibration for these inputs, else a new one, stored; and whether it was made now."""
    fp = fingerprint(conn, retriever.schema, questions, params, key)
    found = None if refresh else stored(conn, retriever.schema, fp)
    if found is not None:
        return found, False
    made = calibrate(conn, retriever, questions, params, key)
    store(conn, retriever.schema, fp, made)
    return made, True

