"""Postgres for the library: ``RETRIEVAL_DSN`` when set, else the project's embedded server.

The package's face: the public names of ``server`` (the embedded server, DSN resolution and
masking), ``sessions`` (``connect``, the partner session, the ``session`` pool) and ``command``
(``python -m retrieval_assets.pg``). Patch a name in the module that defines it.
"""

from retrieval_assets.pg import identity
from retrieval_assets.pg.command import main
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
from retrieval_assets.pg.sessions import (
    ENV_SESSIONS,
    IDLE_MAX,
    SCAN_SESSIONS,
    connect,
    ensure_extension,
    partner,
    search_sessions,
    session,
)

__all__ = [
    "ENV_DSN", "ENV_HOME", "ENV_SESSIONS", "IDLE_MAX", "SCAN_SESSIONS", "SERVER_SETTINGS", "START_TIMEOUT_S",
    "ConnectError", "connect", "embedded_server", "ensure_extension", "identity", "main", "mask_dsn", "mask_secrets",
    "partner", "project_home", "refuse_embedded_when", "resolve_dsn", "search_sessions", "server_settings", "session", "stop_embedded",
]
