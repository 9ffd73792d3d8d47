"""External benchmarks: the Cranfield SMART files, any BEIR folder, and their evaluation.

Contract:
- ``load_cranfield(data_dir)`` and ``load_beir(folder, split="test")`` return a ``Benchmark``
  of plain types: ``documents`` (``types.Document``, text = title + abstract as Markdown),
  ``queries`` ``{qid: text}`` and ``qrels`` ``{qid: {doc_id: grade}}``. A missing file raises
  ``DatasetError`` naming the expected path; malformed lines name file and line.
- Cranfield's trap: ``cran.qry`` numbers its queries ``.I 001, 002, 004, 008, ...`` while
  ``cranqrel`` numbers them by position in that file, 1..225. Query ids here are the
  positions (as the qrels use them); the ``.I`` labels are kept in ``Benchmark.labels``.
- Cranfield grades: code 1..4 is relevant with gain ``5 - code`` (4..1); ``-1`` ("no interest",
  one line a query) is kept as grade 0, judged and not relevant. ``relevant()`` is the binary
  reading: every doc with grade > 0.
- Evaluation: a ranker is ``query text -> ranked doc ids``; ``pipeline_rankers`` gives ours
  (vector, the lexical list, hybrid RRF, + BM25 rerank, + MMR) for either lexical list of
  ``hybrid`` (``ts_rank_cd`` or ``bm25`` inside Postgres) over a chunk table, mapping chunk hits
  to documents by first occurrence (a document ranks where its best chunk ranks);
  ``bm25s_ranker`` is the peer baseline; ``evaluate_rankers`` scores any dict of rankers with
  ``metrics.ndcg_at_k``, ``metrics.recall_at_k`` and ``metrics.mrr`` (MRR over the whole list,
  i.e. to ``depth``); ``trec_eval_check`` recomputes the same numbers with pytrec_eval.
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from retrieval_assets import chunker, hybrid, metrics, rerank, store
from retrieval_assets.embed import CachedEmbedder, Embedder
from retrieval_assets.types import Chunk, Document

CRANFIELD_FILES = ("cran.all.1400", "cran.qry", "cranqrel")
# Where the project reads Cranfield from: $CRANFIELD_DIR, else ../shared/benchmarks/cranfield
# relative to the project root (it is never copied into the repository).
DEFAULT_CRANFIELD = Path(os.environ.get("CRANFIELD_DIR") or Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "cranfield")

Ranker = Callable[[str], Sequence[str]]


class DatasetError(ValueError):
    """A benchmark file that is missing or malformed; the message names the path (and line)."""


@dataclass(frozen=True)
class Benchmark:
    name: str
    documents: list[Document]
    queries: dict[str, str]  # qid -> query text
    qrels: dict[str, dict[str, int]]  # qid -> doc_id -> grade (0 = judged not relevant)
    labels: dict[str, str] = field(default_factory=dict)  # qid -> the id the source file prints

    def relevant(self, min_grade: int = 1) -> dict[str, set[str]]:
        """Binary relevance: ``{qid: docs with grade >= min_grade}`` for queries that have any."""
        out = {qid: {d for d, g in judged.items() if g >= min_grade} for qid, judged in self.qrels.items()}
        return {qid: docs for qid, docs in out.items() if docs}

    def subset(self, doc_ids: Iterable[str] | None = None, qids: Iterable[str] | None = None) -> Benchmark:
        """A smaller benchmark (tests, quick runs): qrels are cut to the kept documents and queries."""
        keep_docs = set(doc_ids) if doc_ids is not None else {d.doc_id for d in self.documents}
        keep_q = set(qids) if qids is not None else set(self.queries)
        qrels = {q: {d: g for d, g in j.items() if d in keep_docs} for q, j in self.qrels.items() if q in keep_q}
        return Benchmark(
            self.name,
            [d for d in self.documents if d.doc_id in keep_docs],
            {q: t for q, t in self.queries.items() if q in keep_q},
            {q: j for q, j in qrels.items() if j},
            {q: label for q, label in self.labels.items() if q in keep_q},
        )


def document_text(title: str, body: str) -> str:
    """Title + body as one Markdown document: ``# title``, a blank line, then the body."""
    title, body = " ".join(title.split()), body.strip()
    if title and body:
        return f"# {title}\n\n{body}"
    return f"# {title}" if title else body


def _read(path: Path, what: str) -> str:
    if not path.is_file():
        raise DatasetError(f"{what} not found: expected {path}")
    try:
        return path.read_bytes().decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


# --- Cranfield (SMART format) -------------------------------------------------------------

_MARKER = re.compile(r"^\.([A-Z])(?:\s+(\S+))?\s*$")


def _smart_records(text: str, path: Path) -> list[tuple[str, int, dict[str, list[str]]]]:
    """``[(id, line_no, {field: lines})]``; a field marker seen again appends to the field.

    Once ``.W`` (the last field) has begun, a stray ``.A``/``.B``/``.T`` line is body text that
    lost its context (three Cranfield abstracts, 240, 576, 578, carry such lines): the marker
    line is dropped and what follows stays in ``.W`` rather than moving into the authors.
    """
    records: list[tuple[str, int, dict[str, list[str]]]] = []
    current: str | None = None
    for line_no, line in enumerate(text.splitlines(), 1):
        m = _MARKER.match(line)
        if m and m.group(1) == "I":
            if not m.group(2):
                raise DatasetError(f"{path}:{line_no}: '.I' without an id")
            records.append((m.group(2), line_no, {}))
            current = None
            continue
        if m and m.group(2) is None:
            if not records:
                raise DatasetError(f"{path}:{line_no}: field .{m.group(1)} before the first .I")
            fields = records[-1][2]
            if current != "W":
                current = m.group(1)
                fields.setdefault(current, [])
            continue
        if current is None:
            if line.strip():
                if not records:
                    raise DatasetError(f"{path}:{line_no}: text before the first .I")
                raise DatasetError(f"{path}:{line_no}: text outside a field in record .I {records[-1][0]}")
            continue
        records[-1][2][current].append(line)
    return records


def _words(text: str) -> list[str]:
    return text.split()


def _strip_repeated_title(lines: list[str], title: str) -> list[str]:
    """Cranfield's ``.W`` repeats the title on its first line(s): drop those lines when they match."""
    want, seen = _words(title), []
    for i, line in enumerate(lines):
        seen.extend(_words(line))
        if seen == want:
            return lines[i + 1 :]
        if len(seen) >= len(want) or want[: len(seen)] != seen:
            break
    return lines


def _paragraphs(lines: list[str]) -> str:
    """SMART abstracts mark a paragraph by indenting its first line (two or more spaces)."""
    paragraphs: list[list[str]] = []
    for line in lines:
        if not line.strip():
            continue
        if not paragraphs or line.startswith("  "):
            paragraphs.append([])
        paragraphs[-1].append(line.strip())
    return "\n\n".join(" ".join(p) for p in paragraphs)


def load_cranfield(data_dir: str | Path = DEFAULT_CRANFIELD) -> Benchmark:
    """Cranfield 1400: documents from ``cran.all.1400``, queries by position in ``cran.qry``, qrels."""
    root = Path(data_dir)
    if not root.is_dir():
        raise DatasetError(
            f"Cranfield data directory not found: expected {root} holding {', '.join(CRANFIELD_FILES)}"
        )
    doc_path, qry_path, rel_path = (root / name for name in CRANFIELD_FILES)

    documents: list[Document] = []
    seen_docs: set[str] = set()
    for doc_id, line_no, fields in _smart_records(_read(doc_path, "Cranfield documents"), doc_path):
        if doc_id in seen_docs:
            raise DatasetError(f"{doc_path}:{line_no}: duplicate document .I {doc_id}")
        seen_docs.add(doc_id)
        title = " ".join(_words(" ".join(fields.get("T", []))))
        body = _paragraphs(_strip_repeated_title(fields.get("W", []), title))
        documents.append(Document(doc_id=doc_id, title=title, text=document_text(title, body)))

    queries: dict[str, str] = {}
    labels: dict[str, str] = {}
    for position, (label, line_no, fields) in enumerate(_smart_records(_read(qry_path, "Cranfield queries"), qry_path), 1):
        text = " ".join(_words(" ".join(fields.get("W", []))))
        if not text:
            raise DatasetError(f"{qry_path}:{line_no}: query .I {label} has no .W text")
        qid = str(position)  # the qrels number queries 1..225 by position, not by .I
        queries[qid], labels[qid] = text, label

    qrels: dict[str, dict[str, int]] = {}
    for line_no, line in enumerate(_read(rel_path, "Cranfield relevance judgements").splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3:
            raise DatasetError(f"{rel_path}:{line_no}: expected 'query_position doc_id code', got {line.strip()!r}")
        qid, doc_id, code = parts
        if qid not in queries:
            raise DatasetError(f"{rel_path}:{line_no}: query position {qid} is not in {qry_path.name} (1..{len(queries)})")
        if doc_id not in seen_docs:
            raise DatasetError(f"{rel_path}:{line_no}: document {doc_id} is not in {doc_path.name}")
        try:
            code_n = int(code)
        except ValueError:
            raise DatasetError(f"{rel_path}:{line_no}: relevance code {code!r} is not an integer") from None
        if code_n not in (-1, 1, 2, 3, 4, 5):
            raise DatasetError(f"{rel_path}:{line_no}: relevance code {code_n} is not -1 or 1..5")
        grade = 5 - code_n if 1 <= code_n <= 4 else 0
        judged = qrels.setdefault(qid, {})
        judged[doc_id] = max(grade, judged.get(doc_id, 0))
    return Benchmark("cranfield", documents, queries, qrels, labels)


# --- BEIR folders ---------------------------------------------------------------------------


def _jsonl(path: Path, what: str) -> Iterable[tuple[int, dict]]:
    for line_no, line in enumerate(_read(path, what).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "_id" not in row:
            raise DatasetError(f"{path}:{line_no}: expected an object with '_id'")
        yield line_no, row


def load_beir(folder: str | Path, split: str = "test", name: str | None = None) -> Benchmark:
    """A BEIR dataset folder: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.

    Only the queries judged in ``split`` are kept. Qrels rows naming a document absent from the
    corpus are kept (BEIR's own evaluation counts them as unretrievable relevant documents).
    """
    root = Path(folder)
    if not root.is_dir():
        raise DatasetError(f"BEIR dataset folder not found: expected {root} holding corpus.jsonl, queries.jsonl, qrels/{split}.tsv")
    corpus_path, queries_path, qrels_path = root / "corpus.jsonl", root / "queries.jsonl", root / "qrels" / f"{split}.tsv"
    for path in (corpus_path, queries_path, qrels_path):
        if not path.is_file():
            raise DatasetError(f"BEIR file not found: expected {path}")

    documents, seen = [], set()
    for line_no, row in _jsonl(corpus_path, "BEIR corpus"):
        doc_id = str(row["_id"])
        if doc_id in seen:
            raise DatasetError(f"{corpus_path}:{line_no}: duplicate document _id {doc_id}")
        seen.add(doc_id)
        title = str(row.get("title") or "")
        documents.append(Document(doc_id=doc_id, title=" ".join(title.split()), text=document_text(title, str(row.get("text") or ""))))

    all_queries = {str(row["_id"]): " ".join(str(row.get("text") or "").split()) for _, row in _jsonl(queries_path, "BEIR queries")}

    qrels: dict[str, dict[str, int]] = {}
    for line_no, line in enumerate(_read(qrels_path, "BEIR qrels").splitlines(), 1):
        parts = line.rstrip("\n").split("\t") if "\t" in line else line.split()
        if not parts or not line.strip():
            continue
        if line_no == 1 and parts[0] in ("query-id", "query_id", "qid"):
            continue  # header
        if len(parts) != 3:
            raise DatasetError(f"{qrels_path}:{line_no}: expected 'query-id<TAB>corpus-id<TAB>score', got {line.strip()!r}")
        qid, doc_id, score = (p.strip() for p in parts)
        if qid not in all_queries:
            raise DatasetError(f"{qrels_path}:{line_no}: query {qid} is not in {queries_path.name}")
        try:
            grade = int(float(score))
        except ValueError:
            raise DatasetError(f"{qrels_path}:{line_no}: score {score!r} is not a number") from None
        qrels.setdefault(qid, {})[doc_id] = grade
    queries = {qid: all_queries[qid] for qid in qrels}
    return Benchmark(name or root.name, documents, queries, qrels)


# --- evaluation -------------------------------------------------------------------------------


def chunk_documents(documents: Sequence[Document], *, max_chars: int = 1200, overlap: int = 1) -> list[Chunk]:
    return [c for d in documents for c in chunker.chunk(d, max_chars=max_chars, overlap=overlap)]


def index_benchmark(conn, bench: Benchmark, embedder: Embedder, *, max_chars: int = 1200, overlap: int = 1) -> tuple[list[Chunk], store.SyncReport]:
    """Chunk and ``store.sync`` the benchmark's documents into the connection's current schema.

    Returns ``(chunks, sync report)``. Re-running re-embeds nothing that is stored.
    """
    chunks = chunk_documents(bench.documents, max_chars=max_chars, overlap=overlap)
    store.Schema.create(conn, embedder.dims)
    report = store.sync(conn, chunks, embedder)
    return chunks, report


def to_documents(chunk_ids: Iterable[str], chunk_doc: Mapping[str, str], depth: int) -> list[str]:
    """Chunk ranking -> document ranking: each document at its first (best) chunk, up to ``depth``."""
    out: list[str] = []
    seen: set[str] = set()
    for cid in chunk_ids:
        doc = chunk_doc.get(cid)
        if doc is not None and doc not in seen:
            seen.add(doc)
            out.append(doc)
            if len(out) == depth:
                break
    return out


def pipeline_names(lexical: str = "ts_rank_cd", *, vector: bool = True) -> list[str]:
    """The ranker names ``pipeline_rankers`` returns, in order."""
    hybrid_name = f"hybrid({lexical})"
    return [*(["vector"] if vector else []), lexical, hybrid_name, f"{hybrid_name} + rerank", f"{hybrid_name} + rerank + MMR"]


def pipeline_rankers(conn, embedder: Embedder, chunks: Sequence[Chunk], *, lexical: str = "ts_rank_cd",
                     corpus_idf: bool | None = None, n: int = 300, depth: int = 100, mmr_lambda: float = 0.7,
                     vector: bool = True) -> dict[str, Ranker]:
    """Our rankers for one lexical list, all read from one ``rerank.trace`` per query (cached).

    Names (``pipeline_names``): ``vector``, the lexical list alone (``ts_rank_cd`` or ``bm25``,
    i.e. ``hybrid.lexical_search``), ``hybrid(<lexical>)`` (RRF of the two), ``+ rerank`` (the
    BM25 ``LexicalReranker`` over the whole fused pool) and ``+ rerank + MMR`` (``mmr_lambda``,
    over the whole reranked pool). The reranker's idf comes from the pool, or from every chunk
    with ``corpus_idf`` (default: only with ``lexical="bm25"``, the pairing ``eval_run`` uses).
    ``n`` chunks are taken from each first-stage list and from the fused pool; every list is
    then mapped to documents and cut at ``depth``.
    """
    chunk_doc = {c.chunk_id: c.doc_id for c in chunks}
    use_corpus = lexical == "bm25" if corpus_idf is None else corpus_idf
    stats = rerank.CorpusStats.from_texts([c.text for c in chunks]) if use_corpus else None
    reranker = rerank.LexicalReranker(corpus=stats)
    embedder = CachedEmbedder(embedder)  # each query embedded once for the vector list and MMR

    @functools.lru_cache(maxsize=1)
    def traced(query: str) -> rerank.Trace:
        return rerank.trace(conn, embedder, reranker, query, n=n, top_k=n, mmr_lambda=mmr_lambda, lexical=lexical)

    def ranker(stage: str) -> Ranker:
        return lambda query: to_documents((h.chunk_id for h in getattr(traced(query), stage)), chunk_doc, depth)

    stages = [*(["vector"] if vector else []), "text", "fused", "reranked", "final"]
    return dict(zip(pipeline_names(lexical, vector=vector), map(ranker, stages)))


def our_rankers(conn, embedder: Embedder, chunks: Sequence[Chunk], *, lexicals: Sequence[str] | None = None,
                **options) -> dict[str, Ranker]:
    """``pipeline_rankers`` for every lexical list of ``hybrid.LEXICAL`` (``vector`` once)."""
    out: dict[str, Ranker] = {}
    for i, lexical in enumerate(lexicals or tuple(hybrid.LEXICAL)):
        out.update(pipeline_rankers(conn, embedder, chunks, lexical=lexical, vector=i == 0, **options))
    return out


def bm25s_ranker(documents: Sequence[Document], *, k1: float = 1.2, b: float = 0.75, depth: int = 100) -> Ranker:
    """The peer baseline: bm25s (Lucene BM25) with English stop words and PyStemmer's English stemmer."""
    try:
        import bm25s
        import Stemmer
    except ImportError as exc:
        raise RuntimeError(f"the bm25s peer needs bm25s and PyStemmer (dev dependencies: `uv sync`): {exc}") from exc
    stemmer = Stemmer.Stemmer("english")
    ids = [d.doc_id for d in documents]
    tokens = bm25s.tokenize([d.text for d in documents], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(tokens, show_progress=False)
    vocab = model.vocab_dict
    limit = min(depth, len(ids))

    def rank(query: str) -> list[str]:
        q = bm25s.tokenize([query], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)[0]
        if not any(t in vocab for t in q) or limit == 0:
            return []
        found, scores = model.retrieve([q], k=limit, show_progress=False, n_threads=1)
        return [ids[i] for i, s in zip(found[0], scores[0]) if s > 0]

    return rank


@dataclass(frozen=True)
class RankerScores:
    name: str
    queries: int
    ndcg: float  # nDCG@k, binary gains
    recall: float  # recall@depth
    mrr: float  # reciprocal rank over the whole list (to depth)
    seconds: float  # wall time of all its queries (a shared trace is charged to the first ranker)
    runs: dict[str, list[str]] = field(repr=False, default_factory=dict)
    per_query: dict[str, tuple[float, float, float]] = field(repr=False, default_factory=dict)


def evaluate_rankers(bench: Benchmark, rankers: Mapping[str, Ranker], *, k: int = 10, depth: int = 100,
                     progress: Callable[[str], None] | None = None) -> dict[str, RankerScores]:
    """Score every ranker on every query with a relevant document (binary relevance)."""
    rel = bench.relevant()
    qids = [q for q in bench.queries if q in rel]
    runs: dict[str, dict[str, list[str]]] = {name: {} for name in rankers}
    seconds = dict.fromkeys(rankers, 0.0)
    for i, qid in enumerate(qids, 1):
        for name, fn in rankers.items():
            start = time.perf_counter()
            runs[name][qid] = list(fn(bench.queries[qid]))[:depth]
            seconds[name] += time.perf_counter() - start
        if progress and (i % 25 == 0 or i == len(qids)):
            progress(f"{i}/{len(qids)} queries")
    out = {}
    for name in rankers:
        per_query = {
            qid: (metrics.ndcg_at_k(ranked, rel[qid], k), metrics.recall_at_k(ranked, rel[qid], depth), metrics.mrr(ranked, rel[qid]))
            for qid, ranked in runs[name].items()
        }
        mean = lambda i: sum(v[i] for v in per_query.values()) / len(per_query) if per_query else 0.0  # noqa: E731
        out[name] = RankerScores(name, len(per_query), mean(0), mean(1), mean(2), seconds[name], runs[name], per_query)
    return out


def trec_eval_check(bench: Benchmark, scores: Mapping[str, RankerScores], *, k: int = 10, depth: int = 100) -> dict[str, float]:
    """Largest per-query difference, per ranker, between our metrics and pytrec_eval's
    ``ndcg_cut_k``, ``recall_depth`` and ``recip_rank`` on the same runs and binary qrels."""
    import pytrec_eval

    rel = bench.relevant()
    qrels = {qid: {d: int(g > 0) for d, g in bench.qrels[qid].items()} for qid in rel}
    measures = {f"ndcg_cut_{k}", f"recall_{depth}", "recip_rank"}
    out = {}
    for name, s in scores.items():
        # strictly decreasing scores so trec_eval keeps our order (it sorts by score, then doc id)
        run = {qid: {d: float(len(ranked) - i) for i, d in enumerate(ranked)} for qid, ranked in s.runs.items() if ranked}
        theirs = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
        worst = 0.0
        for qid, ours in s.per_query.items():
            t = theirs.get(qid, {})  # trec_eval leaves out queries with an empty run: all zero
            expected = (t.get(f"ndcg_cut_{k}", 0.0), t.get(f"recall_{depth}", 0.0), t.get("recip_rank", 0.0))
            worst = max(worst, *(abs(a - b) for a, b in zip(ours, expected)))
        out[name] = worst
    return out


def markdown_table(rows: Sequence[tuple[str, RankerScores]], *, k: int = 10, depth: int = 100) -> str:
    """``| embedder | ranker | queries | nDCG@k | recall@depth | MRR | seconds |`` rows."""
    lines = [f"| embedder | ranker | queries | nDCG@{k} | recall@{depth} | MRR | seconds |", "|---|---|---:|---:|---:|---:|---:|"]
    for label, s in rows:
        lines.append(f"| {label} | {s.name} | {s.queries} | {s.ndcg:.3f} | {s.recall:.3f} | {s.mrr:.3f} | {s.seconds:.1f} |")
    return "\n".join(lines)
