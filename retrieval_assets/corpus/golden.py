"""The golden query set: loading, validation and what counts as relevant (seed stage 05).

Contract: ``load_golden`` reads golden.yaml (a list of queries, or a mapping with ``queries``)
and raises ``GoldenError`` naming the file and the query id at fault. Beside the five fields a
query may carry ``status`` (in golden.yaml only ``reviewed``: a drafted query accepted by ``golden
review``; a draft file's own statuses are ``DRAFT_STATUSES``) and ``source`` (text: who drafted it). A chunk is relevant to a
golden query when it belongs to the query's ``doc_id`` and its text contains the anchor
(case-insensitive, whitespace-normalised).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import psycopg
import yaml
from psycopg.rows import dict_row

from retrieval_assets.index.tables import chunk_of, column_list, statement
from retrieval_assets.types import Chunk, Document, GoldenQuery

KINDS = ("factual", "conceptual", "lexical")
_FIELDS = ("query_id", "kind", "query", "doc_id", "anchor")
REVIEWED = "reviewed"  # the status of a drafted query accepted into golden.yaml
DRAFT_STATUSES = ("draft", "accepted", "rejected")  # the statuses of a draft file's queries


class GoldenError(ValueError):
    """An invalid golden set; the message names the file and the query id at fault."""


def normalise(text: str) -> str:
    return " ".join(text.split()).lower()


# libyaml's parser and loader when PyYAML was built with it (the wheels are): the fixture's golden
# set loads in a few ms instead of 60 in the pure-Python composer
_BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE):
    """The safe loader, with a value its constructor cannot build reported as YAML at the value's place:
    PyYAML's own constructors raise ValueError (``2020-13-45``, ``!!int abc``), AttributeError
    (``!!timestamp x``) or KeyError (``!!bool maybe``) for them, naming neither file nor place."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a constructor raises on a malformed scalar
            value = node.value if isinstance(node.value, str) else ""
            why = f" ({str(exc)[:80]})" if type(exc) is ValueError else ""  # others say nothing about the value
            raise yaml.constructor.ConstructorError(None, None, f"cannot read {value[:40]!r} as !!{node.tag.rsplit(':', 1)[-1]}{why}",
                                                    node.start_mark) from None


_LOADER = _Loader


def load_yaml(text: str, name: str = "<yaml>"):
    """YAML without anchors or aliases (a billion-laughs document is refused, not expanded);
    ``ValueError`` naming ``name`` on invalid YAML (a value its tag cannot build too). The events are
    checked first, then the document is built by a safe loader."""
    try:
        for event in yaml.parse(text, Loader=_BASE):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                mark = event.start_mark
                raise yaml.YAMLError(f"YAML anchors and aliases are not allowed (line {mark.line + 1}, column {mark.column + 1})")
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - SafeLoader or CSafeLoader
    except yaml.YAMLError as exc:
        raise ValueError(f"{name}: not valid YAML ({exc})") from None


def _shown(value: str) -> str:
    """A field's value as an error message quotes it: its first 80 characters (a value can be megabytes)."""
    return value if len(value) <= 80 else f"{value[:80]}... ({len(value):,} characters)"


def load_golden(path: str | Path, documents: Sequence[Document] | None = None, *,
                statuses: Sequence[str] = (REVIEWED,)) -> list[GoldenQuery]:
    """Read and validate golden.yaml (fields, kinds, unique ids, doc ids and anchors when given documents;
    ``statuses``: the values a query's optional ``status`` may take)."""
    path = Path(path)
    try:
        data = load_yaml(path.read_bytes().decode("utf-8"), str(path))
    except FileNotFoundError:
        raise GoldenError(f"{path}: golden set not found") from None
    except UnicodeDecodeError as exc:
        raise GoldenError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise GoldenError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise GoldenError(str(exc)) from None
    items = data.get("queries") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise GoldenError(f"{path}: expected a list of queries (or a mapping with 'queries')")
    texts = {d.doc_id: normalise(d.text) for d in documents} if documents is not None else None
    seen: set[str] = set()
    golden = []
    for i, item in enumerate(items, 1):
        raw = item.get("query_id") if isinstance(item, dict) else None
        qid = raw if isinstance(raw, str) and raw.strip() else f"#{i}"
        where = f"{path}: query {_shown(qid)}"
        if not isinstance(item, dict):
            raise GoldenError(f"{where}: expected a mapping with {', '.join(_FIELDS)}")
        for name in _FIELDS:
            value = item.get(name)
            if value is None:
                raise GoldenError(f"{where}: missing field '{name}'")
            if not isinstance(value, str):
                raise GoldenError(f"{where}: field '{name}' must be text, got {type(value).__name__} (quote it in YAML)")
            if not value.strip():
                raise GoldenError(f"{where}: empty field '{name}'")
        for name in ("status", "source"):
            if name in item and (not isinstance(item[name], str) or not item[name].strip()):
                raise GoldenError(f"{where}: field '{name}' must be non-empty text")
        if "status" in item and item["status"] not in statuses:
            raise GoldenError(f"{where}: status '{_shown(item['status'])}' (expected {' or '.join(statuses)}; a draft's queries "
                              "reach golden.yaml through `python -m retrieval_assets golden review`)")
        if item["kind"] not in KINDS:
            raise GoldenError(f"{where}: unknown kind '{_shown(item['kind'])}' (expected one of {', '.join(KINDS)})")
        if qid in seen:
            raise GoldenError(f"{where}: duplicate query_id")
        seen.add(qid)
        if texts is not None:
            if item["doc_id"] not in texts:
                raise GoldenError(f"{where}: doc_id '{_shown(item['doc_id'])}' is not a document of the corpus")
            if normalise(item["anchor"]) not in texts[item["doc_id"]]:
                raise GoldenError(f"{where}: anchor '{_shown(item['anchor'])}' does not occur in {item['doc_id']}")
        golden.append(GoldenQuery(*(item[name].strip() for name in _FIELDS)))
    return golden


def relevant(chunks: Iterable[Chunk], q: GoldenQuery) -> set[str]:
    anchor = normalise(q.anchor)
    return {c.chunk_id for c in chunks if c.doc_id == q.doc_id and anchor in normalise(c.text)}


def relevant_sets(conn: psycopg.Connection, schema: str, golden: Sequence[GoldenQuery]) -> dict[str, set[str]]:
    """The relevant chunk ids of every golden query, from the chunks indexed in ``schema``."""
    doc_ids = sorted({q.doc_id for q in golden})
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(statement(schema, "SELECT {columns} FROM {chunks} WHERE doc_id = ANY(%s)", columns=column_list()),
                           (doc_ids,)).fetchall()
    by_doc: dict[str, list[Chunk]] = {}
    for r in rows:
        by_doc.setdefault(r["doc_id"], []).append(chunk_of(r))
    return {q.query_id: relevant(by_doc.get(q.doc_id, []), q) for q in golden}
