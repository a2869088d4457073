"""Rate limits: a token bucket per key (a bearer key, an address), in this process."""

from __future__ import annotations

import time


class RateLimiter:
    """Token buckets by key: `rate_per_s` refill, `burst` capacity (in this process)."""

    def __init__(self, rate_per_s: float, burst: int, max_keys: int = 100_000) -> None:
        self.rate = rate_per_s
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[str, tuple[float, float]] = {}

    def wait_s(self, key: str, now: float | None = None) -> float:
        """0 if `key` may go now (and spends a token), else seconds until it may."""
        now = time.monotonic() if now is None else now
        tokens, then = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens >= 1.0:
            if len(self._buckets) >= self.max_keys and key not in self._buckets:
                self._buckets.clear()  # a flood of new keys: start over rather than grow
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate
