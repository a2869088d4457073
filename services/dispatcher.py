"""The dispatcher: turns "a bot is to move" into a turn request, and runs the move clocks.

It consumes every partition's feed (group `dispatcher`). After each batch it looks at the
head of every game the batch touched: when the seat to move is a bot, a `TurnRequest` (game,
options, the moves so far, the seq to answer, seat, token, deadline) goes to that bot's inbox
`agon:bot:{<bot>}:turns`. When the game has a per-move limit, the deadline (time of the head
event + limit, the engine's own rule) goes into the partition's clock zset as "<id>|<seq>";
`claim_timeouts` sends a `ClaimTimeout` for every passed deadline, and the engine decides
whether it really is late. A clock is claimed by whichever dispatcher removes it first, in
the same atomic write that sends the claim, so a failed write never loses a clock.

What it needs of a game (options, seats, moves) is folded from the feed and cached; on a miss
or a gap the game is folded from its log. A redelivered entry can send a turn request twice;
workers drop the copy (the log has moved on, or the command id repeats and the engine answers
with its first reply), so dispatch is at least once and its effect exactly once.
"""

from __future__ import annotations

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
from services.streams import Entry, GroupReader, StreamConsumer, as_text, consumer_name, now_ms

log = logging.getLogger("agon.dispatcher")

#: Inboxes are capped so a bot nobody serves cannot fill Redis; far beyond any live backlog.
INBOX_MAXLEN = 100_000
#: A deadline is claimed this long after it passes, so the engine's clock agrees it passed.
TIMEOUT_GRACE_MS = 50
#: Passed deadlines claimed per partition per sweep; the rest wait for the next sweep.
CLAIMS_PER_SWEEP = 500

# Claim passed clocks of one partition: send each claim, then remove its clock. Atomic, so
# two dispatchers never both claim one clock; the XADD comes first because Redis does not
# roll a script back, so a failed write leaves the clock for the next sweep.
# KEYS: clocks zset, command stream. ARGV: the entry field, then (member, claim) pairs.
_CLAIM_LUA = """
local claimed = 0
for i = 2, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('XADD', KEYS[2], '*', ARGV[1], ARGV[i + 1])
    redis.call('ZREM', KEYS[1], ARGV[i])
    claimed = claimed + 1
  end
end
return claimed
"""


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

    def evolve(self, ev: dict[str, Any]) -> None:
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


class Dispatcher(StreamConsumer):
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
        self.dead_letter = self.keys.reader_dead_letter()
        # Wake at least once per clock sweep, even when the feeds are quiet.
        self.block_ms = min(block_ms, int(clock_every_s * 1000)) or 1
        self.clock_every_s = clock_every_s
        self.clock = clock
        self.cache_size = cache_size
        self.turns_sent = 0
        self.timeouts_claimed = 0
        self._cache: OrderedDict[str, GameTurns] = OrderedDict()
        self._next_sweep = 0.0
        self._claim = redis.register_script(_CLAIM_LUA)

    def forget(self) -> None:
        self._cache.clear()

    async def tick(self) -> None:
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.clock_every_s
            await self.claim_timeouts()

    async def drain(self) -> int:
        """Dispatch everything the feeds hold, then claim passed deadlines, and return."""
        handled = await super().drain()
        await self.claim_timeouts()
        return handled

    async def process(self, entries: Sequence[Entry]) -> None:
        by_game: dict[str, list[dict[str, Any]]] = {}
        for entry in entries:
            try:
                if entry.data is None:
                    raise DecodeError("malformed", f"no field {FIELD!r}")
                ev = unpack(entry.data)
                by_game.setdefault(ev["game_id"], []).append(ev)
            except (DecodeError, KeyError) as exc:
                await self.set_aside(entry, exc)
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
                g.evolve(fresh[s])
            out.append(g)
        out.extend(await self._refold(refold))
        for g in out:
            if g.ended:
                self._cache.pop(g.game_id, None)
            else:
                self._cache[g.game_id] = g
                self._cache.move_to_end(g.game_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    async def _refold(self, game_ids: Sequence[str]) -> list[GameTurns]:
        """These games folded again from their logs, in one trip.

        A log that does not fold is logged and skipped: the engine wrote it, so that is a
        bug to look at, not input to retry.
        """
        if not game_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xrange(self.keys.log(gid), "-", "+")
        out: list[GameTurns] = []
        for gid, rows in zip(game_ids, await pipe.execute(), strict=True):
            try:
                events = [unpack(fields[FIELD_BYTES]) for _, fields in rows]
                g = GameTurns.start(events[0])
                for ev in events[1:]:
                    g.evolve(ev)
            except Exception:
                log.exception("dispatcher: the log of game %s does not fold", gid)
                continue
            old = self._cache.get(gid)
            g.dispatched = old.dispatched if old is not None else 0
            out.append(g)
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
        parts = list(self.keys.all_partitions())
        pipe = self.redis.pipeline(transaction=False)
        for p in parts:
            pipe.zrangebyscore(self.keys.clocks(p), "-inf", limit, start=0, num=CLAIMS_PER_SWEEP)
        answers = await pipe.execute()
        due = [(p, members) for p, members in zip(parts, answers, strict=True) if members]
        if not due:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for p, members in due:
            args: list[Any] = [FIELD]
            for member in map(as_text, members):
                gid, _, seq = member.rpartition("|")
                claim = ClaimTimeout(
                    command_id=f"timeout:{gid}:{seq}", game_id=gid, expected_seq=int(seq)
                )
                args += [member, encode(claim)]
            keys = [self.keys.clocks(p), self.keys.commands(p)]
            await self._claim(keys=keys, args=args, client=pipe)
        claimed = sum(int(n) for n in await pipe.execute())
        self.timeouts_claimed += claimed
        return claimed
