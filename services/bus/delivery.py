"""Delivery: the moment a bot's turn reaches it, which is when its move clock starts.

The dispatcher writes a turn into the bot's inbox with a deadline counted from the event that
made it the bot's turn. Between that inbox and the bot there is more platform: a built-in
bot's worker sharing its process's event loop, or a gateway writing to an outside bot's
stream. Whoever hands the bot its turn calls `Deliveries.deliver`: the turn's clock in its
partition's clock set, `<id>|<seq>`, becomes `<id>|<seq>|took`: the bot is told it has
`allowance` from now (never more than `MAX_GRACE_MS` past the head event's deadline), and
that deadline, plus `SEND_GRACE_MS` for the platform's own lag on the move's way back, is
signed with the clock key for the bot to send back with its move, and is when the clock is
due. One script in the clock set's slot, so delivery and the dispatcher's timeout claim
exclude each other: a turn whose clock was claimed first never reached its bot in time
(`None`: drop it; the claim says the platform failed it), and a clock claimed after
delivery is the bot's. A second delivery (another stream of the same bot) keeps the first
deadline, but for a worker that took the turn over from one that died with it (`again`):
that time was the platform's, and the bot's starts anew. A bot told to prepare for a game
type (the gateway's warm-up) before its first turn in a game is held: `<id>|<seq>|held`,
the bot's clock but due only at the latest deadline (`hold`); it starts when the turn
itself is delivered, on whichever stream, once. Only a seat's first turn in a game is held,
so reconnecting buys a bot no time.

Each delivery's lag (from the turn's event to its delivery) goes into a `Lag` window, which
the worker's and gateway's heartbeats, status lines and metrics show.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from schemas.codec import FIELD_BYTES, DecodeError, decode_turn
from schemas.tokens import MAX_GRACE_MS, SEND_GRACE_MS, clock_stamp
from schemas.turns import TurnRequest
from services.bus.connection import TRANSIENT_ERRORS, Client, Patience
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.scripts import Script
from services.bus.text import now_ms

#: The mark of a clock whose turn reached its bot: "<id>|<seq>|took"; of one held while
#: its bot prepares for the game: "<id>|<seq>|held" (the bot's too, due at the latest).
TOOK = "took"
HELD = "held"
#: The lag shown is that of the deliveries in this many seconds ...
LAG_WINDOW_S = 10.0
#: ... and at most this many of them.
LAG_KEPT = 5_000

# Mark a turn's clock delivered (or held) and give the bot's deadline: false if the clock is
# gone (its game moved on), -1 if it was claimed first (a re-check stands in its place). A
# second delivery answers the first one's deadline, unless it is "again" (the platform lost
# the first: the worker it went to died): then the later of the two; a held clock starts
# when its turn is delivered for real. A plain clock set again for a turn already delivered
# (a dispatcher sending the turn again) goes. KEYS: the clock set. ARGV: the clock member,
# the deadline to give, "hold", "again" or "".
_DELIVER = Script(
    """
local took, held = ARGV[1] .. '|took', ARGV[1] .. '|held'
local first = redis.call('ZSCORE', KEYS[1], took)
if first then
  redis.call('ZREM', KEYS[1], ARGV[1], held)
  if ARGV[3] == 'again' and tonumber(ARGV[2]) > tonumber(first) then
    redis.call('ZADD', KEYS[1], ARGV[2], took)
    return ARGV[2]
  end
  return first
end
local waiting = redis.call('ZSCORE', KEYS[1], held)
if waiting and ARGV[3] == 'hold' then return waiting end
if waiting or redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  redis.call('ZREM', KEYS[1], ARGV[1], held)
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3] == 'hold' and held or took)
  return ARGV[2]
end
if redis.call('ZSCORE', KEYS[1], ARGV[1] .. '|again') then return -1 end
return false
"""
)
#: What the delivery script answers for a clock claimed before its turn reached the bot.
CLAIMED = -1


class Handover(Protocol):
    """What delivery needs of a turn (a `TurnRequest` has it)."""

    @property
    def game_id(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def since(self) -> int: ...
    @property
    def allowance(self) -> int: ...
    @property
    def moves(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class Delivered:
    """A turn as it reached its bot: the deadline it is told (0: no clock) and the stamp
    signing the deadline the engine holds it to (`SEND_GRACE_MS` later)."""

    deadline: int
    clock: str


class Lag:
    """The platform's lag on the turns it delivered in the last `LAG_WINDOW_S`: from a turn's
    event to its delivery (`lag`), and from a bot's answer to the command stream (`send`);
    and the turns it could not deliver before their clocks were claimed (`undelivered`)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lag: collections.deque[tuple[float, int]] = collections.deque(maxlen=LAG_KEPT)
        self.send: collections.deque[tuple[float, int]] = collections.deque(maxlen=LAG_KEPT)
        self.undelivered = 0

    def observe(self, ms: int) -> None:
        self.lag.append((self.clock(), max(0, ms)))

    def observe_send(self, ms: int) -> None:
        self.send.append((self.clock(), max(0, ms)))

    def summary(self) -> dict[str, int]:
        """p50, p99 and max of the delivery lag in ms, the send lag's p99, and the turns
        not delivered in time."""
        lag, send = self._recent(self.lag), self._recent(self.send)
        return {
            "lag_p50_ms": _quantile(lag, 50),
            "lag_p99_ms": _quantile(lag, 99),
            "lag_max_ms": lag[-1] if lag else 0,
            "send_p99_ms": _quantile(send, 99),
            "late": self.undelivered,
        }

    def _recent(self, window: collections.deque[tuple[float, int]]) -> list[int]:
        since = self.clock() - LAG_WINDOW_S
        while window and window[0][0] < since:
            window.popleft()
        return sorted(ms for _, ms in window)


def _quantile(ordered: Sequence[int], q: int) -> int:
    return ordered[min(len(ordered) - 1, len(ordered) * q // 100)] if ordered else 0


class Deliveries:
    """Hands turns to bots: starts their clocks, signs their deadlines, measures the lag."""

    def __init__(
        self, redis: Client, keys: Keys, clock_key: bytes, clock: Callable[[], int] = now_ms
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.clock_key = clock_key
        self.clock = clock
        self.lag = Lag()

    async def deliver(
        self,
        turns: Sequence[Handover],
        *,
        hold: bool = False,
        away: set[str] | None = None,
        again: Collection[str] = (),
        patience: Patience | None = None,
    ) -> list[Delivered | None]:
        """Each turn as it reaches its bot now, or None when its clock is gone (claimed
        before the turn reached the bot, or its game moved on).

        `hold`: the bot is preparing for its first turn in a game (`holdable`): its clock
        is due only at the latest deadline until the turn itself is delivered. `away`: a
        turn whose clock's master did not answer (or not in the time `patience` allows)
        is None too, its game added here (else the call raises). `again`: games
        whose turns a worker of the platform took over from another that died with them:
        what that one's delivery started is the platform's time, and the bot gets its
        allowance from now (at most `latest`)."""
        now = self.clock()
        clocked = [t for t in turns if t.allowance]

        def args(t: Handover) -> list[Any]:
            """The script's arguments: the clock member, the deadline to give, the mode."""
            member = f"{t.game_id}|{t.seq}"
            if hold and holdable(t):
                return [member, latest(t), "hold"]
            given = min(now + t.allowance + SEND_GRACE_MS, latest(t))
            return [member, given, "again" if t.game_id in again else ""]

        calls = [([self.keys.clocks(self.keys.partition(t.game_id))], args(t)) for t in clocked]
        raising = away is None
        answers = iter(
            await _DELIVER.run_many(
                self.redis,
                calls,
                raise_on_error=raising,
                patience=None if raising else patience,
            )
            if calls
            else []
        )
        out: list[Delivered | None] = []
        for t in turns:
            if not (hold and holdable(t)):
                self.lag.observe(now - t.since)
            if not t.allowance:
                out.append(Delivered(0, ""))
                continue
            answer = next(answers)
            if isinstance(answer, TRANSIENT_ERRORS) and away is not None:
                away.add(t.game_id)
                out.append(None)
                continue
            if isinstance(answer, Exception):
                raise answer
            if answer is None or answer == CLAIMED:
                self.lag.undelivered += answer == CLAIMED
                out.append(None)
                continue
            due = int(float(answer))
            stamp = clock_stamp(self.clock_key, t.game_id, t.seq, due)
            out.append(Delivered(due - SEND_GRACE_MS, stamp))
        return out


def holdable(turn: Handover) -> bool:
    """Whether the turn may be held for a warm-up: its seat's first in the game."""
    return len(turn.moves) < 2


def latest(turn: Handover) -> int:
    """The latest deadline any delivery may give the turn (the engine's bound too)."""
    return turn.since + turn.allowance + MAX_GRACE_MS


async def pending_turns(
    redis: Client, keys: Keys, bot: str, count: int, consumers: Sequence[str] | None = None
) -> list[tuple[TurnRequest, dict[str, Any]]]:
    """The turns pending in `bot`'s inbox with its workers (at most `count` of each of
    `consumers`; None: `count` in all), each with its XPENDING row (consumer, ms idle,
    deliveries): two round trips, each one pipeline. A turn that does not decode is left
    out. Raises `ResponseError` when no worker ever read the inbox (no group)."""
    inbox = keys.bot_turns(bot)
    pipe = redis.pipeline(transaction=False)
    for name in [None] if consumers is None else consumers:
        pipe.xpending_range(inbox, WORKERS_GROUP, "-", "+", count, consumername=name)
    rows = [row for rows in await pipe.execute() for row in rows]
    if not rows:
        return []
    pipe = redis.pipeline(transaction=False)
    for row in rows:
        pipe.xrange(inbox, row["message_id"], row["message_id"])
    out = []
    for row, entries in zip(rows, await pipe.execute(), strict=True):
        for _, fields in entries:
            try:
                out.append((decode_turn(fields[FIELD_BYTES]), row))
            except (DecodeError, KeyError):
                continue
    return out
