"""golden.draft.yaml: a draft set on disk, and the review that moves its queries into golden.yaml.

Contract: ``write_draft(path, draft_set, ...)`` writes the set as a mapping (``status: draft``,
the drafter, counts, dropped counts, notes, ``queries``), each query with its ``status``
(``draft``), ``source``, ``chunk_id`` and, when flagged, ``trivial``. It never writes a file named
golden.yaml, nor over a file that is not a draft; over an earlier draft it keeps the earlier
``accepted`` and ``rejected`` statuses of the queries drafted again (same id). ``read_draft``
checks a draft file like golden.yaml (``golden.load_golden``) and returns its mapping and items.
``review(corpus_dir, draft_path, decisions, documents)`` appends the accepted queries (with an
edited query text or kind when given) to golden.yaml with ``status: reviewed``, checks the whole
new golden.yaml against the documents before it replaces the old one, then records every decision
in the draft; a bad decision (unknown id, a query already reviewed or already in golden.yaml)
raises ``DraftFileError`` naming it and changes nothing. Files are replaced atomically, and two reviews of
one corpus (two processes on one host) run one after the other.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from retrieval_assets.corpus import golden
from retrieval_assets.corpus.drafting import DraftItem, DraftSet
from retrieval_assets.replace import replaced
from retrieval_assets.types import Document

DRAFT_NAME = "golden.draft.yaml"
GOLDEN_NAME = "golden.yaml"
HEADER = ("# Drafted golden queries (status: draft). Review them with\n#   python -m retrieval_assets golden review --corpus DIR\n"
          "# accepted ones are appended to golden.yaml with status: reviewed. Drafting again rewrites this file only.\n")
_ITEM_FIELDS = [f.name for f in dataclasses.fields(DraftItem)]


class DraftFileError(ValueError):
    """A draft file or a review decision that cannot be used; the message names the file or the query id."""


@dataclass(frozen=True)
class Decision:
    action: str  # "accept" or "reject"
    query: str | None = None  # an edited query text (accept only)
    kind: str | None = None  # an edited kind (accept only)


def _dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=1_000_000)


def _replace(path: Path, text: str) -> None:
    try:
        with replaced(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise DraftFileError(f"{path}: cannot write ({exc.strerror or exc})") from None


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` (flock on the directory itself: no lock file left in the corpus), so two
    reviews of one golden.yaml run one after the other instead of the second dropping the first's queries."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _item_dict(item: DraftItem) -> dict:
    return {k: v for k, v in dataclasses.asdict(item).items() if v is not None}


def read_draft(path: str | Path) -> tuple[dict, list[DraftItem]]:
    """The draft file's mapping and its queries; ``DraftFileError`` (or ``golden.GoldenError``) naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DraftFileError(f"{path}: no draft file (python -m retrieval_assets golden draft writes one)")
    golden.load_golden(path, statuses=golden.DRAFT_STATUSES)  # fields, kinds, ids: the golden.yaml rules
    data = golden.load_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(data, dict) or data.get("status") != "draft":
        raise DraftFileError(f"{path}: not a draft file (no 'status: draft' at the top)")
    items = []
    for raw in data["queries"]:
        missing = [f for f in ("source", "chunk_id", "status") if not isinstance(raw.get(f), str)]
        if missing:
            raise DraftFileError(f"{path}: query {raw['query_id']}: missing field '{missing[0]}'")
        items.append(DraftItem(**{k: raw.get(k) for k in _ITEM_FIELDS}))
    return data, items


def write_draft(path: str | Path, draft_set: DraftSet, **about) -> Path:
    """Write ``draft_set`` to ``path`` (see the contract); ``about``: corpus, per_doc, chunking, shown at the top."""
    path = Path(path)
    if path.name == GOLDEN_NAME:
        raise DraftFileError(f"{path}: drafts never go to golden.yaml (reviewed queries reach it through golden review)")
    earlier: dict[str, str] = {}
    if path.exists():
        try:
            _, old = read_draft(path)
        except (DraftFileError, golden.GoldenError) as exc:
            raise DraftFileError(f"{path}: exists and is not a draft file, left as it is ({exc})") from None
        earlier = {i.query_id: i.status for i in old if i.status != "draft"}
    items = [dataclasses.replace(i, status=earlier.get(i.query_id, i.status)) for i in draft_set.items]
    notes = list(draft_set.reasons) or []
    if not items:
        notes.insert(0, "no query drafted" + (f": {draft_set.reasons[0]}" if draft_set.reasons else ""))
    data = {"status": "draft", "drafter": draft_set.drafter, **about, "counts": draft_set.counts(),
            "dropped": dict(sorted(draft_set.dropped.items())), "cost_usd": round(draft_set.cost_usd, 4), "notes": notes,
            "queries": [_item_dict(i) for i in items]}
    _replace(path, HEADER + _dump(data))
    return path


def status_counts(draft_path: str | Path, golden_path: str | Path) -> Counter:
    """(kind, status) -> queries: the draft's statuses, golden.yaml's ``reviewed`` and hand-written (no status) ones."""
    counts: Counter = Counter()
    if Path(draft_path).is_file():
        counts.update((i.kind, i.status) for i in read_draft(draft_path)[1])
    if Path(golden_path).is_file():
        data = golden.load_yaml(Path(golden_path).read_text(encoding="utf-8"), str(golden_path))
        raw = data.get("queries") if isinstance(data, dict) else data
        counts.update((q.get("kind"), q.get("status", "hand-written")) for q in raw or [] if isinstance(q, dict))
    return counts


def _golden_text(golden_path: Path, accepted: list[dict]) -> str:
    """golden.yaml's text with ``accepted`` appended: after the list as written (comments kept), or the
    mapping's ``queries`` written again."""
    if not golden_path.exists():
        return "# Golden query set: queries accepted from golden.draft.yaml by golden review.\n" + _dump(accepted)
    text = golden_path.read_text(encoding="utf-8")
    data = golden.load_yaml(text, str(golden_path))
    if isinstance(data, dict):
        return _dump({**data, "queries": [*(data.get("queries") or []), *accepted]})
    if not data:  # an empty file, or only comments
        return text + ("" if text.endswith("\n") or not text else "\n") + _dump(accepted)
    return text + ("" if text.endswith("\n") else "\n") + _dump(accepted)


def review(corpus_dir: str | Path, draft_path: str | Path, decisions: Mapping[str, Decision],
           documents: Sequence[Document]) -> tuple[int, int]:
    """Apply ``decisions`` (query id -> accept or reject); returns (accepted, rejected). See the contract. Reviews
    of one corpus wait for each other (a lock on the corpus folder)."""
    with _locked(Path(corpus_dir)):
        return _review(Path(corpus_dir) / GOLDEN_NAME, draft_path, decisions, documents)


def _review(golden_path: Path, draft_path: str | Path, decisions: Mapping[str, Decision],
            documents: Sequence[Document]) -> tuple[int, int]:
    data, items = read_draft(draft_path)
    by_id = {i.query_id: i for i in items}
    empty = not golden_path.exists() or golden.load_yaml(golden_path.read_text(encoding="utf-8"), str(golden_path)) is None
    present = set() if empty else {q.query_id for q in golden.load_golden(golden_path)}
    for qid, d in decisions.items():
        if qid not in by_id:
            raise DraftFileError(f"{draft_path}: no query {qid!r} in the draft")
        if by_id[qid].status != "draft":
            raise DraftFileError(f"{draft_path}: query {qid} was already {by_id[qid].status}")
        if d.action == "accept" and qid in present:
            raise DraftFileError(f"{golden_path}: query {qid} is there already")
        if d.action not in ("accept", "reject") or (d.kind is not None and d.kind not in golden.KINDS):
            raise DraftFileError(f"query {qid}: cannot {d.action} as kind {d.kind!r} (kinds: {', '.join(golden.KINDS)})")
    accepted = [{"query_id": qid, "kind": d.kind or by_id[qid].kind, "query": " ".join((d.query or by_id[qid].query).split()),
                 "doc_id": by_id[qid].doc_id, "anchor": by_id[qid].anchor, "status": golden.REVIEWED,
                 "source": by_id[qid].source + (" (edited)" if d.query or d.kind else "")}
                for qid, d in decisions.items() if d.action == "accept"]
    if accepted:
        text = _golden_text(golden_path, accepted)
        fd, tmp = tempfile.mkstemp(prefix=f".{GOLDEN_NAME}.", suffix=".check", dir=golden_path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            golden.load_golden(tmp, documents)
        except golden.GoldenError as exc:
            raise golden.GoldenError(str(exc).replace(tmp, str(golden_path))) from None
        finally:
            os.unlink(tmp)
        _replace(golden_path, text)
    status = {qid: "accepted" if d.action == "accept" else "rejected" for qid, d in decisions.items()}
    data["queries"] = [{**raw, "status": status.get(raw["query_id"], raw["status"])} for raw in data["queries"]]
    _replace(Path(draft_path), HEADER + _dump(data))
    return len(accepted), len(decisions) - len(accepted)
