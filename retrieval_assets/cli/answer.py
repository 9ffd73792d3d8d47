"""``python -m retrieval_assets answer``: an extractive answer with cited sources from the corpus's command-line index,
under the corpus's retrieval rule (``cli.rule``; its line on stderr only when the rule changed the retrieval), refused
below the support floor: the seed's ``--floor`` on BM25, else the corpus's calibrated support (fitted and stored once
per index)."""

from __future__ import annotations

import sys

from retrieval_assets.answers import answer, calibration, respond
from retrieval_assets.cli import rule
from retrieval_assets.cli.args import UsageError, index_corpus, pipeline_params
from retrieval_assets.corpus import draft_file
from retrieval_assets.corpus.questions import own_questions
from retrieval_assets.search import pipeline


def answer_question(conn, args, documents, chunks, out) -> None:
    """The answer, its numbered sources with their scores, and the support line."""
    if not args.question.strip():
        raise UsageError("the question is empty")
    try:
        if args.floor is not None:
            answer.check_floor(args.floor, "--floor")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    schema, embedder, _ = index_corpus(conn, args, chunks)
    params, note = rule.ruled_params(conn, args, schema)
    if params != pipeline_params(args):  # said only when a calibrated rule changed the retrieval
        print(note, file=sys.stderr)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    if args.floor is not None:  # the seed's path
        found = answer.sources(conn, retriever, args.question, params)
        result = answer.extractive_answer(args.question, [c for c, _ in found], scores=[s for _, s in found], floor=args.floor)
        line = f"support: the best source's BM25 score, answered from {args.floor:g} (--floor)"
    else:
        questions, origin = own_questions(args.corpus, documents)
        cal, made = calibration.for_index(conn, retriever, questions, params, args.embedder)
        if made:
            print(f"calibrated support on {len(questions)} questions of the corpus ({origin}) and {cal.off_corpus} off-corpus questions "
                  f"(stored in {schema}; later answers on this index reuse it)", file=sys.stderr)
        response = respond.respond(conn, retriever, args.question, params, cal)
        found, result = response.sources, response.result
        drafted = f"; its questions: {origin}" if questions and origin != draft_file.GOLDEN_NAME else ""
        read = f"; the corpus read as {response.language.capitalize()}" if response.language != "english" else ""
        line = f"support {response.support:.2f}, answered from {cal.model.threshold:.2f} ({cal.source} calibration: {cal.note}{drafted}{read})"
    print(result.text, file=out)
    for n, (c, score) in enumerate(found, 1):
        print(f"[{n}] {c.chunk_id} ({score:.2f})", file=out)
    print(line, file=out)
