"""Our BM25 list against the bm25s peer on Cranfield, factor by factor: tokens, documents or chunks, k1 and b.

Run (from the project root; Cranfield read in place from ../shared/benchmarks/cranfield), about a minute with hash:

    uv run python -m benchmarks bm25_gap                    # writes benchmarks/results/bm25-gap.md
    uv run python -m benchmarks bm25_gap --out -

Every row is one token rule scored by the same BM25 (Lucene's idf, k1 1.2, b 0.75, in numpy; the "as searched"
row is ``bm25_rank.bm25_search`` itself, the peer row ``benchmark.bm25s_ranker``): Postgres's ``english`` lexemes
as they were before ``index.lexeme_rule`` and under it, under it without the hyphenated whole words, and the
peer's tokens (``\\w\\w+``, Lucene's 33 stop words, PyStemmer) with its stop words or Postgres's. Units:
Cranfield's whole documents, its chunks (our chunker; a document at its best chunk) and the fixture's chunks
(golden set). Query terms are the query's words under the rule (no operators). "default pipeline" columns:
``params.DEFAULT`` as committed (not refitted) with its BM25 list replaced by the row's (vector list, fusion
and rerank unchanged; hash embedder). Last, k1 and b of today's rule chosen by cross-validation for the default
pipeline (each fold chosen on the other folds plus the other dataset), held out.
"""

from __future__ import annotations

import re
import sys
from collections import Counter

import numpy as np

from benchmarks import common
from retrieval_assets import partitions, pg
from retrieval_assets.corpus import datasets, golden
from retrieval_assets.evaluation import benchmark, crossval, staged_rule
from retrieval_assets.evaluation.metrics import ndcg_at_k
from retrieval_assets.index import lexeme_rule
from retrieval_assets.params import DEFAULT
from retrieval_assets.search import bm25_rank, pipeline
from retrieval_assets.types import Hit

COMPOUNDS = {"asciihword", "hword", "numhword"}  # Postgres's hyphenated whole words (their parts come after them)
GRID = [(k1, b) for k1 in (0.9, 1.2, 1.5, 2.0) for b in (0.6, 0.75, 0.9, 1.0)]


def debug(conn, texts: list[str], rule: bool) -> list[list[tuple[str, list[str]]]]:
    """(token type, lexemes) of every token of every text, from ts_debug (under lexeme_rule's text when ``rule``)."""
    text = lexeme_rule.parsed("t.x") if rule else "t.x"
    rows = conn.execute(f"SELECT t.i, d.alias, d.lexemes FROM unnest(%s::text[]) WITH ORDINALITY AS t(x, i), "
                        f"ts_debug('{lexeme_rule.CONFIG}', {text}) AS d WHERE d.lexemes <> '{{}}'", (texts,)).fetchall()
    out: list[list] = [[] for _ in texts]
    for i, alias, lexemes in rows:
        out[i - 1].append((alias, lexemes))
    return out


def rules(conn):
    """Token rule name -> function(texts) -> token lists."""
    import bm25s
    import Stemmer

    stem = Stemmer.Stemmer("english")
    peer = lambda texts, stop="en": bm25s.tokenize(texts, stopwords=stop, stemmer=stem, return_ids=False, show_progress=False)  # noqa: E731
    lexemes = lambda rule, skip=(): lambda texts: [[x for a, ls in d if a not in skip for x in ls] for d in debug(conn, texts, rule)]  # noqa: E731
    return {"Postgres lexemes before lexeme_rule": lexemes(False), "Postgres lexemes under lexeme_rule (today)": lexemes(True),
            "under lexeme_rule, hyphenated whole words left out": lexemes(True, COMPOUNDS),
            "bm25s tokens: \\w\\w+, Lucene's 33 stop words, PyStemmer (the peer's)": peer,
            "bm25s tokens with Postgres's stop words": lambda texts: peer(texts, stopwords_of(conn, texts))}


def stopwords_of(conn, texts: list[str]) -> list[str]:
    """The words of ``texts`` Postgres's english dictionary drops as stop words."""
    vocab = sorted({w for t in texts for w in re.findall(r"(?u)\b\w\w+\b", t.lower())})
    return [w for (w,) in conn.execute("SELECT w FROM unnest(%s::text[]) w WHERE ts_lexize('english_stem', w) = '{}'", (vocab,)).fetchall()]


class Scorer:
    """BM25 (Lucene's idf) over token lists: scores of every unit for a query's terms."""

    def __init__(self, units: list[list[str]]):
        counts = [Counter(u) for u in units]
        self.lens = np.array([len(u) for u in units], dtype=float)
        self.df = Counter(t for c in counts for t in c)
        self.postings: dict[str, tuple] = {}
        for i, c in enumerate(counts):
            for t, f in c.items():
                self.postings.setdefault(t, ([], []))[0].append(i), self.postings[t][1].append(f)

    def scores(self, terms, k1=1.2, b=0.75) -> np.ndarray:
        out, n, avg = np.zeros(len(self.lens)), len(self.lens), self.lens.mean()
        for t in dict.fromkeys(terms):
            if t in self.postings:
                ids, tf = np.array(self.postings[t][0]), np.array(self.postings[t][1], dtype=float)
                out[ids] += np.log1p((n - self.df[t] + 0.5) / (self.df[t] + 0.5)) * tf / (tf + k1 * (1 - b + b * self.lens[ids] / avg))
        return out


class Setting:
    """One dataset's chunk table, queries and judgements, and the default pipeline's traces (hash)."""

    def __init__(self, conn, schema, chunks, queries, relevant, base, chunk_doc=None):
        self.conn, self.chunks, self.queries, self.relevant, self.chunk_doc = conn, chunks, queries, relevant, chunk_doc
        self.ids = [c.chunk_id for c in chunks]
        self.params = staged_rule.params_of(staged_rule.config_of(DEFAULT), base)  # the default's rule fields, base's k, n and limits
        self.retriever = pipeline.retriever(conn, schema, common.embedder("hash"), self.params)
        self.traces = [pipeline.run(conn, self.retriever, q, self.params) for q in queries]
        self.rows: dict = {}

    def ndcg(self, ranked: list[list[str]]) -> np.ndarray:
        docs = [benchmark.to_documents(r, self.chunk_doc, 100) for r in ranked] if self.chunk_doc else ranked
        return np.array([ndcg_at_k(r, rel, 10) for r, rel in zip(docs, self.relevant)])

    def lists(self, scorer: Scorer, terms, k1=1.2, b=0.75) -> list[list[Hit]]:
        out = []
        for q in terms:
            s = scorer.scores(q, k1, b)
            order = np.lexsort((self.ids, -s))[: self.params.n]  # ties by chunk_id, as bm25_search
            out.append([Hit(self.ids[i], float(s[i]), r) for r, i in enumerate(order, 1) if s[i] > 0])
        return out

    def pipeline(self, lists: list[list[Hit]]) -> np.ndarray:
        """nDCG@10 of the default pipeline with each query's BM25 list replaced by ``lists``."""
        return self.ndcg([[r.chunk_id for r in pipeline.run(self.conn, self.retriever, q, self.params, rows=self.rows,
                                                             first_stage=pipeline.Trace(t.query_vector, t.vector, text, [], [], [])).final]
                          for q, t, text in zip(self.queries, self.traces, lists)])


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--data", default=str(datasets.DEFAULT_CRANFIELD))
    parser.add_argument("--out", default=str(common.RESULTS / "bm25-gap.md"), help="Markdown report path ('-': print only)")
    args = parser.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    bench = datasets.load_cranfield(args.data)
    rel = bench.relevant()
    qids = [q for q in bench.queries if q in rel]
    conn = pg.connect(args.dsn)
    embedder = common.embedder("hash")
    chunks, _ = benchmark.index_benchmark(conn, partitions.schema_name("hash", "cranfield"), bench, embedder)
    _, fixture_chunks, golden_set = common.fixture()
    gschema = common.bench_schema("bm25_gap")
    common.index(conn, gschema, fixture_chunks, embedder)
    grel = golden.relevant_sets(conn, gschema, golden_set)
    cran = Setting(conn, partitions.schema_name("hash", "cranfield"), chunks, [bench.queries[q] for q in qids], [rel[q] for q in qids],
                   benchmark.CRANFIELD, {c.chunk_id: c.doc_id for c in chunks})
    gold = Setting(conn, gschema, fixture_chunks, [q.query for q in golden_set], [grel[q.query_id] for q in golden_set],
                   benchmark.SEED.with_(k=10, n=50))
    docs = [d.doc_id for d in bench.documents]
    peer = benchmark.bm25s_ranker(bench.documents)
    as_searched = [[h.chunk_id for h in bm25_rank.bm25_search(conn, s.retriever.schema, q, s.params.n)] for s in (cran, gold) for q in s.queries]
    lines = ["| token rule | Cranfield documents | Cranfield chunks | golden chunks | Cranfield default pipeline | golden default pipeline |",
             "|---|---:|---:|---:|---:|---:|",
             f"| bm25s itself (the peer) | {np.mean([ndcg_at_k(peer(q), r, 10) for q, r in zip(cran.queries, cran.relevant)]):.4f} | | | | |",
             f"| ours as searched: bm25_rank.bm25_search (query operators read) | | {cran.ndcg(as_searched[:len(cran.queries)]).mean():.4f} "
             f"| {gold.ndcg(as_searched[len(cran.queries):]).mean():.4f} | {cran.ndcg([[r.chunk_id for r in t.final] for t in cran.traces]).mean():.4f} "
             f"| {gold.ndcg([[r.chunk_id for r in t.final] for t in gold.traces]).mean():.4f} |"]
    for name, tokens in rules(conn).items():
        doc_scorer = Scorer(tokens([d.text for d in bench.documents]))
        whole = [[docs[i] for i in np.argsort(-s, kind="stable")[:100] if s[i] > 0] for s in (doc_scorer.scores(t) for t in tokens(cran.queries))]
        cells = [np.mean([ndcg_at_k(r, rel, 10) for r, rel in zip(whole, cran.relevant)])]
        lists = {s: s.lists(Scorer(tokens([c.text for c in s.chunks])), tokens(s.queries)) for s in (cran, gold)}
        cells += [s.ndcg([[h.chunk_id for h in x] for x in lists[s]]).mean() for s in (cran, gold)]
        cells += [s.pipeline(lists[s]).mean() for s in (cran, gold)]
        lines.append(f"| {name} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
        log(lines[-1])
    # k1 and b of today's rule for the default pipeline, by cross-validation over both datasets
    tokens = rules(conn)["Postgres lexemes under lexeme_rule (today)"]
    scored = {}
    for s in (cran, gold):
        scorer, terms = Scorer(tokens([c.text for c in s.chunks])), tokens(s.queries)
        scored[s] = {g: s.pipeline(s.lists(scorer, terms, *g)) for g in GRID}
    held = []
    for s, other, k in ((cran, gold, 5), (gold, cran, 4)):
        out, picks = np.zeros(len(s.queries)), []
        for test in crossval.folds(len(s.queries), k):
            train = np.setdiff1d(np.arange(len(s.queries)), test)
            picks.append(max(GRID, key=lambda g: scored[s][g][train].mean() + scored[other][g].mean()))
            out[test] = scored[s][picks[-1]][test]
        held.append(f"{'Cranfield' if s is cran else 'golden'} {out.mean():.4f} held out against {scored[s][1.2, 0.75].mean():.4f} "
                    f"at k1 1.2, b 0.75 (fold choices {', '.join(f'{k1:g}/{b:g}' for k1, b in picks)})")
    text = "\n".join([
        "# Our BM25 list against the bm25s peer, factor by factor", "",
        f"Measured {common.machine()['date']} on {common.host_line()}; code {common.code_version()}.",
        "Reproduce: `uv run python -m benchmarks bm25_gap`. nDCG@10 over every query (Cranfield 225, golden 48); "
        "BM25 k1 1.2, b 0.75 unless said.", "", *lines, "",
        "k1 and b for the default pipeline (today's rule), chosen by cross-validation on the grid k1 0.9..2.0 x b 0.6..1.0 "
        "(Cranfield 5 folds, golden 4, seed 0; each fold's choice made on the other folds plus the other dataset): " + "; ".join(held) + ".", ""])
    common.write_report(text, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
