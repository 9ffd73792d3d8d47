"""A corpus's own answerable questions, which the answers' support calibration is fitted on: the one place that says which.

Contract: ``own_questions(folder, documents)`` is golden.yaml's queries when the folder has one; else the queries of its
golden.draft.yaml (``golden draft``) that review has not rejected, each drafted from a chunk holding its anchor, so a
question the corpus answers even unreviewed; else none. With it, a phrase naming where they came from ("golden.yaml",
"12 drafted questions of golden.draft.yaml, not reviewed", "none"). A malformed file raises its reader's error, which
names the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from retrieval_assets.corpus import draft_file, golden
from retrieval_assets.types import Document


def own_questions(folder: str | Path, documents: Sequence[Document] | None = None) -> tuple[list[str], str]:
    """The corpus's questions for its calibration and where they came from (see the contract)."""
    gold, draft = Path(folder) / draft_file.GOLDEN_NAME, Path(folder) / draft_file.DRAFT_NAME
    if gold.is_file():
        return [q.query for q in golden.load_golden(gold, documents)], gold.name
    if draft.is_file():
        kept = [item.query for item in draft_file.read_draft(draft)[1] if item.status != "rejected"]
        return kept, f"{len(kept)} drafted questions of {draft.name}, not reviewed"
    return [], "none"
