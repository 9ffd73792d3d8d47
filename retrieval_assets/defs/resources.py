"""The resources every asset reads: the corpus, Postgres (``RETRIEVAL_DSN`` when set, else the
embedded default of ``pg``), and the run executor; ``user_errors`` turns the library's
bad-input errors into one clear step failure."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import psycopg
from pydantic import PrivateAttr

from retrieval_assets import partitions, pg
from retrieval_assets.defs import console, remote  # noqa: F401 - console: a foreseen failure is one console line
from retrieval_assets.defs.executor import retrieval_executor

from retrieval_assets.index import store
from retrieval_assets.index.chunker import CorpusError
from retrieval_assets.index.fastembed_models import ModelUnavailableError
from retrieval_assets.corpus.golden import GoldenError
from retrieval_assets.corpus.registry import CorpusNameError


class CorpusResource(dg.ConfigurableResource):
    """Where reports go, and (optional) a corpus folder to register from run config.

    A corpus is part of the graph, not of this resource: each registered corpus has assets of its own
    (``<corpus>/documents`` ...; ``defs/corpora.py``). ``name`` and ``path`` register the folder under
    that name for a launch that gives them (``--config``), and a run of another corpus's job then stops
    at once, naming the job to launch."""

    name: str = ""
    path: str = ""
    report_dir: str = ""  # default: <RETRIEVAL_HOME>/.retrieval/reports (outside the tracked tree)

    def report_path(self, corpus: str, partition: str) -> Path:
        base = Path(self.report_dir) if self.report_dir else pg.project_home() / ".retrieval" / "reports"
        return base / corpus / partition / "RETRIEVAL_ANALYSIS.md"


class PostgresResource(dg.ConfigurableResource):
    """Connections to the retrieval database; each embedder partition of a corpus works in its own schema."""

    dsn: str | None = None
    schema_prefix: str = ""  # before every schema name (tests use their own)
    _run_server: pg.identity.ServerIdentity | None = PrivateAttr(default=None)  # the run's (defs/remote.py)
    _checked: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._run_server = remote.server_tag(context.run.tags if context.run else None)

    def schema(self, partition: str, role: str = "index", corpus: str = partitions.FIXTURE, run: str = "") -> str:
        return partitions.schema_name(partition, role, self.schema_prefix, corpus, run)

    @property
    def history_schema(self) -> str:
        return self.schema_prefix + partitions.HISTORY

    @property
    def io_schema(self) -> str:
        return self.schema_prefix + partitions.IO_VALUES

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection]:
        """``with postgres.connect() as conn``: a connection for the block, reused across the run's steps (``pg.session``);
        the first in a step checks that this process's server is the run's (``ConnectError`` naming RETRIEVAL_DSN), and
        a privilege the server refuses in the block is a ``pg.PrivilegeError`` naming the SQL that grants it."""
        if self._run_server is not None and not self._checked:
            pg.identity.check(self._run_server, self.dsn, self.schema_prefix)
            self._checked = True
        with pg.session(self.dsn) as conn, pg.privileges(conn):
            yield conn


USER_ERRORS = (CorpusError, CorpusNameError, GoldenError, pg.ConnectError, ModelUnavailableError, store.ShrinkError, store.ChunkTooLargeError)


@contextmanager
def user_errors(what: str) -> Iterator[None]:
    """Re-raise a bad corpus, golden set, server, privilege or model as ``dg.Failure`` with the library's
    message (which names the file, query id or host and the fix, never a password) and the error's kind as
    metadata: the same sentence the command line prints, and the console's one line for it (``console.py``)."""
    try:
        yield
    except USER_ERRORS as exc:
        raise dg.Failure(description=f"{what}: {exc}", metadata={"error": type(exc).__name__, "step": what}) from None


def postgres_resource() -> PostgresResource:
    """The retrieval Postgres of this process: ``$RETRIEVAL_DSN`` (else the embedded default) and ``$RETRIEVAL_SCHEMA_PREFIX``."""
    return PostgresResource(dsn=dg.EnvVar("RETRIEVAL_DSN") if os.environ.get("RETRIEVAL_DSN") else None,
                            schema_prefix=partitions.env_prefix())


@dg.definitions
def resources() -> dg.Definitions:
    # In-process executor by default: a run is a short chain of steps over one database, and the
    # default multiprocess executor re-imports Dagster (about 1.2 s) in a new process for every step
    # (measured: 17 s against 3.2 s for a four-asset graph on a 2-core machine). A run chooses
    # multiprocess, celery or k8s in its run config (defs/executor.py).
    return dg.Definitions(
        resources={
            "postgres": postgres_resource(),
            "corpus": CorpusResource(),
        },
        executor=retrieval_executor,
    )
