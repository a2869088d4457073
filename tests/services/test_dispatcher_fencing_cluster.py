"""Dispatcher fencing on a real Redis Cluster: a dispatcher that lost a partition's lease
writes nothing there, though its turn requests cannot be fenced where they are written.

The cluster counterpart of `test_dispatcher_fencing`. On a single server a batch's fenced
clock writes and its turn requests go out in one script (`_SEND`). On a cluster a bot's
inbox is in the bot's own hash slot, which no script of the partition may name: the
dispatcher runs each partition's fenced clock script (`_CLOCKS`, `_CLAIM`) first, and then
sends the turn requests (a second round trip, one script call an inbox) only of the
partitions whose fence held. The attack is the same: dispatcher A holds partition p, stalls
past its lease and B takes p; A wakes up with the feed entries it had read, or a clock it
saw come due, and writes as if p were still its own. Its clock writes are refused by the
scripts, and its turn requests must then never be sent, though nothing on the inbox's
master could refuse them; its other partitions' writes go on. B's writes go through.

The single-server module's tests run here as they are, on the cluster (this module's
`redis` and `keys`); four more show what only the cluster path does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from schemas.codec import FIELD_BYTES, decode_turn
from services import dispatcher as dispatcher_module
from services.bus.connection import AgonCluster, connect, is_cluster
from services.bus.keys import DISPATCHER_GROUP, WORKERS_GROUP, Keys
from services.bus.ownership import Ownership
from services.bus.presence import beat, forget
from services.bus.reader import ensure_group
from services.bus.stuck import STUCK_AFTER_MS
from services.bus.text import as_text, now_ms
from services.cli.pipeline import create_games
from services.dispatcher import Dispatcher
from services.engine_service import EngineService
from services.projector import Projector
from tests.services import test_dispatcher_fencing as single
from tests.services.test_dispatcher_fencing import BOT, SECRET, bot_game, dispatcher, stall
from tests.support.cluster import ClusterTarget


@pytest.fixture
async def redis(cluster_url: ClusterTarget) -> AsyncIterator[AgonCluster]:
    client = await connect(cluster_url.url)
    assert isinstance(client, AgonCluster) and is_cluster(client)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def keys(cluster_url: ClusterTarget) -> Keys:
    return Keys(prefix=cluster_url.prefix)


async def bot_games(
    redis: AgonCluster, keys: Keys, count: int = 1, run_id: str = "fenced"
) -> list[str]:
    """Games between bots with a move clock, started by the engine: their feed entries make
    it the bot's turn. Their ids are "teeko-<run_id>-<i>"."""
    gids = await create_games(
        redis, keys, [("teeko", {})], count, [BOT, BOT], move_time_ms=60_000, run_id=run_id
    )
    await EngineService(redis, keys, secret=SECRET).drain()
    return gids


async def inbox(redis: AgonCluster, keys: Keys) -> list[tuple[str, int]]:
    """The turns handed out to the bot: (game, seq) of each, oldest first."""
    rows: Any = await redis.xrange(keys.bot_turns(BOT))
    turns = [decode_turn(fields[FIELD_BYTES]) for _, fields in rows]
    return [(turn.game_id, turn.seq) for turn in turns]


def parts(keys: Keys, gids: list[str]) -> set[int]:
    """The games' partitions."""
    return {keys.partition(g) for g in gids}


async def clocks(redis: AgonCluster, keys: Keys, p: int) -> list[str]:
    """Partition `p`'s clock members."""
    members: Any = await redis.zrange(keys.clocks(p), 0, -1)
    return [as_text(m) for m in members]


# The single-server attacks, on the cluster.
test_a_dispatcher_paused_past_its_lease_sets_no_clock_and_hands_out_no_turn = (
    single.test_a_dispatcher_paused_past_its_lease_sets_no_clock_and_hands_out_no_turn
)
test_a_dispatcher_paused_past_its_lease_claims_no_timeout = (
    single.test_a_dispatcher_paused_past_its_lease_claims_no_timeout
)
test_a_repair_is_refused_quietly_where_its_dispatcher_holds_nothing = (
    single.test_a_repair_is_refused_quietly_where_its_dispatcher_holds_nothing
)


async def test_only_the_lost_partitions_turns_are_held_back(redis: AgonCluster, keys: Keys) -> None:
    """On a cluster the turns go out after the clock scripts, one partition's refusal
    beside another's acceptance: A, paused past its leases, finds that B took B's count of
    them (A's beat lapsed too) and nobody the rest (C, which B deals the others to, has
    not taken them: their epochs are still A's). A's batch of games in both sets sets the
    clocks and hands out the turns of the partitions it still holds, and writes nothing in
    those it lost: unfenced, the bot would have their turns from A too."""
    names = ["dispatcher-a", "dispatcher-b", "dispatcher-c"]
    b_share = Ownership(redis, keys, Dispatcher.role, names[1]).desired(names[1:])
    gids: list[str] = []
    while not (b_share & parts(keys, gids) and parts(keys, gids) - b_share):
        # until some are in B's share and some not
        gids += await bot_games(redis, keys, 4, run_id=f"fenced{len(gids)}")
    lost = [g for g in gids if keys.partition(g) in b_share]
    kept = [g for g in gids if keys.partition(g) not in b_share]
    a = await dispatcher(redis, keys, names[0], lease_ms=200)
    entries = await a.reader.read(None)
    assert {e.stream for e in entries} == {keys.feed(keys.partition(g)) for g in gids}
    # A stalls past its leases and its beat; C beats and takes no round; B joins, taking
    # what it deals itself of A's lapsed partitions.
    await forget(redis, keys, [names[0]])
    await asyncio.sleep(0.3)
    await beat(redis, keys, names[2], Dispatcher.role, DISPATCHER_GROUP)
    b = await dispatcher(redis, keys, names[1])
    assert b.ownership is not None and set(b.ownership.owned) == b_share
    await a.process(entries)
    assert sorted(await inbox(redis, keys)) == sorted((g, 4) for g in kept)
    for g in lost:
        assert await clocks(redis, keys, keys.partition(g)) == [], "a fenced clock was set"
    for g in kept:
        assert f"{g}|4" in await clocks(redis, keys, keys.partition(g))
    # A gives up the partitions it was refused in (it finds out about the rest of B's
    # share at its next write there, or its next round).
    assert a.ownership is not None and set(a.ownership.owned).isdisjoint(parts(keys, lost))
    assert parts(keys, kept) <= set(a.ownership.owned)
    assert a.stats()["fenced"] == len(parts(keys, lost))
    assert a.stats()["turns"] == len(kept)
    for p in parts(keys, gids):
        left = [e for e in entries if e.stream == keys.feed(p)] if p in b_share else []
        assert (await redis.xpending(keys.feed(p), DISPATCHER_GROUP))["pending"] == len(left)


async def batches_taken(redis: AgonCluster, keys: Keys, gids: list[str]) -> list[list[str]]:
    """The games of the turns that each of two workers waiting on the inbox took, once a
    dispatcher handed out the turns of `gids` in one batch (a worker that took none: none)."""
    await ensure_group(redis, keys.bot_turns(BOT), WORKERS_GROUP)
    waiting = [
        asyncio.ensure_future(
            redis.xreadgroup(WORKERS_GROUP, f"w{i}", {keys.bot_turns(BOT): ">"}, block=5000)
        )
        for i in range(2)
    ]
    await asyncio.sleep(0.3)  # both wait
    d = await dispatcher(redis, keys, "dispatcher-a")
    await d.process(await d.reader.read(None))
    await asyncio.wait(waiting, timeout=min(5, 0.5 * len(gids)))
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    return [
        [decode_turn(f[FIELD_BYTES]).game_id for _, f in task.result()[0][1]]
        for task in waiting
        if not task.cancelled()
    ]


async def test_a_batch_hands_its_turns_to_one_waiting_worker_together(
    redis: AgonCluster, keys: Keys
) -> None:
    """A batch's turns for one inbox go in with one call, so Redis hands them all to the
    first worker waiting there. With an XADD each, each woke a worker of its own: with
    eight workers on one inbox every worker's batch was a turn, and so was each reply's
    round trip to every master."""
    gids = await bot_games(redis, keys, 6, run_id="together")
    batches = await batches_taken(redis, keys, gids)
    assert len(batches) == 1 and sorted(batches[0]) == sorted(gids)


async def test_a_call_holds_at_most_sends_per_call_turns(
    redis: AgonCluster, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a single server (`_SEND`), one script call puts at most `SENDS_PER_CALL` turns
    in an inbox: a call of a thousand would hold the server up that long."""
    monkeypatch.setattr(dispatcher_module, "SENDS_PER_CALL", 4)
    gids = await bot_games(redis, keys, 6, run_id="chunked")
    batches = await batches_taken(redis, keys, gids)
    assert sorted(map(len, batches)) == [2, 4]
    assert sorted(g for b in batches for g in b) == sorted(gids)


async def test_a_repair_by_a_dispatcher_paused_past_its_lease_hands_out_no_turn(
    redis: AgonCluster, keys: Keys
) -> None:
    """A still believes it holds p when it repairs p's stuck game, so it does not skip it:
    its clock script is refused, and the turn it had refolded never reaches the inbox.
    Unfenced, the bot would have the turn from A as well as from B."""
    gid, p = await bot_game(redis, keys)
    await Projector(redis, keys).drain()
    later = now_ms() + STUCK_AFTER_MS + 1000
    a = await dispatcher(redis, keys, "dispatcher-a", clock_ms=later, lease_ms=200)
    b = await stall(redis, keys, a, p)
    b.clock = lambda: later
    assert await a.repair() == 0
    assert await clocks(redis, keys, p) == [], "a fenced dispatcher set a clock"
    assert await inbox(redis, keys) == [], "a fenced dispatcher handed out a turn"
    assert a.stats()["fenced"] == 1 and a.ownership is not None and p not in a.ownership.owned
    assert await b.repair() == 1
    assert await clocks(redis, keys, p) == [f"{gid}|4"]
    assert await inbox(redis, keys) == [(gid, 4)]
