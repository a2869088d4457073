"""Dispatcher fencing against a real redis-server: a dispatcher that lost a partition's
lease writes nothing there.

The dispatchers divide the partitions by leases (`services.bus.ownership`), and every write
of a partition's clocks carries the epoch its lease was taken under (`services.dispatcher`).
The attack: dispatcher A holds partition p, stalls (a GC pause, SIGSTOP) past its lease and
B takes p; A wakes up with the feed entries it had read, or a clock it saw come due, and
writes as if p were still its own: a clock B knows nothing of, a second turn request, a
timeout claim B sends too. A's writes are refused, A gives p up and leaves its entries to
B; B's writes go through. A repair, which looks at every partition, is refused quietly in
those its dispatcher never held.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from services.bus.keys import DISPATCHER_GROUP, Keys
from services.bus.ownership import LEASE_MS, Ownership
from services.bus.presence import beat, forget
from services.bus.stuck import STUCK_AFTER_MS
from services.bus.text import now_ms
from services.cli.pipeline import create_games
from services.dispatcher import TIMEOUT_GRACE_MS, Dispatcher
from services.engine_service import EngineService
from services.projector import Projector
from tests.support.commandstats import calls
from tests.support.faults import hold_share

SECRET = b"fencing-test-secret"
#: Nobody serves this bot: its inbox shows every turn handed out.
BOT = "nobody"


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace)


async def bot_game(redis: aioredis.Redis, keys: Keys) -> tuple[str, int]:
    """A game between bots with a move clock, started by the engine: its feed entries make
    it the bot's turn. Its id and partition."""
    (gid,) = await create_games(
        redis, keys, [("teeko", {})], 1, [BOT, BOT], move_time_ms=60_000, run_id="fenced"
    )
    await EngineService(redis, keys, secret=SECRET).drain()
    return gid, keys.partition(gid)


async def dispatcher(
    redis: aioredis.Redis,
    keys: Keys,
    name: str,
    clock_ms: int | None = None,
    lease_ms: int = LEASE_MS,
) -> Dispatcher:
    """A dispatcher holding its share of the partitions as `run` holds it: it beats, and
    its ownership took its round (every partition whose lease is free, when it is alone)."""
    clock = now_ms if clock_ms is None else lambda: clock_ms
    d = Dispatcher(redis, keys, secret=SECRET, consumer=name, clock=clock)
    d.ownership = Ownership(redis, keys, d.role, name, lease_ms=lease_ms)
    await beat(redis, keys, name, d.role, DISPATCHER_GROUP)
    await hold_share(d.ownership)
    await d.setup()
    return d


async def stall(redis: aioredis.Redis, keys: Keys, a: Dispatcher, p: int) -> Dispatcher:
    """A stalls past its lease (no beat, no renewal) and B takes p, under the next epoch;
    A still believes it holds p. Returns B."""
    assert a.ownership is not None and p in a.ownership.owned
    await forget(redis, keys, [a.reader.consumer])
    await asyncio.sleep(a.ownership.lease_ms / 1000 + 0.1)
    b = await dispatcher(redis, keys, "dispatcher-b")
    assert b.ownership is not None and b.ownership.owned[p] == a.ownership.owned[p] + 1
    return b


async def test_a_dispatcher_paused_past_its_lease_sets_no_clock_and_hands_out_no_turn(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A resumes with the entries that make it a bot's turn in p, read before it stalled:
    unfenced, it would set a clock B knows nothing of and hand the bot its turn (and B,
    taking the same entries over, would hand it again)."""
    gid, p = await bot_game(redis, keys)
    a = await dispatcher(redis, keys, "dispatcher-a", lease_ms=200)
    entries = await a.reader.read(None)
    assert entries, "the game's start is in the feed"
    b = await stall(redis, keys, a, p)
    await a.process(entries)
    assert await redis.zrange(keys.clocks(p), 0, -1) == [], "a fenced dispatcher set a clock"
    assert await redis.xlen(keys.bot_turns(BOT)) == 0, "a fenced dispatcher handed out a turn"
    pending = await redis.xpending(keys.feed(p), DISPATCHER_GROUP)
    assert pending["pending"] == len(entries), "the entries are left to the new owner"
    assert a.stats()["fenced"] == 1 and a.ownership is not None and p not in a.ownership.owned
    # B takes over what A left pending (as its `rebalance` does), and its writes go through.
    assert await b.reader.claim_strays([keys.feed(p)]) == len(entries)
    await b.process(await b.reader.read(None))
    assert [m.decode() for m in await redis.zrange(keys.clocks(p), 0, -1)] == [f"{gid}|4"]
    assert await redis.xlen(keys.bot_turns(BOT)) == 1
    assert (await redis.xpending(keys.feed(p), DISPATCHER_GROUP))["pending"] == 0
    assert b.stats()["fenced"] == 0


async def test_a_dispatcher_paused_past_its_lease_claims_no_timeout(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A saw a clock of p come due before it stalled: unfenced, its claim would go out
    beside B's, and the clock be replaced by a re-check B did not set."""
    gid, p = await bot_game(redis, keys)
    a = await dispatcher(redis, keys, "dispatcher-a", lease_ms=200)
    await a.drain()
    clocks, commands = keys.clocks(p), keys.commands(p)
    due = await redis.zscore(clocks, f"{gid}|4")
    assert due is not None, "A set the clock while it held p"
    sent = await redis.xlen(commands)
    b = await stall(redis, keys, a, p)
    late = int(due) + TIMEOUT_GRACE_MS + 1
    assert await a.claim_timeouts(now=late) == 0
    assert await redis.xlen(commands) == sent, "a fenced dispatcher sent a claim"
    assert await redis.zscore(clocks, f"{gid}|4") == due, "a fenced dispatcher took the clock"
    assert a.stats()["fenced"] == 1 and a.ownership is not None and p not in a.ownership.owned
    # The owner's claim goes through.
    assert await b.claim_timeouts(now=late) == 1
    assert await redis.xlen(commands) == sent + 1
    assert await redis.zscore(clocks, f"{gid}|4") is None


async def test_a_repair_is_refused_quietly_where_its_dispatcher_holds_nothing(
    redis: aioredis.Redis, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    """A repair looks for stuck games in every partition: unfenced, every dispatcher would
    set the turn and clock of every stuck game, the owner's included. One that never held
    p is refused there without a word, and counts no lost lease; the owner repairs it."""
    caplog.set_level(logging.INFO, logger="agon.dispatcher")
    gid, p = await bot_game(redis, keys)
    await Projector(redis, keys).drain()  # stuck games are found through the views
    later = now_ms() + STUCK_AFTER_MS + 1000
    owner = await dispatcher(redis, keys, "dispatcher-owner", clock_ms=later)
    other = Dispatcher(redis, keys, secret=SECRET, consumer="dispatcher-other", clock=lambda: later)
    other.ownership = Ownership(redis, keys, other.role, "dispatcher-other")  # holds nothing
    assert await other.repair() == 0
    assert await redis.zrange(keys.clocks(p), 0, -1) == [], "a dispatcher wrote outside its share"
    assert await redis.xlen(keys.bot_turns(BOT)) == 0
    assert other.stats()["fenced"] == 0 and other.ownership.moves == 0
    assert caplog.records == [], "a refusal outside its share is no news"
    assert await owner.repair() == 1
    assert [m.decode() for m in await redis.zrange(keys.clocks(p), 0, -1)] == [f"{gid}|4"]
    assert await redis.xlen(keys.bot_turns(BOT)) == 1


async def test_a_batch_of_many_calls_holds_back_only_the_refused_partitions_turns(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A batch of more writes than one call takes (`SENDS_PER_CALL`) goes out in several,
    each partition's answer its own: only the turns of the partition another dispatcher
    took are held back, in whichever call it fell."""
    games = await create_games(
        redis, keys, [("teeko", {})], 48, [BOT, BOT], move_time_ms=60_000, run_id="many"
    )
    await EngineService(redis, keys, secret=SECRET).drain()
    a = await dispatcher(redis, keys, "dispatcher-a")
    entries = []
    while batch := await a.reader.read(None):
        entries += batch
    taken = keys.partition(games[len(games) // 2])
    assert a.ownership is not None
    await redis.hset(keys.lease(taken, a.role), "epoch", a.ownership.owned[taken] + 1)
    before = await calls(redis, "eval", "evalsha")
    await a.process(entries)
    assert await calls(redis, "eval", "evalsha") - before >= 2, "one call took the whole batch"
    kept = [g for g in games if keys.partition(g) != taken]
    assert await redis.xlen(keys.bot_turns(BOT)) == len(kept)
    for p in keys.all_partitions():
        clocks = {m.decode() for m in await redis.zrange(keys.clocks(p), 0, -1)}
        assert clocks == {f"{g}|4" for g in kept if keys.partition(g) == p}, p
    assert a.stats()["fenced"] == 1 and taken not in a.ownership.owned
