"""One console line for a step or run that failed for a reason the project foresees.

Dagster's console logger prints a ``STEP_FAILURE`` or ``RUN_FAILURE`` record with the error's Python stack
under it, a ``dg.Failure`` too (30 to 80 lines for a missing corpus folder, a bad golden set, an unavailable
model or a remote step's refusal, the cause in the middle). A job's loggers can be replaced only through run
config, which ``dg launch --partition`` does not take from a partitioned job, and Dagster builds its console
logger from ``logging.getLoggerClass()``: importing this module (``resources.py`` does, so every process that
loads the definitions) makes that class ``OneLineFailures``, which prints such a record as one line: its
usual head with the failure's description (``STEP_FAILURE - documents: corpus directory not found: ...``),
and a ``RUN_FAILURE`` with the cause of a step whose failure this console did not print (a step on a Celery
worker, a task that could not start there, the executor refusing a broker). Foreseen: a ``dg.Failure``, and
an error of ``launch_errors.foreseen_names()`` anywhere in the error's chain or in a worker's error list.
Anything else keeps its stack, and so does everything with ``RETRIEVAL_TRACEBACK=1``. Only the console
changes: the event log (the UI, ``dagster`` commands) keeps every record whole, its stack included. Every
logger made after the import is of this class, another library's too (``logging.getLogger``), but a record
changes only when it carries Dagster's step or run failure event (``dagster_meta``), which only Dagster's
loggers receive: every other record is handled as the class before made it.
"""

from __future__ import annotations

import logging
import os
import re

from retrieval_assets.defs.launch_errors import ENV_TRACEBACK, foreseen_names

_TOLD: set[tuple[str | None, str | None]] = set()  # (run, step) whose failure a console of this process printed
_WORKER_ERROR = re.compile(r"^\[(?P<step>[^\]]+)\]: (?P<error>.*)$")  # dagster-celery's "[step]: module.Class: text"


def _sentence(text: str) -> str:
    return " ".join(text.split())


def foreseen_text(error) -> str | None:
    """The message of the first foreseen error in a ``SerializableErrorInfo``'s chain (without its class name),
    or the foreseen errors of a worker's error list (``step: message; ...``); None when there is none."""
    names, seen = foreseen_names(), set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        head, _, rest = error.message.partition(": ")
        if head in names:
            return _sentence(rest.split("\n\nStack Trace:")[0])
        found = []
        for line in error.message.splitlines():
            match = _WORKER_ERROR.match(line)
            head, _, rest = match.group("error").partition(": ") if match else ("", "", "")
            if head in names:
                found.append(f"{match.group('step')}: {_sentence(rest)}")
        if found:
            return "; ".join(found)
        error = error.cause or error.context
    return None


def _step_failure_text(event) -> str | None:
    data = event.step_failure_data
    told = data.user_failure_data.description if data.user_failure_data else None
    return _sentence(told) if told else foreseen_text(data.error)


class OneLineFailures(logging.getLoggerClass()):  # type: ignore[misc] - whatever class was set before, extended
    """A logger that prints a foreseen step or run failure of Dagster's log records as one line."""

    def handle(self, record: logging.LogRecord) -> None:
        try:
            short = None if os.environ.get(ENV_TRACEBACK) else self.one_line(record)
        except Exception:  # noqa: BLE001 - a record this cannot read is printed as Dagster made it
            short = None
        if short is not None:
            record.msg, record.args, record.exc_info = short, (), None
        super().handle(record)

    def one_line(self, record: logging.LogRecord) -> str | None:
        meta = getattr(record, "dagster_meta", None)
        event = meta.get("dagster_event") if isinstance(meta, dict) else None
        if event is None or not isinstance(record.msg, str) or not (event.is_step_failure or event.is_run_failure):
            return None
        head, original = record.msg.split("\n", 1)[0], meta.get("orig_message") or ""
        if not head.endswith(original):
            return None
        if event.is_step_failure:
            text = _step_failure_text(event)
            if text is None:
                return None
            _TOLD.add((meta.get("run_id"), event.step_key))
            return head[: len(head) - len(original)] + text
        data = event.job_failure_data
        first = data.first_step_failure_event if data else None
        if first is not None:
            text = _step_failure_text(first)
            if text is None:
                return None
            told = (meta.get("run_id"), first.step_key)
            if told in _TOLD:
                _TOLD.discard(told)
                return head
            return f"{head} {first.step_key}: {text}"
        text = foreseen_text(data.error) if data and data.error else None
        return f"{head} {text}" if text else None


def install() -> None:
    """Make Dagster's console loggers, made from now on in this process, ``OneLineFailures``."""
    if not issubclass(logging.getLoggerClass(), OneLineFailures):
        logging.setLoggerClass(OneLineFailures)


install()
