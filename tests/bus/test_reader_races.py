"""The group reader's housekeeping while the consumer works beside it, on a real redis-server.

Housekeeping runs beside the loop: a group acknowledges entries, and a rebalance changes
the streams read, while a housekeeping read waits for its answer. Each used to fail the
whole housekeeping round (stream trimming, dead consumers, the stats line) on a starved
host in a failover: `'NoneType' object has no attribute 'partition'` and `zip() argument 2
is longer than argument 1`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import redis.asyncio as aioredis

from services.bus.connection import connect
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.reader import Entry, GroupReader, ensure_group, trim_acknowledged
from tests.support.cluster import ClusterTarget


async def test_trimming_while_the_group_acknowledges_its_last_pending_entry(
    redis: aioredis.Redis, namespace: str
) -> None:
    """XINFO sees an entry pending, the group acknowledges it, then XPENDING has no oldest
    entry: the trim goes on with what XINFO said was delivered."""
    keys = Keys(prefix=namespace)
    stream = keys.commands(0)
    await ensure_group(redis, stream, ENGINE_GROUP)
    reader = GroupReader(redis, [stream], ENGINE_GROUP, "c", heartbeats=keys.processes())
    for turns in range(40):  # the acknowledgement lands at a different point each time
        await redis.xadd(stream, {"m": b"x"})
        (entry,) = await reader.read(None)
        trim = asyncio.ensure_future(trim_acknowledged(redis, stream, [ENGINE_GROUP]))
        for _ in range(turns % 8):
            await asyncio.sleep(0)
        await reader.ack([entry])
        await trim
    await trim_acknowledged(redis, stream, [ENGINE_GROUP])
    assert await redis.xlen(stream) == 0, "an acknowledged entry was left untrimmed"


async def test_a_rebalance_while_housekeeping_reads_the_groups(
    redis: aioredis.Redis, namespace: str
) -> None:
    """The streams read shrink (a partition given up) while the dead-consumer sweep, the
    claim sweep and leaving wait for their pipelines: each answers for the streams it asked."""
    keys = Keys(prefix=namespace)
    streams = [keys.commands(p) for p in range(4)]
    reader = GroupReader(redis, streams, ENGINE_GROUP, "c", heartbeats=keys.processes())
    await reader.set_streams(streams)
    for sweep in (reader.forget_dead_consumers, reader.reclaim, reader.leave):
        await reader.set_streams(streams)
        running = asyncio.ensure_future(sweep())
        await asyncio.sleep(0)  # its pipeline is on its way
        await reader.set_streams(streams[:1])
        await running


async def test_a_partition_taken_during_a_wait_is_read_within_that_wait(
    cluster_url: ClusterTarget,
) -> None:
    """On a cluster each stream has its own blocking lane. A member that takes a partition
    while its loop waits (up to `block_ms`, or to the next claim pass) reads the new stream
    in that wait, and what it claimed there from a dead member is handed over at once:
    both waited for the next read, a whole wait later on a quiet consumer."""
    redis = await connect(cluster_url.url)
    keys = Keys(prefix=cluster_url.prefix)
    mine, taken, left = keys.commands(0), keys.commands(1), keys.commands(2)
    reader = GroupReader(
        redis, [mine], ENGINE_GROUP, "heir", heartbeats=keys.processes(), claim_every_s=600
    )

    async def next_batch() -> list[Entry]:
        while not (batch := await reader.read(600_000)):
            pass
        return batch

    async def during_a_wait(*steps: Awaitable[object]) -> list[bytes | None]:
        waiting = asyncio.ensure_future(next_batch())
        await asyncio.sleep(0.2)  # (the wait is under way)
        for step in steps:
            await step
        batch = await asyncio.wait_for(waiting, 10)
        await reader.ack(batch)
        return [e.data for e in batch]

    try:
        await ensure_group(redis, left, ENGINE_GROUP)
        await redis.xadd(left, {"m": b"left"})
        await redis.xreadgroup(ENGINE_GROUP, "dead", {left: ">"})  # read, never acknowledged
        assert await reader.read(None) == []
        await reader.claimed_so_far()  # the next claim pass is 600 s away
        taking = reader.set_streams([mine, taken])
        assert await during_a_wait(taking, redis.xadd(taken, {"m": b"new"})) == [b"new"]
        taking = reader.set_streams([mine, taken, left])
        assert await during_a_wait(taking, reader.claim_strays([left])) == [b"left"]
    finally:
        await reader.close()
        await redis.aclose()


async def test_a_stream_to_recover_during_a_wait_is_read_within_that_wait(
    cluster_url: ClusterTarget,
) -> None:
    """After a failover (`StreamConsumer.master_away`) a consumer reads its own pending
    entries on the promoted master again: a read whose answer the dead master never sent
    left them pending with it. That read came only after the wait under way, up to the
    next claim pass (0.5 s): in a kill-host run, a live engine's move waited 1.05 s."""
    redis = await connect(cluster_url.url)
    keys = Keys(prefix=cluster_url.prefix)
    stream = keys.commands(3)
    reader = GroupReader(
        redis, [stream], ENGINE_GROUP, "me", heartbeats=keys.processes(), claim_every_s=600
    )
    try:
        await ensure_group(redis, stream, ENGINE_GROUP)
        await redis.xadd(stream, {"m": b"lost"})
        await redis.xreadgroup(ENGINE_GROUP, "me", {stream: ">"})  # its answer never came
        assert await reader.read(None) == []
        await reader.claimed_so_far()  # the next claim pass is 600 s away

        async def next_batch() -> list[Entry]:
            while not (batch := await reader.read(600_000)):
                pass
            return batch

        waiting = asyncio.ensure_future(next_batch())
        await asyncio.sleep(0.2)  # (the wait is under way)
        reader.recover([stream])
        batch = await asyncio.wait_for(waiting, 10)
        assert [e.data for e in batch] == [b"lost"]
        await reader.ack(batch)
    finally:
        await reader.close()
        await redis.aclose()
