"""The event store: a game's log on Redis Streams, appended by one atomic Lua script.

`EventStore.commit` is the only way events enter a log. One script, in the game's
partition (every key carries the same `{p}` hash tag), does all of it atomically for
each command:

1. if the command's memory key (its principal and command id: see
   `services.engine_service.decide`) already has a remembered reply, return it and append
   nothing (the same command twice gives the first reply);
2. if the log's head (its length: logs are never trimmed) is not the head the engine
   validated against, return the actual head -> `SeqConflict`;
3. XADD each event to the log with entry id "<seq>-0" (so ids encode seqs, and Redis
   itself refuses a duplicate seq) and to the partition feed;
4. remember the reply (after the digest of the request it answered) under the memory key,
   and register a new game in `games`. A game's
   reply memory lives as long as the game, and for the idempotency window (default 24 h)
   after the commit that ends it: its TTL is set then, once, not on every commit.

Rejections go through the same script with no events and are never remembered: the head
check makes sure a rejection was decided on the current log, and its memory key still finds
the reply of an accepted command it retries. A refused request is decided afresh when it
comes again, so a refused move can be corrected under the same id, and a command that
failed authentication (no memory key) can neither read nor leave a memory.
`commit_many` serves the engine's batches: one script call per partition carries up
to `COMMITS_PER_CALL` commits (each atomic on its own), all calls in one round trip.
A call's commits travel as one msgpack argument (unpacked by the script with Redis's
built-in `cmsgpack`) rather than ten arguments each: packing the protocol of many small
arguments was the engine's largest single cost.

Reads return raw bytes next to decoded events: the hash chain is over the stored
bytes (`prev_hash` of event n = sha256 of event n-1's bytes); `chain_problems`
checks a log's chain, seqs and game id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from services.bus.connection import Client
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.scripts import Rider, Script
from services.engine_service.decide import DIGEST_BYTES

#: Game ids whose key names `EventStore` keeps; the cache is emptied when it is full.
KEY_CACHE_SIZE = 100_000
#: Commits per script call: large enough to amortise the call, small enough not to
#: stall the server for long.
COMMITS_PER_CALL = 64

# One call commits several commands of one partition, in order, each on its own terms.
# KEYS: feed, games registry, the partition's command stream, the engines' lease of the
#       partition, then per commit: log, replies memory.
# ARGV[1]: msgpack [feed maxlen (0 = unbounded), consumer group, reply memory ttl (ms),
#          touch (1: write a duplicate's reply again, so that a WAIT after this call covers
#          the first commit too), fence (the lease epoch the engine holds; 0: none), commit,
#          commit...]
#          where each commit is [head, memory key ("": none), reply, remember (0: no, 1:
#          yes, 2: and the game ends: start the memory's TTL), time (decimal text), game id,
#          [event bytes...], command entry id to acknowledge or "", request digest].
# Returns per commit two values: 0 + remembered digest and reply (duplicate), 1 + actual
# head (conflict) or 2 + new head (committed); or, for the whole call, -1 + the lease's
# epoch when the engine's fence is not it (another engine owns the partition now).
_COMMIT_LUA = """
local call = cmsgpack.unpack(ARGV[1])
local maxlen, group, ttl, touch = tonumber(call[1]), call[2], tonumber(call[3]), call[4]
local fence = tonumber(call[5])
if fence ~= 0 then
  local epoch = tonumber(redis.call('HGET', KEYS[4], 'epoch') or '0')
  if epoch ~= fence then return {-1, epoch} end
end
local out = {}
for c = 1, (#KEYS - 4) / 2 do
  local log, replies = KEYS[3 + 2 * c], KEYS[4 + 2 * c]
  local commit = call[c + 5]
  local expected, cid, reply = tonumber(commit[1]), commit[2], commit[3]
  local remember, time, gid, events = commit[4], commit[5], commit[6], commit[7]
  local ack, digest = commit[8], commit[9]
  local n = #events
  local seen = false
  if cid ~= '' then seen = redis.call('HGET', replies, cid) end
  if seen then
    out[#out + 1] = 0
    out[#out + 1] = seen
    if touch == 1 then redis.call('HSET', replies, cid, seen) end
    if ack ~= '' then redis.call('XACK', KEYS[3], group, ack) end
  else
    local head = redis.call('XLEN', log)
    if head ~= expected then
      out[#out + 1] = 1
      out[#out + 1] = head
    else
      for i = 1, n do
        local data = events[i]
        redis.call('XADD', log, string.format('%d-0', head + i), 'm', data)
        if maxlen > 0 then
          redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 'm', data)
        else
          redis.call('XADD', KEYS[1], '*', 'm', data)
        end
      end
      if remember > 0 then redis.call('HSET', replies, cid, digest .. reply) end
      if remember == 2 then redis.call('PEXPIRE', replies, ttl) end
      if head == 0 and n > 0 then redis.call('ZADD', KEYS[2], time, gid) end
      if ack ~= '' then redis.call('XACK', KEYS[3], group, ack) end
      out[#out + 1] = 2
      out[#out + 1] = head + n
    end
  end
end
return out
"""
_COMMIT = Script(_COMMIT_LUA)


class SeqConflict(Exception):
    """The log moved on since the engine read it: reload the game and re-validate."""

    def __init__(self, game_id: str, expected: int, actual: int) -> None:
        super().__init__(f"game {game_id}: expected head {expected}, log is at {actual}")
        self.game_id = game_id
        self.expected = expected
        self.actual = actual


class Fenced(Exception):
    """The partition's lease changed hands: another engine owns it, this one must not write
    there (`services.bus.ownership`). Nothing was committed."""

    def __init__(self, game_id: str, partition: int, epoch: int) -> None:
        super().__init__(f"game {game_id}: partition {partition} belongs to another engine")
        self.game_id = game_id
        self.partition = partition
        #: the epoch the refused commit carried
        self.epoch = epoch


class Unconfirmed(Exception):
    """Fewer replicas than asked acknowledged a commit in time (or its call failed): it
    may or may not be in the log, and it must not be reported as done."""

    def __init__(self, game_id: str, cause: object) -> None:
        reason = cause if isinstance(cause, BaseException) else "replicas did not acknowledge"
        super().__init__(f"game {game_id}: commit not confirmed ({reason})")
        self.game_id = game_id


@dataclass(frozen=True, slots=True)
class Commit:
    """One command's effect: its events (encoded, seqs head+1...) and its reply.

    `memory` is the key its reply is remembered and looked up under (its principal and
    command id; "" for none: a command that failed authentication), `digest` what it asked
    for (`decide.request_digest`, kept before the reply). `remember` False is for answers
    that are not kept (every rejection); the head check still applies. `ack` is the id of
    the command's entry on its partition's command stream when nobody waits for a
    reply: the script acknowledges it (for the engine group) in the same atomic step
    that commits or finds the command done, which saves the engine a round trip; a
    conflict leaves it pending. `ends`: the events end the game, so the reply memory's
    idempotency window starts.
    """

    game_id: str
    head: int
    memory: str
    reply: bytes
    events: Sequence[bytes] = ()
    time: int = 0
    remember: bool = True
    ack: bytes = b""
    ends: bool = False
    digest: bytes = bytes(DIGEST_BYTES)


@dataclass(frozen=True, slots=True)
class Committed:
    """The outcome of a commit: `duplicate` means the memory key was seen and `reply` is
    the first reply, to the request `digest`."""

    reply: bytes
    head: int
    duplicate: bool
    digest: bytes = b""


#: What one commit came to.
Outcome = Committed | SeqConflict | Unconfirmed | Fenced


class EventStore:
    """Game logs, feeds and command replies in one Redis deployment (`Keys`)."""

    def __init__(
        self,
        redis: Client,
        keys: Keys | None = None,
        feed_maxlen: int = 0,
        reply_ttl_ms: int = 24 * 3_600_000,
        replicas: int = 0,
        replica_timeout_ms: int = 1000,
        fence: Callable[[int], int] | None = None,
    ) -> None:
        self.redis = redis
        #: the lease epoch its commits carry, per partition (`Fenced`); None: unfenced
        self.fence = fence
        self.keys = keys or Keys()
        self.feed_maxlen = feed_maxlen
        self.reply_ttl_ms = reply_ttl_ms
        self.replicas = replicas
        self.replica_timeout_ms = replica_timeout_ms
        self._key_cache: dict[str, tuple[int, str, str]] = {}

    # -- writing -------------------------------------------------------------------------
    async def load_scripts(self) -> None:
        """Load the commit script (on every primary), so a first commit needs no retry."""
        await _COMMIT.load(self.redis)

    def _game_keys(self, game_id: str) -> tuple[int, str, str]:
        """(partition, log key, replies-memory key) of a game, cached: the hot path asks often."""
        found = self._key_cache.get(game_id)
        if found is None:
            if len(self._key_cache) >= KEY_CACHE_SIZE:
                self._key_cache.clear()
            k = self.keys
            found = (k.partition(game_id), k.log(game_id), k.replies_memory(game_id))
            self._key_cache[game_id] = found
        return found

    def partition(self, game_id: str) -> int:
        return self._game_keys(game_id)[0]

    def _fence(self, p: int) -> int:
        return self.fence(p) if self.fence is not None else 0

    def _call_args(self, p: int, commits: Sequence[Commit], fence: int) -> list[Any]:
        k = self.keys
        keys: list[Any] = [k.feed(p), k.games(p), k.commands(p), k.lease(p, ENGINE_GROUP)]
        touch = 1 if self.replicas else 0
        body: list[Any] = [self.feed_maxlen, ENGINE_GROUP, self.reply_ttl_ms, touch, fence]
        for c in commits:
            _, log, replies = self._game_keys(c.game_id)
            keys += (log, replies)
            body.append(
                (
                    c.head,
                    c.memory,
                    c.reply,
                    (2 if c.ends else 1) if c.remember else 0,
                    str(c.time),
                    c.game_id,
                    c.events if isinstance(c.events, list | tuple) else list(c.events),
                    c.ack,
                    c.digest,
                )
            )
        # Redis's cmsgpack knows no msgpack bin type: bytes travel as raw strings.
        return [len(keys), *keys, msgpack.packb(body, use_bin_type=False)]

    def _script_call(
        self, call: Sequence[int], commits: Sequence[Commit], fence: int
    ) -> tuple[list[Any], list[Any]]:
        p = self._game_keys(commits[call[0]].game_id)[0]
        args = self._call_args(p, [commits[i] for i in call], fence)
        n = args[0]
        return args[1 : n + 1], args[n + 1 :]

    @staticmethod
    def _outcome(c: Commit, status: Any, value: Any) -> Committed | SeqConflict:
        if int(status) == 0:
            digest, reply = _remembered(bytes(value))
            return Committed(reply=reply, head=-1, duplicate=True, digest=digest)
        if int(status) == 1:
            return SeqConflict(c.game_id, c.head, int(value))
        return Committed(reply=c.reply, head=int(value), duplicate=False)

    async def commit(self, c: Commit) -> Committed:
        """Append one command's events atomically; raise `SeqConflict` if the head moved,
        `Unconfirmed` if the replicas asked for did not acknowledge it and `Fenced` if
        another engine owns the partition."""
        (result,) = await self.commit_many([c])
        if isinstance(result, SeqConflict | Unconfirmed | Fenced):
            raise result
        return result

    async def commit_many(
        self, commits: Sequence[Commit], *, rider: Rider | None = None
    ) -> list[Outcome]:
        """Many commits in one round trip, each atomic on its own, in order per partition.

        Conflicts are returned, not raised, so that the caller can retry just those. With
        `replicas`, a commit that fewer replicas acknowledged within `replica_timeout_ms`
        (or whose call failed, as in a failover) is `Unconfirmed`: its sender must not be
        told, and a later attempt with the same command id finds it done or does it again.
        `rider`: one more command in the same round trip (`Script.run_many`).
        """
        if not commits:
            return []
        calls: list[list[int]] = []  # indexes into commits, one list per script call
        by_partition: dict[int, list[int]] = {}
        for i, c in enumerate(commits):
            group = by_partition.setdefault(self._game_keys(c.game_id)[0], [])
            if len(group) == COMMITS_PER_CALL:
                calls.append(group[:])
                group.clear()
            group.append(i)
        calls += by_partition.values()
        # The epoch each call carries: a refused one says which (the lease may be held again,
        # under a newer epoch, by the time the answer comes).
        fences = [self._fence(self._game_keys(commits[call[0]].game_id)[0]) for call in calls]
        script_calls = [
            self._script_call(call, commits, fence)
            for call, fence in zip(calls, fences, strict=True)
        ]
        if self.replicas:
            answers = await _COMMIT.run_replicated(
                self.redis, script_calls, self.replicas, self.replica_timeout_ms, rider=rider
            )
        else:
            raws = await _COMMIT.run_many(
                self.redis, script_calls, raise_on_error=False, rider=rider
            )
            answers = [(raw, True) for raw in raws]
        out: list[Outcome | None] = [None] * len(commits)
        for call, fence, (raw, confirmed) in zip(calls, fences, answers, strict=True):
            if not confirmed:
                for i in call:
                    out[i] = Unconfirmed(commits[i].game_id, raw)
                continue
            if isinstance(raw, Exception):
                raise raw
            if int(raw[0]) == -1:
                p = self._game_keys(commits[call[0]].game_id)[0]
                for i in call:
                    out[i] = Fenced(commits[i].game_id, p, fence)
                continue
            for j, i in enumerate(call):
                out[i] = self._outcome(commits[i], raw[2 * j], raw[2 * j + 1])
        return [r for r in out if r is not None]

    async def remembered_reply(self, game_id: str, memory: str) -> bytes | None:
        """The reply remembered under a memory key (within the idempotency window)."""
        value: Any = await self.redis.hget(self.keys.replies_memory(game_id), memory)
        return None if value is None else _remembered(bytes(value))[1]


def _remembered(value: bytes) -> tuple[bytes, bytes]:
    """A remembered value as (request digest, reply)."""
    return value[:DIGEST_BYTES], value[DIGEST_BYTES:]
