"""A step of a run launched elsewhere never falls back to a private embedded Postgres.

Two guards, because a process that runs someone else's step reads Postgres twice before the step
has its run:

- **The run's server, compared by every step.** The definitions tag every job with the server of
  the process that loaded them (``SERVER_TAG``: ``pg.identity``'s system identifier, database and
  schema prefix, with the host and port masked), so a run launched from a shell, the UI or the
  schedule carries the launcher's server. Each step, before its first statement
  (``PostgresResource.connect``, also inside the IO manager), compares its own server with the tag
  (``identity.check``): another server, database or schema prefix is refused in one line naming
  ``RETRIEVAL_DSN``, and so is a step without ``RETRIEVAL_DSN`` whose run's server is not this host's
  embedded one, before that server is started.
- **Processes that exist to run remote steps.** A Celery task (``dagster-celery``'s worker),
  ``dagster api execute_step`` (the Kubernetes and Docker step executors) and any process of a
  dagster-k8s pod (``DAGSTER_RUN_JOB_NAME`` set: ``K8sRunLauncher``'s run pods too) open the Dagster
  instance and load the definitions (the corpus registry) before any step: there the embedded default is
  refused outright (``refusal``, registered with ``pg.refuse_embedded_when`` when this module is
  imported, which ``defs.instance`` and ``defs.resources`` do); one that opens the project's instance
  (a Celery task does, before it loads the job) needs ``RETRIEVAL_DSN`` and ``DAGSTER_PG_URL`` both
  (``instance.check_remote_settings``).

The multiprocess executor's step processes are neither: they run on the launcher's host with its
environment, and reuse its embedded server when it has one (the tag's ``embedded <host>:<folder>``).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping

from retrieval_assets import pg

SERVER_TAG = "retrieval/server"


def remote_process() -> str | None:
    """What makes this process one that runs steps of runs launched elsewhere, or None."""
    celery = sys.modules.get("celery")
    task = getattr(celery, "current_task", None) if celery is not None else None
    if task:  # a proxy of the task being executed: false outside one
        return f"a Celery task ({task.name}) on {socket.gethostname()}"
    if sys.argv[1:3] == ["api", "execute_step"]:
        return f"`dagster api execute_step` on {socket.gethostname()}"
    if os.environ.get("DAGSTER_RUN_JOB_NAME"):  # set by dagster-k8s alone, in its run and step pods
        return f"a Kubernetes pod of dagster-k8s ({socket.gethostname()})"
    return None


def refusal() -> str | None:
    """Why this process must not use the embedded default (``resolve_dsn`` asks), or None."""
    where = remote_process()
    if where is None:
        return None
    return (f"{pg.ENV_DSN} is not set in {where}, which runs steps of runs launched elsewhere: set {pg.ENV_DSN} (and "
            "DAGSTER_PG_URL) to the launcher's servers; a remote step never starts a private embedded Postgres")


pg.refuse_embedded_when(refusal)


def server_tag(tags: Mapping[str, str] | None) -> pg.identity.ServerIdentity | None:
    """The run's server from its tags (None: a run without the tag, e.g. launched by an older version)."""
    tag = (tags or {}).get(SERVER_TAG)
    return pg.identity.ServerIdentity.parse(tag) if tag else None
