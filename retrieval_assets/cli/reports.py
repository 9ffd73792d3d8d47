"""``python -m retrieval_assets evaluate|diagnose``: the golden-set report of the pipeline (``--failures``: only its
misses; ``--json``: the numbers too) and the failure report with its what-if experiments, both on the corpus's
command-line index."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from retrieval_assets import partitions
from retrieval_assets.cli.args import index_corpus, pipeline_params
from retrieval_assets.corpus import golden
from retrieval_assets.evaluation import diagnose, evaluate
from retrieval_assets.search import pipeline


def golden_report(conn, args, documents, chunks, out) -> None:
    """``evaluate``: hybrid, + rerank and the final list against golden.yaml, or its misses; ``--json`` the numbers."""
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


def failure_report(conn, args, documents, chunks, out) -> None:
    """``diagnose``: each golden query the pipeline misses, and what-ifs unless ``--no-what-if``."""
    params = pipeline_params(args)
    gold = golden.load_golden(Path(args.corpus) / "golden.yaml", documents)
    schema, embedder, _ = index_corpus(conn, args, chunks)
    retriever = pipeline.retriever(conn, schema, embedder, params)
    misses = diagnose.diagnose(conn, retriever, gold, params)
    what_ifs = [] if args.no_what_if else diagnose.what_if(
        conn, retriever, gold, documents, chunks, params, scratch=partitions.schema_name(args.embedder, "whatif", partitions.env_prefix(), run=uuid.uuid4().hex[:8]))
    print(diagnose.render(diagnose.Report(args.embedder, params.k, params.n, len(gold), misses, what_ifs, params.describe())), end="", file=out)
