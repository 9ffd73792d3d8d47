"""A file replaced whole: readers see the old file or the new one, never half of it.

Contract: ``replaced(path, mode, **open_kwargs)`` opens a new file beside ``path`` (named after it, hidden,
unique to the call) and yields it; when the block ends without error it is renamed over ``path``, keeping
the replaced file's permissions, or, for a new file, 0666 less the umask (the kernel applies the umask at
creation: no ``os.umask`` read, which is not thread-safe). On any error the new file is removed and
``path`` is as it was. Imports nothing of the package, so any layer can use it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def replaced(path: str | os.PathLike, mode: str = "w", **open_kwargs: Any) -> Iterator[IO]:
    """The file that replaces ``path`` when the block ends (see the module's contract)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    kept = path.stat().st_mode & 0o777 if path.exists() else None
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), mode, **open_kwargs) as f:
            yield f
        if kept is not None:
            os.chmod(tmp, kept)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
