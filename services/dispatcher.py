"""The dispatcher: turns "a bot is to move" into a turn request, and runs the move clocks.

It consumes every partition's feed (group `dispatcher`). After each batch it looks at the
head of every game the batch touched: when the seat to move is a bot, a `TurnRequest` (game,
options, the moves so far, the seq to answer, seat, token, deadline) goes to that bot's inbox
`agon:bot:{<bot>}:turns`. When the game has a per-move limit, the deadline goes into the
partition's clock zset as "<id>|<seq>": for a person, the engine's own rule (time of the head
event + limit + bank); for a bot, due only at the latest its turn may still reach it
(`MAX_GRACE_MS` later). Whoever hands the bot its turn (its worker, or the gateway serving an
outside bot) marks the clock delivered, "<id>|<seq>|took", due the allowance after that
moment (`services.bus.delivery`), so that the platform's lag before the bot could see its
turn is not the bot's time. `claim_timeouts`
sends a `ClaimTimeout` for every passed deadline, signed (`schemas.tokens.clock_stamp`), and
the engine decides whether it really is late. A bot's clock that comes due undelivered while
the bot is served (a worker or a stream beats for it) is the platform's failure: its claim
is signed as such (`late_stamp`) and the game ends as `interrupted`, never the bot's loss;
one delivered to a worker that died with it waits for another worker to take the turn over
(`TAKEOVER_MS`), whose delivery starts the bot's time anew.
A clock is claimed by whichever dispatcher removes it first, in the same atomic write that
sends the claim, so a failed write never loses a clock. A clock that came due while Redis
refused writes (out of memory: `services.bus.outages`) is set again with the time the spell
took, and its bot handed the turn again, instead of claimed.

A bot nobody serves must not hold a game for ever: a bot's turn in a game without a clock
is watched too ("<id>|<seq>|watch" in the clock zset, due after `unserved_ms`); when it
comes due and no worker of that bot has a fresh heartbeat, the game ends as the bot's
`no_reply`, or `disconnect` for an outside bot whose connection to a gateway is gone (an
operator's `Abort` with the admin token), else the watch is set again.

What it needs of a game (options, seats, moves) is the shared fold (`GameFold`, without
the engine position) of the feed, cached; on a miss, a gap or a break in the hash chain (a
master failover replaced an event the cache holds) the game is folded from its log. A
redelivered entry can send a turn request twice; workers drop the copy (the log has moved
on, or the command id repeats and the engine answers with its first reply), so dispatch is
at least once and its effect exactly once.

With `replicas` (`--ack-replicas`, as the engine's), a batch is acknowledged only once that
many replicas hold its turn requests and clocks (`bus.scripts.run_replicated`); otherwise
it is read again and its turns sent again, so a master failover cannot lose a turn and
leave its game waiting for a bot that never heard of it.

The dispatchers divide the partitions (`services.bus.ownership`), and every write of a
partition's clocks is fenced: one script checks the partition's lease holds the epoch this
dispatcher took it under (`fence`), so one that was paused past its lease and resumes can
neither set, clear nor claim a clock of the dispatcher that took over. A turn request goes
to the bot's inbox, in the bot's own hash slot, which no script can check with the lease
on a cluster: it is sent only once its partition's clock write was accepted. A refused
partition is given up at once (`lose`), and its feed entries stay pending for its owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

import msgpack
from redis.exceptions import ResponseError

from schemas.codec import (
    FIELD,
    DecodeError,
    encode,
    event_hash,
    unpack,
    unpack_event,
)
from schemas.commands import Abort, ClaimTimeout
from schemas.events import EventMap
from schemas.tokens import (
    MAX_GRACE_MS,
    SEND_GRACE_MS,
    admin_token,
    bot_token,
    clock_key,
    clock_stamp,
    late_stamp,
)
from schemas.turns import TurnRequest
from services.bus import outages
from services.bus.cache import LRU
from services.bus.clients import QueryClient, log_entries
from services.bus.connection import Client, is_cluster
from services.bus.consumer import ConsumerOptions, ConsumerSettings, StreamConsumer
from services.bus.delivery import HELD, TOOK, pending_turns
from services.bus.keys import DISPATCHER_GROUP, FEED_GROUPS, WORKERS_GROUP, Keys
from services.bus.presence import ALIVE_MS
from services.bus.reader import CLAIM_EVERY_S, Entry
from services.bus.scripts import Call, Script, each_confirmed
from services.bus.secret import shared_secret
from services.bus.stuck import abandoned_games, stuck_games
from services.bus.text import as_text, now_ms
from services.gamelog.fold import GameFold

log = logging.getLogger("agon.dispatcher")

#: Inboxes are capped so a bot nobody serves cannot fill Redis; far beyond any live backlog.
INBOX_MAXLEN = 100_000
#: A deadline is claimed this long after it passes, so the engine's clock agrees it passed.
TIMEOUT_GRACE_MS = 50
#: Passed deadlines claimed per partition per sweep; the rest wait for the next sweep.
CLAIMS_PER_SWEEP = 500
#: A partition with no clock due sooner is swept again this long after it was last looked
#: at (ms), unless this dispatcher writes a clock there: no clock a bot's delivery starts
#: comes due sooner than `SEND_GRACE_MS` after it (`services.bus.delivery`). Looking at
#: every partition every sweep was a third of an idle dispatcher's Redis calls.
LOOK_EVERY_MS = SEND_GRACE_MS
#: A bot turn without a clock whose bot has no live worker this long is aborted.
UNSERVED_MS = 300_000
#: A game nobody touched this long is abandoned: it ends as aborted (`--abandon-after`).
ABANDON_MS = 24 * 3_600_000
#: How often the dispatcher looks for stuck and abandoned games.
REPAIR_EVERY_S = 30.0
#: Clock changes and turn requests per `_SEND` call (a call holds one partition's writes
#: whole): large enough to amortise the call, small enough not to stall the server for long.
SENDS_PER_CALL = 64
#: How long the entries of partitions whose master did not take their writes wait before
#: they are read again (`_away`): a dead master costs a few tries a second, not a spin.
AWAY_PAUSE_S = 0.2

# The fence, first in `_CLOCKS` and `_CLAIM` (`_SEND` checks it per partition): KEYS[2] is the
# partition's dispatcher lease, ARGV[1] the epoch this dispatcher holds it under (0: not
# checked, -1: not held). Refused, the call writes nothing and answers -1, as the engine's
# commit does (`services.engine_service.store`).
_FENCE = """
local fence = tonumber(ARGV[1])
if fence ~= 0 and tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0') ~= fence then
  return -1
end
"""

# Change one partition's clocks, in order. KEYS: clocks zset, lease. ARGV: the fence, then
# (score, member) pairs, an empty score removing the member.
_CLOCKS = Script(
    _FENCE
    + """
for i = 2, #ARGV, 2 do
  if ARGV[i] == '' then
    redis.call('ZREM', KEYS[1], ARGV[i + 1])
  else
    redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 0
"""
)

# One inbox's turn requests of a batch (on a cluster, where they cannot ride with the
# partition's clocks): in one call, so that Redis hands them to one blocked worker together
# (one XADD each would wake a worker for each, every worker's batch one turn). KEYS: the
# inbox. ARGV: its maxlen, the field, then the entries. Answers how many went in.
_TURNS = Script(
    """
for i = 3, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', ARGV[2], ARGV[i])
end
return #ARGV - 2
"""
)

# A single server's batch in one round trip, `SENDS_PER_CALL` writes a call (no hash slots
# to keep apart there): per partition the fence, then its clock changes (as `_CLOCKS`) and
# its turn requests, which go out only where the fence held. KEYS: per partition its clocks
# zset and lease, in pairs, then the inboxes. ARGV[1]: msgpack of [fence, [score or '',
# member, ...], [[inbox key index, entry], ...]] per partition. Answers per partition 0,
# or -1 refused.
_SEND = Script(
    """
local parts, out = cmsgpack.unpack(ARGV[1]), {}
for i, part in ipairs(parts) do
  local clocks, fence, changes = KEYS[2 * i - 1], part[1], part[2]
  if fence ~= 0 and tonumber(redis.call('HGET', KEYS[2 * i], 'epoch') or '0') ~= fence then
    out[i] = -1
  else
    for j = 1, #changes, 2 do
      if changes[j] == '' then
        redis.call('ZREM', clocks, changes[j + 1])
      else
        redis.call('ZADD', clocks, changes[j], changes[j + 1])
      end
    end
    for _, turn in ipairs(part[3]) do
      redis.call('XADD', KEYS[turn[1]], 'MAXLEN', '~', ARGV[2], '*', ARGV[3], turn[2])
    end
    out[i] = 0
  end
end
return out
"""
)

# Claim passed clocks of one partition: send each claim, then replace its clock by a
# re-check (`AGAIN`), due `RECHECK_MS` later, that claims again while the game stands at that
# seq: the engine may refuse a claim (its clock ran through a spell of refused writes the
# dispatcher had not seen yet), and a refusal is not the end of the clock. Atomic, so two
# dispatchers never both claim one clock; the XADD comes first because Redis does not roll a
# script back, so a failed write leaves the clock for the next sweep.
# KEYS: clocks zset, lease, command stream. ARGV: the fence, the entry field, then (member,
# claim, re-check member, its score) quadruples. Answers how many it claimed.
_CLAIM = Script(
    _FENCE
    + """
local claimed = 0
for i = 3, #ARGV, 4 do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('XADD', KEYS[3], '*', ARGV[2], ARGV[i + 1])
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('ZADD', KEYS[1], ARGV[i + 3], ARGV[i + 2])
    claimed = claimed + 1
  end
end
return claimed
"""
)
#: A claimed clock is claimed again this long after, while its game stands at that seq.
RECHECK_MS = 1000
#: The mark of a re-check member, "<id>|<seq>|again": it claims against the deadline its
#: score less `RECHECK_MS` (when the claim before it was sent, at or after the deadline);
#: "<id>|<seq>|again-took" for a delivered clock's (`TOOK`).
AGAIN = "again"
AGAIN_TOOK = f"{AGAIN}-{TOOK}"
#: The kinds of a clock whose turn reached its bot (or is held while it prepares).
DELIVERED = frozenset({TOOK, HELD, AGAIN_TOOK})
#: A delivered clock whose turn is pending with a worker that died is set again this long
#: from now: time for a live worker to see it dead and take the turn over (`ALIVE_MS`,
#: then its next claim sweep).
TAKEOVER_MS = ALIVE_MS + 2 * int(CLAIM_EVERY_S * 1000)
#: At most this many of a dead worker's pending turns are looked at per sweep.
DEAD_TURNS_READ = 1000


@dataclass(slots=True)
class Writes:
    """What the dispatcher writes in one partition: its clock changes, in order, as one
    fenced call (`_CLOCKS`), and the turn requests sent only once that call was accepted."""

    #: (member, score); a score of None removes the member
    clocks: list[tuple[str, int | None]] = field(default_factory=list)
    #: (inbox, turn request entry)
    turns: list[tuple[str, bytes]] = field(default_factory=list)

    def add(self, member: str, score: int) -> Writes:
        self.clocks.append((member, score))
        return self

    def remove(self, *members: str) -> Writes:
        self.clocks += [(m, None) for m in members]
        return self

    def args(self) -> list[Any]:
        """The clock changes as `_CLOCKS`'s arguments after the fence."""
        return [a for m, score in self.clocks for a in ("" if score is None else score, m)]


class Dispatcher(StreamConsumer):
    """One dispatcher consumer: `run` until stopped, or `drain` what is there."""

    role = "dispatcher"
    trim_groups = FEED_GROUPS

    def __init__(
        self,
        redis: Client,
        keys: Keys | None = None,
        *,
        secret: bytes | None = None,
        clock_every_s: float = 0.1,
        clock: Callable[[], int] = now_ms,
        unserved_ms: int = UNSERVED_MS,
        abandon_ms: int = ABANDON_MS,
        settings: ConsumerSettings | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        keys = keys or Keys()
        feeds = [keys.feed(p) for p in keys.all_partitions()]
        self.join(redis, keys, feeds, DISPATCHER_GROUP, settings, partitioned=True, **options)
        # Wake at least once per clock sweep, even when the feeds are quiet.
        self.block_ms = min(self.block_ms, int(clock_every_s * 1000)) or 1
        #: the server secret, given or (at `setup`) shared through Redis
        self.secret = secret or b""
        self.clock_every_s = clock_every_s
        self.clock = clock
        self.unserved_ms = unserved_ms
        self.abandon_ms = abandon_ms
        self._next_repair = time.monotonic() + REPAIR_EVERY_S
        self.turns_sent = 0
        self.timeouts_claimed = 0
        self.unserved_aborted = 0
        self.undelivered = 0
        #: clocks set again for a spell they ran through (`services.bus.outages`)
        self.rearmed = 0
        #: partitions given up because a write there was refused (another one holds them)
        self.fenced = 0
        self.query = QueryClient(redis, self.keys)
        cache_size = self.settings.cache_size
        self._cache: LRU[str, GameFold] = LRU(cache_size)
        #: per cached game, the hash of its head event's bytes (the next one's prev_hash)
        self._heads: LRU[str, str] = LRU(cache_size)
        #: per game, the seq whose turn was dispatched and whose clock was set
        self._dispatched: LRU[str, int] = LRU(cache_size)
        self._next_sweep = 0.0
        #: per partition, when its first clock comes due (by `clock`), as last looked at;
        #: none: look at it in the next sweep
        self._look_at: dict[int, int] = {}

    @property
    def _clock_key(self) -> bytes:
        return clock_key(self.secret)

    def stats(self) -> dict[str, int]:
        return {
            "turns": self.turns_sent,
            "timeouts": self.timeouts_claimed,
            "aborted_unserved": self.unserved_aborted,
            "undelivered": self.undelivered,
            "rearmed": self.rearmed,
            "fenced": self.fenced,
            "set_aside": self.entries_set_aside,
        }

    async def setup(self) -> None:
        await super().setup()
        if not self.secret:
            self.secret = await shared_secret(self.redis, self.keys)

    def forget(self) -> None:
        # A failed batch may have marked turns dispatched that never reached Redis.
        self._cache.clear()
        self._heads.clear()
        self._dispatched.clear()

    def forget_partitions(self, partitions: set[int]) -> None:
        for cache in (self._cache, self._heads, self._dispatched):
            cache.drop(lambda gid: self.keys.partition(gid) in partitions)
        for p in partitions:
            self._look_at.pop(p, None)

    async def tick(self) -> None:
        if time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + self.clock_every_s
            await self.claim_timeouts(every=False)
        # In the loop, between batches: a repair never races a batch over the caches.
        if time.monotonic() >= self._next_repair:
            self._next_repair = time.monotonic() + REPAIR_EVERY_S
            await self.repair()

    async def settle(self) -> None:
        """After a drain: claim passed deadlines too."""
        await self.claim_timeouts()

    async def process(self, entries: Sequence[Entry]) -> None:
        by_game: dict[str, list[tuple[EventMap, bytes]]] = {}
        for entry in entries:
            try:
                if entry.data is None:
                    raise DecodeError("malformed", f"no field {FIELD!r}")
                ev: Any = unpack(entry.data)
                by_game.setdefault(ev["game_id"], []).append((ev, entry.data))
            except (DecodeError, KeyError, TypeError) as exc:
                await self.set_aside(entry, repr(exc))
        games = await self._advance(by_game)
        await self.ack_except(entries, await self._send(self._writes(games)))

    async def _send(self, writes: dict[int, Writes]) -> set[int]:
        """Each partition's clock changes under its fence, and the turn requests of the
        partitions whose fence held; with `replicas`, confirmed by that many. Returns the
        partitions whose entries stay pending: those refused (given up: `_refused`), and
        those whose writes a master did not take or confirm (`_away`: read again later).

        A turn request must not go out from a dispatcher that no longer holds its
        partition. A single server takes the batch in one round trip (`_SEND`, up to
        `SENDS_PER_CALL` writes a call). On a cluster an inbox is in its bot's hash slot,
        which no script of the partition may name: each partition's clocks go first
        (`_CLOCKS`), then the turns of those whose fence held, a second round trip (which
        also means a worker taking a turn always finds its clock to start); one call an
        inbox (`_TURNS`)."""
        parts = [p for p, w in writes.items() if w.clocks or w.turns]
        if not parts:
            return set()
        for p in parts:
            self._look_at.pop(p, None)  # a clock it sets may come due before the next look
        fences = [self.fence(p) for p in parts]
        if is_cluster(self.redis):
            calls: list[Call] = [
                (self._clock_keys(p), [fence, *writes[p].args()])
                for p, fence in zip(parts, fences, strict=True)
            ]
            answers = await self._run(_CLOCKS, calls, "clocks")
        else:
            chunks = self._chunks(writes, parts)
            calls = [self._one_call(writes, parts[a:b], fences[a:b]) for a, b in chunks]
            answers = []
            for (a, b), answer in zip(chunks, await self._run(_SEND, calls, "turns"), strict=True):
                answers += [answer] * (b - a) if isinstance(answer, Exception) else answer
        refused: set[int] = set()
        away: set[int] = set()
        for p, fence, answer in zip(parts, fences, answers, strict=True):
            if isinstance(answer, Exception):
                away.add(p)
            elif int(answer) < 0:
                self._refused(p, fence)
                refused.add(p)
        turns = [(p, t) for p in parts if p not in refused | away for t in writes[p].turns]
        if turns and is_cluster(self.redis):
            by_inbox: dict[str, list[tuple[int, bytes]]] = {}
            for p, (inbox, entry) in turns:
                by_inbox.setdefault(inbox, []).append((p, entry))
            # `SENDS_PER_CALL` turns a call, as `_SEND` takes them: none stalls the server long
            sends = [
                (inbox, sent[i : i + SENDS_PER_CALL])
                for inbox, sent in by_inbox.items()
                for i in range(0, len(sent), SENDS_PER_CALL)
            ]
            calls = [
                ([inbox], [INBOX_MAXLEN, FIELD, *(entry for _, entry in sent)])
                for inbox, sent in sends
            ]
            answers = await self._run(_TURNS, calls, "turn requests")
            for (_, sent), answer in zip(sends, answers, strict=True):
                if isinstance(answer, Exception):
                    away.update(p for p, _ in sent)
        self.turns_sent += sum(p not in away for p, _ in turns)
        self._away(away)
        return refused | away

    def _away(self, partitions: set[int]) -> None:
        """A master did not take (or its replicas did not confirm) these partitions' writes
        (it died, and its replica is taking over): their entries stay pending and are read
        again after `AWAY_PAUSE_S`, their games folded again from their logs (their folds
        ran ahead of what was written); the other partitions' turns go out meanwhile."""
        if not partitions:
            return
        assert self.partition_streams is not None
        self.forget_partitions(partitions)
        streams = [self.partition_streams[p] for p in partitions]
        asyncio.get_running_loop().call_later(AWAY_PAUSE_S, self.reader.recover, streams)
        log.info(
            "dispatcher %s: partitions %s: a master did not take their writes; read again",
            self.reader.consumer, sorted(partitions),
        )  # fmt: skip

    @staticmethod
    def _chunks(writes: dict[int, Writes], parts: list[int]) -> list[tuple[int, int]]:
        """`parts` as index ranges of at most `SENDS_PER_CALL` writes each (one
        partition's writes stay together)."""
        out: list[tuple[int, int]] = []
        start, size = 0, 0
        for i, p in enumerate(parts):
            n = len(writes[p].clocks) + len(writes[p].turns)
            if size and size + n > SENDS_PER_CALL:
                out.append((start, i))
                start, size = i, 0
            size += n
        return [*out, (start, len(parts))]

    def _one_call(self, writes: dict[int, Writes], parts: list[int], fences: list[int]) -> Call:
        """`_SEND`'s keys and arguments for the partitions' writes."""
        keys = [key for p in parts for key in self._clock_keys(p)]
        index: dict[str, int] = {}
        packed = []
        for p, fence in zip(parts, fences, strict=True):
            turns = []
            for inbox, entry in writes[p].turns:
                if inbox not in index:
                    keys.append(inbox)
                    index[inbox] = len(keys)
                turns.append([index[inbox], entry])
            packed.append([fence, writes[p].args(), turns])
        # Redis's cmsgpack reads no bin type: bytes go as (raw) str.
        return keys, [msgpack.packb(packed, use_bin_type=False), INBOX_MAXLEN, FIELD]

    async def _run(self, script: Script, calls: Sequence[Call], what: str) -> list[Any]:
        """The script's calls (with `replicas`, each confirmed by that many): one that its
        master did not take (a failover) or its replicas did not confirm answers that error
        in its place; any other error is raised."""
        if not self.replicas:
            answers = await script.run_many(self.redis, calls, raise_on_error=False)
            return each_confirmed([(a, True) for a in answers], what)
        replicated = await script.run_replicated(
            self.redis, calls, self.replicas, self.replica_timeout_ms
        )
        return each_confirmed(replicated, f"{what} lack {self.replicas} replicas")

    async def _accepted(self, p: int, writes: Writes) -> bool:
        """Send one partition's writes (`_send`): whether the fence let them through."""
        return p not in await self._send({p: writes})

    def _clock_keys(self, p: int) -> list[str]:
        """The keys every clock script of partition `p` starts with (`_FENCE`)."""
        return [self.keys.clocks(p), self.keys.lease(p, self.role)]

    def _refused(self, p: int, fence: int) -> None:
        """A write in partition `p` under `fence` was refused: another dispatcher holds p.
        Counted (and told) only when this one held it: `repair` writes in every partition,
        and is refused quietly in those it never held."""
        if fence > 0:
            self.fenced += 1
            log.info(
                "dispatcher %s: partition %d was taken over; giving it up", self.reader.consumer, p
            )
        self.lose(p, fence)

    async def _advance(self, by_game: dict[str, list[tuple[EventMap, bytes]]]) -> list[GameFold]:
        """Bring each touched game up to its newest event, from the feed or from its log."""
        out: list[GameFold] = []
        refold: list[str] = []
        for gid, events in by_game.items():
            g, head = self._cache.get(gid), self._heads.get(gid)
            if g is not None and not self._continues(g, head, events):
                # The chain broke: a failover replaced events this cache holds. The log
                # decides, and the turn it ends with is sent again.
                self._cache.pop(gid)
                self._dispatched.pop(gid)
                refold.append(gid)
                continue
            fresh = {ev["seq"]: (ev, data) for ev, data in events if g is None or ev["seq"] > g.seq}
            if not fresh:
                continue
            seqs = sorted(fresh)
            if g is None and seqs[0] == 1:
                g = GameFold.start(fresh[1][0], replay=False, keep_moves=True)
                seqs = seqs[1:]
            if g is None or seqs != list(range(g.seq + 1, g.seq + 1 + len(seqs))):
                refold.append(gid)  # a miss or a gap: this consumer has not seen it all
                continue
            g.extend(fresh[s][0] for s in seqs)
            self._heads.put(gid, event_hash(fresh[max(fresh)][1]))
            out.append(g)
        out.extend(await self._refold(refold))
        for g in out:
            if g.status == "ended":
                self._cache.pop(g.game_id)
                self._heads.pop(g.game_id)
            else:
                self._cache.put(g.game_id, g)
        return out

    @staticmethod
    def _continues(g: GameFold, head: str | None, events: list[tuple[EventMap, bytes]]) -> bool:
        """Whether the feed's events agree with the cached fold: the one of its head's seq
        is the very event it holds, and the next one links to it."""
        for ev, data in events:
            if ev["seq"] == g.seq and event_hash(data) != head:
                return False
            if ev["seq"] == g.seq + 1 and ev.get("prev_hash") != head:
                return False
        return True

    async def _refold(self, game_ids: Sequence[str]) -> list[GameFold]:
        """These games folded again from their logs, in one trip.

        A log that does not fold is logged and skipped: the engine wrote it, so that is a
        bug to look at, not input to retry.
        """
        if not game_ids:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for gid in game_ids:
            pipe.xrange(self.keys.log(gid), "-", "+")
        out: list[GameFold] = []
        for gid, rows in zip(game_ids, await pipe.execute(), strict=True):
            try:
                entries = log_entries(rows)
                events: list[Any] = [unpack_event(e.data) for e in entries]
                g = GameFold.start(events[0], replay=False, keep_moves=True)
                g.extend(events[1:])
            except Exception:
                log.exception("dispatcher: the log of game %s does not fold", gid)
                continue
            self._heads.put(gid, event_hash(entries[-1].data))
            out.append(g)
        return out

    def _writes(self, games: Sequence[GameFold]) -> dict[int, Writes]:
        """The games' turn requests and clock changes (`_turn_writes`), by partition."""
        out: dict[int, Writes] = {}
        for g in games:
            self._turn_writes(g, out.setdefault(self.keys.partition(g.game_id), Writes()))
        return out

    def _turn_writes(self, g: GameFold, out: Writes) -> None:
        """The game's head decides: a turn request and a clock, or clearing the clock."""
        dispatched = self._dispatched.get(g.game_id) or 0
        if dispatched and dispatched != g.seq:
            old = f"{g.game_id}|{dispatched}"
            out.remove(old, *(f"{old}|{kind}" for kind in ("watch", TOOK, HELD, AGAIN, AGAIN_TOOK)))
        if "imported_from" in g.created:
            return  # appended whole and finished: a batch seeing it half-read is no turn
        if g.status != "playing" or not g.to_move or dispatched == g.seq:
            if g.status == "ended":
                self._dispatched.pop(g.game_id)
            return
        self._dispatched.put(g.game_id, g.seq)
        seat = g.seats[g.to_move - 1]
        deadline = due = g.deadline
        if deadline and seat["kind"] == "bot":
            deadline = max(deadline, self.clock() + deadline - g.updated)
            # Due only once no delivery could start it any more: delivery marks it taken.
            due = g.deadline + MAX_GRACE_MS
        if deadline:
            out.add(f"{g.game_id}|{g.seq}", due)
        elif seat["kind"] == "bot":
            out.add(f"{g.game_id}|{g.seq}|watch", g.updated + self.unserved_ms)
        if seat["kind"] == "bot":
            out.turns.append(self._turn_request(g, deadline))

    def _turn_request(self, g: GameFold, deadline: int) -> tuple[str, bytes]:
        """The bot to move in `g`'s inbox, and the turn request that hands it its turn, due
        by `deadline` (0: none)."""
        created, seat = g.created, g.seats[g.to_move - 1]
        request = TurnRequest(
            game_id=g.game_id,
            game=created["game"],
            options=created["options"],
            moves=g.moves,
            seq=g.seq,
            seat=g.to_move,
            colour=g.colour_of(g.to_move),
            bot=seat["name"],
            token=bot_token(self.secret, g.game_id, g.to_move),
            deadline=deadline,
            seed=created["seed"],
            since=g.updated,
            allowance=g.deadline - g.updated if g.deadline else 0,
        )
        return self.keys.bot_turns(seat["name"]), encode(request)

    async def claim_timeouts(self, now: int | None = None, *, every: bool = True) -> int:
        """Send a `ClaimTimeout` for every deadline passed (by the grace) in any partition,
        and abort the games of unserved bots whose watch came due. A partition another
        dispatcher took over meanwhile is given up, and nothing of it claimed (the fence).
        Not `every` (the sweeps of `run`): only the partitions whose first clock may have
        come due since they were looked at (`_look_at`)."""
        if self.write_watch.refusing:
            # Redis refused this dispatcher's last write: record the spell (or find it still
            # refusing) before any claim, so no clock that ran through it is claimed.
            await self.heartbeat()
        now = self.clock() if now is None else now
        limit = now - TIMEOUT_GRACE_MS
        parts = [p for p in self.partitions() if every or self._look_at.get(p, 0) <= now]
        parts = await self._due_partitions(parts, now)
        if not parts:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for p in parts:
            pipe.zrangebyscore(
                self.keys.clocks(p), "-inf", limit, start=0, num=CLAIMS_PER_SWEEP, withscores=True
            )
        answers = await pipe.execute()
        due = [
            (p, [(as_text(m), int(score)) for m, score in ms])
            for p, ms in zip(parts, answers, strict=True)
            if ms
        ]
        if not due:
            return 0
        calls: list[Call] = []
        fences: list[tuple[int, int]] = []  # per call, its partition and fence
        served: dict[str, bool] = {}  # bot -> has a live worker, asked once per sweep
        lost: dict[str, set[tuple[str, int]]] = {}  # bot -> turns its dead workers hold
        due_parts = [None, *(p for p, _ in due)]
        read = self.with_unwritten(await outages.partition_spells(self.redis, self.keys, due_parts))
        recheck = self.clock() + RECHECK_MS
        for p, members in due:
            claims: list[Any] = []
            spells = sorted([*read.get(None, ()), *read.get(p, ())])  # every partition's, and p's
            for member, due_at in members:
                if self.fence(p) < 0:
                    break  # a clock write of p was refused: p is another dispatcher's now
                gid, seq, kind, deadline = _clock_member(member, due_at)
                if kind and not await self._still_at(p, member, gid, seq):
                    continue
                if spells and await self._rearmed(p, member, deadline, spells, limit):
                    continue
                if kind == TOOK and await self._with_a_dead_worker(p, member, served, lost):
                    continue
                command = await self._due_command(p, member, deadline, served)
                if command is not None:
                    took = kind in DELIVERED
                    again = (
                        member
                        if kind == "watch"
                        else f"{gid}|{seq}|{AGAIN_TOOK if took else AGAIN}"
                    )
                    claims += [member, encode(command), again, recheck]
            fence = self.fence(p)
            if claims and fence >= 0:
                calls.append(
                    ([*self._clock_keys(p), self.keys.commands(p)], [fence, FIELD, *claims])
                )
                fences.append((p, fence))
        claimed = 0
        for (p, fence), n in zip(fences, await _CLAIM.run_many(self.redis, calls), strict=True):
            if int(n) < 0:
                self._refused(p, fence)
            else:
                claimed += int(n)
        self.timeouts_claimed += claimed
        return claimed

    async def _due_partitions(self, parts: list[int], now: int) -> list[int]:
        """Of `parts`, those whose first clock is due; each other one is next looked at
        when its first clock comes due, and no later than `LOOK_EVERY_MS` from now."""
        if not parts:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for p in parts:
            pipe.zrange(self.keys.clocks(p), 0, 0, withscores=True)
        due = []
        for p, first in zip(parts, await pipe.execute(), strict=True):
            at = int(first[0][1]) + TIMEOUT_GRACE_MS if first else now + LOOK_EVERY_MS
            if at <= now:
                due.append(p)
                self._look_at.pop(p, None)  # and again next sweep, until none is due
            else:
                self._look_at[p] = min(at, now + LOOK_EVERY_MS)
        return due

    async def repair(self) -> int:
        """Set the turn and clock again of every stuck game (`stuck_games`): whatever lost
        them (a write that never landed, a cache that forgot), the game goes on. End every
        abandoned game as aborted. Returns how many games were repaired or ended.

        Stuck games are looked for in every partition, and repaired by the dispatcher that
        holds theirs: the fence refuses the others' writes."""
        if not self.secret:  # for turn requests and the operator's aborts
            self.secret = await shared_secret(self.redis, self.keys)
        now = self.clock()
        # Only where this dispatcher holds the partition: the others' owners repair theirs
        # (no log read for a write the fence would refuse).
        stuck = [
            gid
            for gid in await stuck_games(self.redis, self.keys, now)
            if self.fence(self.keys.partition(gid)) >= 0
        ]
        for gid in stuck:
            self._dispatched.pop(gid)
            self._cache.pop(gid)
        refused = await self._send(self._writes(await self._refold(stuck)))
        stuck = [gid for gid in stuck if self.keys.partition(gid) not in refused]
        if stuck:
            log.warning(
                "dispatcher: %d stuck game(s) given their turn and clock again: %s",
                len(stuck),
                ", ".join(stuck[:5]),
            )
        abandoned = await abandoned_games(self.redis, self.keys, now, self.abandon_ms)
        token = admin_token(self.secret)
        pipe = self.redis.pipeline(transaction=False)
        for gid, seq in abandoned:
            end = Abort(command_id=f"abandoned:{gid}:{seq}", game_id=gid, seat=0, token=token,
                        reason="abandoned")  # fmt: skip
            pipe.xadd(self.keys.commands_for(gid), {FIELD: encode(end)})
        if abandoned:
            await pipe.execute()
            log.info("dispatcher: %d abandoned game(s) ended as aborted", len(abandoned))
        return len(stuck) + len(abandoned)

    async def _still_at(self, p: int, member: str, gid: str, seq: int) -> bool:
        """Whether a re-check's game still stands at its seq, playing; else it is removed."""
        g = await self._game(gid)
        if g is not None and g.seq == seq and g.status == "playing":
            return True
        await self._accepted(p, Writes().remove(member))
        return False

    async def _game(self, gid: str) -> GameFold | None:
        """The game as this dispatcher knows it, folded from its log on a miss."""
        return self._cache.get(gid) or next(iter(await self._refold([gid])), None)

    async def _rearmed(
        self, p: int, member: str, deadline: int, spells: list[outages.Spell], limit: int
    ) -> bool:
        """Whether a due clock ran through a spell in which Redis refused writes, and was set
        again with the time the spell took: the platform's time is never the player's. A
        bot is handed its turn again, with the new deadline signed (its first answer may
        never have reached a command stream). True too when the write was refused: the
        clock is the partition's new owner's."""
        gid, seq, kind, _ = _clock_member(member, deadline)
        g = await self._game(gid)
        if kind == "watch" or g is None or g.seq != seq or g.status != "playing":
            return False
        allowance = g.deadline - g.updated
        start = deadline - allowance
        if kind in ("", AGAIN, HELD) and g.seats[g.to_move - 1]["kind"] == "bot":
            start -= MAX_GRACE_MS  # an undelivered bot's clock is due only at the latest
        now = self.clock()
        paused = outages.paused_ms(spells, start, now)
        if not paused:
            return False
        # What the turn had left when the first spell began, counted again from now: the
        # bot hears of its turn again only now.
        began = min(a for a, b in spells if b > start)
        later = max(deadline + paused, now + max(0, deadline - max(start, began)))
        if later <= limit:
            return False
        # A re-check is a clock again; a delivered one stays delivered.
        delivered = kind in DELIVERED
        clock = f"{gid}|{seq}" + (f"|{TOOK}" if delivered else "")
        writes = Writes().remove(member).add(clock, later)
        if g.seats[g.to_move - 1]["kind"] == "bot":
            writes.turns.append(self._turn_request(g, later))
        if not await self._accepted(p, writes):
            return True
        self.rearmed += 1
        log.info(
            "dispatcher: game %s's clock ran through a spell of refused writes: %d ms more",
            gid,
            later - deadline,
        )
        return True

    async def _due_command(
        self, p: int, member: str, deadline: int, served: dict[str, bool]
    ) -> ClaimTimeout | Abort | None:
        """The command a due clock sends: a timeout claim, or for a watch an abort if
        nobody serves the bot (else the watch is set again and None returned)."""
        gid, seq, kind, _ = _clock_member(member, deadline)
        if kind != "watch":
            stamp = clock_stamp(self._clock_key, gid, seq, deadline)
            if kind not in DELIVERED and await self._served_bot(gid, served):
                # A served bot's turn that never reached it: the platform's failure.
                stamp = late_stamp(self.secret, gid, seq, deadline)
                self.undelivered += 1
            return ClaimTimeout(
                command_id=f"timeout:{gid}:{seq}", game_id=gid, expected_seq=seq, clock=stamp
            )
        g = await self._game(gid)
        bot = g.seats[g.to_move - 1]["name"] if g is not None and g.to_move else None
        if bot is not None and await self._served_bot(gid, served):
            await self._accepted(p, Writes().add(member, self.clock() + self.unserved_ms))
            return None
        self.unserved_aborted += 1
        # An outside bot (registered at the gateway) is served by its connection: it left.
        outside = bot is not None and await self.redis.hexists(self.keys.registered_bots(), bot)
        log.warning("dispatcher: nobody serves the bot to move in game %s: aborting it", gid)
        return Abort(
            command_id=f"unserved:{gid}:{seq}",
            game_id=gid,
            seat=0,
            token=admin_token(self.secret),
            reason="disconnect" if outside else "no_reply",
        )

    async def _with_a_dead_worker(
        self,
        p: int,
        member: str,
        served: dict[str, bool],
        lost: dict[str, set[tuple[str, int]]],
    ) -> bool:
        """Whether a delivered clock came due while its turn is pending with a worker that
        died (killed between handing the bot its turn and answering it): that time is the
        platform's, not the bot's. The clock is then set again `TAKEOVER_MS` from now, for
        a live worker of the bot to take the turn over and deliver it again, which starts
        its clock anew (`Deliveries.deliver`); not past the latest deadline a delivery may
        give, nor when no worker is alive to take it. Only the built-in workers read an
        inbox in its group (a gateway reads an outside bot's turns with XREAD), so no
        client can leave a turn pending with a consumer that goes away."""
        gid, seq, _, _ = _clock_member(member, 0)
        g = await self._game(gid)
        seat = g.seats[g.to_move - 1] if g is not None and g.to_move else None
        if g is None or seat is None or seat["kind"] != "bot" or g.seq != seq:
            return False
        again_at = self.clock() + TAKEOVER_MS
        if again_at > g.deadline + MAX_GRACE_MS or not await self._served_bot(gid, served):
            return False
        bot = seat["name"]
        if bot not in lost:
            lost[bot] = await self._turns_of_dead_workers(bot)
        if (gid, seq) not in lost[bot]:
            return False
        log.info(
            "dispatcher: game %s's turn %d is with a worker that died: its clock waits %d ms"
            " for another to take it over",
            gid, seq, TAKEOVER_MS,
        )  # fmt: skip
        await self._accepted(p, Writes().add(member, again_at))
        return True

    async def _turns_of_dead_workers(self, bot: str) -> set[tuple[str, int]]:
        """The turns (game, seq) pending in `bot`'s inbox with workers that died."""
        inbox = self.keys.bot_turns(bot)
        try:
            summary: Any = await self.redis.xpending(inbox, WORKERS_GROUP)
        except ResponseError:
            return set()  # no inbox, or no worker ever read it
        holders = {as_text(c["name"]) for c in summary["consumers"] or ()}
        dead = sorted(await self.reader.dead_consumers(holders))
        if not dead:
            return set()
        rows = await pending_turns(self.redis, self.keys, bot, DEAD_TURNS_READ, dead)
        return {(turn.game_id, turn.seq) for turn, _ in rows}

    async def _served_bot(self, gid: str, served: dict[str, bool]) -> bool:
        """Whether the seat to move in `gid` is a bot with a live worker or stream (asked
        once per bot per sweep)."""
        g = await self._game(gid)
        seat = g.seats[g.to_move - 1] if g is not None and g.to_move else None
        if seat is None or seat["kind"] != "bot":
            return False
        bot = seat["name"]
        if bot not in served:
            served[bot] = (await self.query.bot_health(bot)).workers > 0
        return served[bot]


def _clock_member(member: str, score: int) -> tuple[str, int, str, int]:
    """A clock zset member as (game id, seq, kind, deadline): kind "" for a clock (its score
    is its deadline), "watch" for a watch, `AGAIN` for a re-check."""
    parts = member.split("|")
    kind = parts[2] if len(parts) > 2 else ""
    again = kind in (AGAIN, AGAIN_TOOK)
    return parts[0], int(parts[1]), kind, score - RECHECK_MS if again else score
