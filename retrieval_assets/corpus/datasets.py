"""External benchmark datasets: the Cranfield SMART files and any BEIR folder.

Contract:
- ``load_cranfield(data_dir)`` and ``load_beir(folder, split="test")`` return a ``Benchmark``
  of plain types: ``documents`` (``types.Document``, text = title + abstract as Markdown; for
  Cranfield the abstract as distributed, which repeats the title in 1,396 of 1,400 documents,
  or without that repeat with ``strip_title=True``),
  ``queries`` ``{qid: text}`` and ``qrels`` ``{qid: {doc_id: grade}}``. A missing file raises
  ``DatasetError`` naming the expected path; malformed lines name file and line.
- Cranfield's trap: ``cran.qry`` numbers its queries ``.I 001, 002, 004, 008, ...`` while
  ``cranqrel`` numbers them by position in that file, 1..225. Query ids here are the
  positions (as the qrels use them); the ``.I`` labels are kept in ``Benchmark.labels``.
- Cranfield grades: code 1..4 is relevant with gain ``5 - code`` (4..1); ``-1`` ("no interest",
  one line a query) is kept as grade 0, judged and not relevant. ``relevant()`` is the binary
  reading: every doc with grade > 0.
Their evaluation is ``benchmark_eval``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from retrieval_assets.types import Document

CRANFIELD_FILES = ("cran.all.1400", "cran.qry", "cranqrel")
# Where the project reads Cranfield from: $CRANFIELD_DIR, else ../shared/benchmarks/cranfield
# relative to the project root (it is never copied into the repository).
DEFAULT_CRANFIELD = Path(os.environ.get("CRANFIELD_DIR") or Path(__file__).resolve().parents[3] / "shared" / "benchmarks" / "cranfield")


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


def load_cranfield(data_dir: str | Path = DEFAULT_CRANFIELD, *, strip_title: bool = False) -> Benchmark:
    """Cranfield 1400: documents from ``cran.all.1400``, queries by position in ``cran.qry``, qrels.

    Document text is ``# title`` + the ``.W`` abstract as the file has it (what standard
    baselines index); ``strip_title`` drops the abstract's leading repeat of the title.
    """
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
        abstract = fields.get("W", [])
        body = _paragraphs(_strip_repeated_title(abstract, title) if strip_title else abstract)
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
