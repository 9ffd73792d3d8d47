"""Retrieval quality by cross-validation: fusion, rerank and MMR chosen on training folds only.

Run (from the project root; Cranfield is read in place from ../shared/benchmarks/cranfield):

    uv run python -m benchmarks quality                  # hash and minilm, a few minutes once indexed
    uv run python -m benchmarks quality --embedders hash --out -

Settings: Cranfield as distributed (title + abstract as the file has them; 225 queries, 5
folds) and the fixture's golden set (48 queries, 4 folds), each with every embedder. The
candidates (``STAGES``): first stage = lexical list x fusion (RRF, min-max, z-score) x vector
weight 0..1; then the rerank stage (BM25 with the pool's or the corpus's idf, blended with the
fused score, weight 0.1..1); then MMR (lambda 0.5, 0.7, 0.9). Before the rerank stage, two
pseudo-relevance feedback stages: RM3 expansion of the BM25 list (``PRF_DOCS`` x ``PRF_TERMS`` x
``PRF_WEIGHTS``, the vector weight refitted within 0.1 of the first stage's) and Rocchio on the
query vector (``PRF_BETAS``). ``crossval.choose`` keeps a later stage only when it
raises the training nDCG@10 on every dataset. Reported: held-out nDCG@10 (mean over the
folds' held-out queries, 95% bootstrap interval), for (a) the rule fitted per setting and
(b) the rule fitted jointly on both datasets (the default: trained on the other folds of the
held-out dataset plus all of the other dataset), the bm25s peer computed in the same run, and
the unfitted seed pipeline; the default rule without the feedback stages is reported beside it
(same run, same folds: what the feedback stages change), and (c) that rule fitted for each embedder
alone on both datasets (would an embedder's own default do better?), with the golden set's held-out
recall@10 and nDCG@10 on its conceptual queries. ``--candidates`` (partitions or wheel models, ``index.wheel_models``)
are indexed and scored the same way but left out of every fit: held out under each fold's choice made without them
(every joint rule's row), calibrated on their own training queries as the product does, and under a rule of their
own; each embedder's speed and peak memory on the fixture's chunks are measured in a process of its own.
``--no-feedback`` fits only the rules without the feedback stages (what ``params.DEFAULT`` is), in a fraction of the
time; ``--no-sparse`` skips the rule with the SPLADE list. Nested in each outer fold, ``crossval.calibrate``
(``CALIBRATED``) fits a rule on the setting's own training queries and keeps it only when cross-validation inside
them shows it above that fold's default-rule choice, else that choice. The joint rule on all queries is printed at
the end (``params.DEFAULT`` is what an earlier run printed; docs/quality.md says why it was not moved since).
Writes benchmarks/results/quality.md (``--out``).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
import numpy as np

from benchmarks import common
from retrieval_assets import partitions, pg
from retrieval_assets.corpus import datasets, golden
from retrieval_assets.evaluation import benchmark, crossval
from retrieval_assets.evaluation.metrics import ndcg_at_k, recall_at_k
from retrieval_assets.evaluation.staged_rule import (ALPHAS, BEFORE_DOCUMENTS, BEFORE_EVIDENCE, NO_FEEDBACK, Scorer, config_of,
                                                     describe, document_stage, first_stages, mmr_stage, rerank_stage)
from retrieval_assets.params import DEFAULT, SEED
from retrieval_assets.index.splade import SpladeEncoder
from retrieval_assets.search import sparse

DEFAULT_OUT = common.RESULTS / "quality.md"

# RM3's grid. A first run on hash alone (5, 10, 20 docs; 10, 20, 40 terms; weights 0.3, 0.5, 0.7)
# picked 5 docs, 40 terms and 0.7 on Cranfield's training folds, at the grid's edge: 3 docs and
# weight 0.9 were added and 20 docs dropped.
PRF_DOCS = (3, 5, 10)  # feedback chunks (Cranfield: a document is one chunk or a few)
PRF_TERMS = (10, 20, 40)
PRF_WEIGHTS = (0.3, 0.5, 0.7, 0.9)
PRF_BETAS = (0.25, 0.5, 1.0)


def near(alpha: float) -> list[tuple[float, float]]:
    """Fusion weights within 0.1 of vector weight ``alpha``."""
    return [(a, round(1 - a, 1)) for a in sorted({round(alpha + d, 1) for d in (-0.1, 0.0, 0.1)}) if 0 <= a <= 1]


def rm3_stage(current: crossval.Config) -> list[crossval.Config]:
    v = dict(current)
    if v.get("lexical") != "bm25":
        return []
    return [crossval.config(prf_docs=d, prf_terms=t, prf_weight=w, weights=ws)
            for d in PRF_DOCS for t in PRF_TERMS for w in PRF_WEIGHTS for ws in near(v["weights"][0])]


def rocchio_stage(current: crossval.Config) -> list[crossval.Config]:
    v = dict(current)
    if v["weights"][0] == 0:
        return []
    docs = [v["prf_docs"]] if v.get("prf_docs") else PRF_DOCS
    off = {} if v.get("prf_docs") else {"prf_weight": 0.0}  # Rocchio alone: the BM25 list as it was
    return [crossval.config(prf_docs=d, prf_beta=beta, **off) for d in docs for beta in PRF_BETAS]


def score_rerank_stage(current: crossval.Config) -> list[crossval.Config]:
    """The rerank stage before rank fusion: the reranker's scores blended with the fused scores only."""
    return rerank_stage(current, ("minmax",))


def sparse_stage(_current: crossval.Config) -> list[crossval.Config]:
    return [crossval.config(sparse_weight=w) for w in ALPHAS[1:]]


STAGES = (first_stages, rm3_stage, rocchio_stage, rerank_stage, document_stage, mmr_stage)
WITH_SPARSE = (first_stages, sparse_stage, rerank_stage, document_stage, mmr_stage)  # the SPLADE list as a third fused list
# for comparison: the first stage alone, and the no-feedback rule with the rerank stage it had before rank fusion
# (stages, what a later stage must raise: every dataset's training mean, the default rule's, or every setting's)
RULES = {"first stage alone (joint rule)": ((first_stages,), "dataset"),
         "joint rule before issue 37: score-blend rerank only": ((first_stages, score_rerank_stage, mmr_stage), "dataset"),
         "joint rule, a stage kept only when it helps every setting, no feedback stages": (NO_FEEDBACK, "setting"),
         "joint rule before the query-dependent fusion weight (evidence_shift), no feedback stages": (BEFORE_EVIDENCE, "dataset"),
         "joint rule with the SPLADE list, no feedback stages": (WITH_SPARSE, "dataset"),
         "default rule before document evidence, no feedback stages": (BEFORE_DOCUMENTS, "dataset"),
         "default rule, params.DEFAULT kept unless clearly beaten, no feedback stages": (NO_FEEDBACK, "dataset", "prior"),
         "every setting, params.DEFAULT kept unless clearly beaten, no feedback stages": (NO_FEEDBACK, "setting", "prior")}
CALIBRATED = ("calibrated on the corpus's own queries, else the default rule (crossval.calibrate), no feedback stages", NO_FEEDBACK), \
    ("calibrated on the corpus's own queries, SPLADE list offered, else the default rule", WITH_SPARSE)
SEED_CONFIG = config_of(SEED)
DEFAULT_CONFIG = config_of(DEFAULT)  # params.DEFAULT as it is, no fitting
FIXED = {"hybrid(bm25) RRF 1:1, no rerank (no fitting)": crossval.config(lexical="bm25", fusion="rrf", weights=(0.5, 0.5), rerank=False,
                                                                          mmr_lambda=None),
         "params.DEFAULT as committed": DEFAULT_CONFIG}


def golden_as_is(scorer: Scorer, conceptual: np.ndarray, doc: dict[str, str]) -> str:
    """nDCG@10 on the golden set under ``params.DEFAULT`` as it is and of its vector list alone: all queries (conceptual);
    with and without its rerank, by chunk and by document (``doc``: chunk_id -> doc_id; a document at its best chunk)."""
    final = scorer.ndcg(DEFAULT_CONFIG)
    params = scorer.base.with_(**dict(DEFAULT_CONFIG))
    vector = np.array([ndcg_at_k([h.chunk_id for h in scorer.trace(i, params).vector][:10], rel, 10) for i, rel in enumerate(scorer.relevant)])
    plain = crossval.merged(DEFAULT_CONFIG, crossval.config(rerank=False))
    by_doc = [np.mean([ndcg_at_k(benchmark.to_documents(scorer.ranked(c, i), doc, 10), {doc[r] for r in rel}, 10)
                       for i, rel in enumerate(scorer.relevant)]) for c in (plain, DEFAULT_CONFIG)]
    return (f"under params.DEFAULT as it is (not fitted), nDCG@10 {final.mean():.3f} ({final[conceptual].mean():.3f} on the "
            f"conceptual queries); its vector list alone {vector.mean():.3f} ({vector[conceptual].mean():.3f}); without its rerank "
            f"{scorer.ndcg(plain).mean():.3f}; by document (a document at its best chunk) {by_doc[0]:.3f} without the rerank, {by_doc[1]:.3f} with it")


DEFAULT_EMBEDDERS = ["hash", "minilm"]  # the rule params.DEFAULT came from is fitted jointly on these


def scored(conn, data: str, keys: list[str], splade: SpladeEncoder | None, log):
    """Cranfield (``data``) and the golden set indexed with each partition in ``keys`` (a re-run embeds nothing): the bm25s
    peer's per-query nDCG@10 and recall@100 on Cranfield, the fixture's chunks, the golden set and a ``Scorer`` per (dataset, key)."""
    bench = datasets.load_cranfield(data)
    rel = bench.relevant()
    qids = [q for q in bench.queries if q in rel]
    peer_rank = benchmark.bm25s_ranker(bench.documents, depth=100)
    peer_runs = [peer_rank(bench.queries[q]) for q in qids]
    peer_ndcg = np.array([ndcg_at_k(r, rel[q], 10) for r, q in zip(peer_runs, qids)])
    peer_recall = np.array([recall_at_k(r, rel[q], 100) for r, q in zip(peer_runs, qids)])
    _, fixture_chunks, golden_set = common.fixture()
    scorers: dict[tuple[str, str], Scorer] = {}
    synced = lambda schema: "" if splade is None else f"; SPLADE (encoded, deleted): {sparse.sync(conn, schema, splade)}"  # noqa: E731
    for key in keys:
        embedder = common.embedder(key)
        schema = partitions.schema_name(key, "cranfield")
        chunks, report = benchmark.index_benchmark(conn, schema, bench, embedder)
        log(f"cranfield/{key}: {len(chunks)} chunks in {schema} ({report}){synced(schema)}")
        scorers["cranfield", key] = Scorer(conn, schema, embedder, chunks, [bench.queries[q] for q in qids], [rel[q] for q in qids],
                                           benchmark.CRANFIELD, splade=splade, chunk_doc={c.chunk_id: c.doc_id for c in chunks})
        gschema = common.bench_schema("quality", key)
        log(f"golden/{key}: {common.index(conn, gschema, fixture_chunks, embedder)} in {gschema}{synced(gschema)}")
        grel = golden.relevant_sets(conn, gschema, golden_set)
        scorers["golden", key] = Scorer(conn, gschema, embedder, fixture_chunks, [q.query for q in golden_set],
                                        [grel[q.query_id] for q in golden_set], SEED.with_(k=10, n=50), splade=splade)
    return peer_ndcg, peer_recall, fixture_chunks, golden_set, scorers


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD))
    parser.add_argument("--embedders", nargs="+", default=DEFAULT_EMBEDDERS, help="partitions the default rule is fitted on")
    parser.add_argument("--candidates", nargs="*", default=[], help="partitions or wheel models (index.wheel_models) scored held "
                        "out under the default rule's fold choices and under their own rule; never part of a fit")
    parser.add_argument("--cranfield-folds", type=int, default=5)
    parser.add_argument("--golden-folds", type=int, default=4)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown report path ('-': print only)")
    parser.add_argument("--no-feedback", action="store_true", help="fit only the rules without the feedback stages (RM3, "
                        "Rocchio): the rows with them are left out, the run takes a fraction of the time")
    parser.add_argument("--no-sparse", action="store_true", help="skip the rule with the SPLADE list and the SPLADE sync")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()

    conn = pg.connect(args.dsn)
    splade = None if args.no_sparse else SpladeEncoder()
    keys = [*args.embedders, *args.candidates]
    peer_ndcg, peer_recall, fixture_chunks, golden_set, scorers = scored(conn, args.data, keys, splade, log)
    settings: list[crossval.Setting] = []
    for (dataset, key), scorer in scorers.items():
        settings.append(crossval.Setting(dataset, key, scorer.ndcg))
    fit_on = [s for s in settings if s.embedder in args.embedders]
    sizes = {"cranfield": len(peer_ndcg), "golden": len(golden_set)}
    fold_sets = {"cranfield": crossval.folds(sizes["cranfield"], args.cranfield_folds),
                 "golden": crossval.folds(sizes["golden"], args.golden_folds)}

    lines = []
    rows = []  # (setting, label, held-out scores)
    for s in fit_on:
        for label, stages in (("fitted on this setting", STAGES), ("fitted on this setting, no feedback stages", NO_FEEDBACK))[args.no_feedback:]:
            t = time.perf_counter()
            own = crossval.cross_validate([s], stages, fold_sets, sizes)[s.embedder]
            log(f"{s.dataset}/{s.embedder}: {label}: CV {own.mean:.3f} in {time.perf_counter() - t:.0f} s")
            rows.append((s, label, own))
    before: dict = {}
    joint = before if args.no_feedback else {}
    for dataset in ("cranfield", "golden"):
        t = time.perf_counter()
        if not args.no_feedback:
            joint.update({(dataset, e): h for e, h in crossval.cross_validate(fit_on, STAGES, fold_sets, sizes, held_out=dataset).items()})
        before.update({(dataset, e): h for e, h in crossval.cross_validate(fit_on, NO_FEEDBACK, fold_sets, sizes, held_out=dataset).items()})
        log(f"joint CV held out {dataset} in {time.perf_counter() - t:.0f} s")
    candidates = [s for s in settings if s.embedder not in args.embedders]

    def under(s: crossval.Setting, picks) -> crossval.HeldOut:  # a candidate under each fold's choice, made without it
        scores = np.zeros(sizes[s.dataset])
        for test, pick in zip(fold_sets[s.dataset], picks):
            scores[test] = s.score(pick)[test]
        return crossval.HeldOut(s, scores, tuple(picks))

    for s in candidates:
        for rule in (joint, before):
            rule[s.dataset, s.embedder] = under(s, rule[s.dataset, args.embedders[0]].picks)
    for s, (label, stages) in ((s, c) for s in settings for c in CALIBRATED[: 2 - args.no_sparse]):  # nested: inside each outer fold
        scores, picks = np.zeros(sizes[s.dataset]), []
        for test, default in zip(fold_sets[s.dataset], before[s.dataset, s.embedder].picks):
            picks.append(crossval.calibrate(s, stages, default, np.setdiff1d(np.arange(sizes[s.dataset]), test)))
            scores[test] = s.score(picks[-1])[test]
        rows.append((s, label, crossval.HeldOut(s, scores, tuple(picks))))
        log(f"{s.dataset}/{s.embedder}: {label}: {scores.mean():.3f}")
    alone = {}  # the rule fitted per embedder on both datasets: does a default of its own help an embedder?
    for e in keys:
        mine = [s for s in settings if s.embedder == e]
        for dataset in ("cranfield", "golden"):
            alone.update({(dataset, e): crossval.cross_validate(mine, NO_FEEDBACK, fold_sets, sizes, held_out=dataset)[e]})
    for label, (stages, every, *prior) in RULES.items():
        if args.no_sparse and stages is WITH_SPARSE:
            continue
        for dataset in ("cranfield", "golden"):
            for e, held in crossval.cross_validate(fit_on, stages, fold_sets, sizes, held_out=dataset, every=every,
                                                   prior=DEFAULT_CONFIG if prior else None).items():
                rows.append((next(s for s in settings if (s.dataset, s.embedder) == (dataset, e)), label, held))
                rows += [(c, label, under(c, held.picks)) for c in candidates if c.dataset == dataset and e == args.embedders[0]]
        log(f"{label}: done")
    for s in settings:
        rows.append((s, "default rule, no feedback stages", before[s.dataset, s.embedder]))
        if not args.no_feedback:
            rows.append((s, "default rule (fitted on both datasets)", joint[s.dataset, s.embedder]))
        rows.append((s, "rule of this embedder alone (both datasets), no feedback stages", alone[s.dataset, s.embedder]))
    everything = {d: np.arange(n) for d, n in sizes.items()}
    default_before = crossval.choose(fit_on, NO_FEEDBACK, everything)
    default = default_before if args.no_feedback else crossval.choose(fit_on, STAGES, everything)
    with_sparse = None if args.no_sparse else describe(crossval.choose(fit_on, WITH_SPARSE, everything))
    log(f"default (joint rule on all queries): {describe(default)}; without the feedback stages: {describe(default_before)}; "
        f"with the SPLADE list: {with_sparse}")

    header = "| dataset | embedder | pipeline | nDCG@10 held out [95% CI] | / peer | fold choices |"
    lines += [header, "|---|---|---|---:|---:|---|"]
    if "cranfield" in sizes:
        lo, hi = crossval.bootstrap_interval(peer_ndcg)
        lines.append(f"| cranfield | peer | bm25s (no fitting) | {peer_ndcg.mean():.3f} [{lo:.3f}, {hi:.3f}] | 1.00 | |")
    summary = []
    for s in settings:
        seed = s.score(SEED_CONFIG)
        lo, hi = crossval.bootstrap_interval(seed)
        ratio = lambda v: f"{v.mean() / peer_ndcg.mean():.2f}" if s.dataset == "cranfield" else ""  # noqa: E731
        lines.append(f"| {s.dataset} | {s.embedder} | seed (no fitting): {describe(SEED_CONFIG)} | {seed.mean():.3f} [{lo:.3f}, {hi:.3f}] | {ratio(seed)} | |")
        for label, cfg in FIXED.items():
            fixed_scores = s.score(cfg)
            lo, hi = crossval.bootstrap_interval(fixed_scores)
            lines.append(f"| {s.dataset} | {s.embedder} | {label}: {describe(cfg)} | {fixed_scores.mean():.3f} [{lo:.3f}, {hi:.3f}] | "
                         f"{ratio(fixed_scores)} | |")
        for label, held in [(label, h) for (t, label, h) in rows if t is s]:
            lo, hi = held.interval
            picks = "; ".join(sorted({describe(p) for p in held.picks}))
            lines.append(f"| {s.dataset} | {s.embedder} | {label} | {held.mean:.3f} [{lo:.3f}, {hi:.3f}] | {ratio(held.scores)} | {picks} |")
        fixed = s.score(default)
        summary.append(f"- {s.dataset}/{s.embedder}: the default on all queries {fixed.mean():.3f} (in-sample, for reference only)")

    notes = []
    for e in keys:
        held = joint["cranfield", e]
        diff, lo, hi, wins, losses = common.paired_difference(held.scores, peer_ndcg)
        notes.append(f"- cranfield/{e}, default rule held out: {held.mean:.3f} = {held.mean / peer_ndcg.mean():.2f}x the peer's "
                     f"{peer_ndcg.mean():.3f}; paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}], better on {wins} queries, worse on {losses}")
    for s in [] if args.no_feedback else fit_on:
        for label, fitted in (("default rule", (joint, before)),
                              ("fitted on this setting", ({(s.dataset, s.embedder): h for t, lab, h in rows if t is s and lab == "fitted on this setting"},
                                                          {(s.dataset, s.embedder): h for t, lab, h in rows
                                                           if t is s and lab == "fitted on this setting, no feedback stages"}))):
            after_h, before_h = fitted[0][s.dataset, s.embedder], fitted[1][s.dataset, s.embedder]
            diff, lo, hi, wins, losses = common.paired_difference(after_h.scores, before_h.scores)
            notes.append(f"- {s.dataset}/{s.embedder}, {label} with the feedback stages against without: {after_h.mean:.3f} vs "
                         f"{before_h.mean:.3f}, paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}], better on {wins} queries, worse on {losses}")
    conceptual = np.array([q.kind == "conceptual" for q in golden_set])
    by_label = {(s.dataset, s.embedder, label): h for s, label, h in rows}
    for s in fit_on:  # what the document-evidence stage changes, same run, same folds
        new, old = before[s.dataset, s.embedder].scores, by_label[s.dataset, s.embedder, "default rule before document evidence, no feedback stages"].scores
        diff, lo, hi, wins, losses = common.paired_difference(new, old)
        notes.append(f"- {s.dataset}/{s.embedder}, default rule with the document-evidence stage against before it: {new.mean():.3f} vs "
                     f"{old.mean():.3f}, paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}], better on {wins} queries, worse on {losses}")
    for e in args.embedders:
        for label in ("default rule, no feedback stages", *RULES, *(label for label, _ in CALIBRATED)):
            if ("golden", e, label) not in by_label:
                continue
            h, c = by_label["golden", e, label], by_label["cranfield", e, label]
            diff, lo, hi, wins, losses = common.paired_difference(c.scores, peer_ndcg)
            notes.append(f"- {e}, {label}: golden nDCG@10 held out {h.mean:.3f}, conceptual queries {h.scores[conceptual].mean():.3f}; "
                         f"cranfield {c.mean:.3f} = {c.mean / peer_ndcg.mean():.2f}x the peer, paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    for label, rule in (("default rule, no feedback stages", before), ("rule of this embedder alone", alone)):
        for e in keys:
            scorer, recall10 = scorers["golden", e], np.zeros(len(golden_set))
            for test, pick in zip(fold_sets["golden"], rule["golden", e].picks):
                recall10[test] = [recall_at_k(scorer.ranked(pick, i), scorer.relevant[i], 10) for i in test]
            notes.append(f"- golden/{e}, {label}: recall@10 held out {recall10.mean():.3f}, conceptual queries "
                         f"{recall10[conceptual].mean():.3f} ({conceptual.sum()} queries); nDCG@10 held out on the conceptual "
                         f"queries {rule['golden', e].scores[conceptual].mean():.3f}")
    notes += [f"- golden/{e}: {golden_as_is(scorers['golden', e], conceptual, {c.chunk_id: c.doc_id for c in fixture_chunks})}" for e in keys]
    for e in keys:
        rec = scorers["cranfield", e].recall(default, 100)
        notes.append(f"- cranfield/{e}: recall@100 of the default pipeline {rec.mean():.3f} against the peer's {peer_recall.mean():.3f}")
    for e in keys:
        load_s, rate, peak = common.embed_profile(e, [c.text for c in fixture_chunks])
        notes.append(f"- {e} ({scorers['golden', e].embedder.name}): the fixture's {len(fixture_chunks)} chunks at {rate:.1f} texts/s "
                     f"after {load_s:.1f} s to load and embed one, peak memory {peak:.0f} MB (own process; load average {common.load_average()})")
    text = "\n".join([
        "# Retrieval quality, cross-validated",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {common.host_line()}; total run "
        f"{time.perf_counter() - started:.0f} s; code {common.code_version()}.",
        f"Reproduce: `uv run python -m benchmarks quality{' --no-feedback' * args.no_feedback}{' --no-sparse' * args.no_sparse}"
        f"{'' if args.embedders == DEFAULT_EMBEDDERS else ' --embedders ' + ' '.join(args.embedders)}"
        f"{''.join(' --candidates ' + ' '.join(args.candidates) for _ in args.candidates[:1])}`.",
        "",
        *([f"Candidates (`--candidates`, never part of a fit): {', '.join(args.candidates)}; their `default rule` rows use each "
           "fold's choice made without them."] if args.candidates else []),
        f"Folds: Cranfield {args.cranfield_folds} ({sizes['cranfield']} queries, distributed text), golden set "
        f"{args.golden_folds} ({sizes['golden']} queries), shuffled with seed 0. nDCG@10 (Cranfield: documents, a document at "
        "its best chunk; golden: chunks). Intervals: 95% bootstrap of the held-out mean, 10,000 resamples. "
        "`/ peer`: against bm25s (k1 1.2, b 0.75, English stop words, PyStemmer) on the same text, same run.",
        "",
        *lines,
        "",
        *notes,
        "",
        f"Default pipeline (the joint rule on every query of both datasets): **{describe(default)}** "
        f"(without the feedback stages: {describe(default_before)}; with the SPLADE list, no feedback stages: {with_sparse})."
        + (" Run with --no-feedback: the rules with the feedback stages were not fitted." if args.no_feedback else ""),
        *summary,
        "",
    ])
    common.write_report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
