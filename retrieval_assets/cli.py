"""The command line: ``python -m retrieval_assets <command>``.

Commands: ``index`` (sync a corpus into a partition's command-line schema; with
``--check-vector-index``, choose its vector search by measured recall), ``evaluate`` (the
golden-set report), ``diagnose`` (the failure report with what-ifs), ``chunk-stats`` (corpus
statistics), ``answer`` (an extractive cited answer), ``search`` (the top chunks of a query) and ``calibrate``
(the corpus's retrieval rule, which ``search`` and ``answer`` use: ``cli_rule``), ``golden draft|review`` (drafted golden sets,
``corpus.golden_command``), and over the assets' history ``runs``
(the latest evaluations) and ``diff`` (per-query changes between two runs). Every command indexes into
``partitions.schema_name(embedder, "cli", corpus=...)`` (after ``$RETRIEVAL_SCHEMA_PREFIX``), never the
Dagster assets' schema. Every bad
argument or input is one ``error: ...`` line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from retrieval_assets import cli_rule, partitions, pg

from retrieval_assets.answers import answer, calibration, respond

from retrieval_assets.corpus import command as corpus_command, golden, golden_command

from retrieval_assets.evaluation import diagnose, evaluate, history, regression

from retrieval_assets.index import chunker, vector_index

from retrieval_assets.search import pipeline
from retrieval_assets.corpus.datasets import DatasetError
from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.params import DEFAULT, FUSION, LEXICAL, PIPELINES, RERANK_FUSION
from retrieval_assets.cli_args import UsageError, chunks_of, index_corpus, pipeline_params


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage dump
        raise UsageError(f"{self.prog}: {message}")


def _partition(key: str) -> str:
    """``--embedder``: a partition key, else the sentence ``dg launch --partition`` gives for it."""
    try:
        return partitions.get(key).key
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    top = _Parser(prog="python -m retrieval_assets", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True, parser_class=_Parser)
    specs = {
        "index": "sync a corpus into the embedder's command-line schema",
        "evaluate": "index, then print the golden-set report for hybrid, + rerank, + MMR",
        "diagnose": "index, then print the failure report with its what-if experiments",
        "chunk-stats": "print corpus statistics as JSON",
        "answer": "index, then answer a question from the corpus with cited source sentences",
        "search": "index, then print the top chunks of a query (the corpus's calibrated retrieval rule when stored)",
        "calibrate": "index, then fit the corpus's retrieval rule on its golden.yaml and store it for search and answer",
    }
    corpus_command.add_parser(commands)
    golden_command.add_parser(commands)
    for name, help_text in {"runs": "list the latest evaluations in the assets' history (run ids for diff)",
                            "diff": "per-query nDCG and rank changes of one pipeline between two runs of the history"}.items():
        p = commands.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
        p.add_argument("--pipeline", default="mmr", help="stage as recorded: mmr (the final list), rerank, hybrid; seed:mmr etc. for the seed pipeline")
        if name == "diff":
            p.add_argument("before", help="run id (or a unique prefix) of the earlier run")
            p.add_argument("after", help="run id (or a unique prefix) of the later run")
        else:
            p.add_argument("--corpus-name", default=None, help="only this corpus (default: all)")
    for name, help_text in specs.items():
        p = commands.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--corpus", default=str(partitions.FIXTURE_DIR), help=f"corpus directory (default: the fixture corpus, {partitions.FIXTURE_DIR})")
        p.add_argument("--max-chars", type=int, default=1200)
        p.add_argument("--overlap", type=int, default=1)
        if name == "chunk-stats":
            continue
        p.add_argument("--embedder", default="hash", type=_partition, help=f"embedder partition: {', '.join(partitions.PARTITIONS)}")
        p.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
        if name == "calibrate":
            p.add_argument("--refit", action="store_true", help="fit again even when the stored rule was fitted on this index and golden.yaml")
            continue
        if name == "index":
            p.add_argument("--check-vector-index", action="store_true",
                           help="after the sync, measure the HNSW index's recall and keep it or scan exactly "
                                "(vector_index.choose_vector_index; done by itself after a bulk load)")
            p.add_argument("--recall-target", type=float, default=vector_index.RECALL_TARGET,
                           help=f"recall@10 the graph must reach, within [0, 1] (default {vector_index.RECALL_TARGET})")
            continue
        p.add_argument("--pipeline", default="default", help=f"named pipeline ({', '.join(PIPELINES)}); the options below override it")
        p.add_argument("--k", type=int, default=DEFAULT.k if name != "answer" else answer.SOURCES.k)
        p.add_argument("--n", type=int, default=DEFAULT.n, help="fused candidate pool size")
        p.add_argument("--lexical", default=None, choices=LEXICAL, help="lexical list fused with vectors")
        p.add_argument("--fusion", default=None, choices=FUSION, help="how the two lists are fused")
        p.add_argument("--vector-weight", type=float, default=None, help="fusion weight of the vector list in [0, 1] (lexical: 1 - it)")
        p.add_argument("--rerank-weight", type=float, default=None, help="the reranker's share of the rerank score in [0, 1]")
        p.add_argument("--rerank-fusion", default=None, choices=RERANK_FUSION, help="mix the reranker's list with the fused one by scores or ranks")
        p.add_argument("--mmr-lambda", type=float, default=None, help="MMR trade-off in [0, 1]")
        p.add_argument("--no-mmr", action="store_true", help="no MMR")
        p.add_argument("--corpus-idf", action="store_true", help="BM25 rerank with corpus-level idf instead of the pool's")
        p.add_argument("--prf-docs", type=int, default=None,
                       help="pseudo-relevance feedback from the first search's top chunks (0: none; needs --lexical bm25 for RM3)")
        p.add_argument("--prf-terms", type=int, default=None, help="RM3 expansion terms kept")
        p.add_argument("--prf-weight", type=float, default=None, help="RM3's share of the expanded query in [0, 1]")
        p.add_argument("--prf-beta", type=float, default=None, help="Rocchio weight of the feedback chunks' mean vector (0: none)")
        if name == "evaluate":
            p.add_argument("--failures", action="store_true", help="print query_id, kind, best_rank of every miss instead")
            p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON ('-' for stdout)")
        elif name == "diagnose":
            p.add_argument("--no-what-if", action="store_true", help="skip the what-if experiments")
        if name in ("answer", "search"):
            p.add_argument("question" if name == "answer" else "query")
            p.add_argument("--ignore-rule", action="store_true", help="params.DEFAULT even when a calibrated retrieval rule is stored")
        if name == "answer":
            p.add_argument("--floor", type=float, default=None,
                           help="refuse below this BM25 support instead (the seed's floor: "
                                f"{answer.SUPPORT_FLOOR}, fitted on the fixture corpus); default: the corpus's calibrated support "
                                "(its golden.yaml against off-corpus questions, or the cross-corpus default)")
    return top


def _evaluate(conn, args, documents, chunks, out) -> None:
    params = pipeline_params(args)
    gold = golden.load_golden(Path(args.corpus) / "golden.yaml", documents)
    schema, embedder, _ = index_corpus(conn, args, chunks)
    ev = evaluate.evaluate_pipelines(conn, pipeline.retriever(conn, schema, embedder, params), gold, params)
    if args.failures:
        print("query_id\tkind\tbest_rank", file=out)
        for q in ev.failures():
            print(f"{q.query_id}\t{q.kind}\t{q.best_rank if q.best_rank is not None else 'none'}", file=out)
    else:
        print(f"embedder {embedder.name}, pipeline {args.pipeline}: {params.describe()}; k={params.k}, n={params.n}: "
              f"fused recall@{params.n} = {ev.pool_recall:.3f}", file=out)
        for name, label in (("hybrid", f"hybrid ({params.fusion})"), ("rerank", "+ rerank"), ("mmr", "final (+ MMR when set)")):
            print(f"\n{label}", file=out)
            evaluate.report(ev.metrics[name], file=out)
    if args.json:
        text = json.dumps(evaluate.as_dict(ev), indent=2)
        if args.json == "-":
            print(text, file=out)
        else:
            Path(args.json).write_text(text + "\n")


def _diagnose(conn, args, documents, chunks, out) -> None:
    params = pipeline_params(args)
    gold = golden.load_golden(Path(args.corpus) / "golden.yaml", documents)
    schema, embedder, _ = index_corpus(conn, args, chunks)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    misses = diagnose.diagnose(conn, retriever, gold, params)
    what_ifs = [] if args.no_what_if else diagnose.what_if(
        conn, retriever, gold, documents, chunks, params, scratch=partitions.schema_name(args.embedder, "whatif", partitions.env_prefix(), run=uuid.uuid4().hex[:8]))
    print(diagnose.render(diagnose.Report(args.embedder, params.k, params.n, len(gold), misses, what_ifs, params.describe())), end="", file=out)


def _answer(conn, args, documents, chunks, out) -> None:
    if not args.question.strip():
        raise UsageError("the question is empty")
    try:
        if args.floor is not None:
            answer.check_floor(args.floor, "--floor")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    schema, embedder, _ = index_corpus(conn, args, chunks)
    params, rule = cli_rule.ruled_params(conn, args, schema)
    if params != pipeline_params(args):  # said only when a calibrated rule changed the retrieval
        print(rule, file=sys.stderr)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    if args.floor is not None:  # the seed's path
        found = answer.sources(conn, retriever, args.question, params)
        result = answer.extractive_answer(args.question, [c for c, _ in found], scores=[s for _, s in found], floor=args.floor)
        line = f"support: the best source's BM25 score, answered from {args.floor:g} (--floor)"
    else:
        gold = Path(args.corpus) / "golden.yaml"
        questions = [q.query for q in golden.load_golden(gold, documents)] if gold.exists() else []
        cal, made = calibration.for_index(conn, retriever, questions, params, args.embedder)
        if made:
            print(f"calibrated support on {len(questions)} questions of the corpus and {cal.off_corpus} off-corpus questions "
                  f"(stored in {schema}; later answers on this index reuse it)", file=sys.stderr)
        response = respond.respond(conn, retriever, args.question, params, cal)
        found, result = response.sources, response.result
        line = f"support {response.support:.2f}, answered from {cal.model.threshold:.2f} ({cal.source} calibration: {cal.note})"
    print(result.text, file=out)
    for n, (c, score) in enumerate(found, 1):
        print(f"[{n}] {c.chunk_id} ({score:.2f})", file=out)
    print(line, file=out)


def _run_id(conn, schema: str, prefix: str) -> str:
    matches = history.run_ids(conn, schema, prefix)
    if len(matches) != 1:
        raise UsageError(f"run '{prefix}': {'no such run' if not matches else 'ambiguous prefix'} in {schema}.eval_queries "
                         "(python -m retrieval_assets runs lists them)")
    return matches.pop()


def _history(args, out) -> None:
    schema = partitions.env_prefix() + partitions.HISTORY
    with pg.connect(args.dsn) as conn, pg.privileges(conn):
        if args.command == "runs":
            print(f"{'run':<10} {'partition':<10} {'corpus':<12} {'k':>3} {'queries':>7}  time (UTC)", file=out)
            for r in history.runs(conn, schema, args.corpus_name):
                print(f"{r['run_id'][:8]:<10} {r['partition']:<10} {r['corpus']:<12} {r['k']:>3} {r['queries']:>7}  {r['created_at']:%Y-%m-%d %H:%M}", file=out)
            return
        before, after = (_run_id(conn, schema, prefix) for prefix in (args.before, args.after))
        a, b = history.query_rows(conn, schema, before, args.pipeline), history.query_rows(conn, schema, after, args.pipeline)
    if not a or not b:
        raise UsageError(f"pipeline '{args.pipeline}' has no per-query rows in {'run ' + before[:8] if not a else 'run ' + after[:8]}")
    changes, left_out = regression.pair(a, b)
    mean, low, high = regression.paired_bootstrap([c.delta for c in changes])
    print(f"{args.pipeline}: {before[:8]} -> {after[:8]}: {len(changes)} paired queries, mean nDCG change {mean:+.4f} "
          f"(95% bootstrap interval {low:+.4f} to {high:+.4f})" + (f"; left out (changed or not in both): {', '.join(left_out)}" if left_out else ""), file=out)
    print(f"{'query':<8} {'kind':<11} {'rank':>11} {'nDCG before':>12} {'after':>7} {'change':>7}", file=out)
    show = lambda r: "-" if r is None else str(r)  # noqa: E731
    for c in sorted(changes, key=lambda c: (c.delta, c.query_id)):
        print(f"{c.query_id:<8} {c.kind:<11} {show(c.rank_before):>5} -> {show(c.rank_after):<3} {c.before:>12.3f} {c.after:>7.3f} {c.delta:>+7.3f}", file=out)


def run(argv: list[str] | None = None, out=None) -> int:
    """Parse ``argv`` and run the command; raises ``UsageError`` and the library's errors."""
    out = out or sys.stdout
    args = _parser().parse_args(argv)
    if args.command in ("runs", "diff"):
        _history(args, out)
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
            {"evaluate": _evaluate, "diagnose": _diagnose, "answer": _answer, "search": cli_rule.search,
             "calibrate": cli_rule.calibrate}[args.command](conn, args, documents, chunks, out)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``run``, with every expected failure as one ``error:`` line and exit status 2."""
    try:
        return run(argv)
    except (UsageError, chunker.CorpusError, golden.GoldenError, DatasetError, pg.ConnectError,
            ModelUnavailableError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
