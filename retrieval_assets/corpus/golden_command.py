"""``python -m retrieval_assets golden draft|review``: drafted golden sets from a shell.

Contract: ``draft --corpus DIR`` drafts queries for every document (``drafting.draft``; the
offline drafter, or Claude with ``--drafter claude``) and writes them to ``DIR/golden.draft.yaml``
(``--out``), never to golden.yaml; it prints the counts by kind, what was dropped and why a
document gave nothing. ``review --corpus DIR`` shows each query still ``draft`` with its anchor
chunk and asks: accept, edit (then accept), reject, skip or quit; ``--accept ID,ID``,
``--reject ID``, ``--edit ID QUERY`` decide without asking, ``--list`` prints the queries still
to review. Decisions are applied once, at the end (``draft_file.review``). Errors are one line.
"""

from __future__ import annotations

import argparse
import builtins
from pathlib import Path

from retrieval_assets.corpus import draft_file, drafting, golden
from retrieval_assets.corpus.draft_file import Decision
from retrieval_assets.index import chunker


def add_parser(commands) -> None:
    p = commands.add_parser("golden", help="draft golden queries for a corpus and review them into golden.yaml",
                            description="draft golden queries for a corpus and review them into golden.yaml")
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    draft = actions.add_parser("draft", help="write golden.draft.yaml: queries of the three kinds for every document")
    review = actions.add_parser("review", help="accept, edit or reject drafted queries; accepted ones go to golden.yaml")
    for sub in (draft, review):
        sub.add_argument("--corpus", required=True, help="the corpus folder")
        sub.add_argument("--max-chars", type=int, default=1200, help="chunking, as the index uses it (default 1200)")
        sub.add_argument("--overlap", type=int, default=1)
    draft.add_argument("--per-doc", type=int, default=3, help="queries per document, at most (default 3: one of each kind)")
    draft.add_argument("--out", default=None, help=f"the draft file (default DIR/{draft_file.DRAFT_NAME})")
    draft.add_argument("--drafter", choices=("offline", "claude"), default="offline",
                       help="offline (deterministic, no network) or claude (claude-agent-sdk; needs credentials)")
    draft.add_argument("--model", default=None, help="Claude model (default: the answers' model)")
    draft.add_argument("--max-cost", type=float, default=2.0, help="USD the Claude drafter may spend in all (default 2.0)")
    review.add_argument("--draft", default=None, help=f"the draft file (default DIR/{draft_file.DRAFT_NAME})")
    review.add_argument("--accept", default="", metavar="ID,ID", help="accept these queries as drafted")
    review.add_argument("--reject", default="", metavar="ID,ID", help="reject these queries")
    review.add_argument("--edit", nargs=2, action="append", default=[], metavar=("ID", "QUERY"), help="accept ID with the query text QUERY")
    review.add_argument("--list", action="store_true", help="print the queries still to review and stop")


def _chunks(args, documents):
    return [c for d in documents for c in chunker.chunk(d, max_chars=args.max_chars, overlap=args.overlap)]


def _draft(args, out) -> None:
    if args.per_doc < 1:
        raise ValueError(f"--per-doc must be at least 1, got {args.per_doc}")
    documents = chunker.load_documents(args.corpus)
    drafter = None
    if args.drafter == "claude":
        from retrieval_assets.corpus.draft_claude import ClaudeDrafter

        drafter = ClaudeDrafter(args.per_doc, model=args.model, max_cost_usd=args.max_cost)
    drafted = drafting.draft(documents, _chunks(args, documents), per_doc=args.per_doc, drafter=drafter)
    path = draft_file.write_draft(args.out or Path(args.corpus) / draft_file.DRAFT_NAME, drafted, corpus=str(Path(args.corpus).resolve()),
                                  per_doc=args.per_doc, max_chars=args.max_chars, overlap=args.overlap)
    counts = ", ".join(f"{n} {k}" for k, n in drafted.counts().items())
    print(f"{path}: {len(drafted.items)} queries drafted by {drafted.drafter} from {len(documents)} documents ({counts})", file=out)
    if drafted.dropped:
        print("candidates dropped: " + ", ".join(f"{n} {why}" for why, n in sorted(drafted.dropped.items())), file=out)
    if drafted.cost_usd:
        print(f"Claude cost: {drafted.cost_usd:.4f} USD", file=out)
    for note in drafted.reasons:
        print(f"note: {note}", file=out)
    print(f"next: python -m retrieval_assets golden review --corpus {args.corpus}", file=out)


def _show(item, chunk, n: int, total: int, out) -> None:
    flag = f"; trivial: '{item.trivial}' alone finds it" if item.trivial else ""
    print(f"\n[{n}/{total}] {item.query_id}  {item.kind}  (doc {item.doc_id}, {item.source}{flag})", file=out)
    print(f"  query:  {item.query}\n  anchor: {item.anchor}", file=out)
    if chunk is not None:
        text = " ".join(chunk.text.split())
        at = golden.normalise(text).find(golden.normalise(item.anchor))
        if at >= 0:  # the anchor marked, with up to 600 characters either side
            end = at + len(golden.normalise(item.anchor))
            text = f"{'...' if at > 600 else ''}{text[max(0, at - 600):at]}>>>{text[at:end]}<<<{text[end:end + 600]}"
        print(f"  chunk {chunk.chunk_id} ({chunk.heading_path or 'no heading'}):\n    {text[:2000]}", file=out)


def _ask(items, chunks, input_fn, out) -> dict[str, Decision]:
    by_id = {c.chunk_id: c for c in chunks}
    decisions: dict[str, Decision] = {}
    for n, item in enumerate(items, 1):
        _show(item, by_id.get(item.chunk_id) or drafting.anchor_chunk([c for c in chunks if c.doc_id == item.doc_id], item.anchor),
              n, len(items), out)
        while True:
            try:
                answer = input_fn("accept (a), edit (e), reject (r), skip (s), quit (q)? ").strip().lower()[:1]
            except EOFError:
                answer = "q"
            if answer in ("a", "r"):
                decisions[item.query_id] = Decision("accept" if answer == "a" else "reject")
            elif answer == "e":
                try:
                    query = input_fn(f"query [{item.query}]: ").strip() or item.query
                    kind = input_fn(f"kind [{item.kind}]: ").strip() or item.kind
                except EOFError:
                    return decisions
                if kind not in golden.KINDS:
                    print(f"  unknown kind {kind!r} (kinds: {', '.join(golden.KINDS)})", file=out)
                    continue
                decisions[item.query_id] = Decision("accept", query, kind)
            elif answer == "q":
                return decisions
            elif answer != "s":
                continue
            break
    return decisions


def _review(args, out, input_fn) -> None:
    path = Path(args.draft or Path(args.corpus) / draft_file.DRAFT_NAME)
    documents = chunker.load_documents(args.corpus)
    _, items = draft_file.read_draft(path)
    pending = [i for i in items if i.status == "draft"]
    if args.list:
        for i in pending:
            print(f"{i.query_id}\t{i.kind}\t{i.doc_id}\t{i.query}", file=out)
        return
    ids = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    decisions = {qid: Decision("accept") for qid in ids(args.accept)}
    decisions.update({qid: Decision("reject") for qid in ids(args.reject)})
    decisions.update({qid: Decision("accept", query) for qid, query in args.edit})
    scripted = bool(args.accept or args.reject or args.edit)
    if not scripted:
        if not pending:
            print(f"{path}: nothing to review ({len(items)} queries, none still draft)", file=out)
            return
        decisions = _ask(pending, _chunks(args, documents), input_fn, out)
    accepted, rejected = draft_file.review(args.corpus, path, decisions, documents)
    print(f"{accepted} accepted into {Path(args.corpus) / draft_file.GOLDEN_NAME} (status: reviewed), {rejected} rejected, "
          f"{len(pending) - accepted - rejected} still to review in {path}", file=out)


def run(args: argparse.Namespace, out, input_fn=None) -> None:
    if args.action == "draft":
        _draft(args, out)
    else:
        _review(args, out, input_fn or builtins.input)
