"""Partition ownership: the live members of a service kind divide the partitions by leases.

Every engine reading every partition's command stream put a game's consecutive moves on
engines holding stale copies of it: they lost the append race and decided again (hundreds
of conflicts per thousand moves at four engines). So each partitioned kind (engine,
projector, dispatcher) reads only the partitions it owns, as Kafka's consumers own
their partitions and Redis Cluster's masters their slots:

- **Even, sticky shares.** The partitions are dealt round-robin over the kind's live members
  (their heartbeats, `services.bus.presence`) ranked by a hash of their names (`targets`):
  each holds its count, one apart at most. What changes hands is only what a count asks
  for, as with Kafka's cooperative-sticky assignor: a member over its count gives up the
  partitions it ranks lowest; a member under it reads who holds each lease and takes free
  ones (no live member holds them, or their lease lapsed), dealt among the members short
  of theirs: a lapsed one back to its holder where it has room, the rest by rendezvous
  hash (`plan`). A member that joins takes its count from the others, one that leaves
  hands its partitions to the others, and every other partition stays where it is,
  unpaused. (Rendezvous hashing alone left a member of three with up to nine of sixteen
  partitions, and its host a backlog.)
- **Leases.** A partition's lease (`Keys.lease`, in the partition's hash slot) names its
  owner until `expires`, on Redis's clock; the owner renews it every `RENEW_S`. A member
  gives up what is over its count by releasing it; a lease not renewed for
  `LEASE_MS` frees itself, so a dead member's partitions move within two seconds. A
  round renews only the leases last renewed `RENEW_S` ago or more (every round after
  that until one answers): renewing every lease every round was half of an idle
  member's Redis calls.
- **Fencing.** A lease's `epoch` grows each time it changes hands. A write that must come
  from the owner carries the epoch it holds, and the script refuses another
  (`services.engine_service.store`: `Fenced`; `services.projector.write`: `FENCED`; the
  dispatcher's clock scripts, before it sends a turn): an owner that was paused past its
  lease and resumes cannot write over its successor. On a replicated Redis a member uses
  a partition it took only once `replicas` replicas have the new epoch (WAIT, at most
  `TAKE_WAIT_MS`): a take the failover lost would hand the same epoch to the next taker.
- **Handover.** A member that takes a partition claims the entries still pending there
  (`GroupReader.claim_strays`): those its predecessor read and never acknowledged.
- **Another host's death.** A round waits at most `BEATS_WAIT_S` for the beats and
  `NODE_WAIT_S` for each master's leases, so a master that died holds back none of the
  renewals on the others; a lease it holds stays held (its epoch fences it) until it
  answers again or its replica took over, and no look deals it meanwhile (`UNSEEN`). A
  partition taken or given up drops only its own games from the member's caches.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from services.bus.connection import Client
from services.bus.keys import Keys
from services.bus.presence import Sight, alive, ask_each, beat_keys, beats_of, newest
from services.bus.scripts import UNANSWERED, Call, Script
from services.bus.text import as_text, now_ms

log = logging.getLogger("agon.bus")

#: A round that cannot read the beats within `BEATS_WAIT_S` goes on with the members it
#: knew, and a master that does not answer its leases within `NODE_WAIT_S` holds back none
#: of the others' (a lease must be renewed before it expires, whatever another host does).
BEATS_WAIT_S = 0.4
NODE_WAIT_S = 0.3
#: How long a lease lasts without renewal (ms): a dead member's partitions move this soon.
LEASE_MS = 1000
#: How often a member reads the beats and takes or gives up partitions (s).
ROUND_S = 0.25
#: A lease is renewed at the first round this long after its last renewal (s): with
#: rounds every `ROUND_S`, every 0.5 s, and a renewal that fails is tried again the next
#: round, 0.25 s before the lease lapses. A lapse alone moves nothing: the holder renews it
#: under the same epoch unless a member short of its count took it meanwhile.
RENEW_S = 0.33
#: How long a take waits for the replicas (ms); one not confirmed is tried next round.
TAKE_WAIT_MS = 200
#: A lease another member holds is asked for again this long after it expires (ms).
DUE_MARGIN_MS = 10

# KEYS[1]: the lease. ARGV[1]: the member, ARGV[2]: the lease's length (ms). Renews a
# lease the member holds, takes one that is free or expired (the epoch grows); returns
# the epoch held, or when another member holds it, minus the ms until it expires.
_TAKE = Script(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'expires')
local owner, epoch, expires = lease[1], tonumber(lease[2] or '0'), tonumber(lease[3] or '0')
if owner ~= ARGV[1] then
  if owner and owner ~= '' and expires > now then return now - expires end
  epoch = epoch + 1
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'epoch', epoch, 'expires', now + tonumber(ARGV[2]))
return epoch
"""
)

# KEYS[1]: the lease. ARGV[1]: the member. Frees the lease if the member holds it (the
# epoch stays: the next owner's is higher).
_RELEASE = Script(
    """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'owner', '', 'expires', 0)
  return 1
end
return 0
"""
)


#: Who holds each partition's lease, and who held each lapsed one (`Ownership._look`).
Holders = tuple[dict[int, str], dict[int, str]]

#: Who holds a lease whose master did not answer (`Ownership._look`): not free.
UNSEEN = "?"

# KEYS[1]: the lease. Who holds it, or held it last ('' once released), and 1 while it
# holds it (0 once it lapsed).
_LOOK = Script(
    """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = redis.call('HMGET', KEYS[1], 'owner', 'expires')
return {lease[1] or '', tonumber(lease[2] or '0') > now and 1 or 0}
"""
)


def _score(member: str, item: int | str) -> tuple[int, str]:
    """How highly `member` ranks `item` (rendezvous hashing)."""
    return zlib.crc32(f"{member}|{item}".encode()), member


def share(items: Iterable[str], members: Sequence[str], me: str) -> list[str]:
    """The items `me` owns among `members`: those whose highest (member, item) hash is its.

    Rendezvous hashing: when a member comes or goes, only its own share moves.
    """
    mine = []
    for item in items:
        owner = max(members, key=lambda m: _score(m, item))
        if owner == me:
            mine.append(item)
    return mine


def targets(members: Sequence[str], partitions: int) -> dict[str, int]:
    """How many partitions each member holds: dealt round-robin over the members ranked by
    a hash of their names. A member's rank only rises when another leaves and falls when
    one joins, so a join only lowers the others' counts and a leave only raises them."""
    ranked = sorted(members, key=lambda m: (zlib.crc32(m.encode()), m))
    return {m: (partitions - i + len(ranked) - 1) // len(ranked) for i, m in enumerate(ranked)}


def plan(
    partitions: Sequence[int],
    members: Sequence[str],
    held: Mapping[int, str],
    me: str,
    lapsed: Mapping[int, str] | None = None,
) -> set[int]:
    """The partitions `me` holds, given who holds which (`held`; a partition not there, or
    held by one neither among `members` nor `UNSEEN`, is free): over its count, its own it
    ranks highest; under it, its own and the free ones dealt to it. Free partitions go to the
    members short of their count: first a lease that lapsed (`lapsed`, by whom) to the
    member that held it, which could not renew it (its master failing over) or gave it up
    and its release did not land; then each to the member ranking it highest among those
    with room. Every member that reads the same leases deals them the same way."""
    count = targets(members, len(partitions))
    mine = [p for p in partitions if held.get(p) == me]
    if len(mine) >= count[me]:
        return set(sorted(mine, key=lambda p: _score(me, p), reverse=True)[: count[me]])
    holding = Counter(held[p] for p in partitions if held.get(p) in count)
    room = {m: count[m] - holding[m] for m in members if count[m] > holding[m]}
    free = [p for p in partitions if held.get(p) not in count and held.get(p) != UNSEEN]
    back = [(p, m) for p in free if (m := (lapsed or {}).get(p)) in room]
    ranked = sorted(((_score(m, p), m, p) for m in room for p in free), reverse=True)
    dealt: set[int] = set()
    for p, m in [*back, *((p, m) for _, m, p in ranked)]:
        if room[m] > 0 and p not in dealt:
            room[m] -= 1
            dealt.add(p)
            if m == me:
                mine.append(p)
    return set(mine)


@dataclass(slots=True)
class Change:
    """What a round changed: the partitions taken (with their new epochs) and given up."""

    taken: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)


class Ownership:
    """`member`'s share of `kind`'s partitions, held by leases with fencing epochs."""

    def __init__(
        self,
        redis: Client,
        keys: Keys,
        kind: str,
        member: str,
        lease_ms: int = LEASE_MS,
        replicas: int = 0,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.kind = kind
        self.member = member
        self.lease_ms = lease_ms
        #: how many replicas must hold a new epoch before the partition is used
        self.replicas = replicas
        #: the partitions held, with the epoch each was taken under
        self.owned: dict[int, int] = {}
        #: partitions this member took over and gave up, since it started
        self.moves = 0
        #: when the soonest lease this member wants and another holds expires, or another
        #: member stops counting (s from the last round; None: neither): the next round
        #: comes no later (a dead member's share moves as soon as it stops counting and
        #: its leases lapse, not up to a round after)
        self.due_s: float | None = None
        #: when the soonest other member stops counting by its beat (ms; None: none, or
        #: the beats may not say): the round comes then, this member's count rises
        self._member_ends_ms: int | None = None
        self.sight = Sight()
        self._members: list[str] | None = None
        #: what `_tell_waiting` last said
        self._waiting: list[tuple[str, tuple[int, ...]]] = []
        #: when each lease held was last renewed (or taken), on the event loop's clock
        self._renewed: dict[int, float] = {}
        #: how many partitions the last round found this member's, and which it wanted
        self.count = 0
        self.wanted: set[int] = set()

    def epoch(self, p: int) -> int:
        """The epoch `p` is held under; -1 when it is not held (a write under it is refused)."""
        return self.owned.get(p, -1)

    async def members(self) -> list[str]:
        """The kind's live members, this one among them. While the beats cannot be read,
        or only by copies that have not answered for long (`Sight`), and for a moment
        after, no member it knew is dropped. A member counts while its last beat is
        younger than a lease: one whose beats a starved host held back for over
        `ALIVE_MS` still renews its leases, and taking its partitions from it then only to
        hand them back costs both a handover; a dead one's leases lapse no sooner anyway.
        Of every process's beat, only the kind's own are parsed."""
        began, copies = now_ms(), beat_keys(self.redis, self.keys)
        try:
            settled = self.sight.settled(began)
            answers = await ask_each(
                self.redis, copies, "HGETALL", prefer=settled, wait_s=BEATS_WAIT_S
            )
        except UNANSWERED:
            # The round goes on with the members it knew: its leases must be renewed.
            self.sight.failed()
            self._member_ends_ms = None
            if self._members is None:
                raise
            return self._members
        now, beats = now_ms(), beats_of(newest(answers.answers, self.kind))
        live = {self.member}
        others = {
            n: b.time
            for n, b in beats.items()
            if n != self.member and b.role == self.kind and alive(b, now, self.lease_ms)
        }
        live.update(others)
        fresh = answers.fresh((b.time for b in beats.values()), now, self.lease_ms)
        judged = self.sight.read(now, now - began, fresh, answers)
        ends = min(others.values(), default=None) if judged else None
        self._member_ends_ms = None if ends is None else ends + self.lease_ms + 1
        if not judged and self._members is not None:
            live.update(self._members)
        self._members = sorted(live)
        return self._members

    def desired(
        self,
        members: Sequence[str],
        held: Mapping[int, str] | None = None,
        lapsed: Mapping[int, str] | None = None,
    ) -> set[int]:
        """The partitions this member holds among `members`, given who holds the others
        (`plan`)."""
        mine = {p: self.member for p in self.owned}
        partitions = self.keys.all_partitions()
        return plan(partitions, members, {**(held or {}), **mine}, self.member, lapsed)

    async def round(self) -> Change:
        """Renew what is held and still this member's, give up what its count does not ask
        for, take free partitions where it is short; what changed."""
        self.due_s = None  # a round that fails waits a whole period, never spins
        began = asyncio.get_running_loop().time()
        due = [p for p in sorted(self.owned) if began - self._renewed.get(p, 0) >= RENEW_S]
        early: list[Any] | None = None
        looked: Holders | None = None
        if self._short_soon():
            # Likely short this round: the look and the renewals go beside the beats' read,
            # not after it (on a starved host each round trip costs 0.1-0.3 s of a handover).
            members, looked, early = await asyncio.gather(
                self.members(), self._look(), self._renew(due)
            )
        else:
            members = await self.members()
        count = self.count = targets(members, len(self.keys.all_partitions()))[self.member]
        if len(self.owned) < count:  # short: it keeps all it holds, renewed beside the look
            if looked is None:
                looked, early = await asyncio.gather(self._look(), self._renew(due))
            want = self.wanted = self.desired(members, *looked)
        else:
            want = self.wanted = self.desired(members)
        change = Change()
        giving = sorted(set(self.owned) - want)
        for p in giving:
            self.owned.pop(p)
        change.lost += giving
        if giving:
            calls = [self._lease(p, self.member) for p in giving]
            await _RELEASE.run_per_node(self.redis, calls, NODE_WAIT_S)
        renewing = [p for p in due if p in want]
        taking = sorted(want - set(self.owned))
        if early is None:
            renewed, took = await asyncio.gather(self._renew(renewing), self._take(taking))
        else:  # (a look that found more leases naming it than it counted may drop some)
            renewed_early = dict(zip(due, early, strict=True))
            renewed, took = [renewed_early[p] for p in renewing], await self._take(taking)
        due_ms: int | None = None
        waiting: dict[str, list[int]] = {}  # why, and the partitions wanted and not taken
        for p, answer in zip([*renewing, *taking], [*renewed, *took], strict=True):
            if isinstance(answer, UNANSWERED):
                if p not in self.owned:
                    waiting.setdefault(str(answer) or type(answer).__name__, []).append(p)
                continue  # its master is away: what is held stays held (its epoch fences it)
            if isinstance(answer, Exception):
                raise answer
            epoch, held = max(0, int(answer)), self.owned.get(p)
            if int(answer) < 0:  # another member holds it, this long yet
                due_ms = min(-int(answer), due_ms if due_ms is not None else -int(answer))
                waiting.setdefault("another member's lease has not lapsed", []).append(p)
            if epoch and held is None:
                change.taken.append(p)
            elif held is not None and epoch != held:
                change.lost.append(p)  # it expired and changed hands meanwhile
                epoch = 0
            if epoch:
                self.owned[p] = epoch
                self._renewed[p] = began
            else:
                self.owned.pop(p, None)
        self.moves += len(change.taken) + len(change.lost)
        if self._member_ends_ms is not None:  # (a dead member's share moves as it stops counting)
            ends_ms = max(0, self._member_ends_ms - now_ms())
            due_ms = ends_ms if due_ms is None else min(due_ms, ends_ms)
        self.due_s = None if due_ms is None else (due_ms + DUE_MARGIN_MS) / 1000
        self._tell_waiting(waiting, count - len(want))
        return change

    def _short_soon(self) -> bool:
        """Whether this round will likely find this member short of its count: it was
        short at the last round, or another member stops counting by now."""
        if len(self.owned) < self.count:
            return True
        return self._member_ends_ms is not None and now_ms() >= self._member_ends_ms

    async def _look(self) -> Holders:
        """Who holds each partition this member does not, and who held those whose lease
        lapsed; `UNSEEN` holds those whose master did not answer in time. Such a master is
        failing over: its holder cannot renew meanwhile, and whoever dealt it as free would
        take it from its holder when it answers."""
        others = [p for p in self.keys.all_partitions() if p not in self.owned]
        calls = [self._lease(p) for p in others]
        answers = await _LOOK.run_per_node(self.redis, calls, NODE_WAIT_S)
        held: dict[int, str] = {}
        lapsed: dict[int, str] = {}
        for p, answer in zip(others, answers, strict=True):
            if isinstance(answer, Exception):
                held[p] = UNSEEN
            elif owner := as_text(answer[0]):
                (held if int(answer[1]) else lapsed)[p] = owner
        return held, lapsed

    def _tell_waiting(self, waiting: dict[str, list[int]], short: int) -> None:
        """Say which partitions this member wants and could not take, and why, and how many
        its count asks for that others still hold, when that changed since it last said
        so (a handover or a failover; a line per change)."""
        told = sorted((why, tuple(ps)) for why, ps in waiting.items())
        if short > 0:
            told.append((f"{short} more held by members over their count, or unseen", ()))
        if told != self._waiting and told:
            reasons = "; ".join(f"{list(ps)}: {why[:100]}" if ps else why for why, ps in told)
            log.info("%s: partitions not taken yet: %s", self.member, reasons)
        self._waiting = told

    def lose(self, p: int, epoch: int) -> bool:
        """Forget `p`: a write under `epoch` was refused, another member holds it now. A
        lease held again since, under a newer epoch, stays held. Whether `p` was given up."""
        if epoch <= 0 or self.owned.get(p) != epoch:
            return False
        del self.owned[p]
        self.moves += 1
        return True

    async def release_all(self) -> None:
        """Give every lease back (a member that stops), so that the others take over at once."""
        held, self.owned = sorted(self.owned), {}
        if held:
            await _RELEASE.run_many(self.redis, [self._lease(p, self.member) for p in held])

    def _lease(self, p: int, *args: str | int) -> Call:
        return [self.keys.lease(p, self.kind)], args

    def _leases(self, partitions: Sequence[int]) -> list[Call]:
        return [self._lease(p, self.member, self.lease_ms) for p in partitions]

    async def _renew(self, partitions: Sequence[int]) -> list[Any]:
        return await _TAKE.run_per_node(self.redis, self._leases(partitions), NODE_WAIT_S)

    async def _take(self, partitions: Sequence[int]) -> list[Any]:
        """TAKE each of `partitions`; on a replicated Redis an epoch the replicas did not
        confirm counts as unanswered (the next round asks again: the lease is this
        member's by then, the same epoch comes back)."""
        calls = self._leases(partitions)
        if not calls or not self.replicas:
            return await self._renew(partitions)
        # Each master on its own: one that died holds back no take on the others.
        try:
            answers = await _TAKE.run_replicated(
                self.redis, calls, self.replicas, TAKE_WAIT_MS, NODE_WAIT_S + TAKE_WAIT_MS / 1000
            )
        except UNANSWERED as exc:
            return [exc] * len(calls)
        unconfirmed = TimeoutError(f"a take not confirmed by {self.replicas} replica(s)")
        return [
            answer if confirmed or isinstance(answer, Exception) or answer <= 0 else unconfirmed
            for answer, confirmed in answers
        ]
