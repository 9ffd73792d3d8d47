"""Progress reports for long loops, at most one every ``every`` seconds.

Contract: ``Progress(report, total, what)`` is called with the number of items done; it calls
``report(message)`` (a logger's ``info``, ``print``) when ``every`` seconds have passed since the
last message, and never otherwise. ``None`` as ``report`` turns it off.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Progress:
    def __init__(self, report: Callable[[str], object] | None, total: int, what: str, every: float = 10.0):
        self.report, self.total, self.what, self.every = report, total, what, every
        self.start = self.last = time.monotonic()

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if self.report is None or now - self.last < self.every:
            return
        self.last = now
        self.report(f"{self.what}: {done}/{self.total} after {now - self.start:.0f} s")
