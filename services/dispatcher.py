"""The dispatcher: turns "a bot is to move" into a turn request, and runs the move clocks.

It consumes every partition's feed (group `dispatcher`). After each batch it looks at the
head of every game the batch touched: when the seat to move is a bot, a `TurnRequest` (game,
options, the moves so far, the seq to answer, seat, token, deadline) goes to that bot's inbox
`agon:bot:{<bot>}:turns`. When the game has a per-move limit, the deadline (time of the head
event + limit, the engine's own rule) goes into the partition's clock zset as "<id>|<seq>";
`claim_timeouts` sends a `ClaimTimeout` for every passed deadline, and the engine decides
whether it really is late. A clock is claimed by whichever dispatcher removes it first.

What it needs of a game (options, seats, moves) is folded from the feed and cached; on a miss
or a gap the game is folded from its log. A redelivered entry can send a turn request twice;
workers drop the copy (the log has moved on, or the command id repeats and the engine answers
with its first reply), so dispatch is at least once and its effect exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from schemas.codec import FIELD, FIELD_BYTES, DecodeError, encode, unpack
from schemas.commands import ClaimTimeout
from schemas.tokens import bot_token, server_secret
from schemas.turns import TurnRequest
from services.keys import DISPATCHER_GROUP, Keys
from services.streams import Entry, GroupReader, consumer_name

log = logging.getLogger("agon.dispatcher")

#: Inboxes are capped so a bot nobody serves cannot fill Redis; far beyond any live backlog.
INBOX_MAXLEN = 100_000
#: A deadline is claimed this long after it passes, so the engine's clock agrees it passed.
TIMEOUT_GRACE_MS = 50


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class GameTurns:
    """What the dispatcher knows of one game: enough to write its turn requests."""

    game_id: str
    game: str
    options: dict[str, str]
    seats: list[dict[str, Any]]
    move_time_ms: int
    seed: int
    seq: int = 0
    time: int = 0
    moves: list[str] = field(default_factory=list)
    to_move: int = 0
    colours: list[int] = field(default_factory=lambda: [1, 2])
    ended: bool = False
    #: the seq whose turn was dispatched and whose clock was set (0: none yet)
    dispatched: int = 0

    @classmethod
    def start(cls, ev: dict[str, Any]) -> GameTurns:
        if ev.get("type") != "game_created":
            raise ValueError(f"game {ev.get('game_id')}: log starts with {ev.get('type')!r}")
        return cls(
            ev["game_id"],
            ev["game"],
            dict(ev["options"]),
            list(ev["seats"]),
            ev["move_time_ms"],
            ev["seed"],
            seq=ev["seq"],
            time=ev["time"],
        )

    def apply(self, ev: dict[str, Any]) -> None:
        kind = ev["type"]
        if kind in ("game_started", "move_played"):
            self.to_move = ev["to_move"]
            self.colours = list(ev["colours"])
            if kind == "move_played":
                self.moves.append(ev["move"])
        elif kind == "game_ended":
            self.ended = True
            self.to_move = 0
        self.seq = ev["seq"]
        self.time = ev["time"]

    @property
    def deadline(self) -> int:
        return self.time + self.move_time_ms if self.move_time_ms else 0


class Dispatcher:
    """One dispatcher consumer: `run` until stopped, or `drain` what is there."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        consumer: str | None = None,
        secret: bytes | None = None,
        batch: int = 1000,
        block_ms: int = 1000,
        claim_idle_ms: int = 30_000,
        clock_every_s: float = 0.1,
        clock: Callable[[], int] = now_ms,
        cache_size: int = 20_000,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.secret = secret if secret is not None else server_secret()
        self.reader = GroupReader(
            redis,
            [self.keys.feed(p) for p in self.keys.all_partitions()],
            DISPATCHER_GROUP,
            consumer or consumer_name("dispatcher"),
            count=batch,
            claim_idle_ms=claim_idle_ms,
        )
        self.block_ms = block_ms
        self.clock_every_s = clock_every_s
        self.clock = clock
        self.cache_size = cache_size
        self.turns_sent = 0
        self.timeouts_claimed = 0
        self._cache: OrderedDict[str, GameTurns] = OrderedDict()

    async def run(self, stop: asyncio.Event | None = None) -> None:
        stop = stop or asyncio.Event()
        block = min(self.block_ms, int(self.clock_every_s * 1000)) or 1
        next_clock = 0.0
        while not stop.is_set():
            try:
                await self.process(await self.reader.read(block))
                if time.monotonic() >= next_clock:
                    next_clock = time.monotonic() + self.clock_every_s
                    await self.claim_timeouts()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatcher: batch failed; retrying")
                self.reader.recover()
                self._cache.clear()
                await asyncio.sleep(0.5)

    async def drain(self) -> int:
        """Dispatch everything the feeds hold (and claim passed deadlines), then return."""
        handled = 0
        while True:
            entries = await self.reader.read(None, reclaim=not handled)
            if not entries:
                await self.claim_timeouts()
                return handled
            handled += len(entries)
            await self.process(entries)

    async def process(self, entries: Sequence[Entry]) -> None:
        by_game: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            try:
                if entry.data is None:
                    raise DecodeError("malformed", "no field 'm'")
                ev = unpack(entry.data)
                by_game.setdefault(ev["game_id"], []).append(ev)
            except (DecodeError, KeyError) as exc:
                log.error("dispatcher: skipping feed entry %r: %s", entry.entry_id, exc)
        games = await self._advance(by_game)
        pipe = self.redis.pipeline(transaction=False)
        for g in games:
            self._queue_turn(pipe, g)
        await pipe.execute()
        await self.reader.ack(entries)

    async def _advance(self, by_game: dict[str, list[dict[str, Any]]]) -> list[GameTurns]:
        """Bring each touched game up to its newest event, from the feed or from its log."""
        out: list[GameTurns] = []
        refold: list[str] = []
        for gid, events in by_game.items():
            g = self._cache.get(gid)
            fresh = {ev["seq"]: ev for ev in events if g is None or ev["seq"] > g.seq}
            if not fresh:
                continue
            seqs = sorted(fresh)
            if g is None and seqs[0] == 1:
                g = GameTurns.start(fresh[1])
                seqs = seqs[1:]
            if g is None or seqs != list(range(g.seq + 1, g.seq + 1 + len(seqs))):
                refold.append(gid)  # a miss or a gap: this consumer has not seen it all
                continue
            for s in seqs:
                g.apply(fresh[s])
            out.append(g)
        if refold:
            pipe = self.redis.pipeline(transaction=False)
            for gid in refold:
                pipe.xrange(self.keys.log(gid), "-", "+")
            for gid, rows in zip(refold, await pipe.execute(), strict=True):
                old = self._cache.get(gid)
                try:
                    events = [unpack(fields[FIELD_BYTES]) for _, fields in rows]
                    g = GameTurns.start(events[0])
                    for ev in events[1:]:
                        g.apply(ev)
                except Exception:
                    log.exception("dispatcher: the log of game %s does not fold", gid)
                    continue
                g.dispatched = old.dispatched if old is not None else 0
                out.append(g)
        for g in out:
            if g.ended:
                self._cache.pop(g.game_id, None)
            else:
                self._cache[g.game_id] = g
                self._cache.move_to_end(g.game_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def _queue_turn(self, pipe: Any, g: GameTurns) -> None:
        """The game's head decides: a turn request and a clock, or clearing the clock."""
        clocks = self.keys.clocks(self.keys.partition(g.game_id))
        if g.dispatched and g.dispatched != g.seq:
            pipe.zrem(clocks, f"{g.game_id}|{g.dispatched}")
        if g.ended or not g.to_move or g.dispatched == g.seq:
            return
        g.dispatched = g.seq
        if g.move_time_ms:
            pipe.zadd(clocks, {f"{g.game_id}|{g.seq}": g.deadline})
        seat = g.seats[g.to_move - 1]
        if seat["kind"] != "bot":
            return
        request = TurnRequest(
            game_id=g.game_id,
            game=g.game,
            options=g.options,
            moves=g.moves,
            seq=g.seq,
            seat=g.to_move,
            colour=g.colours[g.to_move - 1],
            bot=seat["name"],
            token=bot_token(self.secret, g.game_id, g.to_move),
            deadline=g.deadline,
            seed=g.seed,
        )
        pipe.xadd(
            self.keys.bot_turns(seat["name"]),
            {FIELD: encode(request)},
            maxlen=INBOX_MAXLEN,
            approximate=True,
        )
        self.turns_sent += 1

    async def claim_timeouts(self, now: int | None = None) -> int:
        """Send a `ClaimTimeout` for every deadline passed (by the grace) in any partition."""
        limit = (self.clock() if now is None else now) - TIMEOUT_GRACE_MS
        pipe = self.redis.pipeline(transaction=False)
        parts = list(self.keys.all_partitions())
        for p in parts:
            pipe.zrangebyscore(self.keys.clocks(p), "-inf", limit, start=0, num=500)
        due = [(p, _text(m)) for p, ms in zip(parts, await pipe.execute(), strict=True) for m in ms]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for p, member in due:
            pipe.zrem(self.keys.clocks(p), member)
        won = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        claimed = 0
        for (_, member), removed in zip(due, won, strict=True):
            if not removed:
                continue  # another dispatcher took this clock
            gid, _, seq = member.rpartition("|")
            claim = ClaimTimeout(
                command_id=f"timeout:{gid}:{seq}", game_id=gid, expected_seq=int(seq)
            )
            pipe.xadd(self.keys.commands_for(gid), {FIELD: encode(claim)})
            claimed += 1
        await pipe.execute()
        self.timeouts_claimed += claimed
        return claimed


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
