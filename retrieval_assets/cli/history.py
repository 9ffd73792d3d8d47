"""``python -m retrieval_assets runs|diff`` over the assets' history schema: the latest evaluations (their run ids),
and one pipeline's per-query nDCG and rank changes between two runs with a paired bootstrap interval."""

from __future__ import annotations

from retrieval_assets import partitions, pg
from retrieval_assets.cli.args import UsageError
from retrieval_assets.evaluation import history, regression


def _run_id(conn, schema: str, prefix: str) -> str:
    matches = history.run_ids(conn, schema, prefix)
    if len(matches) != 1:
        raise UsageError(f"run '{prefix}': {'no such run' if not matches else 'ambiguous prefix'} in {schema}.eval_queries "
                         "(python -m retrieval_assets runs lists them)")
    return matches.pop()


def report(args, out) -> None:
    """``runs`` or ``diff``, as ``args.command`` says."""
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
