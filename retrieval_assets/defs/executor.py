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

import dagster as dg
from dagster._core.definitions.executor_definition import (
    IN_PROC_CONFIG,
    MULTI_PROC_CONFIG,
    _core_in_process_executor_creation,
    _core_multiprocess_executor_creation,
)
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
    return chosen.executor_creation_fn(InitExecutorContext(job=init_context.job, executor_def=chosen, executor_config=config,
                                                           instance=init_context.instance))
