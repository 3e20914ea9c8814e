"""A log line every few seconds while something long runs, so a console or log file never goes quiet."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("nmt")


@contextlib.contextmanager
def heartbeat(what: str, every: float = 30.0) -> Iterator[None]:
    """Log ``still <what> (N s)`` every ``every`` seconds until the block ends (from a daemon thread)."""
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every):
            log.info("still %s (%d s)", what, time.monotonic() - start)

    thread = threading.Thread(target=beat, name=f"heartbeat: {what}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def clock(seconds: float) -> str:
    """12:34 or 1:02:03."""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
