"""Every registered corpus as its own part of the graph: assets under ``<corpus>/``, groups named
after it, its own jobs, schedule and sensor.

The registry (``corpus.registry``, in Postgres beside the history) is read when the definitions
load: ``python -m retrieval_assets corpus add NAME PATH`` registers a folder, and the next load
(a new ``dg launch``, or Reload in the UI) shows its assets. ``docs/design.md`` says why a corpus is a
key prefix and not a partition dimension.
"""

from collections.abc import Iterable

import dagster as dg

from retrieval_assets import partitions, pg
from retrieval_assets.corpus import registry
from retrieval_assets.corpus.registry import Corpus
from retrieval_assets.defs.answers import answer_assets
from retrieval_assets.defs.corpus import corpus_assets
from retrieval_assets.defs.diagnosis import diagnosis_assets
from retrieval_assets.defs.evaluation import evaluation_assets
from retrieval_assets.defs.golden_drafts import golden_drafts_assets
from retrieval_assets.defs.index import index_assets
from retrieval_assets.defs.retrieval_rule import retrieval_rule_assets
from retrieval_assets.defs import remote
from retrieval_assets.defs.jobs import corpus_jobs
from retrieval_assets.defs.resources import PostgresResource


def corpus_definitions(corpus: Corpus, server: str = "") -> dg.Definitions:
    """The assets, checks, jobs, schedule and sensor of one corpus (``server``: its jobs' server tag)."""
    assets = [*corpus_assets(corpus), *golden_drafts_assets(corpus), *index_assets(corpus), *retrieval_rule_assets(corpus),
              *evaluation_assets(corpus),
              *diagnosis_assets(corpus), *answer_assets(corpus)]
    return dg.Definitions.merge(dg.Definitions(assets=assets), corpus_jobs(corpus, server))


def definitions_for(corpora: Iterable[Corpus], server: str = "") -> dg.Definitions:
    return dg.Definitions.merge(*(corpus_definitions(c, server) for c in corpora))


@dg.definitions
def corpora() -> dg.Definitions:
    """Read where the graph runs from: the registry, and the server its jobs' runs carry as a tag, which
    each of their steps checks (``defs/remote.py``: a step elsewhere never falls back to its own server)."""
    postgres = PostgresResource(schema_prefix=partitions.env_prefix())  # no dsn: $RETRIEVAL_DSN, else the embedded default
    try:
        with postgres.connect() as conn:
            if remote.refusal() is None:  # the launcher: the registry exists, and the role may create schemas, before any step
                registry.ensure(conn, postgres.history_schema)
            registered = registry.listed(conn, postgres.history_schema)
            server = pg.identity.identify(conn, postgres.dsn, postgres.schema_prefix)
    except pg.ConnectError:
        if remote.refusal() is None:
            raise
        # A remote step's process without RETRIEVAL_DSN (defs/remote.py) whose instance is not the project's (a
        # Celery task's is, and refuses first: instance.check_remote_settings): the fixture's definitions, read from
        # no server, so that its step fails with the one line naming RETRIEVAL_DSN and the run's server (an error
        # of the definitions load reaches a launcher without its cause).
        return definitions_for([registry.FIXTURE_CORPUS])
    return definitions_for(registered, server.tag())
