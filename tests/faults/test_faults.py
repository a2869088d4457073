"""Faults: consumers that die holding work, a process killed with -9, Redis restarted.

Each test ends the same way: every game has ended, `verify` replays every log through
the engine, checks every hash chain (no gap, no duplicate seq) and finds the read models
equal to what the logs imply: nothing lost, nothing doubled.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis

from services.bus.connection import connect
from services.bus.embedded import EmbeddedRedis, free_port
from services.bus.keys import DISPATCHER_GROUP, PROJECTOR_GROUP, WORKERS_GROUP, Keys
from services.cli.pipeline import ServiceSet, collect, create_games, wait_until_ended
from services.projector import Projector, verify

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()
BOTS = ["random", "random"]


async def pending(redis: aioredis.Redis, stream: str, group: str) -> int:
    count: int = (await redis.xpending(stream, group))["pending"]
    return count


async def settle_and_verify(redis: aioredis.Redis, ids: list[str]) -> None:
    """Finish the games with fresh services that claim what dead consumers left, then verify."""
    survivors = ServiceSet(redis, KEYS, ["random"], claim_idle_ms=0)
    await survivors.drain()
    result = await collect(redis, KEYS, ids)
    assert (result.finished, result.unfinished) == (len(ids), [])
    report = await verify(redis, KEYS)
    assert report.problems == []
    for p in KEYS.all_partitions():
        for group in (PROJECTOR_GROUP, DISPATCHER_GROUP):
            assert await pending(redis, KEYS.feed(p), group) == 0


async def test_a_projector_that_dies_holding_a_batch(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    ids = await create_games(redis, KEYS, [("teeko", {}), ("supply-chains", {})], 2, BOTS)
    for _ in range(5):
        for engine in services.engines:
            await engine.drain()
        await services.dispatcher.drain()
        await services.workers[0].drain()
    doomed = Projector(redis, KEYS, consumer="doomed")
    taken = await doomed.reader.read(None)
    assert taken, "the doomed projector holds entries"
    # It dies here: nothing processed, nothing acknowledged.
    feeds = {e.stream for e in taken}
    assert sum([await pending(redis, f, PROJECTOR_GROUP) for f in feeds]) == len(taken)
    await settle_and_verify(redis, ids)


async def test_a_worker_and_a_dispatcher_that_die_holding_work(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    ids = await create_games(redis, KEYS, [("hexade", {})], 3, BOTS)
    await services.engines[0].drain()
    # The dispatcher takes the feed and dies before writing any turn request.
    assert await services.dispatcher.reader.read(None)
    survivors = ServiceSet(redis, KEYS, ["random"], claim_idle_ms=0)
    await survivors.dispatcher.drain()
    inbox = KEYS.bot_turns("random")
    assert await redis.xlen(inbox) == 3
    # A worker takes the turns and dies before answering.
    assert len(await services.workers[0].reader.read(None)) == 3
    assert await pending(redis, inbox, WORKERS_GROUP) == 3
    await settle_and_verify(redis, ids)
    assert await pending(redis, inbox, WORKERS_GROUP) == 0


async def test_a_process_killed_with_minus_9_mid_run(redis: aioredis.Redis, redis_url: str) -> None:
    """`up` in its own process plays; kill -9 it mid-run; others finish its work."""
    ids = await create_games(
        redis, KEYS, [("supply-chains", {}), ("overflow", {"size": "5"})], 15, BOTS
    )
    up = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "up",
            "--redis-url",
            redis_url,
            "--port",
            str(free_port()),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            moves = sum([await redis.xlen(KEYS.log(gid)) for gid in ids])
            if moves >= 300:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the pipeline process made no progress")
    finally:
        os.kill(up.pid, signal.SIGKILL)
        up.wait(timeout=10)
    result = await collect(redis, KEYS, ids)
    assert result.finished < len(ids), "killed mid-run, not after the end"
    await settle_and_verify(redis, ids)


async def test_redis_restarted_under_a_running_pipeline(
    redis_server_factory: Callable[..., EmbeddedRedis],
) -> None:
    """AOF on, Redis killed with -9 and restarted mid-run: the services reconnect and finish."""
    server = redis_server_factory(appendonly=True)
    redis = await connect(server.url)
    services = ServiceSet(redis, KEYS, ["random"], claim_idle_ms=500)
    try:
        await services.start()
        ids = await create_games(redis, KEYS, [("supply-chains", {})], 10, BOTS)
        deadline = time.monotonic() + 30
        while sum([await redis.xlen(KEYS.log(gid)) for gid in ids]) < 100:
            assert time.monotonic() < deadline, "no progress before the restart"
            await asyncio.sleep(0.01)
        server.kill()
        await asyncio.sleep(0.3)  # the services meet a dead server and retry
        server.restart()
        assert await wait_until_ended(redis, KEYS, ids, 60, services.failed) == []
    finally:
        await services.stop()
    try:
        report = await verify(redis, KEYS)
        assert report.problems == []
    finally:
        await redis.aclose()
