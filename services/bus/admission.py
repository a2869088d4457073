"""Admission control: no more clocked games at once than the platform serves within clocks.

As a match runner limits its concurrency to its cores, a tournament director and `agon
selfplay` limit the clocked games they keep going by the platform's own measured lag: every
bot process (a worker, or a gateway for the outside bots streaming there) beats the p99 of
its recent turns' lag from their event to their delivery, and from a bot's answer to the
command stream, and counts the turns it could not deliver in time (`services.bus.delivery`).
Additive increase, multiplicative decrease, as TCP's congestion window: while turns reach
their bots within `HEALTHY` of the move time and answers reach the engine within half the
send grace, the limit grows by a quarter; when they do not, or a turn went undelivered, it
falls by `BACK_OFF`, at most once per lag window (the p99 remembers the bad seconds). Never
below one game nor above what was asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from schemas.tokens import SEND_GRACE_MS
from services.bus.delivery import LAG_WINDOW_S
from services.bus.presence import Beat, alive
from services.bus.text import now_ms

#: Clocked games a runner starts with before it has measured anything.
FIRST = 32
#: Lag under this share of the move time (or of `FLOOR_MS`, when more) lets the limit grow.
HEALTHY = 0.2
#: Lag over this share of the move time (or of `FLOOR_MS`) shrinks the limit.
CONGESTED = 0.5
#: Move times shorter than this are judged as this long: a loaded machine always lags some.
FLOOR_MS = 200
#: What a congested window keeps of the limit.
BACK_OFF = 0.7


@dataclass(frozen=True, slots=True)
class PlatformLag:
    """The worst recent lag of the live bot processes, and the turns they did not deliver."""

    lag_ms: int = 0
    send_ms: int = 0
    late: int = 0


def platform_lag(beats: Mapping[str, Beat], now: int | None = None) -> PlatformLag:
    """The lag the live bot processes' heartbeats (`QueryClient.processes`) report; a
    process gone (not `alive`) no longer counts."""
    now = now_ms() if now is None else now
    live = [b.stats for b in beats.values() if b.role.startswith("bot-") and alive(b, now)]
    return PlatformLag(
        lag_ms=max((int(b.get("lag_p99_ms", 0)) for b in live), default=0),
        send_ms=max((int(b.get("send_p99_ms", 0)) for b in live), default=0),
        late=sum(int(b.get("late", 0)) for b in live),
    )


class Admission:
    """How many clocked games of `move_time_ms` may be going at once, at most `most`."""

    def __init__(
        self, move_time_ms: int, most: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.most = max(1, most)
        self.judged_ms = max(move_time_ms, FLOOR_MS)
        self.limit = min(self.most, FIRST) if move_time_ms else self.most
        self.clocked = move_time_ms > 0
        self.clock = clock
        self._late: int | None = None  # the first reading is the baseline: only news counts
        #: the most games its runner had going at once (the runner keeps it)
        self.most_going = 0
        self._backed_off = float("-inf")

    def observe(self, lag: PlatformLag) -> int:
        """The limit after this measurement."""
        if not self.clocked:
            return self.limit
        late = lag.late - (lag.late if self._late is None else self._late)
        self._late = lag.late
        congested = (
            late > 0
            or lag.lag_ms > self.judged_ms * CONGESTED
            or lag.send_ms > SEND_GRACE_MS * CONGESTED
        )
        now = self.clock()
        if congested and now - self._backed_off >= LAG_WINDOW_S:
            self.limit = max(1, int(self.limit * BACK_OFF))
            self._backed_off = now
        elif not congested and max(lag.lag_ms, lag.send_ms * 2) <= self.judged_ms * HEALTHY:
            self.limit = min(self.most, self.limit + max(1, self.limit // 4))
        return self.limit

    def room(self, going: int) -> int:
        """Games that may start now, with `going` already going."""
        return max(0, self.limit - going)
