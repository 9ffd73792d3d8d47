"""The command line ``python -m retrieval_assets.pg`` runs (``__main__``): ``main``."""

from __future__ import annotations

import sys

from retrieval_assets.pg import server, sessions


def main(argv: list[str] | None = None) -> int:
    """``python -m retrieval_assets.pg [dsn|settings|stop]``: print the DSN in use, the server settings the
    embedded default sets (``SERVER_SETTINGS``) as the server in use has them, or stop the embedded server."""
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "dsn"
    if command == "dsn":
        print(server.mask_dsn(server.resolve_dsn()))
        return 0
    if command == "settings":
        with sessions.connect() as conn:
            for name, current, state in server.server_settings(conn):
                print(f"{name} = {current} ({state})")
        return 0
    if command == "stop":
        stopped = server.stop_embedded()
        print("stopped the embedded server" if stopped else "no embedded server was running")
        return 0
    print(f"usage: python -m retrieval_assets.pg [dsn|settings|stop] (got {command!r})", file=sys.stderr)
    return 2
