"""Logging for things that go wrong again and again (a heartbeat that cannot reach the Synchronizer, a weight
load that keeps failing): each distinct problem is logged when it first appears, then at most once per
``interval_s`` with how often it recurred in between, instead of once per poll forever."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """Logs each ``key`` at most once per ``interval_s``; a new key is logged at once. Thread-safe."""

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger, self.interval_s, self.clock = logger, interval_s, clock
        self._last: dict[str, float] = {}
        """Per key: when it was last logged."""
        self._suppressed: dict[str, int] = {}
        """Per key: repeats not logged since then."""
        self._lock = threading.Lock()
        """Guards both dicts: heartbeat and poll threads log through one instance."""

    def log(self, level: int, key: str, msg: str, *args) -> bool:
        """Log ``msg % args`` at ``level`` unless ``key`` was logged less than ``interval_s`` ago; return whether
        it was logged. A logged repeat says how many were left out before it."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            skipped = self._suppressed.pop(key, 0)
        if skipped:
            msg += f" (repeated {skipped} times in the last {self.interval_s:.0f}s)"
        self.logger.log(level, msg, *args)
        return True

    def forget(self, key: str) -> None:
        """The problem ``key`` is over: the next time it appears it is logged at once."""
        with self._lock:
            self._last.pop(key, None)
            self._suppressed.pop(key, None)
