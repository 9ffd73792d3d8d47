"""Postgres for the library: ``RETRIEVAL_DSN`` when set, else the project's embedded server.

The package's face: the public names of ``server`` (the embedded server, DSN resolution and
masking), ``errors`` (one-line texts for a refused connection or privilege), ``sessions`` (``connect``, the ``session``
pool), ``partners`` (the partner sessions searches borrow) and ``command`` (``python -m retrieval_assets.pg``).
Patch a name in the module that defines it.
"""

from retrieval_assets.pg import identity
from retrieval_assets.pg.command import main
from retrieval_assets.pg.errors import PrivilegeError, privilege_error, privileges
from retrieval_assets.pg.server import (
    ENV_DSN,
    ENV_HOME,
    SERVER_SETTINGS,
    START_TIMEOUT_S,
    ConnectError,
    embedded_server,
    mask_dsn,
    mask_secrets,
    project_home,
    refuse_embedded_when,
    resolve_dsn,
    server_settings,
    stop_embedded,
)
from retrieval_assets.pg.partners import PARTNER_SLOTS, PARTNERS_MAX, give_back_partner, lend_partner, partner
from retrieval_assets.pg.sessions import (
    ENV_SESSIONS,
    IDLE_MAX,
    SCAN_SESSIONS,
    connect,
    ensure_extension,
    ensure_schema,
    search_sessions,
    session,
)

__all__ = [
    "ENV_DSN", "ENV_HOME", "ENV_SESSIONS", "IDLE_MAX", "PARTNERS_MAX", "PARTNER_SLOTS", "SCAN_SESSIONS",
    "SERVER_SETTINGS", "START_TIMEOUT_S", "ConnectError", "PrivilegeError", "connect", "embedded_server",
    "ensure_extension", "ensure_schema", "give_back_partner", "identity", "lend_partner", "main", "mask_dsn", "mask_secrets",
    "partner", "privilege_error", "privileges", "project_home", "refuse_embedded_when", "resolve_dsn",
    "search_sessions", "server_settings", "session", "stop_embedded",
]
