"""The executor of every run, chosen by run config: in process unless the run asks for another.

.. code-block:: yaml

    execution:
      config:
        in_process: {}          # the default (defs/resources.py says why)
        multiprocess: {max_concurrent: 2}
        celery: {broker: "redis://broker:6379/0", backend: "redis://broker:6379/0"}   # the `celery` extra
        k8s: {job_namespace: dagster}                                                    # the `k8s` extra

Each choice takes the config of Dagster's own executor of that name (``in_process_executor``,
``multiprocess_executor``, dagster-celery's ``celery_executor``, dagster-k8s's ``k8s_job_executor``)
and builds that executor; ``celery`` and ``k8s`` are offered when their extra is installed
(``uv sync --extra celery``). Every choice but ``in_process`` runs steps in other processes, so it
needs a job Dagster can rebuild there and a persistent instance (the root ``dagster.yaml``).
"""

from __future__ import annotations

import warnings
from urllib.parse import urlsplit

import dagster as dg
from dagster._core.definitions.executor_definition import (
    IN_PROC_CONFIG,
    MULTI_PROC_CONFIG,
    _core_in_process_executor_creation,
    _core_multiprocess_executor_creation,
)
from dagster._core.errors import DagsterUserCodeExecutionError, user_code_error_boundary
from dagster._core.executor.init import InitExecutorContext

DEFAULT = "in_process"


def _optional() -> dict[str, dg.ExecutorDefinition]:
    """The executors of the installed extras, by the name a run config chooses them with."""
    found = {}
    try:
        from dagster_celery import celery_executor
    except ImportError:
        pass
    else:
        found["celery"] = celery_executor
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError:
        pass
    else:
        found["k8s"] = k8s_job_executor
    return found


OPTIONAL = _optional()
CHOICES = (DEFAULT, "multiprocess", *OPTIONAL)


def _masked(url: str) -> str:
    parts = urlsplit(url)
    return url.replace(f":{parts.password}@", ":***@", 1) if parts.password else url


def check_celery(config: dict) -> None:
    """The run's Celery broker and result backend (when they are a broker: redis or AMQP) answer, else a
    ``dg.Failure`` of one line naming the URL, password masked; dagster-celery would retry for about 25 s
    and end in a traceback of 140 lines."""
    from dagster_celery.defaults import broker_url
    from kombu import Connection

    for role, url in (("broker", config.get("broker") or broker_url), ("backend", config.get("backend") or "")):
        if not url.startswith(("redis://", "rediss://", "amqp://", "pyamqp://")):
            continue  # rpc:// is the broker's connection; a database backend is not checked here
        connection = Connection(url, connect_timeout=5)
        try:
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        except Exception as exc:  # noqa: BLE001 - kombu raises its own OperationalError or the transport's
            raise dg.Failure(description=f"the Celery {role} at {_masked(url)} cannot be reached ({exc}): start it, or set "
                             f"execution.config.celery.{role} in the run config to one that runs", metadata={role: _masked(url)}) from None
        finally:
            connection.release()


def _requirements(config) -> list:
    """In process needs nothing; every other choice runs steps in other processes."""
    name = next(iter(config or {DEFAULT: {}}))
    return [] if name == DEFAULT else dg.multiple_process_executor_requirements()


@dg.executor(
    name="retrieval",
    config_schema=dg.Field(
        dg.Selector({DEFAULT: IN_PROC_CONFIG, "multiprocess": MULTI_PROC_CONFIG,
                     **{name: definition.config_schema.as_field() for name, definition in OPTIONAL.items()}}),
        default_value={DEFAULT: {}},
        description="Where the run's steps execute: " + ", ".join(CHOICES) + f" (default {DEFAULT}).",
    ),
    requirements=_requirements,
)
def retrieval_executor(init_context: InitExecutorContext) -> dg.Executor:
    [(name, config)] = init_context.executor_config.items()
    if name == DEFAULT:
        return _core_in_process_executor_creation(config)
    if name == "multiprocess":
        return _core_multiprocess_executor_creation(config)
    chosen = OPTIONAL[name]
    if name == "celery":  # dagster-celery defines its task again for every step it sends; Celery warns each time
        warnings.filterwarnings("ignore", message="Task name 'execute_plan' is already registered")
        with user_code_error_boundary(DagsterUserCodeExecutionError, lambda: "Error occurred while checking the Celery broker"):
            check_celery(config)  # in the boundary: the run ends as a failure of its start, not NOT_STARTED
    return chosen.executor_creation_fn(InitExecutorContext(job=init_context.job, executor_def=chosen, executor_config=config,
                                                           instance=init_context.instance))
