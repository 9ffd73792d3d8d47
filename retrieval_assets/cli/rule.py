"""``python -m retrieval_assets search|calibrate``, and the parameters ``search`` and ``answer`` run with.

Contract: ``calibrate`` indexes the corpus into the command-line schema, fits its retrieval rule on its golden.yaml
(``retrieval_rule.for_index``: reused when fitted on the same index version and queries, unless ``--refit``) and stores
it for the corpus and embedder, where the ``<corpus>/retrieval_rule`` asset stores it too (the later one's is kept).
``ruled_params`` gives ``search`` and ``answer`` the stored rule under ``--pipeline default`` (the pipeline options
still override it), the embedder's default (``params.default_for``) when none is stored or with ``--ignore-rule``, and the line saying which,
printed on stderr (by ``answer`` only when a calibrated rule changed its retrieval). A corpus folder without golden.yaml is a
``UsageError`` for ``calibrate``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from retrieval_assets import partitions
from retrieval_assets.cli.args import UsageError, index_corpus, pipeline_params
from retrieval_assets.corpus import golden
from retrieval_assets.evaluation import retrieval_rule
from retrieval_assets.params import RetrievalParams, default_name
from retrieval_assets.search import pipeline


def _history() -> str:
    return partitions.env_prefix() + partitions.HISTORY


def ruled_params(conn, args, schema: str) -> tuple[RetrievalParams, str]:
    """The parameters of a ``search`` or ``answer`` on the index in ``schema`` (see the contract) and the line saying which rule they are."""
    if args.pipeline != "default":
        return pipeline_params(args), f"retrieval rule: the named pipeline {args.pipeline} (--pipeline)"
    base, note = retrieval_rule.for_search(conn, _history(), partitions.corpus_name_for(args.corpus), args.embedder,
                                           ignore=args.ignore_rule, schema=schema)
    return pipeline_params(args, base), note


def search(conn, args, documents, chunks, out) -> None:
    """The query's top ``k`` chunks: rank, chunk id, score and the start of its text; the pipeline on the first line."""
    if not args.query.strip():
        raise UsageError("the query is empty")
    schema, embedder, _ = index_corpus(conn, args, chunks)
    params, note = ruled_params(conn, args, schema)
    trace = pipeline.run(conn, pipeline.retriever(conn, schema, embedder, params), args.query, params)
    rows = pipeline.fetch(conn, schema, [r.chunk_id for r in trace.final], vectors=False)
    print(f"pipeline: {params.describe()}", file=out)
    for n, r in enumerate(trace.final, 1):
        text = " ".join(rows[r.chunk_id][0].text.split()) if r.chunk_id in rows else ""
        print(f"{n}. {r.chunk_id} ({r.score:.3f}) {text[:100]}{'…' if len(text) > 100 else ''}", file=out)
    print(note, file=sys.stderr)


def calibrate(conn, args, documents, chunks, out) -> None:
    """Fit, store and print the corpus's retrieval rule for ``--embedder``."""
    path = Path(args.corpus) / "golden.yaml"
    if not path.exists():
        raise UsageError(f"{path}: no golden.yaml in the corpus folder; calibration needs the corpus's judged queries "
                         "(python -m retrieval_assets golden draft and golden review write one)")
    gold = golden.load_golden(path, documents)
    schema, embedder, _ = index_corpus(conn, args, chunks)
    rule, when = retrieval_rule.for_index(conn, _history(), schema, embedder, chunks, gold, partitions.corpus_name_for(args.corpus),
                                          args.embedder, refit=args.refit)
    print(rule.summary() + (f"; reused: fitted {when} UTC on this index version and these golden queries (--refit fits again)"
                            if when else ""), file=out)
    print(f"stored in {_history()}.{retrieval_rule.TABLE}: search and answer on this corpus and embedder use it "
          f"(--ignore-rule: {default_name(args.embedder)})", file=out)
