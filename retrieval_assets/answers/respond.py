"""One question answered with calibrated support: sources, support, then the answer or the refusal.

Contract: ``respond(conn, retriever, question, params, calibration)`` runs the pipeline once, takes its
final chunks as the sources (``answer.sources_of``: each with the seed's BM25 score, which weighs the
extractive answerer's sentences), computes the question's evidence and support with ``calibration``
(``calibration.Calibration``), and answers only when the support reaches the model's threshold:
``extractive`` answers with cited source sentences, ``claude`` sends the numbered-source prompt
(``answer.assemble``, ``claude.run``; ``query_fn`` replaces the SDK call) unless the question's focus is what
the corpus never names (``unnamed``, the extractive answerer's focus rule) or asks for a number or a name to type
that no source holds (``untyped``). A refused question costs no model call.
Any question text, empty, huge or in any script, gives an answer or the refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from retrieval_assets.answers import answer, asked, claude, support
from retrieval_assets.answers.calibration import Calibration
from retrieval_assets.answers.citations import REFUSAL, check
from retrieval_assets.answers.support import Evidence
from retrieval_assets.params import RetrievalParams
from retrieval_assets.search import pipeline
from retrieval_assets.types import Answer, Chunk


@dataclass(frozen=True)
class Response:
    result: Answer
    sources: list[tuple[Chunk, float]]
    evidence: Evidence
    support: float  # the calibrated probability that the sources answer the question
    supported: bool  # support reached the threshold (the answerer may still refuse)
    language: str = "english"  # how the corpus was read (support.StemStats.language: its function words and stems)


def respond(conn: psycopg.Connection, retriever: pipeline.Retriever, question: str, params: RetrievalParams, calibration: Calibration,
            *, answerer: str = "extractive", model: str | None = None, query_fn=None) -> Response:
    """The answer to ``question`` from the retriever's index, or the refusal (see the contract)."""
    trace = pipeline.run(conn, retriever, question, params)
    found = answer.sources_of(conn, retriever, question, trace)
    chunks, scores = [c for c, _ in found], [s for _, s in found]
    stats = support.stem_stats(pipeline.corpus_stats(conn, retriever.schema))
    evidence = calibration.evidence(question, trace, chunks, stats)
    probability = calibration.model.probability(evidence)
    supported = probability >= calibration.model.threshold and bool(chunks)
    if answerer == "extractive":
        result = (answer.extractive_answer(question, chunks, scores=scores, floor=0.0, stats=stats) if supported
                  else Answer(REFUSAL, check(REFUSAL, tuple(c.chunk_id for c in chunks)), 0.0))
    else:
        send = supported and not unnamed(question, chunks, stats) and not untyped(question, chunks)
        draft = answer.assemble(question, chunks if send else [], scores=scores if send else None, floor=0.0)
        result = claude.run(question, draft, model=model, query_fn=query_fn)
    return Response(result, found, evidence, probability, supported, stats.language)


def unnamed(question: str, chunks: list[Chunk], stats: support.StemStats, picking: answer.Picking = answer.PICKING) -> bool:
    """``answer.pick``'s focus rule over whole sources, as a model reads them: the question's focus is what the corpus
    never names (words no chunk holds carry at least ``picking.unknown`` of its idf mass) and the sources' text and
    headings hold less than ``picking.quoted`` of it. The Claude path refuses such a question without a model call."""
    shares, unknown = support.focus(support.question_idf(question, stats), stats)
    present = set().union(*(support.stems(f"{c.text} {c.heading_path}", stats.stem) for c in chunks))
    return picking.off_focus(unknown, sum(v for t, v in shares.items() if t in present))


def untyped(question: str, chunks: list[Chunk], picking: answer.Picking = answer.PICKING) -> bool:
    """``answer.pick``'s type check over whole sources (code and tables included, as a model reads them): the question
    asks for a number or a name to type (``asked.expected``) and no source's text holds one."""
    kind = asked.expected(question) if picking.asked else None
    return kind is not None and not any(kind in asked.carries(c.text) for c in chunks)
