"""How long a thinking bot may think: until the turn's deadline, less a margin it measures.

A turn's deadline (`TurnContext.deadline_ms`) is wall-clock time, since it crosses processes;
a bot's own clock is monotonic, since it must not jump. `Clock` converts once, when the turn
starts, and plans to stop at the deadline less a margin: the larger of a fixed share of the
time left (`RESERVE`, 15%: a bot never plans to use the last of its time) and the overhead
this process has been seen to add (`Overhead`), plus `PAD_MS`. The overhead is what
cutechess and fastchess call "move overhead", except measured rather than set: the worker
reports, for each move it sends, how late it reached the command stream after the planned
stop (the bot's last iteration, freeing its tree, encoding, the trip to Redis, the GIL shared
with the worker's event loop), and the margin follows a high quantile (p90) of the last `WINDOW`
reports or the worst of the last `RECENT`, so one slow move raises it at once and ages out
after `RECENT` more, while slow moves that recur (one in ten) keep it up. A turn without
a deadline (0) gets the bot's own budget instead.

A bot checks its clock between steps that each take at most a few milliseconds, so what can
still overrun is a pause no step controls: the cyclic garbage collector, whose full pass over
a process holding a large search tree was measured at 15-220 ms (Teeko, 5 s MCTS turns).
A search runs inside `thinking()`, which pauses the collector; the searches make no cycles
(engine states and trees are freed by reference counting), so nothing piles up meanwhile.
A large tree also takes time to free (about 1 us a node: 60 ms after a 5 s MCTS turn), which
`bots.mcts` does on a thread of its own, after the move has gone out, with the collector
still paused (`pause_collector` on the thinking thread, `resume_collector` when freed).
The pause is the whole process's: where the services share it (`agon up`, selfplay), the
collector waits while a bot thinks, and runs once no bot does.

The worker's side of the loop (`bots.worker`): after `bot.choose`, `take_planned_stop_ms()`
(on the thread that chose) gives the wall-clock time the bot planned to stop, or None when it
made no `Clock`; once the move's XADD has returned, `OVERHEAD.observe(now_ms() - planned)`.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from bots.base import TurnContext

#: the share of the time left that a bot never plans to use
RESERVE = 0.15
#: added to the overhead estimate: the clock reads and scheduling no report shows
PAD_MS = 5
#: the least overhead assumed, and the estimate before any report
FLOOR_MS = 15
#: how many recent reports the estimate looks at
WINDOW = 64
#: the quantile of the window's reports taken as the overhead
QUANTILE = 0.9
#: the last reports, whose maximum is taken when higher: one slow move counts at once
RECENT = 8


class Overhead:
    """A process's recent move overhead: how late moves arrived after their planned stop.

    Thread-safe: bots plan on the worker's thinking thread and the worker reports on its
    event loop's.
    """

    def __init__(
        self, window: int = WINDOW, floor_ms: int = FLOOR_MS, quantile: float = QUANTILE
    ) -> None:
        self.floor_ms = floor_ms
        self.quantile = quantile
        self._late: deque[int] = deque(maxlen=window)
        self._lock = threading.Lock()

    def observe(self, late_ms: int) -> None:
        """One move reached the command stream `late_ms` after its planned stop.

        A move that arrived before its planned stop (the bot finished early) says nothing
        about the overhead of stopping at the deadline, and is left out.
        """
        if late_ms >= 0:
            with self._lock:
                self._late.append(late_ms)

    def estimate_ms(self) -> int:
        """The overhead to plan for: the `quantile` of the window's reports or the worst of
        the last `RECENT`, whichever is more, and at least the floor."""
        with self._lock:
            late = list(self._late)
        if not late:
            return self.floor_ms
        ranked = sorted(late)
        high = ranked[min(len(ranked) - 1, math.ceil(self.quantile * len(ranked)) - 1)]
        return max(self.floor_ms, high, *late[-RECENT:])

    def margin_s(self, left_s: float) -> float:
        """How much of `left_s` to leave unused: the reserve, or the overhead if more."""
        return max(RESERVE * left_s, (self.estimate_ms() + PAD_MS) / 1000)

    def reset(self) -> None:
        with self._lock:
            self._late.clear()


#: this process's overhead, fed by the bot worker
OVERHEAD = Overhead()

_planned = threading.local()


def take_planned_stop_ms() -> int | None:
    """The planned stop (wall-clock ms) of the last `Clock` made on this thread, and forget
    it: None when none was made since the last call (a bot that does not think)."""
    stop: int | None = getattr(_planned, "stop_ms", None)
    _planned.stop_ms = None
    return stop


_paused = 0
_paused_lock = threading.Lock()


def pause_collector() -> bool:
    """Pause the cyclic garbage collector; True when this call paused it (then hand the
    True to `resume_collector`). Counted, so that bots thinking on several threads at once
    resume it only when the last one is done; False, and nothing done, when someone else
    (a test, a benchmark) turned it off."""
    global _paused
    with _paused_lock:
        if _paused == 0 and not gc.isenabled():
            return False
        _paused += 1
        gc.disable()
        return True


def resume_collector(paused: bool) -> None:
    """Undo a `pause_collector()` that returned `paused`."""
    global _paused
    if paused:
        with _paused_lock:
            _paused -= 1
            if _paused == 0:
                gc.enable()


@contextmanager
def thinking() -> Iterator[None]:
    """The cyclic garbage collector paused for the block (`pause_collector`)."""
    paused = pause_collector()
    try:
        yield
    finally:
        resume_collector(paused)


class Clock:
    """Answers "is there time left?" for one turn.

    `stop` is the planned stop on `time.monotonic()`; `stop_ms` the same in wall-clock ms
    since the epoch, which is what a report to `Overhead.observe` is measured from.
    """

    __slots__ = ("stop", "stop_ms")

    def __init__(
        self, context: TurnContext, budget_s: float, overhead: Overhead | None = None
    ) -> None:
        think = budget_s
        wall = time.time()
        if context.deadline_ms:
            left = context.deadline_ms / 1000 - wall
            think = left - (overhead or OVERHEAD).margin_s(max(0.0, left))
        think = max(0.0, think)
        self.stop = time.monotonic() + think
        self.stop_ms = int((wall + think) * 1000)
        _planned.stop_ms = self.stop_ms

    def expired(self) -> bool:
        return time.monotonic() >= self.stop

    def left(self) -> float:
        """Seconds until the planned stop (negative once past it)."""
        return self.stop - time.monotonic()
