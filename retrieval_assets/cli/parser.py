"""The command line's argument parser: every command, its options and their defaults; a bad argument is a ``UsageError``
(one line), and ``--embedder`` takes a partition key with the sentence ``dg launch --partition`` gives for another."""

from __future__ import annotations

import argparse

from retrieval_assets import partitions
from retrieval_assets.answers import answer
from retrieval_assets.cli.args import UsageError
from retrieval_assets.corpus import command as corpus_command, golden_command
from retrieval_assets.index import vector_index
from retrieval_assets.params import DEFAULT, FUSION, LEXICAL, PIPELINES, RERANK_FUSION, RERANK_IDF


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of argparse's usage dump
        raise UsageError(f"{self.prog}: {message}")


def _partition(key: str) -> str:
    """``--embedder``: a partition key, else the sentence ``dg launch --partition`` gives for it."""
    try:
        return partitions.get(key).key
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build(description: str) -> argparse.ArgumentParser:
    """The parser of ``python -m retrieval_assets``, described by ``description``."""
    top = _Parser(prog="python -m retrieval_assets", description=description)
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
        p.add_argument("--pipeline", default="default", help=f"named pipeline ({', '.join(PIPELINES)}; default: the embedder's, params.default_for); the options below override it")
        p.add_argument("--k", type=int, default=DEFAULT.k if name != "answer" else answer.SOURCES_K)
        p.add_argument("--n", type=int, default=DEFAULT.n, help="fused candidate pool size")
        p.add_argument("--lexical", default=None, choices=LEXICAL, help="lexical list fused with vectors")
        p.add_argument("--fusion", default=None, choices=FUSION, help="how the two lists are fused")
        p.add_argument("--vector-weight", type=float, default=None, help="fusion weight of the vector list in [0, 1] (lexical: 1 - it)")
        p.add_argument("--rerank-weight", type=float, default=None, help="the reranker's share of the rerank score in [0, 1]")
        p.add_argument("--rerank-fusion", default=None, choices=RERANK_FUSION, help="mix the reranker's list with the fused one by scores or ranks")
        p.add_argument("--mmr-lambda", type=float, default=None, help="MMR trade-off in [0, 1]")
        p.add_argument("--no-mmr", action="store_true", help="no MMR")
        p.add_argument("--corpus-idf", action="store_true", help="BM25 rerank with corpus-level idf instead of the pool's")
        p.add_argument("--rerank-idf", default=None, choices=RERANK_IDF, help="where the BM25 rerank's idf comes from: the fused pool or every chunk")
        p.add_argument("--doc-weight", type=float, default=None, help="document evidence after the rerank in [0, 1] (0: none)")
        p.add_argument("--evidence-shift", type=float, default=None,
                       help="share of the lexical weight moved to the vector list as the lexical evidence is weak, in [0, 1] (0: fixed)")
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
            p.add_argument("--ignore-rule", action="store_true", help="the embedder's default pipeline even when a calibrated retrieval rule is stored")
        if name == "answer":
            p.add_argument("--floor", type=float, default=None,
                           help="refuse below this BM25 support instead (the seed's floor: "
                                f"{answer.SUPPORT_FLOOR}, fitted on the fixture corpus); default: the corpus's calibrated support "
                                "(its golden.yaml against off-corpus questions, or the cross-corpus default)")
    return top
