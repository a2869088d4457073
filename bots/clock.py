"""How long a thinking bot may think: until the turn's deadline, less a safety margin.

A turn's deadline (`TurnContext.deadline_ms`) is wall-clock time, since it crosses processes;
a bot's own clock is monotonic, since it must not jump. `Clock` converts once, when the turn
starts. The margin leaves room for the reply's trip to the engine: 30 ms, or two fifths of
the time left when that is less, so that very short clocks (0.05 s) still leave over half
the turn to think and the move still arrives in time on a busy machine. A turn without a
deadline (0) gets the bot's own budget instead.
"""

from __future__ import annotations

import time

from bots.base import TurnContext

SAFETY_S = 0.030


class Clock:
    """Answers "is there time left?" for one turn."""

    __slots__ = ("stop",)

    def __init__(self, context: TurnContext, budget_s: float) -> None:
        think = budget_s
        if context.deadline_ms:
            left = context.deadline_ms / 1000 - time.time()
            think = left - min(SAFETY_S, left * 0.4)
        self.stop = time.monotonic() + max(0.0, think)

    def expired(self) -> bool:
        return time.monotonic() >= self.stop
