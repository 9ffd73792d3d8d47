"""Which Postgres a connection reached, written so that a run can carry it and each of its steps compare.

A server is its cluster's ``system_identifier`` (``pg_control_system()``: fixed when the cluster was
created, readable by any role), the database and the schema prefix the process uses
(``$RETRIEVAL_SCHEMA_PREFIX``); where it was reached (host and port, or the embedded server's host
and data folder) is shown beside them but not compared, since one server has many addresses. The
text never holds a password. ``check`` is what a step runs before its first statement: it refuses,
in one line naming ``RETRIEVAL_DSN``, a server other than the run's, and refuses to start this
host's embedded server for a run whose server is elsewhere.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psycopg

from retrieval_assets.pg import errors, server, sessions

EMBEDDED = "embedded"


@dataclass(frozen=True)
class ServerIdentity:
    system: str  # the cluster's system_identifier
    database: str
    prefix: str  # the schema prefix in use ('' for none)
    where: str  # "host=... port=... dbname=..." or "embedded <hostname>:<data folder>"

    def tag(self) -> str:
        """One line: ``<system>/<database>/<prefix> <where>``."""
        return f"{self.system}/{self.database}/{self.prefix} {self.where}"

    @classmethod
    def parse(cls, tag: str) -> ServerIdentity:
        key, _, where = tag.strip().partition(" ")
        parts = key.split("/")
        if len(parts) != 3 or not parts[0].isdigit():
            raise server.ConnectError(f"the run's server tag {tag[:120]!r} is not <system>/<database>/<prefix> <where>")
        return cls(parts[0], parts[1], parts[2], where)

    def same_server(self, other: ServerIdentity) -> bool:
        return (self.system, self.database, self.prefix) == (other.system, other.database, other.prefix)

    def describe(self) -> str:
        prefix = f", schema prefix {self.prefix!r}" if self.prefix else ""
        return f"database {self.database} on {self.where} (system {self.system}{prefix})"

    @property
    def embedded(self) -> bool:
        return self.where.startswith(EMBEDDED + " ")


def embedded_here() -> str:
    """Where this process's embedded default lives: ``embedded <hostname>:<data folder>``."""
    return f"{EMBEDDED} {socket.gethostname()}:{(server.project_home() / '.retrieval' / 'pgdata').expanduser().resolve()}"


def explicit_dsn(dsn: str | None) -> str | None:
    """The DSN a connection would use other than the embedded default: ``dsn``, else ``$RETRIEVAL_DSN``."""
    return dsn or os.environ.get(server.ENV_DSN) or None


def identify(conn: psycopg.Connection, dsn: str | None, prefix: str) -> ServerIdentity:
    """The identity of ``conn``'s server, reached through ``dsn`` (None: the embedded default)."""
    system, database = conn.execute("SELECT system_identifier::text, current_database() FROM pg_control_system()").fetchone()
    explicit = explicit_dsn(dsn)
    return ServerIdentity(system, database, prefix, errors.describe(explicit) if explicit else embedded_here())


def check(expected: ServerIdentity, dsn: str | None, prefix: str) -> ServerIdentity:
    """This process's server (``dsn``, else ``$RETRIEVAL_DSN``, else the embedded default) when it is
    ``expected``; ``ConnectError`` in one line otherwise, before the embedded server is started for
    a run whose server is not this host's embedded one."""
    fix = f"set {server.ENV_DSN} (and RETRIEVAL_SCHEMA_PREFIX) in this process to the run's server"
    if explicit_dsn(dsn) is None and expected.where != embedded_here():
        raise server.ConnectError(
            f"{server.ENV_DSN} is not set on {socket.gethostname()}, so this step would start a private embedded Postgres, "
            f"but its run was launched against {expected.describe()}: {fix}")
    with sessions.session(explicit_dsn(dsn)) as conn:
        here = identify(conn, dsn, prefix)
    if not here.same_server(expected):
        raise server.ConnectError(f"{server.ENV_DSN} here reaches {here.describe()}, but this step's run was launched against "
                                  f"{expected.describe()}: {fix}")
    return here

