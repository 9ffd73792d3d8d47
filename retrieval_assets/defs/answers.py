"""Cited answers as an asset (seed stage 09), and the support calibration they use: in the ``live``
group, outside the default job and schedule, because the default answerer calls Claude and costs money."""


import base64
import time
from pathlib import Path

import dagster as dg

from retrieval_assets import partitions

from retrieval_assets.answers import answer, calibration, claude, reliability, respond, support

from retrieval_assets.search import pipeline
from retrieval_assets.answers.citations import invalid_citations
from retrieval_assets.corpus.questions import own_questions
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.evaluation import retrieval_rule
from retrieval_assets.defs.partitions import embedders, group, key
from retrieval_assets.defs.resources import CorpusResource, PostgresResource, user_errors

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
    top_k: int = answer.SOURCES_K
    model: str | None = None  # Claude model; None: claude.MODEL
    # None: the corpus's calibrated support (its support_calibration); a number: the seed's BM25 floor instead
    # (answer.SUPPORT_FLOOR = 6.80, calibrated on the fixture corpus alone)
    support_floor: float | None = None
    ignore_rule: bool = False  # the embedder's default (params.default_for) even when the corpus's calibrated retrieval rule (retrieval_rule) is stored


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


def _language(conn, schema: str) -> str:
    """How the index's questions and texts are read (support.StemStats.language: its function words and stems)."""
    return support.stem_stats(pipeline.corpus_stats(conn, schema)).language


def calibration_metadata(cal: calibration.Calibration, questions_from: str) -> dict:
    """The calibration's metadata; ``questions_from``: where its corpus questions came from (``own_questions``)."""
    meta = {"source": cal.source, "note": cal.note, "questions_from": questions_from, "summary": dg.MetadataValue.md(reliability.summary(cal)),
            "answerable_questions": cal.answerable, "off_corpus_questions": cal.off_corpus, "refusal_rate": round(cal.refusal_rate, 4)}
    if cal.answer_rate is not None:
        meta["answer_rate"] = round(cal.answer_rate, 4)
    if cal.separates is not False:
        meta["threshold"] = cal.model.threshold  # a corpus that cannot separate reports that (note) instead of a threshold
    return meta


def answer_assets(corpus: Corpus) -> list[dg.AssetsDefinition]:
    """``<corpus>/support_calibration`` and ``<corpus>/answers`` (per embedder), in the corpus's ``live`` group."""

    @dg.asset(
        partitions_def=embedders,
        kinds={"python", "postgres"},
        group_name=group(corpus, "live"), key_prefix=[corpus.name], required_resource_keys={"corpus", "postgres"},
        deps=[dg.AssetDep(key(corpus, "chunk_index")), dg.AssetDep(key(corpus, "retrieval_rule"))],
        description="The support model answers use on this corpus and embedder (their sources retrieved by its retrieval rule): "
        "fitted on the corpus's golden questions (else its unreviewed golden drafts) against the shipped off-corpus questions "
        "(or the cross-corpus default where it has none), with its held-out reliability (answer rate, refusal rate) and a reliability plot; stored in the partition's schema.",
    )
    def support_calibration(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        postgres: PostgresResource = context.resources.postgres
        files: CorpusResource = context.resources.corpus
        partition = context.partition_key
        with user_errors("support_calibration"), postgres.connect() as conn:
            schema = postgres.schema(partition, corpus=corpus.name)
            params, rule = retrieval_rule.for_search(conn, postgres.history_schema, corpus.name, partition, answer.sources_for(partition),
                                                     schema=schema)
            retriever = pipeline.retriever(conn, schema, partitions.embedder(partition), params)
            questions, origin = own_questions(corpus.path)  # golden.yaml's, else unreviewed drafts, else none
            cal, _ = calibration.for_index(conn, retriever, questions, params, partition, refresh=True)
            language = _language(conn, schema)
        context.log.info(f"support_calibration ({corpus.name}, {partition}): {reliability.summary(cal)}")
        path = reliability.plot(cal, Path(files.report_path(corpus.name, partition)).with_name("support_calibration.png"),
                                f"corpus {corpus.name}, {partition}: support ({cal.source})")
        image = base64.b64encode(path.read_bytes()).decode()
        return dg.MaterializeResult(metadata={**calibration_metadata(cal, origin), "language": language, "retrieval_rule": rule,
                                              "plot": dg.MetadataValue.md(f"![reliability](data:image/png;base64,{image})"),
                                              "path": dg.MetadataValue.path(str(path))})

    @dg.asset(
        partitions_def=embedders,
        kinds={"python", "claude"},
        group_name=group(corpus, "live"), key_prefix=[corpus.name],
        deps=[dg.AssetDep(key(corpus, "chunk_index")), dg.AssetDep(key(corpus, "support_calibration"))],
        description="Cited answers to a list of questions from the partition's index: sources (the corpus's retrieval rule: "
        "retrieval_rule, else the default pipeline; config ignore_rule: the default; top 5), "
        "the calibrated support (support_calibration; refused below its threshold, no model call), a numbered-source prompt, "
        "Claude (or the offline extractive answerer), and the faithfulness check of every answer.",
    )
    def answers(context: dg.AssetExecutionContext, config: AnswersConfig, postgres: PostgresResource) -> dg.MaterializeResult:
        check_answerer(config.answerer)
        if config.top_k < 1:
            raise dg.Failure(f"top_k must be at least 1, got {config.top_k}")
        try:
            if config.support_floor is not None:
                answer.check_floor(config.support_floor, "support_floor")
        except ValueError as exc:
            raise dg.Failure(str(exc)) from None
        if not config.questions or any(not q.strip() for q in config.questions):
            raise dg.Failure("questions must be a non-empty list of non-empty strings")
        key = context.partition_key
        meta: dict = {"answerer": config.answerer, "model": (config.model or claude.MODEL) if config.answerer == "claude" else "none",
                      "support_floor": config.support_floor, "questions": len(config.questions)}
        rows = ["| # | question | answer | cited | uncited claims | refused | cost (USD) |", "|---|---|---|---|---|---|---|"]
        total, refused, start = 0.0, 0, time.perf_counter()
        with user_errors("answers"), postgres.connect() as conn:
            schema = postgres.schema(key, corpus=corpus.name)
            params, meta["retrieval_rule"] = retrieval_rule.for_search(conn, postgres.history_schema, corpus.name, key,
                                                                       answer.sources_for(key).with_(k=config.top_k), ignore=config.ignore_rule,
                                                                       schema=schema)
            retriever = pipeline.retriever(conn, schema, partitions.embedder(key), params)
            meta["language"] = _language(conn, schema)
            cal = None
            if config.support_floor is None:
                questions, origin = own_questions(corpus.path)
                cal, made = calibration.for_index(conn, retriever, questions, params, key)
                meta.update({f"calibration/{k}": v for k, v in calibration_metadata(cal, origin).items()})
                context.log.info(f"support ({'calibrated now' if made else 'stored calibration'}): {reliability.summary(cal)}")
            for i, question in enumerate(config.questions, 1):
                if cal is not None:
                    response = respond.respond(conn, retriever, question, params, cal, answerer=config.answerer, model=config.model)
                    found, result = response.sources, response.result
                    meta[f"question_{i}/support"] = round(response.support, 4)
                else:
                    found = answer.sources(conn, retriever, question, params)
                    result = _seed_answer(question, found, config)
                scores = [s for _, s in found]
                citations = tuple(c.chunk_id for c, _ in found)
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

    return [support_calibration, answers]


def _seed_answer(question: str, found, config: AnswersConfig):
    """The seed's path: refused below the BM25 floor ``config.support_floor``."""
    chunks, scores = [c for c, _ in found], [s for _, s in found]
    if config.answerer == "extractive":
        return answer.extractive_answer(question, chunks, scores=scores, floor=config.support_floor)
    return claude.run(question, answer.assemble(question, chunks, scores=scores, floor=config.support_floor), model=config.model)
