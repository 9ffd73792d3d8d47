"""What a refused Postgres connection or privilege means to the person running the project: one line
that names the cause and the fix, never the password.

Contract: ``connect_failure(exc, dsn, variable)`` is the ``ConnectError`` for a connection that failed
(host, port and database, the server's reason and what to check in ``variable``); ``privilege_error(exc,
conn)`` is the ``PrivilegeError`` for a refused privilege or a missing pgvector (the role, the database
and the SQL that its owner or a superuser must run), or None for any other error; ``privileges(conn)``
raises it for the statements of a block; ``chain(exc)`` walks an error and those it was raised from (one
walker for the search's lost-session test and the launcher's foreseen errors). Identifiers in the SQL shown
are quoted by ``psycopg.sql``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from retrieval_assets.pg.server import ConnectError, mask_secrets

INSUFFICIENT_PRIVILEGE = "42501"
EXTENSION_MISSING = ("0A000", "58P01")  # feature_not_supported (PG 16+), undefined_file (older): not installed
DSN_VARIABLE = "$RETRIEVAL_DSN (or --dsn)"
_PREFIX = re.compile(r'^(connection (failed|is bad): )?(connection to server (at|on socket) .*? failed: )?(FATAL:\s+)?')


def chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then each error it was raised from (``__cause__``, else ``__context__``), each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


class PrivilegeError(ConnectError):
    """The server refused something the project needs; the message gives the SQL that grants it."""


def _ident(name: str) -> str:
    return sql.Identifier(name).as_string()


def _server(host: str | None, port: str | None) -> str:
    return f"host={host or os.environ.get('PGHOST') or 'localhost'} port={port or os.environ.get('PGPORT') or '5432'}"


def _where(host: str | None, port: str | None, dbname: str | None) -> str:
    return f"{_server(host, port)} dbname={dbname or '(default)'}"


def describe(dsn: str) -> str:
    """``host=... port=... dbname=...`` of a DSN (libpq's defaults where it gives none), never the password."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "an unparseable DSN"
    return _where(params.get("host"), params.get("port"),
                  params.get("dbname") or os.environ.get("PGDATABASE") or params.get("user"))


def _text(value: bytes | str | None) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def reason(exc: BaseException) -> str:
    """The server's or libpq's reason on one line: ``Connection refused (Is the server running ...?)``."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = _PREFIX.sub("", lines[0])
    hints = [line for line in lines[1:] if not line.startswith(("DETAIL:", "HINT:", "CONTEXT:"))]
    return first + (f" ({' '.join(hints)})" if hints else "")


def _connect_fix(text: str, variable: str) -> str:
    if "password authentication failed" in text or ("role" in text and "does not exist" in text):
        return f"check the user and password in {variable}"
    if "database" in text and "does not exist" in text:
        return f"create that database or name an existing one in {variable}"
    return f"check that the server is running and that {variable} names its host and port"


def connect_failure(exc: psycopg.Error, dsn: str, variable: str = DSN_VARIABLE) -> ConnectError:
    """The ``ConnectError`` (a ``PrivilegeError`` for a role without CONNECT) of a failed connection to ``dsn``."""
    pgconn = getattr(exc, "pgconn", None)
    where = describe(dsn)
    if pgconn is not None and _text(pgconn.db):
        where = _where(_text(pgconn.host), _text(pgconn.port), _text(pgconn.db))
    text = reason(exc)
    if "permission denied for database" in text and pgconn is not None:
        role, db = _text(pgconn.user), _text(pgconn.db)
        return PrivilegeError(f"role {role} may not connect to database {db} at {where}: the database owner or a superuser "
                              f"must run GRANT CONNECT ON DATABASE {_ident(db)} TO {_ident(role)};")
    return ConnectError(mask_secrets(f"cannot connect to Postgres at {where}: {text}; {_connect_fix(text, variable)}", dsn))


def privilege_error(exc: BaseException, conn: psycopg.Connection) -> PrivilegeError | None:
    """The ``PrivilegeError`` for ``exc`` raised on ``conn``, or None when it is no refused privilege."""
    state = getattr(exc, "sqlstate", None)
    if not isinstance(exc, psycopg.Error) or state not in (INSUFFICIENT_PRIVILEGE, *EXTENSION_MISSING):
        return None
    role, db = conn.info.user, conn.info.dbname
    where = _server(conn.info.host, str(conn.info.port))
    text = reason(exc)
    if state in EXTENSION_MISSING and "vector" in text:
        return PrivilegeError(f"pgvector is not installed on the Postgres server at {where}: install pgvector 0.7 or later "
                              f"there (e.g. Debian's postgresql-NN-pgvector), then a superuser runs, in database {db}: "
                              "CREATE EXTENSION vector;")
    if state in EXTENSION_MISSING:
        return None
    if "create extension" in text and "vector" in text:
        return PrivilegeError(f"pgvector is not enabled in database {db} at {where} and role {role} may not enable it: "
                              "a superuser must run, in that database: CREATE EXTENSION vector;")
    if "permission denied for database" in text:
        return PrivilegeError(f"role {role} may not create schemas in database {db} at {where}: the database owner or a "
                              f"superuser must run GRANT CREATE ON DATABASE {_ident(db)} TO {_ident(role)};")
    if match := re.search(r"permission denied for schema (\S+)", text):
        schema = match.group(1).strip('"')
        return PrivilegeError(f"role {role} may not use schema {schema} in database {db} at {where}: its owner or a superuser "
                              f"must run GRANT USAGE, CREATE ON SCHEMA {_ident(schema)} TO {_ident(role)}; (or set "
                              "$RETRIEVAL_SCHEMA_PREFIX to keep to schemas of your own)")
    if match := re.search(r"must be owner of (schema|table) (\S+)", text):
        kind, name = match.group(1), match.group(2).strip('"')
        return PrivilegeError(f"role {role} does not own {kind} {name} in database {db} at {where}: run as its owner, or a "
                              f"superuser runs ALTER {kind.upper()} {_ident(name)} OWNER TO {_ident(role)};")
    return PrivilegeError(f"role {role} lacks a privilege in database {db} at {where}: {text}")


@contextmanager
def privileges(conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """``with privileges(conn):`` a refused privilege in the block becomes its ``PrivilegeError``."""
    try:
        yield conn
    except psycopg.Error as exc:
        known = privilege_error(exc, conn)
        if known is None:
            raise
        raise known from None
