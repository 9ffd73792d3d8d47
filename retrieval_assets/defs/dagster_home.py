"""``dg`` run in the project root reads the root ``dagster.yaml``, its telemetry setting included.

Dagster's commands load the instance from ``dagster.yaml`` in the working directory when
``DAGSTER_HOME`` is unset, but the ``dg`` CLI decides about its own telemetry, and prints its
first-run banner, from ``$DAGSTER_HOME/dagster.yaml`` alone (or the user's ``dg.toml``), before it
reads anything of the project. The ``retrieval_assets_dg.pth`` file that this package installs
imports this module at the start of a ``dg`` process only (no other interpreter pays for it); in
the project root, with no ``DAGSTER_HOME`` of the user's, it names the root, as
``python -m retrieval_assets.ui`` does for the other Dagster commands. Plain ``os`` and the package's
``ROOT`` only: this runs before anything else is imported.

It also sets ``sys.excepthook``: an error the project foresees (a refused privilege, an unreachable server,
an unknown partition) that stops ``dg`` before any step is one line (``launch_errors.py``, imported only
then).
"""

import os
import sys

import retrieval_assets

ROOT = str(retrieval_assets.ROOT)


def point_at_root() -> None:
    """Set ``DAGSTER_HOME`` to the project root when unset and the working directory is the root."""
    if os.environ.get("DAGSTER_HOME") or not os.path.isfile(os.path.join(ROOT, "dagster.yaml")):
        return
    try:
        here = os.path.realpath(os.getcwd())
    except OSError:  # the working directory was removed
        return
    if here == os.path.realpath(ROOT):
        os.environ["DAGSTER_HOME"] = ROOT


def _excepthook(kind, exc, tb) -> None:
    try:
        from retrieval_assets.defs.launch_errors import excepthook
    except Exception:  # noqa: BLE001 - a broken import must not hide the error being reported
        sys.__excepthook__(kind, exc, tb)
        return
    excepthook(kind, exc, tb)


point_at_root()
if os.path.basename((getattr(sys, "argv", None) or [""])[0]) in ("dg", "dg.exe"):  # not a process that loads the defs
    sys.excepthook = _excepthook
