"""A corpus's retrieval rule: the embedder's default (``params.default_for``), or the rule fitted on the corpus's own judged
queries where it earns it.

Contract: ``fit(conn, schema, embedder, chunks, golden, corpus, key)`` scores the staged rule's candidates
(``staged_rule.NO_FEEDBACK``) on the golden queries against the index in ``schema`` and runs
``crossval.calibrated``: the corpus's own rule replaces the embedder's default only when 5-fold cross-validation within
its queries puts the 95% interval of the paired held-out nDCG@10 difference above 0; with fewer than
``MIN_QUERIES`` queries (or none: no golden.yaml) the rule is the default, untried, and ``Rule.reason`` says so.
``store`` keeps one rule per (corpus, embedder partition) in the history schema's ``retrieval_rules`` table (launches
storing at once take turns on an advisory lock; the later one's is kept); ``stored`` reads it back (None: none
stored). ``for_index`` reuses the stored rule when its ``fingerprint`` (index version, golden queries, default,
candidates, folds) is this one's (the fit is deterministic: the same inputs choose the same rule), else fits and
stores. ``in_force`` says which rule a search of the corpus runs with: the stored rule's choice over
``staged_rule.FIELDS`` on top of the caller's base, or none (the base) when none is stored or it kept the default, and one
line saying which (and whether the index the rule was fitted on has changed since: the rule is still used until it is
fitted again); ``for_search`` gives a search or an answer its parameters and that line, or the base when told to ignore
the rule.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from retrieval_assets import pg
from retrieval_assets.corpus.golden import relevant_sets
from retrieval_assets.evaluation import crossval, staged_rule
from retrieval_assets.params import SEED, RetrievalParams, default_for, default_name
from retrieval_assets.partitions import RULES
from retrieval_assets.search import pipeline, snapshot
from retrieval_assets.types import Chunk, GoldenQuery

TABLE = RULES  # in the history schema (partitions.HISTORY, after the prefix)
MIN_QUERIES = 20  # fewer judged queries: the default, untried
FOLDS = 5  # the inner cross-validation's folds
VERSION = 1  # of the stored form and the fit: a row of another version is not read


@dataclass(frozen=True)
class Rule:
    """The rule of one corpus and embedder partition, with the evidence it was chosen on."""

    corpus: str
    partition: str
    params: RetrievalParams  # the chosen rule (the embedder's default, params.default_for, when kept)
    kept_default: bool
    queries: int  # judged queries it was calibrated on
    reason: str
    schema: str  # the index it was fitted against
    held_out: float | None = None  # inner CV: the own rule's nDCG@10, each query scored by a rule fitted without it
    default_ndcg: float | None = None  # the embedder's default's nDCG@10 on the same queries
    difference: float | None = None  # held_out - default_ndcg, paired ...
    interval: tuple[float, float] | None = None  # ... and its 95% bootstrap interval
    in_sample: float | None = None  # the chosen rule's nDCG@10 on every query it was fitted on (in-sample for an own rule)
    fingerprint: str = ""  # what the fit depended on (``fingerprint``)
    content: str = ""  # the content of the index it was fitted against (``content``): a later sync that changed it makes the rule stale

    @property
    def description(self) -> str:
        return staged_rule.describe(staged_rule.config_of(self.params))

    def as_dict(self) -> dict:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> Rule:
        fields = {k: v for k, v in data.items() if k != "version"}
        interval = tuple(fields["interval"]) if fields.get("interval") is not None else None
        return cls(**{**fields, "params": RetrievalParams(**fields["params"]), "interval": interval})

    def summary(self) -> str:
        """One line: which rule, and why."""
        which = f"{default_name(self.partition)} kept" if self.kept_default else f"own rule {self.description}"
        cv = "" if self.difference is None else (f"; held out (inner {FOLDS}-fold CV) own rule {self.held_out:.3f} against the default's "
                                                 f"{self.default_ndcg:.3f}, paired difference {self.difference:+.3f} "
                                                 f"[{self.interval[0]:+.3f}, {self.interval[1]:+.3f}]")
        return f"{self.corpus}/{self.partition}: {which} ({self.reason}){cv}"


def fingerprint(conn: psycopg.Connection, schema: str, golden: Sequence[GoldenQuery], key: str) -> str:
    """What a fit depends on: the index's version, the golden queries, the embedder's default, the candidates and the folds."""
    parts = [VERSION, key, schema, list(pipeline.index_version(conn, schema)), [asdict(q) for q in golden], repr(default_for(key)),
             [stage(crossval.config()) for stage in staged_rule.NO_FEEDBACK], FOLDS, MIN_QUERIES]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def content(conn: psycopg.Connection, schema: str) -> str:
    """The content of the index in ``schema`` as its last sync recorded it ("" before one)."""
    version = pipeline.index_version(conn, schema)
    return str(version[3]) if len(version) > 3 and version[3] is not None else ""


def fit(conn: psycopg.Connection, schema: str, embedder, chunks: Sequence[Chunk], golden: Sequence[GoldenQuery], corpus: str,
        key: str, *, fp: str | None = None) -> Rule:
    """The corpus's rule on the index in ``schema`` (see the contract); ``chunks``: the indexed chunks (the rerank's corpus idf);
    ``fp``: these inputs' ``fingerprint`` when the caller has it already."""
    fp, now, default = fp or fingerprint(conn, schema, golden, key), content(conn, schema), default_for(key)
    if not golden:
        return Rule(corpus, key, default, True, 0, "no judged queries (no golden.yaml, or an empty one): the default, untried", schema,
                    fingerprint=fp, content=now)
    rel = relevant_sets(conn, schema, golden)
    scorer = staged_rule.Scorer(conn, schema, embedder, chunks, [q.query for q in golden], [rel[q.query_id] for q in golden], default,
                                search=pipeline.retriever(conn, schema, embedder, SEED))  # its vector search; the scorer brings its rerankers
    setting = crossval.Setting(corpus, key, scorer.ndcg)
    with snapshot.search(conn):  # every run reads this one snapshot, and joins its transaction instead of opening its own
        found = crossval.calibrated(setting, staged_rule.NO_FEEDBACK, staged_rule.config_of(default), np.arange(len(golden)), k=FOLDS,
                                    min_queries=MIN_QUERIES)
        in_sample = float(setting.score(found.choice).mean())
    params = staged_rule.params_of(found.choice, default)
    if found.difference is None:
        return Rule(corpus, key, params, found.kept_default, found.queries, found.reason, schema, in_sample=in_sample, fingerprint=fp,
                    content=now)
    diff, low, high = found.difference
    return Rule(corpus, key, params, found.kept_default, found.queries, found.reason, schema, float(found.own.mean()),
                float(found.base.mean()), diff, (low, high), in_sample, fp, now)


def for_index(conn: psycopg.Connection, history: str, schema: str, embedder, chunks: Sequence[Chunk], golden: Sequence[GoldenQuery],
              corpus: str, key: str, *, refit: bool = False) -> tuple[Rule, str | None]:
    """The stored rule when it was fitted on these inputs (and when it was stored), else a new one, stored (and None)."""
    fp = fingerprint(conn, schema, golden, key)
    found = None if refit else stored(conn, history, corpus, key)
    if found is not None and found[0].fingerprint == fp:
        return found
    rule = fit(conn, schema, embedder, chunks, golden, corpus, key, fp=fp)
    store(conn, history, rule)
    return rule, None


def _table(history: str) -> sql.Identifier:
    return sql.Identifier(history, TABLE)


def store(conn: psycopg.Connection, history: str, rule: Rule) -> None:
    """Keep ``rule`` as its corpus and partition's one rule in ``history`` (the schema is created if missing)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('retrieval_assets.retrieval_rules:' || %s))", (history,))
        pg.ensure_schema(conn, history)
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (corpus text NOT NULL, partition text NOT NULL, rule jsonb NOT NULL, "
                             "created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (corpus, partition))").format(_table(history)))
        conn.execute(sql.SQL("INSERT INTO {} (corpus, partition, rule) VALUES (%s, %s, %s) ON CONFLICT (corpus, partition) DO UPDATE "
                             "SET rule = EXCLUDED.rule, created_at = now()").format(_table(history)),
                     (rule.corpus, rule.partition, Jsonb(rule.as_dict())))


def stored(conn: psycopg.Connection, history: str, corpus: str, key: str) -> tuple[Rule, str] | None:
    """The rule stored for ``corpus`` and partition ``key``, with when it was stored (UTC, to the minute); None when none is
    (or its parameters no longer validate)."""
    if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_table(history).as_string(conn),)).fetchone()[0]:
        return None
    row = conn.execute(sql.SQL("SELECT rule, to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') FROM {} "
                               "WHERE corpus = %s AND partition = %s").format(_table(history)), (corpus, key)).fetchone()
    if row is None or row[0].get("version") != VERSION:
        return None
    try:
        return Rule.from_dict(row[0]), row[1]
    except (TypeError, ValueError):  # parameters this code no longer takes: as if none were stored (the next fit replaces it)
        return None


def applied(rule: Rule, base: RetrievalParams) -> RetrievalParams:
    """``base`` with the rule's choice over ``staged_rule.FIELDS`` (its k, n and limits kept)."""
    return staged_rule.params_of(staged_rule.config_of(rule.params), base)


@dataclass(frozen=True)
class InForce:
    """The rule a search of a corpus runs with (``in_force``)."""

    rule: Rule | None  # the stored rule (None: none stored)
    params: RetrievalParams | None  # its choice over the caller's base (None: the base, when none is stored or it kept the default)
    line: str  # which rule, and why
    stale: bool = False  # fitted on the index in the caller's schema before a later sync changed it


def in_force(conn: psycopg.Connection, history: str, corpus: str, key: str, base: RetrievalParams | None = None, *,
             schema: str = "") -> InForce:
    """The rule stored for ``corpus`` and partition ``key`` over ``base`` (None: the partition's default); a rule fitted on the index in ``schema`` whose
    content a later sync changed is still in force, and its line says so."""
    found = stored(conn, history, corpus, key)
    if found is None:
        return InForce(None, None, f"{default_name(key)} (no calibrated rule stored for corpus {corpus}, embedder {key}: "
                                   f"the retrieval_rule asset or python -m retrieval_assets calibrate makes one)")
    rule, when = found
    if rule.kept_default:
        return InForce(rule, None, f"{default_name(key)}, kept by the calibration of {when} UTC ({rule.reason})")
    stale = bool(schema == rule.schema and rule.content and rule.content != content(conn, schema))
    return InForce(rule, applied(rule, base or default_for(key)), f"corpus {corpus}'s calibrated rule of {when} UTC, {rule.description} (held out "
                                              f"within its {rule.queries} queries: {rule.difference:+.3f} nDCG@10 over {default_name(key)})"
                   + ("; fitted before the index last changed: the retrieval_rule asset or calibrate fits it again" if stale else ""),
                   stale)


def for_search(conn: psycopg.Connection, history: str, corpus: str, key: str, base: RetrievalParams | None = None, *,
               ignore: bool = False, schema: str = "") -> tuple[RetrievalParams, str]:
    """The parameters a search of ``corpus`` with partition ``key`` runs with (``in_force``, or ``base`` when told to
    ``ignore`` the stored rule; None: the partition's default), and one line saying which rule they are."""
    base = base or default_for(key)
    if ignore:
        return base, f"retrieval rule: {default_name(key)} (a stored calibrated rule, if any, ignored)"
    found = in_force(conn, history, corpus, key, base, schema=schema)
    return found.params or base, f"retrieval rule: {found.line}"
