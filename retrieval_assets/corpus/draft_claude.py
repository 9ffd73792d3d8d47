"""The Claude drafter: golden-query candidates written by Claude through claude-agent-sdk.

Contract: ``ClaudeDrafter(per_doc)`` sends one prompt per document (its chunks, numbered, at
most ``PROMPT_CHARS`` characters of them) through ``answers.claude.ask`` (the pinned options:
no tools, one turn, no settings, a cost cap of ``CALL_BUDGET_USD`` a call) and asks for JSON:
``{"queries": [{"kind": ..., "query": ..., "anchor": ...}]}``, each anchor one sentence copied
from one chunk. ``drafting.draft`` then checks every item like any candidate (anchor inside a
chunk, kind, near-duplicates). Dropped here and counted in ``dropped``: a reply that is not that
JSON (``invalid JSON``, its items with it), an item without text fields (``invalid item``), a
call that failed (``Claude error``). No document is sent once ``max_cost_usd`` is spent, nor after
three failed calls in a row; ``notes`` says why. Without credentials (``claude.claude_credentials``)
and without a ``query_fn`` the drafter refuses to start, naming the variables to set.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence

from retrieval_assets.answers import claude
from retrieval_assets.corpus.drafting import Candidate, Vocabulary
from retrieval_assets.types import Chunk, Document

PROMPT_CHARS = 24_000  # of a document's chunks in one prompt
CALL_BUDGET_USD = 0.25  # the cost cap of one call
MAX_FAILURES = 3  # failed calls in a row before the drafter stops sending

PROMPT = """You write test queries for a search engine over a document collection. Below is one document, cut into
numbered chunks. Write {n} queries a real user might type whose answer is in this document, about evenly of three kinds:
- "factual": a question in the document's own words about one fact it states;
- "conceptual": a question about an idea of the document asked in other words: avoid the document's rare terms and names;
- "lexical": a short query built around one exact rare term of the document (an identifier, a code name, a number, a name).
For each query copy, character for character, one sentence of one chunk that answers it: its anchor.
Reply with JSON only, no prose: {{"queries": [{{"kind": "factual", "query": "...", "anchor": "..."}}]}}

Document: {title}
{chunks}"""


class ClaudeDrafter:
    """Candidates from Claude, one call a document (see the contract)."""

    def __init__(self, per_doc: int = 3, *, query_fn=None, model: str | None = None, max_cost_usd: float = 2.0):
        if query_fn is None and claude.claude_credentials() is None:
            raise ValueError("the Claude drafter needs Claude credentials and none were found: set ANTHROPIC_API_KEY (or "
                             f"CLAUDE_CODE_OAUTH_TOKEN; after `claude login`, {claude.LOGIN_VARIABLE}=login), or draft offline")
        if not max_cost_usd > 0:
            raise ValueError(f"max_cost_usd must be positive, got {max_cost_usd!r}")
        self.per_doc, self.query_fn, self.max_cost_usd = per_doc, query_fn, max_cost_usd
        self.model = model or claude.MODEL
        self.name = f"claude:{self.model}"
        self.dropped: Counter = Counter()
        self.notes: list[str] = []
        self.cost_usd = 0.0
        self._failures = 0

    def prompt(self, doc: Document, chunks: Sequence[Chunk]) -> str:
        parts, size = [], 0
        for i, c in enumerate(chunks, 1):
            part = f"[chunk {i}]\n{c.text}\n"
            if parts and size + len(part) > PROMPT_CHARS:
                self.notes.append(f"{doc.doc_id}: only its first {len(parts)} of {len(chunks)} chunks sent ({PROMPT_CHARS:,} characters)")
                break
            parts.append(part[: PROMPT_CHARS])
            size += len(part)
        return PROMPT.format(n=self.per_doc + 2, title=doc.title, chunks="\n".join(parts))

    def candidates(self, doc: Document, chunks: Sequence[Chunk], vocabulary: Vocabulary) -> Iterator[Candidate]:
        if self.cost_usd >= self.max_cost_usd or self._failures >= MAX_FAILURES:
            why = f"{self.max_cost_usd:.2f} USD spent" if self.cost_usd >= self.max_cost_usd else f"{MAX_FAILURES} failed calls in a row"
            self.notes.append(f"{doc.doc_id}: not sent ({why})")
            return
        try:
            text, cost = claude.ask(self.prompt(doc, chunks), query_fn=self.query_fn, model=self.model, budget_usd=CALL_BUDGET_USD)
        except claude.ClaudeError as exc:
            self._failures += 1
            self.dropped["Claude error"] += 1
            self.notes.append(f"{doc.doc_id}: {exc}")
            return
        self._failures = 0
        self.cost_usd += cost
        items = parse(text)
        if items is None:
            self.dropped["invalid JSON"] += 1
            return
        for rank, item in enumerate(items):
            fields = [item.get(name) if isinstance(item, dict) else None for name in ("kind", "query", "anchor")]
            if not all(isinstance(f, str) and f.strip() for f in fields):
                self.dropped["invalid item"] += 1
                continue
            kind, query, anchor = (f.strip() for f in fields)
            yield Candidate(kind.lower(), query, doc.doc_id, anchor, self.name, float(len(items) - rank))

    def why_none(self, doc: Document) -> str:
        """Why ``doc`` gave nothing: its last note (taken out of ``notes``), else the dropped counts."""
        mine = [i for i, n in enumerate(self.notes) if n.startswith(f"{doc.doc_id}: ")]
        return self.notes.pop(mine[-1]).split(": ", 1)[1] if mine else "no usable query in Claude's reply (see the dropped counts)"


def parse(text: str) -> list | None:
    """The list of queries in a reply (a ``{"queries": [...]}`` object or a bare list, a code fence around it
    allowed), else None."""
    body = re.sub(r"^\s*```(?:json)?\s*|\s*```\s*$", "", text.strip())
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, RecursionError):
        return None
    items = data.get("queries") if isinstance(data, dict) else data
    return items if isinstance(items, list) else None
