"""Partition ownership against a real redis-server: shares, leases, handover and fencing.

Members of a kind divide the partitions (`services.bus.ownership`): disjoint shares that
cover every partition, a joining member takes only its share, a dead member's partitions
move within two seconds, a take counts once the replicas have it, and an owner that lost
its lease cannot write (the attack: an engine paused past its lease resumes and commits).
End to end, two engines serve the games with no append conflict, and one of them stopping
moves its share to the other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections import Counter

import pytest
import redis.asyncio as aioredis

from schemas.codec import encode
from schemas.events import GameCreated
from services.bus import outages
from services.bus.consumer import STRAYS_EVERY_S
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.ownership import LEASE_MS, RENEW_S, ROUND_S, UNSEEN, Ownership, plan, share
from services.bus.presence import ALIVE_MS, beat
from services.bus.text import now_ms
from services.cli.pipeline import ServiceSet, create_games, wait_until_ended
from services.engine_service import EngineService, EventStore
from services.engine_service.store import Commit, Fenced
from services.projector import Projector
from tests.conftest import PrimaryAndReplica
from tests.support.gate import Gate


async def members(redis: aioredis.Redis, keys: Keys, *names: str) -> list[Ownership]:
    """Live members of the engine kind (each beats once), with their ownership."""
    for name in names:
        await beat(redis, keys, name, ENGINE_GROUP, ENGINE_GROUP)
    return [Ownership(redis, keys, ENGINE_GROUP, name) for name in names]


async def settled(owners: list[Ownership], rounds: int = 3) -> None:
    for _ in range(rounds):
        for o in owners:
            await o.round()


def test_shares_are_disjoint_cover_everything_and_move_only_with_their_member() -> None:
    items = [str(p) for p in range(64)]
    three = ["a", "b", "c"]
    shares = {m: set(share(items, three, m)) for m in three}
    assert set.union(*shares.values()) == set(items)
    assert sum(len(s) for s in shares.values()) == len(items)
    assert all(len(s) > 8 for s in shares.values()), "a member got almost nothing"
    four = {m: set(share(items, [*three, "d"], m)) for m in [*three, "d"]}
    for m in three:  # a joining member takes only from the others, never reshuffles
        assert four[m] <= shares[m]
    assert set(share(items, three, "zz")) == set()  # not a member: nothing


def deal(members: list[str], held: dict[int, str]) -> dict[int, str]:
    """Who holds which partition once every member took its rounds (`plan` on the same
    leases), checking that no two members want one partition at once."""
    held = {p: m for p, m in held.items() if m in members}  # the others' leases lapsed
    for _ in range(3):
        wants = {m: plan(range(16), members, held, m) for m in members}
        for m, want in wants.items():
            assert not any(want & wants[o] for o in members if o != m), "two want one"
            held = {p: o for p, o in held.items() if o != m or p in want}
            held.update({p: m for p in want if held.get(p) in (None, m)})
    return held


def test_counts_are_even_and_only_a_joining_or_leaving_members_partitions_move() -> None:
    """Rendezvous hashing alone left one of three members nine of sixteen partitions, and a
    kill-host run's games waited 15 s on its host. Counts differ by one at most; a member
    that leaves hands only its partitions on, one that joins takes only the others'."""
    rng = random.Random(7)
    for _ in range(100):
        names = [f"engine-{rng.randrange(10**6)}" for _ in range(5)]
        held = deal(names[:4], {})
        assert sorted(Counter(held.values()).values()) == [4, 4, 4, 4]
        before = held
        held = deal(names[:3], held)  # names[3] dies
        assert sorted(Counter(held.values()).values()) == [5, 5, 6]
        assert all(held[p] == m for p, m in before.items() if m != names[3])
        before = held
        held = deal([*names[:3], names[4]], held)  # names[4] joins
        assert sorted(Counter(held.values()).values()) == [4, 4, 4, 4]
        assert all(before[p] == m for p, m in held.items() if m != names[4])


def test_a_lease_whose_master_did_not_answer_is_not_dealt_as_free() -> None:
    """The attack on a live member, seen in a kill-host run: B's look cannot read p's lease
    (p's master is failing over), so nobody seems to hold p; B deals p to itself and, the
    moment the replica answers with A's lease lapsed (A could not renew during the outage),
    takes p from A, which then loses it (a handover for nothing)."""
    a, b = "engine-a", "engine-b"
    held = {p: a for p in [*range(7), 15]} | {p: b for p in range(8, 15)}  # b is one short
    assert plan(range(16), [a, b], {**held, 7: UNSEEN}, b) == set(range(8, 15))
    assert 7 in plan(range(16), [a, b], held, b), "a free partition was not dealt"


def test_a_lapsed_lease_goes_back_to_its_holder_where_it_has_room() -> None:
    """After a failover a live member's lease has lapsed (it could not renew while the
    master was away): a member short of its count must not take it before its holder
    renews it. A lapsed lease of a member at its count (it gave the partition up, and the
    release did not land) goes to a member short of theirs."""
    a, b = "engine-a0", "engine-b"  # b ranks partition 7 above a
    held = {p: a for p in range(7)} | {p: b for p in range(8, 15)}
    assert plan(range(16), [a, b], held, b) == set(range(8, 15)) | {7}
    assert plan(range(16), [a, b], held, b, lapsed={7: a}) == set(range(8, 16))
    held = {p: a for p in range(8)} | {p: b for p in range(8, 15)}
    assert plan(range(16), [a, b], held, b, lapsed={15: a}) == set(range(8, 16))


async def test_a_partition_whose_release_did_not_land_goes_to_a_member_short_of_its_count(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A member over its count gives a partition up and the release does not land (its
    master too slow, or a failover lost it): the lease still names it, lapsed, while it
    no longer counts it. Read as its, the partition stayed unowned for good, and the
    member short of it read every lease every round."""
    keys = Keys(prefix=namespace)
    (a,) = await members(redis, keys, "engine-a")
    await a.round()  # alone, a holds every partition
    (b,) = await members(redis, keys, "engine-b")
    await a.round()  # a gives half up
    p = min(set(keys.all_partitions()) - set(a.owned))
    await redis.hset(keys.lease(p, ENGINE_GROUP), mapping={"owner": "engine-a", "expires": 0})
    await settled([a, b])
    assert p in b.owned and len(b.owned) == len(a.owned) == 8


async def test_a_short_member_whose_look_finds_more_leases_naming_it_keeps_its_count(
    redis: aioredis.Redis, namespace: str
) -> None:
    """Takes whose answers were lost leave leases naming a member that does not count them.
    Short of its count, it renews what it holds beside its look, and the look finds those
    leases too, more than its count: it keeps those it ranks highest and gives up the rest
    (a renewal answered for a partition it then gave up once failed the round)."""
    keys = Keys(prefix=namespace)
    (a,) = await members(redis, keys, "engine-a")
    await a.round()  # alone, a holds every partition
    for p in sorted(a.owned)[6:]:
        del a.owned[p]  # its take's answer lost: the lease names a, a does not count it
    await members(redis, keys, "engine-b")  # a's count is 8 now
    await asyncio.sleep(RENEW_S)  # what a holds is due for renewal
    await a.round()
    assert len(a.owned) == a.count == 8


async def test_two_members_split_the_partitions_and_a_third_takes_only_its_share(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    assert set(a.owned) | set(b.owned) == set(keys.all_partitions())
    assert not set(a.owned) & set(b.owned)
    before = {**a.owned, **b.owned}
    (c,) = await members(redis, keys, "engine-c")
    await settled([a, b, c])
    assert sorted(len(o.owned) for o in (a, b, c)) == [5, 5, 6], "uneven counts"
    assert not (set(a.owned) | set(b.owned)) & set(c.owned)
    assert set(a.owned) | set(b.owned) | set(c.owned) == set(keys.all_partitions())
    for p, epoch in {**a.owned, **b.owned}.items():
        assert before[p] == epoch, f"partition {p} changed hands without a reason"
    assert all(epoch == before[p] + 1 for p, epoch in c.owned.items())


async def test_a_member_says_once_which_partitions_of_its_share_it_could_not_take_and_why(
    redis: aioredis.Redis, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """What a handover or a failover waits on shows in the log (`-v`): a line when the
    partitions a member wants and could not take, or the reason, change; none while they
    stay the same, whatever the rounds."""
    keys = Keys(prefix=namespace)
    (a,) = await members(redis, keys, "engine-a")
    await a.round()  # alone, a holds every partition
    (b,) = await members(redis, keys, "engine-b")
    caplog.set_level(logging.INFO, logger="agon.bus")
    await b.round()
    await b.round()
    told = [r.getMessage() for r in caplog.records if "not taken yet" in r.getMessage()]
    assert told == [
        "engine-b: partitions not taken yet: 8 more held by members over their count, or unseen"
    ]
    caplog.clear()
    await a.round()  # a gives up half
    await b.round()
    assert len(b.owned) == len(a.owned) == 8 and b.wanted == set(b.owned)
    assert not [r for r in caplog.records if "not taken yet" in r.getMessage()]


async def test_a_dead_members_partitions_move_within_two_seconds(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    lost = dict(b.owned)
    await redis.hdel(keys.processes(), "engine-b")  # b dies: no beat, no renewal
    started = time.monotonic()
    while set(a.owned) != set(keys.all_partitions()):
        assert time.monotonic() - started < 2.0, f"still not taken: {set(lost) - set(a.owned)}"
        await a.round()
        await asyncio.sleep(0.1)
    assert all(a.owned[p] == epoch + 1 for p, epoch in lost.items())


async def test_a_round_renews_a_lease_only_once_renew_s_has_passed_and_retries_after(
    redis: aioredis.Redis, namespace: str
) -> None:
    """Renewing every lease every round was half of an idle member's Redis calls: a round
    renews a lease only `RENEW_S` after its last renewal, and one whose renewal did not
    land (its master away) is tried again in the next round, long before it runs out."""
    keys = Keys(prefix=namespace)
    (a,) = await members(redis, keys, "engine-a")
    await a.round()
    p = min(a.owned)

    async def expires() -> int:
        return int(await redis.hget(keys.lease(p, ENGINE_GROUP), "expires"))

    taken = await expires()
    await asyncio.sleep(0.05)
    await a.round()
    assert await expires() == taken, "a lease renewed a moment after it was taken"
    await asyncio.sleep(RENEW_S)
    await a.round()
    renewed = await expires()
    assert renewed > taken, "a lease not renewed RENEW_S after it was taken"
    first = math.ceil(RENEW_S / ROUND_S) * ROUND_S  # the round that renews
    assert first + ROUND_S < LEASE_MS / 1000, "fewer than two tries before a lease lapses"


async def test_a_member_whose_beats_are_late_but_younger_than_a_lease_keeps_its_share(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A starved host holds a member's beats back past `ALIVE_MS` while it still renews its
    leases: the others leave its share alone (taking it, then handing it back, cost both a
    handover), and take it once its beat is older than a lease."""
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    late = json.loads(await redis.hget(keys.processes(), "engine-a"))
    late["time"] = int(time.time() * 1000) - ALIVE_MS - 200
    await redis.hset(keys.processes(), "engine-a", json.dumps(late))
    assert "engine-a" in await b.members()
    late["time"] = int(time.time() * 1000) - LEASE_MS - 200
    await redis.hset(keys.processes(), "engine-a", json.dumps(late))
    assert "engine-a" not in await b.members()


async def test_a_dead_members_partitions_are_asked_for_as_its_leases_lapse(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A member that wants a partition another holds learns when that lease lapses
    (`due_s`), so a dead member's share moves then, not up to a round later."""
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    await redis.hdel(keys.processes(), "engine-a")  # a dies: no beat, no renewal
    await b.round()
    assert b.due_s is not None and 0 < b.due_s <= LEASE_MS / 1000 + 0.05
    await asyncio.sleep(b.due_s)
    await b.round()
    assert set(b.owned) == set(keys.all_partitions()), "the lapsed leases were not taken"
    assert b.due_s is None


async def test_the_next_round_comes_as_a_member_that_stopped_beating_stops_counting(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A member counts until its beat is a lease old; the others' next round comes then
    (`due_s`), when their counts rise and its share is theirs to take, not up to a round
    later (a kill-host run's engines took a dead one's partitions 0.1-0.2 s late)."""
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    last = json.loads(await redis.hget(keys.processes(), "engine-a"))["time"]  # a is dead
    await b.round()
    ends = (last + LEASE_MS - now_ms()) / 1000
    assert b.due_s is not None and ends - 0.05 <= b.due_s <= ends + 0.05, (b.due_s, ends)
    await asyncio.sleep(b.due_s)
    assert await b.members() == ["engine-b"]


async def test_a_round_as_a_member_stops_counting_asks_for_the_leases_beside_the_beats(
    redis: aioredis.Redis, redis_server: EmbeddedRedis, redis_db: int, namespace: str
) -> None:
    """The round that comes as a member stops counting will find its survivor short: it
    reads who holds the leases beside the beats, not after them, and takes the dead one's
    share in two round trips (beats and leases, then the take), not three. On a starved
    host each round trip cost 0.1-0.3 s of a kill-host run's handover."""
    keys = Keys(prefix=namespace)
    a, b = await members(redis, keys, "engine-a", "engine-b")
    await settled([a, b])
    await b.round()  # a stopped beating: b learns when it stops counting
    assert b.due_s is not None
    await asyncio.sleep(b.due_s)
    async with Gate(redis_server.port) as gate:
        b.redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{gate.port}/{redis_db}")
        try:
            await gate.waves(asyncio.gather(*(b.redis.ping() for _ in range(4))))  # connect
            change, waves = await gate.waves(b.round())
        finally:
            await b.redis.aclose()
    assert sorted(change.taken) == sorted(a.owned) and set(b.owned) == set(keys.all_partitions())
    assert waves == 2, f"the dead member's share took {waves} round trips"


async def test_a_master_that_answers_again_starts_the_next_round_at_once(
    redis: aioredis.Redis, namespace: str
) -> None:
    """The leases on a master that failed over can be renewed and taken once its replica
    took over (`master_away`): the next round starts then, not up to a period later."""
    keys = Keys(prefix=namespace)
    projector = Projector(redis, keys)
    rounds: list[float] = []

    async def work() -> None:
        rounds.append(time.monotonic())

    done = asyncio.Event()
    loop = asyncio.ensure_future(projector._every(60.0, work, done, rate=True))
    while not rounds:
        await asyncio.sleep(0.01)
    projector.master_away((0, 1), frozenset({keys.slot(0)}))
    async with asyncio.timeout(5):
        while len(rounds) < 2:
            await asyncio.sleep(0.01)
    done.set()
    async with asyncio.timeout(1):
        await loop  # and `done` ends it at once
    assert len(rounds) == 2


async def test_spells_written_by_two_callers_at_once_are_each_written_and_kept_once(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A bot worker's batch and its heartbeat both write the spells a failover left: the
    one must not drop a spell the other is still writing (seen in a kill-host run as
    "pop from empty list", a failed batch)."""
    keys = Keys(prefix=namespace)
    projector = Projector(redis, keys)
    projector.master_away((0, 1), frozenset({keys.slot(0)}))
    projector.master_away((2, 3), frozenset({keys.slot(1)}))
    await asyncio.gather(projector.write_spells(), projector.write_spells())
    assert projector.spells_unwritten == []
    read = await outages.partition_spells(redis, keys, [0, 1])
    assert (read[0], read[1]) == ([(0, 1)], [(2, 3)])


async def test_an_owner_paused_past_its_lease_cannot_write_after_it_resumes(
    redis: aioredis.Redis, namespace: str
) -> None:
    """The attack fencing stops: engine A holds partition p, stalls (a GC pause, SIGSTOP)
    past its lease; B takes p; A wakes up and commits with what it still believes."""
    keys = Keys(prefix=namespace)
    gid = "fenced-1"
    p = keys.partition(gid)
    a = Ownership(redis, keys, ENGINE_GROUP, "engine-a", lease_ms=200)
    await beat(redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    await a.round()
    assert p in a.owned
    stale = dict(a.owned)  # what A believes while it sleeps
    await redis.hdel(keys.processes(), "engine-a")
    await asyncio.sleep(0.3)
    (b,) = await members(redis, keys, "engine-b")
    await b.round()
    assert b.owned[p] == stale[p] + 1
    created = GameCreated(
        game_id=gid, command_id="c1", seq=1, time=1, prev_hash="", game="teeko",
        options={}, seats=[], move_time_ms=0, seed=0, engine_version="1",
    )  # fmt: skip
    commit = Commit(gid, 0, "m:c1", b"ok", [encode(created)], 1)
    old = EventStore(redis, keys, fence=lambda q: stale.get(q, -1))
    (result,) = await old.commit_many([commit])
    assert isinstance(result, Fenced) and (result.partition, result.epoch) == (p, stale[p])
    assert await redis.xlen(keys.log(gid)) == 0, "a fenced engine wrote"
    new = EventStore(redis, keys, fence=b.epoch)
    (result,) = await new.commit_many([commit])
    assert not isinstance(result, Exception) and result.head == 1


async def test_a_refusal_under_an_old_epoch_keeps_the_lease_taken_again_since(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A write under epoch e is refused after the member lost p and took it again (epoch
    e + 2): giving p up for it would drop a lease the member holds, and its successor's
    round would have to take it back (a handover for nothing)."""
    keys = Keys(prefix=namespace)
    (a,) = await members(redis, keys, "engine-a")
    await a.round()
    p, old = 0, a.owned[0]
    (b,) = await members(redis, keys, "engine-b")
    await redis.hset(keys.lease(p, ENGINE_GROUP), mapping={"owner": "", "expires": 0})
    await redis.hdel(keys.processes(), "engine-a")
    await b.round()
    assert b.owned[p] == old + 1
    await redis.hdel(keys.processes(), "engine-b")
    await redis.hset(keys.lease(p, ENGINE_GROUP), mapping={"owner": "", "expires": 0})
    await beat(redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    await asyncio.sleep(RENEW_S)  # A's next renewal ...
    assert p in (await a.round()).lost  # ... sees p changed hands while A held it ...
    assert p in (await a.round()).taken  # ... and A takes it again
    assert a.owned[p] == old + 2
    assert not a.lose(p, old) and a.owned[p] == old + 2, "a stale refusal gave p up"
    assert a.lose(p, old + 2) and p not in a.owned


async def test_a_partition_taken_again_reads_what_its_member_left_pending_there(
    redis: aioredis.Redis, namespace: str
) -> None:
    """An engine read commands of p, then lost p (a refused commit) and took it again:
    those commands are pending with it, and `claim_strays` takes only the others'. It
    reads them again at once, not after the idle sweep's minutes."""
    keys = Keys(prefix=namespace)
    engine = EngineService(redis, keys, consumer="engine-a")
    await beat(redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    engine.ownership = Ownership(redis, keys, ENGINE_GROUP, "engine-a")
    await engine.setup()
    await engine.rebalance()
    p = 3
    sent = await redis.xadd(keys.commands(p), {"m": b"not read yet"})
    (first,) = await engine.reader.read(None)
    assert first.entry_id.decode() == sent.decode()
    engine.lose(p, engine.fence(p))
    assert engine.fence(p) == -1
    await engine.rebalance()
    assert engine.fence(p) > 0, "p was not taken again"
    again = await engine.reader.read(None)
    assert [e.entry_id for e in again] == [first.entry_id], "its own pending entry waits"


async def test_what_a_stale_owner_read_after_the_take_is_claimed_within_strays_every_s(
    redis: aioredis.Redis, namespace: str
) -> None:
    """An owner paused past its lease reads a command after its successor took the
    partition (and claimed what was pending then): not every round, but within
    `STRAYS_EVERY_S`, the owner's rounds claim it, and at once after a take."""
    keys = Keys(prefix=namespace)
    engine = EngineService(redis, keys, consumer="engine-a")
    await beat(redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    engine.ownership = Ownership(redis, keys, ENGINE_GROUP, "engine-a")
    await engine.setup()
    await engine.rebalance()  # takes every partition: looks for strays at once
    assert engine._claiming is not None
    await engine._claiming
    p = 5
    sent = await redis.xadd(keys.commands(p), {"m": b"read by the stale owner"})
    await redis.xreadgroup(ENGINE_GROUP, "engine-zombie", {keys.commands(p): ">"})
    began = time.monotonic()
    await engine.rebalance()
    await engine._claiming
    assert not await engine.reader.read(None), "looked for strays every round"
    while not (got := await engine.reader.read(None)):
        assert time.monotonic() - began < STRAYS_EVERY_S + 1, "the stray was never claimed"
        await asyncio.sleep(ROUND_S)
        await engine.rebalance()
        await engine._claiming
    assert [e.entry_id for e in got] == [sent]


async def test_a_partition_taken_is_looked_at_at_once_beside_a_look_under_way(
    redis: aioredis.Redis, namespace: str
) -> None:
    """A look for strays held up (by a master failing over, say) must not hold back those
    of a partition just taken: in a kill-host run a dead engine's last batch, a move of
    the slowest game among it, waited 0.8 s after the take for the look before it."""
    keys = Keys(prefix=namespace)
    engine = EngineService(redis, keys, consumer="engine-a")
    await beat(redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    engine.ownership = Ownership(redis, keys, ENGINE_GROUP, "engine-a")
    await engine.setup()
    held: asyncio.Future[int] = asyncio.get_running_loop().create_future()  # never ends
    engine._claiming, engine._next_strays = held, 0.0
    p = 5
    sent = await redis.xadd(keys.commands(p), {"m": b"read by the member that died"})
    await redis.xreadgroup(ENGINE_GROUP, "engine-dead", {keys.commands(p): ">"})
    try:
        await engine.rebalance()  # takes every partition
        assert engine._taking, "no look at the partitions taken"
        await asyncio.wait(engine._taking, timeout=5)
        assert [e.entry_id for e in await engine.reader.read(None)] == [sent]
    finally:
        held.cancel()


async def test_a_take_the_replicas_have_not_confirmed_is_not_used(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    """The attack on fencing across a failover: a member takes a partition on the primary,
    the primary dies before its replica has the new epoch, and the next taker is handed
    the same epoch: two owners the fence cannot tell apart. A take counts only once the
    replicas have it."""
    pair = primary_and_replica
    keys = Keys(prefix="lease")
    await beat(pair.redis, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    a = Ownership(pair.redis, keys, ENGINE_GROUP, "engine-a", replicas=1)
    change = await a.round()  # no replica follows the primary yet
    assert a.owned == {} and change.taken == [], "used an epoch only the primary holds"
    await pair.follow()
    change = await a.round()
    assert set(a.owned) == set(change.taken) == set(keys.all_partitions())
    for p, epoch in a.owned.items():
        assert int(await pair.replica.hget(keys.lease(p, ENGINE_GROUP), "epoch")) == epoch


async def test_two_engines_serve_every_game_without_a_conflict_and_one_leaving_hands_over(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    services = ServiceSet(redis, keys, ["random"], block_ms=50, director=False)
    await services.start()
    second = EngineService(redis, keys, block_ms=50)
    stop = asyncio.Event()
    running = asyncio.create_task(second.run(stop))
    try:
        first = services.engines[0]
        deadline = time.monotonic() + 5
        while not (first.partitions() and second.partitions()):
            assert time.monotonic() < deadline, "the second engine never got a share"
            await asyncio.sleep(0.05)
        games = await create_games(redis, keys, [("teeko", {})], 24, ["random", "random"])
        assert await wait_until_ended(redis, keys, games, 60) == []
        both = first.counts, second.counts
        assert all(c.moves for c in both), "one engine served nothing"
        assert sum(c.conflicts for c in both) == 0
        assert not set(first.partitions()) & set(second.partitions())
        stop.set()
        await asyncio.wait_for(running, 10)
        deadline = time.monotonic() + LEASE_MS / 1000 + 1
        while first.partitions() != list(keys.all_partitions()):
            assert time.monotonic() < deadline, "the leaving engine's share was not taken"
            await asyncio.sleep(0.05)
        more = await create_games(redis, keys, [("teeko", {})], 8, ["random", "random"])
        assert await wait_until_ended(redis, keys, more, 60) == []
    finally:
        stop.set()
        await services.stop()
