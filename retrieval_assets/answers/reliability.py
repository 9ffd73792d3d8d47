"""A calibration's reliability for people: one Markdown paragraph and a PNG plot.

Contract: ``summary(calibration)`` says which model answers (the corpus's own or the cross-corpus default,
and why), its threshold, and the held-out answer and refusal rates (or that the corpus cannot separate);
``plot(calibration, path)`` draws, with matplotlib's Agg backend, the held-out support of the answerable and
the off-corpus questions as two histograms with the threshold, and the reliability diagram (the share of
answerable questions among those whose support falls in each tenth, against the support), and writes a PNG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from retrieval_assets.answers.calibration import Calibration
from retrieval_assets.evaluation import trend


def summary(calibration: Calibration) -> str:
    c = calibration
    rates = (f"held out, it answers {c.answer_rate:.0%} of {c.answerable} answerable questions and refuses {c.refusal_rate:.1%} "
             f"of {c.off_corpus} off-corpus questions" if c.answer_rate is not None else
             f"it refuses {c.refusal_rate:.1%} of {c.off_corpus} off-corpus questions here; no answerable questions to measure its answer rate")
    model = "the corpus's own support model" if c.source == "corpus" else "the cross-corpus default support model"
    return f"Answers use {model} (threshold {c.model.threshold:.2f}): {c.note}. For that calibration, {rates}."


def plot(calibration: Calibration, path: str | Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    answerable = np.asarray(calibration.held_out.get("answerable", []), dtype=float)
    off = np.asarray(calibration.held_out.get("off_corpus", []), dtype=float)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    bins = np.linspace(0, 1, 21)
    left.hist(off, bins=bins, alpha=0.6, label=f"off-corpus ({len(off)})", color="tab:red")
    if len(answerable):
        left.hist(answerable, bins=bins, alpha=0.6, label=f"answerable ({len(answerable)})", color="tab:green")
    left.axvline(calibration.model.threshold, color="black", linestyle="--", label=f"threshold {calibration.model.threshold:.2f}")
    left.set_xlabel("held-out support")
    left.set_ylabel("questions")
    left.legend(fontsize=8)
    scores = np.r_[answerable, off]
    labels = np.r_[np.ones(len(answerable)), np.zeros(len(off))]
    tenth = np.minimum((scores * 10).astype(int), 9)
    centres = [(tenth == b).any() and scores[tenth == b].mean() for b in range(10)]
    observed = [(tenth == b).any() and labels[tenth == b].mean() for b in range(10)]
    kept = [b for b in range(10) if (tenth == b).any()]
    right.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfectly calibrated")
    right.plot([centres[b] for b in kept], [observed[b] for b in kept], marker="o", label="observed")
    right.set_xlabel("held-out support (mean per tenth)")
    right.set_ylabel("share answerable")
    right.set_xlim(0, 1)
    right.set_ylim(-0.02, 1.02)
    right.legend(fontsize=8)
    fig.suptitle(title or f"support calibration ({calibration.source})")
    return trend.save(fig, path)
