"""Drafted golden sets against hand-written ones: do they rank pipeline configurations alike?

Run (from the project root; Cranfield is read in place from ../shared/benchmarks/cranfield):

    uv run python -m benchmarks drafted                    # fixture and Cranfield, hash and minilm
    uv run python -m benchmarks drafted --cranfield-docs 300 --out -

The offline drafter (``corpus.drafting.draft``, ``--per-doc`` queries a document) drafts a set
for the fixture corpus and one for Cranfield's abstracts. Every configuration of embedder (hash,
minilm) x lexical list (ts_rank_cd, bm25) x fusion (rrf, minmax, zscore) x rerank (none, the
default's BM25 rerank), 24 in all, the default's weights, no MMR, is scored by nDCG@10 on the
drafted set and on the hand-written queries (the fixture's golden.yaml, chunks relevant by
anchor; Cranfield's 225 judged queries, documents relevant by qrels, a document at its best
chunk; a drafted Cranfield query's one relevant document is the one it was drafted from).
Reported: Kendall's tau-b between the two rankings of the configurations, with a 95% bootstrap
interval (queries of both sets resampled, 2,000 times), and per kind (drafted kind against the
same kind of golden.yaml; against all 225 queries on Cranfield, which has no kinds), against all
hand-written queries and against each half of them: the drafter's changes after its first version
were judged on the development half (even positions), never on the held-out half (odd positions).
As a reference, tau between the two halves of the hand-written queries: how far hand-written
queries agree with each other. Writes benchmarks/results/drafted.md.
"""

from __future__ import annotations

import datetime as dt
import sys
import time

import numpy as np

from benchmarks import common
from retrieval_assets import partitions
from retrieval_assets.corpus import datasets, drafting, golden
from retrieval_assets.evaluation import benchmark, crossval
from retrieval_assets.evaluation.staged_rule import Scorer
from retrieval_assets.params import DEFAULT, FUSION, LEXICAL
from retrieval_assets.types import GoldenQuery

DEFAULT_OUT = common.RESULTS / "drafted.md"
RERANK = {"none": crossval.config(rerank=False), "bm25": crossval.config(rerank=True, rerank_weight=DEFAULT.rerank_weight,
                                                                         rerank_idf=DEFAULT.rerank_idf)}
CONFIGS = [(e, crossval.merged(crossval.config(lexical=lex, fusion=f, weights=DEFAULT.weights, mmr_lambda=None), r), f"{e} {lex} {f} rerank:{rn}")
           for e in ("hash", "minilm") for lex in LEXICAL for f in FUSION for rn, r in RERANK.items()]


def matrix(scorers: dict, configs=CONFIGS) -> np.ndarray:
    """Per-query nDCG@10, configurations x queries."""
    return np.array([scorers[e].ndcg(cfg) for e, cfg, _ in configs])


def tau_interval(a: np.ndarray, b: np.ndarray, resamples: int = 2000) -> tuple[float, float, float]:
    """Kendall tau-b between the configurations' mean scores on ``a`` and on ``b`` (configs x queries), 95% bootstrap."""
    from scipy.stats import kendalltau

    rng = np.random.default_rng(0)
    taus = [kendalltau(a[:, rng.integers(0, a.shape[1], a.shape[1])].mean(1), b[:, rng.integers(0, b.shape[1], b.shape[1])].mean(1))[0]
            for _ in range(resamples)]
    return float(kendalltau(a.mean(1), b.mean(1))[0]), float(np.nanquantile(taus, 0.025)), float(np.nanquantile(taus, 0.975))


def compare(name: str, drafted: np.ndarray, kinds: np.ndarray, hand: np.ndarray, hand_kinds: np.ndarray | None) -> list[str]:
    """Rows of tau: all queries and per kind, against all hand-written queries and against each half."""
    half = np.arange(hand.shape[1]) % 2  # 0: the development half (even positions), 1: the held-out half
    lines = []
    for label in ("all", *golden.KINDS):
        mine = kinds == label if label != "all" else np.ones(len(kinds), bool)
        theirs = hand_kinds == label if label != "all" and hand_kinds is not None else np.ones(hand.shape[1], bool)
        if mine.any() and theirs.any():
            cells = ["{:.3f} [{:.3f}, {:.3f}]".format(*tau_interval(drafted[:, mine], hand[:, theirs & (half == h) if h >= 0 else theirs]))
                     for h in (-1, 0, 1)]
            lines.append(f"| {name} | {label} | {mine.sum()} | {theirs.sum()} | {' | '.join(cells)} |")
    split = "{:.3f} [{:.3f}, {:.3f}]".format(*tau_interval(hand[:, half == 0], hand[:, half == 1]))
    return lines + [f"| {name} | reference: the hand-written halves against each other | | {hand.shape[1]} | {split} | | |"]


def table(name: str, drafted: np.ndarray, hand: np.ndarray) -> list[str]:
    order = np.argsort(-hand.mean(1), kind="stable")
    lines = [f"| {name}: configuration | nDCG@10 hand-written | rank | nDCG@10 drafted | rank |", "|---|---:|---:|---:|---:|"]
    drank = {c: r for r, c in enumerate(np.argsort(-drafted.mean(1), kind="stable"), 1)}
    return lines + [f"| {CONFIGS[c][2]} | {hand[c].mean():.3f} | {r} | {drafted[c].mean():.3f} | {drank[c]} |" for r, c in enumerate(order, 1)]


def as_golden(items) -> list[GoldenQuery]:
    return [GoldenQuery(i.query_id, i.kind, i.query, i.doc_id, i.anchor) for i in items]


def measure(args, log) -> dict:
    """Per dataset: the drafted set, the hand-written kinds (None: Cranfield) and both nDCG matrices."""
    started = time.perf_counter()
    documents, chunks, golden_set = common.fixture()
    fixture_draft = drafting.draft(documents, chunks, per_doc=args.per_doc)
    log(f"fixture: {len(fixture_draft.items)} drafted queries {fixture_draft.counts()} in {time.perf_counter() - started:.0f} s")
    bench = datasets.load_cranfield(args.data)
    rel = bench.relevant()
    qids = [q for q in bench.queries if q in rel]
    step = len(bench.documents) / min(args.cranfield_docs, len(bench.documents))
    drafted_from = [bench.documents[int(i * step)] for i in range(min(args.cranfield_docs, len(bench.documents)))]
    cran_chunks = benchmark.chunk_documents(bench.documents)
    t = time.perf_counter()
    cran_draft = drafting.draft(drafted_from, cran_chunks, per_doc=1)  # the vocabulary of all abstracts
    log(f"cranfield: {len(cran_draft.items)} drafted queries {cran_draft.counts()} in {time.perf_counter() - t:.0f} s")

    sets = {"fixture": {}, "cranfield": {}}
    conn = common.connect(args.dsn)
    chunk_doc = {c.chunk_id: c.doc_id for c in cran_chunks}
    for key in ("hash", "minilm"):
        embedder = partitions.embedder(key)
        schema = common.bench_schema("drafted", key)
        log(f"fixture/{key}: {common.index(conn, schema, chunks, embedder)} in {schema}")
        fixture_base = DEFAULT.with_(k=10, n=50)
        for label, queries in (("hand", golden_set), ("drafted", as_golden(fixture_draft.items))):
            rels = golden.relevant_sets(conn, schema, queries)
            sets["fixture"].setdefault(label, {})[key] = Scorer(conn, schema, embedder, chunks, [q.query for q in queries],
                                                               [rels[q.query_id] for q in queries], fixture_base)
        cschema = partitions.schema_name(key, "cranfield")
        _, report = benchmark.index_benchmark(conn, cschema, bench, embedder)
        log(f"cranfield/{key}: {report} in {cschema}")
        cran_base = DEFAULT.with_(k=100, n=100)
        for label, texts, relevant in (("hand", [bench.queries[q] for q in qids], [rel[q] for q in qids]),
                                       ("drafted", [i.query for i in cran_draft.items], [{i.doc_id} for i in cran_draft.items])):
            sets["cranfield"].setdefault(label, {})[key] = Scorer(conn, cschema, embedder, cran_chunks, texts, relevant, cran_base,
                                                                 chunk_doc=chunk_doc)
    out = {}
    for name, draft_set, hand_kinds in (("fixture", fixture_draft, np.array([q.kind for q in golden_set])), ("cranfield", cran_draft, None)):
        t = time.perf_counter()
        out[name] = (draft_set, hand_kinds, matrix(sets[name]["hand"]), matrix(sets[name]["drafted"]))
        log(f"{name}: {len(CONFIGS)} configurations scored in {time.perf_counter() - t:.0f} s")
    out["cranfield_docs"] = len(drafted_from)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD))
    parser.add_argument("--per-doc", type=int, default=3, help="drafted queries per fixture document")
    parser.add_argument("--cranfield-docs", type=int, default=600, help="Cranfield documents drafted from (one query each, evenly spread)")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="Markdown report path ('-': print only)")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    found = measure(args, log)
    lines, tables = [], []
    for name in ("fixture", "cranfield"):
        draft_set, hand_kinds, hand, drafted = found[name]
        lines += compare(name, drafted, np.array([i.kind for i in draft_set.items]), hand, hand_kinds)
        tables += ["", *table(name, drafted, hand)]
    fixture_draft, cran_draft = found["fixture"][0], found["cranfield"][0]
    text = "\n".join([
        "# Drafted golden sets against hand-written ones",
        "",
        f"Measured {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC on {common.host_line()}; total run "
        f"{time.perf_counter() - started:.0f} s; code {common.code_version()}.",
        f"Reproduce: `uv run python -m benchmarks drafted` (--per-doc {args.per_doc}, --cranfield-docs {args.cranfield_docs}).",
        "",
        f"{len(CONFIGS)} configurations (embedder x lexical list x fusion x rerank, weights vector {DEFAULT.weights[0]:g} / lexical "
        f"{DEFAULT.weights[1]:g}, no MMR), nDCG@10. Drafted by the offline drafter: fixture {len(fixture_draft.items)} queries "
        f"{fixture_draft.counts()}, dropped {dict(fixture_draft.dropped)}; Cranfield {len(cran_draft.items)} queries "
        f"{cran_draft.counts()} from {found['cranfield_docs']} abstracts, dropped {dict(cran_draft.dropped)}.",
        "Tau: Kendall's tau-b between the rankings of the configurations by the drafted set and by the hand-written queries; "
        "[95% bootstrap interval], both query sets resampled 2,000 times. Goal: tau >= 0.7. The drafter's changes after its "
        "first version were judged against the development half of the hand-written queries (even positions in golden.yaml "
        "and in Cranfield's judged queries); the held-out half (odd positions) never decided anything.",
        "",
        "| corpus | kind | drafted queries | hand-written queries | tau, all [95% CI] | tau, development half | tau, held-out half |",
        "|---|---|---:|---:|---:|---:|---:|",
        *lines,
        *tables,
        "",
    ])
    common.write_report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
