"""``<corpus>/golden_drafts``: drafted golden queries for a registered corpus, written to its golden.draft.yaml.

In the corpus's group beside ``golden_queries``, unpartitioned, and left out of its evaluation job
(``jobs.py``): drafting is a step a user asks for (Materialize), and its file is theirs to review.
Only user corpora have it: the fixture's golden set is hand-written and fixed, and a draft written
into this checkout's fixtures folder would be a stray file (the drafted benchmark drafts the
fixture without writing anything).
"""

import dagster as dg

from retrieval_assets.answers.claude import ClaudeError
from retrieval_assets.corpus import draft_file, drafting
from retrieval_assets.corpus.golden import KINDS
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.corpus import _preview
from retrieval_assets.defs.partitions import group, ins
from retrieval_assets.defs.resources import user_errors
from retrieval_assets.types import Chunk, Document

STATUSES = ("draft", "accepted", "rejected", "reviewed", "hand-written")


class DraftsConfig(dg.Config):
    per_doc: int = 3  # queries per document, at most
    drafter: str = "offline"  # "offline" (deterministic, no network) or "claude" (claude-agent-sdk, needs credentials)
    model: str | None = None  # Claude model; None: the answers' model
    max_cost_usd: float = 2.0  # what the Claude drafter may spend in all


def golden_drafts_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/golden_drafts`` for a user corpus; nothing for the fixture."""
    if corpus.is_fixture:
        return []

    @dg.asset(kinds={"python", "yaml"}, group_name=group(corpus), key_prefix=[corpus.name], ins=ins(corpus, "documents", "chunks"),
              description="Drafted golden queries of the three kinds for every document, each anchor checked inside a chunk, "
              f"written to {draft_file.DRAFT_NAME} in the corpus folder (never golden.yaml); review them with "
              "`python -m retrieval_assets golden review --corpus DIR`. Metadata: queries by kind and status.")
    def golden_drafts(context: dg.AssetExecutionContext, config: DraftsConfig, documents: list[Document],
                      chunks: list[Chunk]) -> dg.Output[list[drafting.DraftItem]]:
        path = corpus.golden_path.with_name(draft_file.DRAFT_NAME)
        try:
            drafter = None
            if config.drafter == "claude":
                from retrieval_assets.corpus.draft_claude import ClaudeDrafter

                drafter = ClaudeDrafter(config.per_doc, model=config.model, max_cost_usd=config.max_cost_usd)
            elif config.drafter != "offline":
                raise ValueError(f"unknown drafter {config.drafter!r}: choose offline or claude")
            with user_errors("golden_drafts"):
                drafted = drafting.draft(documents, chunks, per_doc=config.per_doc, drafter=drafter)
                draft_file.write_draft(path, drafted, corpus=corpus.path, per_doc=config.per_doc)
                counts = draft_file.status_counts(path, corpus.golden_path)
        except (ValueError, ClaudeError) as exc:
            raise dg.Failure(description=f"golden_drafts: {exc}") from None
        context.log.info(f"corpus {corpus.name}: {len(drafted.items)} queries drafted into {path}")
        rows = [{"kind": k, **{s: counts[k, s] for s in STATUSES}} for k in KINDS]
        return dg.Output(drafted.items, metadata={
            "corpus": corpus.name,
            "path": str(path),
            "drafter": drafted.drafter,
            "queries": len(drafted.items),
            **{f"{k}_queries": n for k, n in drafted.counts().items()},
            **{f"status_{s}": sum(counts[k, s] for k in KINDS) for s in STATUSES},
            "by_kind_and_status": _preview(rows),
            "dropped": dg.MetadataValue.json(dict(drafted.dropped)),
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in drafted.reasons) or "(none)"),
            "cost_usd": drafted.cost_usd,
            "preview": _preview([{"query_id": i.query_id, "kind": i.kind, "query": i.query, "doc_id": i.doc_id,
                                  "trivial": i.trivial or ""} for i in drafted.items]),
        })

    return [golden_drafts]
