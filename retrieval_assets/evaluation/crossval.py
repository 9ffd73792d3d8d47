"""Choosing pipeline parameters by k-fold cross-validation over queries.

Contract: a *setting* is one (dataset, embedder) pair with a function ``config -> per-query
scores`` (one float per query, the same query order every call; scores are memoised per
config). ``choose`` applies the staged rule on training queries: the first stage takes its
best candidate, and each later stage is kept only when its best candidate raises the mean
training score on every dataset. ``cross_validate`` runs the rule once per fold, scores the
held-out queries with the fold's choice, and reports their mean with a bootstrap interval:
no reported figure comes from parameters fitted on the queries it is measured on. ``calibrated`` keeps one
corpus's own rule only where cross-validation within its queries shows it above a default (``Calibrated``: the
choice, why, and the inner held-out scores); ``calibrate`` is its choice alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

Config = tuple[tuple[str, object], ...]  # sorted (parameter, value) pairs


def config(**values) -> Config:
    return tuple(sorted(values.items()))


def merged(base: Config, change: Config) -> Config:
    return config(**{**dict(base), **dict(change)})


def folds(n: int, k: int, *, seed: int = 0) -> list[np.ndarray]:
    """``k`` disjoint, shuffled index arrays covering ``range(n)`` (``k == n``: leave-one-out)."""
    if not 2 <= k <= n:
        raise ValueError(f"folds: k must be within [2, {n}] for {n} queries, got {k}")
    order = np.random.default_rng(seed).permutation(n)
    return [np.sort(part) for part in np.array_split(order, k)]


def bootstrap_interval(*groups: np.ndarray, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean over ``groups`` of each group's mean, each group resampled on its
    own (a stratified bootstrap; one group: the plain bootstrap of its mean)."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    means = np.mean([a[rng.integers(0, len(a), size=(resamples, len(a)))].mean(axis=1) for a in arrays], axis=0)
    return float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


@dataclass
class Setting:
    """One dataset scored with one embedder: ``score(config)`` gives a float per query (memoised)."""

    dataset: str
    embedder: str
    score_fn: Callable[[Config], np.ndarray] = field(repr=False)
    _cache: dict[Config, np.ndarray] = field(default_factory=dict, repr=False)

    def score(self, cfg: Config) -> np.ndarray:
        if cfg not in self._cache:
            self._cache[cfg] = np.asarray(self.score_fn(cfg), dtype=np.float64)
        return self._cache[cfg]


def choose(settings: Sequence[Setting], stages: Sequence[Callable[[Config], Sequence[Config]]],
           train: Mapping[str, np.ndarray], *, every: str = "dataset", prior: Config | None = None) -> Config:
    """The staged rule on the training queries (``train``: index array per dataset).

    ``stages[0]`` lists first-stage candidates (it receives an empty config); each later stage
    lists changes to the current choice, of which only those raising the training mean of every
    dataset (``every="dataset"``, the mean over its settings: the rule params.DEFAULT came from) or of
    every setting (``every="setting"``: each embedder on each dataset, so a later stage never trades one
    embedder's loss for another's gain) qualify, and the best of them is kept (none qualifying: the stage is skipped). The
    objective is the mean over datasets of the mean over that dataset's settings of the training mean. ``prior`` (the
    committed default): kept unless the rule's choice beats it clearly (``clearly_better``), so that near-equal
    settings do not flip from fold to fold.
    """
    if every not in ("setting", "dataset"):
        raise ValueError(f"every must be 'setting' or 'dataset', got {every!r}")
    datasets = sorted({s.dataset for s in settings})

    def per_dataset(cfg: Config) -> dict[str, float]:
        return {d: float(np.mean([s.score(cfg)[train[d]].mean() for s in settings if s.dataset == d])) for d in datasets}

    def objective(cfg: Config) -> float:
        return float(np.mean(list(per_dataset(cfg).values())))

    def guarded(cfg: Config) -> list[float]:  # the training means a later stage must raise
        if every == "dataset":
            return list(per_dataset(cfg).values())
        return [float(s.score(cfg)[train[s.dataset]].mean()) for s in settings]

    current = max(stages[0](config()), key=objective)
    for stage in stages[1:]:
        now = guarded(current)
        helping = [c for c in (merged(current, change) for change in stage(current))
                   if all(score > before for score, before in zip(guarded(c), now))]
        if helping:
            current = max(helping, key=objective)
    if prior is not None and current != prior and not clearly_better(settings, current, prior, train):
        return prior
    return current


def clearly_better(settings: Sequence[Setting], cfg: Config, prior: Config, train: Mapping[str, np.ndarray], *,
                   resamples: int = 10_000, seed: int = 0) -> bool:
    """Whether ``cfg``'s training gain over ``prior`` has its 95% bootstrap interval above 0: the gain is the mean over
    datasets of the mean paired per-query difference (over that dataset's settings), each dataset's queries resampled
    on their own. The bar ``calibrated`` sets a corpus's own rule, not a margin tuned on any scores."""
    diffs = [np.mean([s.score(cfg)[train[d]] - s.score(prior)[train[d]] for s in settings if s.dataset == d], axis=0)
             for d in sorted({s.dataset for s in settings})]
    return bootstrap_interval(*diffs, resamples=resamples, seed=seed)[0] > 0


@dataclass(frozen=True)
class HeldOut:
    """Held-out scores of one setting under a cross-validated rule."""

    setting: Setting
    scores: np.ndarray  # per query, each from its fold's choice
    picks: tuple[Config, ...]  # the choice of each fold

    @property
    def mean(self) -> float:
        return float(self.scores.mean())

    @property
    def interval(self) -> tuple[float, float]:
        return bootstrap_interval(self.scores)


def cross_validate(settings: Sequence[Setting], stages: Sequence[Callable[[Config], Sequence[Config]]],
                   fold_sets: Mapping[str, Sequence[np.ndarray]], sizes: Mapping[str, int], *,
                   held_out: str | None = None, every: str = "dataset", prior: Config | None = None) -> dict[str, HeldOut]:
    """Per setting of the ``held_out`` dataset (default: the only dataset), the held-out scores of the rule.

    For fold i of that dataset the rule trains on its other folds plus every query of the other
    datasets, and the fold's queries are scored with the choice (``every``, ``prior``: as ``choose``).
    """
    datasets = sorted({s.dataset for s in settings})
    target = held_out or (datasets[0] if len(datasets) == 1 else None)
    if target is None:
        raise ValueError(f"held_out must name one of the datasets: {', '.join(datasets)}")
    mine = [s for s in settings if s.dataset == target]
    scores = {s.embedder: np.zeros(sizes[target]) for s in mine}
    picks = []
    for test in fold_sets[target]:
        train = {d: np.arange(sizes[d]) for d in datasets}
        train[target] = np.setdiff1d(np.arange(sizes[target]), test)
        pick = choose(settings, stages, train, every=every, prior=prior)
        picks.append(pick)
        for s in mine:
            scores[s.embedder][test] = s.score(pick)[test]
    return {s.embedder: HeldOut(s, scores[s.embedder], tuple(picks)) for s in mine}


@dataclass(frozen=True)
class Calibrated:
    """What ``calibrated`` found on one corpus: the rule it keeps, and the inner cross-validation behind it."""

    choice: Config  # the corpus's own rule, or the default
    default: Config
    queries: int
    reason: str  # why the choice (one sentence)
    own: np.ndarray | None = None  # per query, held out: the own rule refitted without that query's inner fold (None: untried)
    base: np.ndarray | None = None  # per query, the default's score
    difference: tuple[float, float, float] | None = None  # mean held-out paired difference (own - base), its 95% bootstrap interval

    @property
    def kept_default(self) -> bool:
        return self.choice == self.default


def calibrated(setting: Setting, stages: Sequence[Callable[[Config], Sequence[Config]]], default: Config,
               queries: np.ndarray, *, k: int = 5, min_queries: int = 20) -> Calibrated:
    """The rule fitted on one corpus's own ``queries`` (indices into ``setting``'s scores), or ``default``.

    The corpus's own choice (``choose`` on ``queries`` alone) replaces ``default`` only when it earns it there:
    ``k``-fold cross-validation within ``queries`` scores both on each fold's held-out queries (the own rule
    refitted without them), and the 95% bootstrap interval of the paired difference must lie above 0. With
    fewer than ``min_queries`` queries the answer is ``default``, untried.
    """
    queries = np.asarray(queries)
    least = max(min_queries, 2 * k)
    if len(queries) < least:
        return Calibrated(default, default, len(queries), f"{len(queries)} judged queries, fewer than {least}: the default, untried")
    own, base = np.zeros(len(queries)), setting.score(default)[queries]
    for test in folds(len(queries), k):
        pick = choose([setting], stages, {setting.dataset: queries[np.setdiff1d(np.arange(len(queries)), test)]})
        own[test] = setting.score(pick)[queries[test]]
    low, high = bootstrap_interval(own - base)  # the one bootstrap: the decision and the reported interval
    difference = (float((own - base).mean()), low, high)
    if low <= 0:
        return Calibrated(default, default, len(queries), f"the own rule is not above the default held out ({k}-fold CV within "
                          f"{len(queries)} queries, the 95% interval of the paired difference starts at {low:+.4f}, not above 0)",
                          own, base, difference)
    choice = choose([setting], stages, {setting.dataset: queries})
    return Calibrated(choice, default, len(queries), f"the own rule is above the default held out ({k}-fold CV within "
                      f"{len(queries)} queries, the 95% interval of the paired difference starts at {low:+.4f}, above 0)",
                      own, base, difference)


def calibrate(setting: Setting, stages: Sequence[Callable[[Config], Sequence[Config]]], default: Config,
              queries: np.ndarray, *, k: int = 5, min_queries: int = 20) -> Config:
    """``calibrated(...).choice``: the corpus's own rule where it earns it, else ``default``."""
    return calibrated(setting, stages, default, queries, k=k, min_queries=min_queries).choice
