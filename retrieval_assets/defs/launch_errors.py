"""One line for a foreseen error that stops ``dg launch`` before any step runs.

Dagster loads the instance (``instance.py``: the storage and its database), the definitions (the corpus
registry in Postgres) and checks the partition key in the ``dg`` process itself, and lets an error there
end the process with a Python traceback of 40 to 170 lines, the cause at its foot. ``dagster_home.py`` (run
at the start of every ``dg`` process) sets ``sys.excepthook`` to ``excepthook``: when the error, or one it
was raised from, is one of ours, it prints ``error: <the sentence>``, the same line the project's command
line prints for it, and nothing else; any other error keeps its traceback, and so does every error with
``RETRIEVAL_TRACEBACK=1``. A step's errors are the console's (``console.py``).
"""

import os
import sys

from retrieval_assets.pg.errors import chain

ENV_TRACEBACK = "RETRIEVAL_TRACEBACK"


def _foreseen() -> tuple[type[BaseException], ...]:
    import dagster as dg

    from retrieval_assets.defs.resources import USER_ERRORS

    return (*USER_ERRORS, dg.Failure, dg.DagsterUnknownPartitionError)


def foreseen_names() -> set[str]:
    """The qualified class names (``module.Class``, as a traceback's last line starts) of the foreseen errors and
    their subclasses: how ``console.py`` knows them in a serialized error."""
    names, kinds = set(), list(_foreseen())
    while kinds:
        kind = kinds.pop()
        names.add(f"{kind.__module__}.{kind.__qualname__}")
        kinds.extend(kind.__subclasses__())
    return names


def foreseen(exc: BaseException | None) -> BaseException | None:
    """``exc`` or the first error it was raised from (``__cause__``, else ``__context__``) that is foreseen."""
    kinds = _foreseen()
    return next((e for e in chain(exc) if isinstance(e, kinds)), None)


def sentence(exc: BaseException) -> str:
    text = getattr(exc, "description", None) or str(exc)
    return " ".join(text.split())


def excepthook(kind, exc, tb) -> None:
    try:
        known = None if os.environ.get(ENV_TRACEBACK) else foreseen(exc)
    except Exception:  # noqa: BLE001 - never hide the original error behind one of ours
        known = None
    if known is None:
        sys.__excepthook__(kind, exc, tb)
    else:
        print(f"error: {sentence(known)}", file=sys.stderr)
