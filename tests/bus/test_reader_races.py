"""The group reader's housekeeping while the consumer works beside it, on a real redis-server.

Housekeeping runs beside the loop: a group acknowledges entries, and a rebalance changes
the streams read, while a housekeeping read waits for its answer. Each used to fail the
whole housekeeping round (stream trimming, dead consumers, the stats line) on a starved
host in a failover: `'NoneType' object has no attribute 'partition'` and `zip() argument 2
is longer than argument 1`.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.reader import GroupReader, ensure_group, trim_acknowledged


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
