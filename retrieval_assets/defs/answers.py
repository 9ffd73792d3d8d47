"""Cited answers as an asset (seed stage 09): in the ``live`` group, outside the default job and
schedule, because its default answerer calls Claude and costs money."""


import time

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.answers import answer, claude

from retrieval_assets.search import pipeline
from retrieval_assets.answers.citations import invalid_citations
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.partitions import embedders, group, key
from retrieval_assets.defs.resources import PostgresResource

# One golden query per kind (fixtures/corpus/golden.yaml): q03 factual, q28 conceptual, q41
# lexical. On the hash index each clears answer.SUPPORT_FLOOR with an anchor chunk ranked first.
DEFAULT_QUESTIONS = [
    "How is a sentence treated when its citation marker number exceeds the number of sources sent?",
    "Why does measuring how rare a word is using only the retrieved shortlist break keyword scoring?",
    "What did the kestrel-search load test measure?",
]
ANSWERERS = ("claude", "extractive")


class AnswersConfig(dg.Config):
    questions: list[str] = DEFAULT_QUESTIONS
    answerer: str = "claude"  # "claude" (claude-agent-sdk, needs credentials) or "extractive" (offline)
    top_k: int = answer.SOURCES.k
    model: str | None = None  # Claude model; None: claude.MODEL
    support_floor: float = answer.SUPPORT_FLOOR  # refuse below this support; calibrated on the fixture corpus


def check_answerer(answerer: str) -> None:
    """Fail at once, before any retrieval, when the answerer is unknown or Claude has no credentials."""
    if answerer not in ANSWERERS:
        raise dg.Failure(f"unknown answerer {answerer!r}: choose one of {', '.join(ANSWERERS)}")
    if answerer == "claude" and claude.claude_credentials() is None:
        raise dg.Failure(
            "answerer 'claude' needs Claude credentials and none were found: set ANTHROPIC_API_KEY "
            "(or CLAUDE_CODE_OAUTH_TOKEN, or CLAUDE_CODE_USE_BEDROCK / CLAUDE_CODE_USE_VERTEX with that "
            f"provider's credentials; after `claude login`, set {claude.LOGIN_VARIABLE}=login), or choose "
            "the offline answerer: config answerer: extractive"
        )


def _md_cell(text: str, limit: int = 300) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def answer_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/answers`` (per embedder), in the corpus's ``live`` group."""

    @dg.asset(
        partitions_def=embedders,
        kinds={"python", "claude"},
        group_name=group(corpus, "live"), key_prefix=[corpus.name],
        deps=[dg.AssetDep(key(corpus, "chunk_index"))],
        description="Cited answers to a list of questions from the partition's index: sources (the default pipeline, top 5), "
        "a numbered-source prompt, Claude (or the offline extractive answerer), and the faithfulness check of every answer.",
    )
    def answers(context: dg.AssetExecutionContext, config: AnswersConfig, postgres: PostgresResource) -> dg.MaterializeResult:
        check_answerer(config.answerer)
        if config.top_k < 1:
            raise dg.Failure(f"top_k must be at least 1, got {config.top_k}")
        try:
            answer.check_floor(config.support_floor, "support_floor")
        except ValueError as exc:
            raise dg.Failure(str(exc)) from None
        if not config.questions or any(not q.strip() for q in config.questions):
            raise dg.Failure("questions must be a non-empty list of non-empty strings")
        key = context.partition_key
        params = answer.SOURCES.with_(k=config.top_k)
        meta: dict = {"answerer": config.answerer, "model": (config.model or claude.MODEL) if config.answerer == "claude" else "none",
                      "support_floor": config.support_floor, "questions": len(config.questions)}
        rows = ["| # | question | answer | cited | uncited claims | refused | cost (USD) |", "|---|---|---|---|---|---|---|"]
        total, refused, start = 0.0, 0, time.perf_counter()
        with postgres.connect() as conn:
            retriever = pipeline.retriever(conn, postgres.schema(key, corpus=corpus.name), partitions.embedder(key), params)
            for i, question in enumerate(config.questions, 1):
                found = answer.sources(conn, retriever, question, params)
                chunks, scores = [c for c, _ in found], [s for _, s in found]
                citations = tuple(c.chunk_id for c in chunks)
                if config.answerer == "extractive":
                    result = answer.extractive_answer(question, chunks, scores=scores, floor=config.support_floor)
                else:
                    draft = answer.assemble(question, chunks, scores=scores, floor=config.support_floor)
                    result = claude.run(question, draft, model=config.model)
                f = result.faithfulness
                cited = [citations[n - 1] for n in f.cited]
                invalid = invalid_citations(result.text, citations)
                total += result.cost_usd
                refused += f.refused
                context.log.info(f"question {i}: {len(cited)} sources cited, {f.uncited_claims} uncited claims, "
                                 f"refused={f.refused}, ${result.cost_usd:.4f}")
                meta.update({
                    f"question_{i}/question": question,
                    f"question_{i}/answer": dg.MetadataValue.md(result.text),
                    f"question_{i}/sources": ", ".join(f"[{n}] {cid} ({s:.2f})" for n, (cid, s) in enumerate(zip(citations, scores), 1)) or "none",
                    f"question_{i}/top_score": max(scores, default=0.0),
                    f"question_{i}/cited": ", ".join(cited) or "none",
                    f"question_{i}/uncited_claims": f.uncited_claims,
                    f"question_{i}/invalid_citations": ", ".join(map(str, invalid)) or "none",
                    f"question_{i}/refused": f.refused,
                    f"question_{i}/cost_usd": result.cost_usd,
                })
                rows.append(f"| {i} | {_md_cell(question, 120)} | {_md_cell(result.text)} | {', '.join(cited) or '-'} "
                            f"| {f.uncited_claims} | {'yes' if f.refused else 'no'} | {result.cost_usd:.4f} |")
        meta.update({"total_cost_usd": total, "refused": refused, "seconds": round(time.perf_counter() - start, 3),
                     "answers": dg.MetadataValue.md("\n".join(rows))})
        return dg.MaterializeResult(metadata=meta)

    return [answers]
