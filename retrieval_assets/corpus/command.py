"""``python -m retrieval_assets corpus add|list|remove``: the corpus registry from a shell.

Contract: ``add NAME PATH`` registers a folder (the Dagster definitions then show its assets,
``NAME/documents`` ..., and its job ``evaluate_embedders__NAME``); ``list`` prints every corpus
with its folder and whether that folder still exists; ``remove NAME --yes`` drops the corpus's
schemas, history rows and stored values, then its registration (without ``--yes`` it only says
what it would drop). Errors are ``registry.CorpusNameError`` with one line naming corpus and path.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from retrieval_assets import partitions, pg
from retrieval_assets.corpus import registry


def add_parser(commands) -> None:
    p = commands.add_parser("corpus", help="register, list or remove corpora (each its own assets in Dagster)",
                            description="register, list or remove corpora (each its own assets in Dagster)")
    p.add_argument("--dsn", default=None, help="Postgres DSN (default: $RETRIEVAL_DSN, else the embedded server)")
    actions = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    add = actions.add_parser("add", help="register a folder under a name")
    add.add_argument("name", help="1 to 24 of a-z, 0-9, _ (a letter first, no __)")
    add.add_argument("path", help="the corpus folder")
    actions.add_parser("list", help="every registered corpus")
    remove = actions.add_parser("remove", help="drop a corpus's schemas, history and stored values, then its registration")
    remove.add_argument("name")
    remove.add_argument("--yes", action="store_true", help="really drop (without it: only say what would be dropped)")


def run(args: argparse.Namespace, out) -> None:
    prefix = partitions.env_prefix()
    schema = prefix + partitions.HISTORY
    with pg.connect(args.dsn) as conn, pg.privileges(conn):
        if args.action == "add":
            corpus, new = registry.add(conn, schema, args.name, args.path)
            state = "registered" if new else "already registered"
            print(f"corpus {corpus.name}: {corpus.path} {state}; its job: "
                  f"dg launch --job {partitions.job_name('evaluate_embedders', corpus.name)} --partition hash", file=out)
        elif args.action == "list":
            for c in registry.listed(conn, schema):
                print(f"{c.name:<24} {c.path}{'' if Path(c.path).is_dir() else '  (folder missing)'}", file=out)
        elif not args.yes:
            registry.get(conn, schema, args.name)
            print(f"corpus {args.name}: would drop its schemas ({prefix}{args.name}__*), history rows and stored values; "
                  "nothing dropped: add --yes", file=out)
        else:
            dropped = registry.remove(conn, schema, args.name, prefix, prefix + partitions.IO_VALUES)
            print(f"corpus {args.name}: removed ({len(dropped)} schemas dropped: {', '.join(dropped) or 'none'})", file=out)
