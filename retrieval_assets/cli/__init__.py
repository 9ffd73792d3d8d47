"""The command line: ``python -m retrieval_assets <command>``.

Commands: ``index`` (sync a corpus into a partition's command-line schema; with
``--check-vector-index``, choose its vector search by measured recall), ``evaluate`` (the
golden-set report), ``diagnose`` (the failure report with what-ifs), ``chunk-stats`` (corpus
statistics), ``answer`` (an extractive cited answer), ``search`` (the top chunks of a query) and ``calibrate``
(the corpus's retrieval rule, which ``search`` and ``answer`` use: ``cli.rule``), ``golden draft|review`` (drafted golden sets,
``corpus.golden_command``), and over the assets' history ``runs``
(the latest evaluations) and ``diff`` (per-query changes between two runs: ``cli.history``). The parser is ``cli.parser``,
the shared pieces (``UsageError``, the pipeline options, the corpus's command-line index) ``cli.args``. Every command indexes into
``partitions.schema_name(embedder, "cli", corpus=...)`` (after ``$RETRIEVAL_SCHEMA_PREFIX``), never the
Dagster assets' schema. Every bad
argument or input is one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys

from retrieval_assets import pg
from retrieval_assets.cli import answer, history, parser, reports, rule
from retrieval_assets.cli.args import UsageError, chunks_of, index_corpus
from retrieval_assets.corpus import command as corpus_command, golden, golden_command
from retrieval_assets.corpus.datasets import DatasetError
from retrieval_assets.index import chunker, vector_index
from retrieval_assets.index.fastembed_models import ModelUnavailableError


def run(argv: list[str] | None = None, out=None) -> int:
    """Parse ``argv`` and run the command; raises ``UsageError`` and the library's errors."""
    out = out or sys.stdout
    args = parser.build(__doc__.split("\n\n")[0]).parse_args(argv)
    if args.command in ("runs", "diff"):
        history.report(args, out)
        return 0
    if args.command in ("corpus", "golden"):
        (corpus_command if args.command == "corpus" else golden_command).run(args, out)
        return 0
    documents = chunker.load_documents(args.corpus)
    if args.command == "chunk-stats":
        print(json.dumps(chunker.stats(documents, max_chars=args.max_chars, overlap=args.overlap), indent=2), file=out)
        return 0
    chunks = chunks_of(args, documents)
    if args.command == "index":
        try:
            vector_index.check_recall_target(args.recall_target)
        except ValueError as exc:
            raise UsageError(f"--recall-target: {exc}") from None
    with pg.connect(args.dsn) as conn, pg.privileges(conn):
        if args.command == "index":
            schema, embedder, report = index_corpus(conn, args, chunks)
            print(f"{schema}: {report.inserted} inserted, {report.updated} updated, {report.deleted} deleted, "
                  f"{report.unchanged} unchanged, {report.embedded} embedded ({embedder.name})", file=out)
            if args.check_vector_index:
                with conn.transaction():
                    vector_index.choose_vector_index(conn, schema, embedder, args.recall_target)
            chosen = vector_index.vector_index(conn, schema)
            print(f"vector search: {chosen.kind}: {chosen.reason}" if chosen else
                  "vector search: hnsw, not checked (a bulk load checks it; --check-vector-index does now)", file=out)
        else:
            {"evaluate": reports.golden_report, "diagnose": reports.failure_report, "answer": answer.answer_question,
             "search": rule.search, "calibrate": rule.calibrate}[args.command](conn, args, documents, chunks, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``run``, with every expected failure as one ``error:`` line and exit status 2."""
    try:
        return run(argv)
    except (UsageError, chunker.CorpusError, golden.GoldenError, DatasetError, pg.ConnectError,
            ModelUnavailableError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
