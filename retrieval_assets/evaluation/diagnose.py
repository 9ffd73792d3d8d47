"""Why the pipeline misses golden queries, and whether the obvious fixes would help (stage 07).

Contract: ``diagnose`` returns one ``Diagnosis`` per golden query whose relevant chunks are all
outside the final top ``k``, with the first relevant rank in every list the query passed
through, a failure kind and a fix from the seed's vocabulary. ``what_if`` re-runs the golden set
with each mechanical fix applied and reports the misses it rescues and the hits it loses.
``render`` writes the report as Markdown.

Classification rules, applied in this order to the evidence of one miss:
1. reranker-demotion: fusion had a relevant chunk in the top k; the reranker (or MMR) pushed it out.
2. chunk-boundary: a chunk adjacent to a relevant one (same document, index +-1) is in the final
   top k, so the cut left the matching words on the wrong side of the anchor.
3. ranking: a relevant chunk is in the fused pool (top n) but ranked below k.
4. anchor-ambiguity: another chunk of the query's document is in the final top k.
5. vocabulary-gap: neither first-stage list reaches a relevant chunk within n.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import psycopg
from psycopg import sql

from retrieval_assets.index import chunker, store

from retrieval_assets.search import pipeline
from retrieval_assets.evaluation.evaluate import Evaluation, evaluate_pipelines
from retrieval_assets.params import DEFAULT, RetrievalParams
from retrieval_assets.search.pipeline import Retriever
from retrieval_assets.index.tables import statement, table_dims
from retrieval_assets.types import Chunk, Document, GoldenQuery

FAILURES = ("vocabulary-gap", "chunk-boundary", "ranking", "reranker-demotion", "anchor-ambiguity")
FIXES = ("hybrid-weights", "smaller-chunks", "contextual-chunk-headers", "query-rewrite", "better-embedder")
FIX_FOR = {
    "reranker-demotion": "hybrid-weights",
    "chunk-boundary": "contextual-chunk-headers",
    "ranking": "hybrid-weights",
    "anchor-ambiguity": "query-rewrite",
    "vocabulary-gap": "better-embedder",
}
LISTS = ("vector", "text", "fused", "reranked", "final", "exact_vector")
WEIGHT_GRID = ((0.5, 1.0), (1.0, 0.5), (0.25, 1.0), (1.0, 0.25))  # (vector, lexical), in the pipeline's own fusion


@dataclass(frozen=True)
class Diagnosis:
    query: GoldenQuery
    relevant: tuple[str, ...]
    ranks: dict[str, int | None]  # first relevant rank per list (LISTS); exact_vector over the whole table
    top: tuple[str, ...]
    neighbour: tuple[str, int] | None  # an adjacent chunk in the final top k, with its rank
    same_doc: tuple[str, int] | None  # another chunk of the query's document in the final top k
    failure: str
    fix: str


@dataclass(frozen=True)
class WhatIf:
    fix: str
    variant: str
    rescued: tuple[str, ...]
    lost: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Report:
    partition: str
    k: int
    n: int
    queries: int
    misses: list[Diagnosis]
    what_ifs: list[WhatIf] = field(default_factory=list)
    pipeline: str = ""  # the pipeline diagnosed, as RetrievalParams.describe() puts it


def _index(chunk_id: str) -> tuple[str, int]:
    doc_id, _, number = chunk_id.rpartition("#")
    return doc_id, int(number) if number.isdigit() else -1


def exact_vector_rank(conn: psycopg.Connection, schema: str, vector: np.ndarray, relevant: Sequence[str]) -> int | None:
    """Rank of the first relevant chunk by exact cosine distance to ``vector`` over the whole table (no index)."""
    if not np.any(vector) or not relevant:
        return None
    return conn.execute(
        statement(schema, """SELECT min(r) FROM (SELECT chunk_id, row_number() OVER (ORDER BY embedding <=> %s, chunk_id) AS r
                                FROM {chunks}) ranked WHERE chunk_id = ANY(%s)"""),
        (np.asarray(vector, dtype=np.float32), list(relevant)),
    ).fetchone()[0]


def classify(ranks: dict[str, int | None], neighbour, same_doc, k: int) -> str:
    """The failure kind of one miss, by the module's ordered rules."""
    if ranks["fused"] is not None and ranks["fused"] <= k:
        return "reranker-demotion"
    if neighbour is not None:
        return "chunk-boundary"
    if ranks["fused"] is not None:
        return "ranking"
    if same_doc is not None:
        return "anchor-ambiguity"
    return "vocabulary-gap"


def diagnose(conn: psycopg.Connection, retriever: Retriever, golden: Sequence[GoldenQuery],
             params: RetrievalParams = DEFAULT) -> list[Diagnosis]:
    """Every golden query without a relevant chunk in the final top ``params.k``, explained."""
    return explain(conn, retriever.schema, evaluate_pipelines(conn, retriever, golden, params), golden)


def explain(conn: psycopg.Connection, schema: str, ev: Evaluation, golden: Sequence[GoldenQuery]) -> list[Diagnosis]:
    """The misses of an evaluation already run (its per-query ranks and query vectors), explained:
    no query is searched again; only a miss's exact vector rank is computed."""
    by_id = {q.query_id: q for q in golden}
    out = []
    for r in ev.queries:
        if r.ranks["final"] is not None:
            continue
        q = by_id[r.query_id]
        ranks = {**r.ranks, "exact_vector": exact_vector_rank(conn, schema, r.query_vector, r.relevant)}
        top = r.ranked["mmr"]
        adjacent = {(doc, i + d) for doc, i in map(_index, r.relevant) for d in (-1, 1)}
        neighbour = next(((cid, rank) for rank, cid in enumerate(top, 1) if _index(cid) in adjacent), None)
        same_doc = next(((cid, rank) for rank, cid in enumerate(top, 1) if _index(cid)[0] == q.doc_id), None)
        failure = classify(ranks, neighbour, same_doc, ev.k)
        out.append(Diagnosis(q, r.relevant, ranks, top, neighbour, same_doc, failure, FIX_FOR[failure]))
    return out


def _variant_chunks(documents: Sequence[Document], chunks: Sequence[Chunk]) -> dict[str, tuple[str, list[Chunk]]]:
    """The re-chunked corpora of the chunking fixes: fix -> (variant, chunks)."""
    headed = [Chunk(c.chunk_id, c.doc_id, c.heading_path, c.start_char, c.end_char,
                    f"{c.heading_path}\n\n{c.text}" if c.heading_path else c.text) for c in chunks]
    return {
        "contextual-chunk-headers": ("heading path prepended to each chunk", headed),
        "smaller-chunks": ("max_chars 600", [c for d in documents for c in chunker.chunk(d, max_chars=600)]),
    }


def what_if(conn: psycopg.Connection, retriever: Retriever, golden: Sequence[GoldenQuery], documents: Sequence[Document],
            chunks: Sequence[Chunk], params: RetrievalParams = DEFAULT, *, scratch: str,
            others: Mapping[str, Retriever | None] | None = None,
            progress: Callable[[str], object] | None = None) -> list[WhatIf]:
    """Re-run the golden set with each mechanical fix: fusion weights (from the same first-stage
    lists), re-chunked corpora (indexed into the ``scratch`` schema, dropped afterwards) and the
    ``others`` partitions' retrievers (None: not available here; an index whose chunk ids differ
    from ``chunks`` holds another version of the corpus and is not compared). ``progress`` gets
    one line per experiment."""
    say = progress or (lambda message: None)

    def hits(r: Retriever, p: RetrievalParams = params, cache: dict | None = None) -> set[str]:
        return evaluate_pipelines(conn, r, golden, p, first_stage_cache=cache).hits()

    lists: dict = {}  # the base index's first-stage lists, shared by the fusion-weight variants
    base = hits(retriever, cache=lists)
    misses = {q.query_id for q in golden} - base

    def outcome(fix, variant, found, note="") -> WhatIf:
        return WhatIf(fix, variant, tuple(sorted(misses & found)), tuple(sorted(base - found)), note)

    results = []
    fusion = "RRF" if params.fusion == "rrf" else params.fusion
    for w in WEIGHT_GRID:
        results.append(outcome("hybrid-weights", f"{fusion} weights vector {w[0]:g}, lexical {w[1]:g}", hits(retriever, params.with_(weights=w), lists)))
        say(f"what-if {results[-1].variant}: rescued {len(results[-1].rescued)}, lost {len(results[-1].lost)}")
    embedder = retriever.embedder
    try:
        for fix, (variant, variant_chunks) in _variant_chunks(documents, chunks).items():
            store.drop(conn, scratch)
            store.create(conn, scratch, embedder.dims)
            say(f"what-if {fix}: indexing {len(variant_chunks)} chunks into {scratch}")
            store.sync(conn, scratch, variant_chunks, embedder, allow_shrink=True)
            # built after each sync: a bulk-loaded scratch table carries its own vector-search choice
            results.append(outcome(fix, variant, hits(pipeline.retriever(conn, scratch, embedder, params, reranker=retriever.reranker))))
            say(f"what-if {fix}: rescued {len(results[-1].rescued)}, lost {len(results[-1].lost)}")
    finally:  # the scratch schema is this run's alone (unique name), dropped even when an experiment fails
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(scratch)))
    for name, other in (others or {}).items():
        if other is None or table_dims(conn, other.schema) != other.embedder.dims:
            results.append(WhatIf("better-embedder", f"the {name} partition", (), (), f"not run: partition {name} is not indexed"))
        elif store.chunk_ids(conn, other.schema) != {c.chunk_id for c in chunks}:
            results.append(WhatIf("better-embedder", f"the {name} partition", (), (),
                                  f"not run: partition {name} holds another version of this corpus (materialize its chunk_index first)"))
        else:
            results.append(outcome("better-embedder", f"the {name} partition", hits(other)))
    return results


def _rank(value: int | None) -> str:
    return "none" if value is None else str(value)


_EXPLAIN = {
    "vocabulary-gap": "the query shares too few words with the passage that answers it: neither the vector list nor the full-text list brings a relevant chunk into the top {n}",
    "chunk-boundary": "a neighbouring chunk of the same document reaches the final top {k} while the chunk holding the anchor does not: the cut left the matching words on the other side",
    "ranking": "a relevant chunk is inside the fused pool of {n}, but fusion ranks it below {k} because other candidates match the query's common words as well or better",
    "reranker-demotion": "fusion had a relevant chunk in its top {k}, and the BM25 reranker or MMR pushed it out, because the passage answers in words the query does not use",
    "anchor-ambiguity": "another chunk of the right document is in the top {k}, one that may answer the question without the anchor phrase",
}


def render(report: Report) -> str:
    """The report as Markdown: the table, one paragraph per failure kind used, the what-if results."""
    by_query: dict[str, list[str]] = {}
    for w in report.what_ifs:
        for qid in w.rescued:
            by_query.setdefault(qid, []).append(w.variant)
    lines = [
        f"# Retrieval analysis: {report.partition}", "",
        f"{len(report.misses)} of {report.queries} golden queries have no relevant chunk in the final top {report.k} "
        f"(fused pool n = {report.n}{'; ' + report.pipeline if report.pipeline else ''}). Ranks are of the first relevant chunk in each list; "
        "exact vector is the rank by exact cosine distance over the whole table.", "",
        "| query_id | failure | fix | kind | vector | text | fused | reranked | exact vector | rescued by |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in report.misses:
        r = d.ranks
        lines.append(f"| {d.query.query_id} | {d.failure} | {d.fix} | {d.query.kind} | {_rank(r['vector'])} | {_rank(r['text'])} "
                     f"| {_rank(r['fused'])} | {_rank(r['reranked'])} | {_rank(r['exact_vector'])} | {'; '.join(by_query.get(d.query.query_id, [])) or ('none' if report.what_ifs else 'not run')} |")
    for kind in FAILURES:
        examples = [d for d in report.misses if d.failure == kind]
        if not examples:
            continue
        ids = ", ".join(d.query.query_id for d in examples)
        detail = "; ".join(
            f"{d.query.query_id} (\"{d.query.query}\") has its anchor chunk at vector rank {_rank(d.ranks['exact_vector'])}, "
            f"full-text rank {_rank(d.ranks['text'])}, fused rank {_rank(d.ranks['fused'])}"
            + (f", while neighbour {d.neighbour[0]} sits at {d.neighbour[1]}" if kind == "chunk-boundary" and d.neighbour else "")
            for d in examples[:3]
        )
        lines += ["", f"## {kind}", "",
                  f"In {len(examples)} {'miss' if len(examples) == 1 else 'misses'} ({ids}), "
                  + _EXPLAIN[kind].format(k=report.k, n=report.n) + f". For example, {detail}. "
                  f"The proposed fix is {FIX_FOR[kind]}."]
    if not report.what_ifs:
        lines += ["", "## What-if experiments", "", "Not run: materialize the `what_ifs` asset (group experiments) or "
                  "`python -m retrieval_assets diagnose` to test each fix on the whole golden set."]
    else:
        lines += ["", "## What-if experiments", "",
                  "Each fix applied to the whole golden set: misses it rescues, hits it loses.", "",
                  "| fix | variant | rescued | lost | note |", "|---|---|---|---|---|"]
        lines += [f"| {w.fix} | {w.variant} | {', '.join(w.rescued) or 'none'} | {', '.join(w.lost) or 'none'} | {w.note} |" for w in report.what_ifs]
    return "\n".join(lines) + "\n"
