"""The query-dependent fusion weight (issue 37, ``params.evidence_shift``) held out, against the same run without it.

Run (from the project root; Cranfield is read in place, each partition indexed once as ``quality`` does):

    uv run python -m benchmarks adaptive_fusion --embedders hash minilm mpnet
    uv run python -m benchmarks adaptive_fusion --embedders hash minilm --full-rule   # the whole staged rule as well

Settings: Cranfield (225 queries, 5 folds) and the golden set (48 queries, 4 folds), each with every embedder. Rules,
every one fitted on training folds only: (a) ``params.DEFAULT`` with ``evidence_shift`` chosen among 0 and
``staged_rule.SHIFTS`` on training queries: of each setting alone (one dataset and embedder: what the
``retrieval_rule`` asset fits on a corpus's own judged queries), of both datasets for each embedder alone, and of both
datasets for all embedders jointly; against ``params.DEFAULT`` as it is, on the same queries. With ``--full-rule``,
(b) the whole staged rule without the feedback stages (``staged_rule.NO_FEEDBACK``, which offers ``evidence_stage``)
against the rule before it (``BEFORE_EVIDENCE``), fitted jointly. Reported: held-out nDCG@10 with a 95% bootstrap
interval, the golden set's conceptual queries apart, Cranfield against the bm25s peer, and each rule's paired
difference from its reference. Writes benchmarks/results/quality-adaptive-fusion.md (``--out``).
"""

from __future__ import annotations

import datetime as dt
import sys
import time

import numpy as np

from benchmarks import common
from benchmarks.guards.quality import scored
from retrieval_assets import pg
from retrieval_assets.corpus import datasets
from retrieval_assets.evaluation import crossval
from retrieval_assets.evaluation.staged_rule import BEFORE_EVIDENCE, NO_FEEDBACK, SHIFTS, config_of, describe
from retrieval_assets.params import DEFAULT

DEFAULT_CONFIG = config_of(DEFAULT)


def shifted(_current: crossval.Config) -> list[crossval.Config]:
    """``params.DEFAULT`` with each evidence_shift: the one-stage rule that fits the shift alone."""
    return [crossval.merged(DEFAULT_CONFIG, crossval.config(evidence_shift=s)) for s in (0.0, *SHIFTS)]


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD))
    parser.add_argument("--embedders", nargs="+", default=["hash", "minilm"])
    parser.add_argument("--full-rule", action="store_true", help="also the whole staged rule with and without evidence_stage")
    parser.add_argument("--out", default=str(common.RESULTS / "quality-adaptive-fusion.md"), help="Markdown report path ('-': print only)")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    peer, _, _, golden_set, scorers = scored(pg.connect(args.dsn), args.data, args.embedders, None, log)
    settings = [crossval.Setting(d, e, s.ndcg) for (d, e), s in scorers.items()]
    sizes = {"cranfield": len(peer), "golden": len(golden_set)}
    fold_sets = {"cranfield": crossval.folds(sizes["cranfield"], 5), "golden": crossval.folds(sizes["golden"], 4)}
    conceptual = np.array([q.kind == "conceptual" for q in golden_set])
    fixed = {id(s): crossval.HeldOut(s, s.score(DEFAULT_CONFIG), (DEFAULT_CONFIG,)) for s in settings}
    rows = []  # (setting, label, held out, reference label, reference)
    for s in settings:  # what a corpus's own retrieval rule does: its own judged queries only
        held = crossval.cross_validate([s], (shifted,), fold_sets, sizes)[s.embedder]
        rows.append((s, "evidence_shift fitted on this setting alone", held, "params.DEFAULT as it is", fixed[id(s)]))
    for label, fit_on in [(f"evidence_shift fitted for {e} alone (both datasets)", [s for s in settings if s.embedder == e])
                          for e in args.embedders] + [("evidence_shift fitted jointly (every embedder, both datasets)", settings)]:
        for d in sizes:
            for e, held in crossval.cross_validate(fit_on, (shifted,), fold_sets, sizes, held_out=d).items():
                rows.append((held.setting, label, held, "params.DEFAULT as it is", fixed[id(held.setting)]))
        log(f"{label}: done ({time.perf_counter() - started:.0f} s)")
    if args.full_rule:
        for d in sizes:
            before = crossval.cross_validate(settings, BEFORE_EVIDENCE, fold_sets, sizes, held_out=d)
            after = crossval.cross_validate(settings, NO_FEEDBACK, fold_sets, sizes, held_out=d)
            rows += [(h.setting, "staged rule with evidence_stage (NO_FEEDBACK), joint", h, "the staged rule before it (BEFORE_EVIDENCE)",
                      before[e]) for e, h in after.items()]
            log(f"full rule held out {d}: done ({time.perf_counter() - started:.0f} s)")

    def cell(scores: np.ndarray, s: crossval.Setting) -> str:
        lo, hi = crossval.bootstrap_interval(scores)
        ratio = f"{scores.mean() / peer.mean():.2f}" if s.dataset == "cranfield" else ""
        return f"{scores.mean():.3f} [{lo:.3f}, {hi:.3f}] | {ratio} | " + (f"{scores[conceptual].mean():.3f}" if s.dataset == "golden" else "")

    lines = ["| dataset | embedder | pipeline | nDCG@10 held out [95% CI] | / peer | conceptual | fold choices |", "|---|---|---|---:|---:|---:|---|",
             f"| cranfield | peer | bm25s (no fitting) | {peer.mean():.3f} [{crossval.bootstrap_interval(peer)[0]:.3f}, "
             f"{crossval.bootstrap_interval(peer)[1]:.3f}] | 1.00 | | |"]
    notes, shown = [], set()
    for s in sorted(settings, key=lambda s: (s.dataset, args.embedders.index(s.embedder))):
        for setting, label, held, ref_label, ref in (r for r in rows if r[0] is s):
            for name, h in ((ref_label, ref), (label, held)):
                if (id(s), name) not in shown:
                    shown.add((id(s), name))
                    lines.append(f"| {s.dataset} | {s.embedder} | {name} | {cell(h.scores, s)} | {'; '.join(sorted({describe(p) for p in h.picks}))} |")
            diff, lo, hi, wins, losses = common.paired_difference(held.scores, ref.scores)
            part = ""
            if s.dataset == "golden":
                cd, clo, chi, _, _ = common.paired_difference(held.scores[conceptual], ref.scores[conceptual])
                part = f"; conceptual {held.scores[conceptual].mean():.3f} vs {ref.scores[conceptual].mean():.3f}, {cd:+.3f} [{clo:+.3f}, {chi:+.3f}]"
            notes.append(f"- {s.dataset}/{s.embedder}, {label} against {ref_label}: {held.mean:.3f} vs {ref.mean:.3f}, paired difference "
                         f"{diff:+.3f} [{lo:+.3f}, {hi:+.3f}], better on {wins} queries, worse on {losses}{part}")
    text = "\n".join([
        "# The query-dependent fusion weight, cross-validated", "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {common.host_line()}; total run "
        f"{time.perf_counter() - started:.0f} s; code {common.code_version()}; load average {common.load_average()}.",
        f"Reproduce: `uv run python -m benchmarks adaptive_fusion --embedders {' '.join(args.embedders)}{' --full-rule' * args.full_rule}`.", "",
        "Folds: Cranfield 5 (225 queries), golden set 4 (48 queries, 16 conceptual), shuffled with seed 0; nDCG@10 (Cranfield: "
        "documents, a document at its best chunk; golden: chunks). Every figure in a rule's row is held out: each query scored "
        "by the choice made on the other folds (plus the other dataset). Intervals: 95% bootstrap, 10,000 resamples; paired "
        "differences: the same queries under both rules. `/ peer`: against bm25s on the same text, same run.", "",
        *lines, "", *notes, ""])
    common.write_report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
