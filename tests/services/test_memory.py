"""Bounded memory: what a finished game leaves in Redis, and what goes.

Feeds, command streams and bot inboxes are trimmed once every group that reads them has
acknowledged an entry (never earlier, and not at all while one of the groups is missing);
reply memories expire after the idempotency window; a dead letter keeps the first 4 KiB of
an oversized payload with its size and sha256. The last test lists every key a finished
game leaves behind and fails on any it cannot name.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from schemas.codec import FIELD
from schemas.commands import Abort, CreateGame, SeatSpec
from schemas.tokens import admin_token
from services.bus.clients import CommandClient
from services.bus.consumer import DEAD_LETTER_KEEP_BYTES
from services.bus.keys import (
    DISPATCHER_GROUP,
    ENGINE_GROUP,
    FEED_GROUPS,
    PROJECTOR_GROUP,
    Keys,
)
from services.bus.reader import trim_acknowledged
from services.bus.secret import shared_secret
from services.cli.pipeline import ServiceSet, create_games, wait_until_ended
from services.cli.services import ENGINE
from services.dispatcher import Dispatcher
from services.engine_service import EngineService
from services.engine_service.decide import DIGEST_BYTES
from services.projector import Projector, verify

BOT = "random"
DAY_MS = 24 * 3_600_000
#: Event-sized garbage: 70 KiB that is neither a command nor an event (and too large).
GARBAGE = bytes(range(256)) * 280


async def play(
    redis: aioredis.Redis, keys: Keys, game: str, count: int, timeout_s: float = 40.0
) -> tuple[ServiceSet, list[str]]:
    """Play `count` games between two random bots through running services, then stop them,
    drain what is left and run every consumer's housekeeping (what `run` does every 5 s)."""
    services = ServiceSet(redis, keys, [BOT])
    await services.start()
    try:
        ids = await create_games(redis, keys, [(game, {})], count, [BOT, BOT])
        left = await wait_until_ended(redis, keys, ids, timeout_s, services.failed)
    finally:
        await services.stop()
    assert left == [], f"games did not end: {left}"
    await services.drain()
    for service in services.services():
        await service.housekeeping()
    return services, ids


def partition_streams(keys: Keys) -> list[str]:
    """Every stream that a consumer trims: command streams, feeds, the bot's inbox."""
    parts = keys.all_partitions()
    return [
        *(keys.commands(p) for p in parts),
        *(keys.feed(p) for p in parts),
        keys.bot_turns(BOT),
    ]


async def stream_ids(redis: aioredis.Redis, stream: str) -> list[bytes]:
    return [entry_id for entry_id, _ in await redis.xrange(stream)]


# -- a. trimming ------------------------------------------------------------------------
async def test_streams_are_trimmed_after_play_and_logs_keep_every_event(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace, partitions=4)
    _, ids = await play(redis, keys, "teeko", 4)

    lengths = {s: await redis.xlen(s) for s in partition_streams(keys)}
    assert await redis.exists(*lengths) == len(lengths), "a stream with groups went away"
    assert {s: n for s, n in lengths.items() if n > 1} == {}
    # Every group is caught up: nothing pending that the trim had to keep.
    for s in partition_streams(keys):
        for g in await redis.xinfo_groups(s):
            assert g["pending"] == 0, (s, g)

    # The logs are never trimmed: each still holds every event, as the views say.
    report = await verify(redis, keys)
    assert report.problems == []
    assert report.games == len(ids)
    total = 0
    for gid in ids:
        view = await redis.get(keys.view(gid))
        assert view is not None
        head = await redis.xlen(keys.log(gid))
        seqs = [int(i.decode().partition("-")[0]) for i in await stream_ids(redis, keys.log(gid))]
        assert seqs == list(range(1, head + 1))
        assert head > 8  # created, seated x2, started, moves..., ended
        total += head
    assert report.events == total


async def test_nothing_unacknowledged_is_trimmed(redis: aioredis.Redis, namespace: str) -> None:
    keys = Keys(prefix=namespace, partitions=1)
    feed = keys.feed(0)
    engine = EngineService(redis, keys)
    await create_games(redis, keys, [("teeko", {})], 3, [BOT, BOT])
    assert await engine.drain() == 3
    # The engine acknowledged its commands: its own trim empties the command stream.
    await engine.housekeeping()
    assert await redis.xlen(keys.commands(0)) == 0

    everything = await stream_ids(redis, feed)
    assert len(everything) == 3 * 4  # created, two seats, started: per game

    # No reader group yet: nothing at all is trimmed (a late group starts from 0).
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 0
    # The projector read and acknowledged everything; the dispatcher's group is missing.
    projector = Projector(redis, keys)
    assert await projector.drain() == len(everything)
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 0
    await projector.housekeeping()
    assert await stream_ids(redis, feed) == everything

    # The dispatcher's group exists but has read nothing: still nothing goes.
    dispatcher = Dispatcher(redis, keys)
    await dispatcher.setup()
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 0
    assert await stream_ids(redis, feed) == everything

    # The dispatcher group reads 5 entries and acknowledges only the first 2.
    raw = await redis.xreadgroup(DISPATCHER_GROUP, "slow-reader", {feed: ">"}, count=5)
    read = [entry_id for entry_id, _ in raw[0][1]]
    assert read == everything[:5]
    await redis.xack(feed, DISPATCHER_GROUP, *read[:2])
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 2
    assert await stream_ids(redis, feed) == everything[2:]

    # Acknowledging entry 4 but not 3 keeps 3 (the oldest pending) and everything after.
    await redis.xack(feed, DISPATCHER_GROUP, read[3])
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 0
    assert await stream_ids(redis, feed) == everything[2:]

    # The projector lags now (its group moved back to the 4th entry): the trim stops at the
    # slowest group.
    await redis.xack(feed, DISPATCHER_GROUP, read[2], read[4])
    await redis.xgroup_setid(feed, PROJECTOR_GROUP, everything[3])
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 2
    assert await stream_ids(redis, feed) == everything[4:]
    # Now the dispatcher is the slowest: only what it acknowledged (up to the 5th) goes.
    await redis.xgroup_setid(feed, PROJECTOR_GROUP, everything[8])
    assert await trim_acknowledged(redis, feed, FEED_GROUPS) == 1
    assert await stream_ids(redis, feed) == everything[5:]


# -- b. reply memories expire ------------------------------------------------------------
async def abort(redis: aioredis.Redis, keys: Keys, game_id: str) -> Abort:
    """The operator ends the game: the commit that starts its reply memory's window."""
    token = admin_token(await shared_secret(redis, keys))
    return Abort(command_id=f"abort-{game_id}", game_id=game_id, seat=0, token=token)


def create(game_id: str, reply_to: str = "") -> CreateGame:
    return CreateGame(
        command_id=f"create-{game_id}",
        game_id=game_id,
        game="teeko",
        options={},
        seats=[SeatSpec(kind="bot", name=BOT), SeatSpec(kind="bot", name=BOT)],
        seed=1,
        reply_to=reply_to,
    )


async def test_reply_memory_expires_after_the_idempotency_window(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace, partitions=2)
    # A game played with the default window: its memory lives (at most) 24 h.
    _, (played,) = await play(redis, keys, "teeko", 1)
    ttl = await redis.pttl(keys.replies_memory(played))
    assert DAY_MS - 120_000 < ttl <= DAY_MS
    assert await redis.hlen(keys.replies_memory(played)) > 4  # every move's command id

    # A shorter window, on a command that asks for a reply. While the game goes on its
    # memory stays; the window starts with the commit that ends the game.
    reply_to = keys.reply_stream("memory-test")
    engine = EngineService(redis, keys, reply_ttl_ms=2000)
    await CommandClient(redis, keys).send([create("short", reply_to)])
    assert await engine.drain() == 1
    [(_, reply)] = await redis.xrange(reply_to)
    memory = keys.replies_memory("short")
    remembered = await redis.hget(memory, "create create-short")
    assert remembered is not None and remembered[DIGEST_BYTES:] == reply[FIELD.encode()]
    assert await redis.pttl(memory) == -1
    await CommandClient(redis, keys).send([await abort(redis, keys, "short")])
    assert await engine.drain() == 1
    assert 0 < await redis.pttl(memory) <= 2000

    # After the window the memory is gone; the log and the view stay, without a TTL.
    engine = EngineService(redis, keys, reply_ttl_ms=300)
    await CommandClient(redis, keys).send([create("brief"), await abort(redis, keys, "brief")])
    assert await engine.drain() == 2
    await Projector(redis, keys).drain()
    memory = keys.replies_memory("brief")
    assert 0 < await redis.pttl(memory) <= 300
    head = await redis.xlen(keys.log("brief"))
    deadline = time.monotonic() + 5.0
    while await redis.exists(memory) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await redis.exists(memory) == 0
    assert await redis.xlen(keys.log("brief")) == head == 5
    assert await redis.exists(keys.view("brief")) == 1
    assert await redis.pttl(keys.log("brief")) == -1
    assert await redis.pttl(keys.view("brief")) == -1

    # `agon engine --idempotency-hours` sets the window; 24 h by default.
    parser = argparse.ArgumentParser()
    ENGINE.add_arguments(parser)
    (short,) = ENGINE._make(redis, keys, parser.parse_args(["--idempotency-hours", "0.5"]), 0)
    (default,) = ENGINE._make(redis, keys, parser.parse_args([]), 0)
    assert isinstance(short, EngineService) and isinstance(default, EngineService)
    assert (short.store.reply_ttl_ms, default.store.reply_ttl_ms) == (1_800_000, DAY_MS)


# -- c. dead letters keep 4 KiB -----------------------------------------------------------
def assert_truncated(fields: dict[bytes, bytes], payload: bytes, stream: str) -> None:
    assert fields[FIELD.encode()] == payload[:DEAD_LETTER_KEEP_BYTES]
    assert len(fields[FIELD.encode()]) == 4096
    assert int(fields[b"size"]) == len(payload)
    assert fields[b"sha256"].decode() == hashlib.sha256(payload).hexdigest()
    assert fields[b"stream"].decode() == stream


async def test_dead_letters_keep_the_first_4_kib_size_and_sha256(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace, partitions=2)
    assert len(GARBAGE) == 70 * 1024

    # Garbage on a command stream: the engine dead-letters it in its partition.
    engine = EngineService(redis, keys)
    await engine.setup()
    await redis.xadd(keys.commands(1), {FIELD: GARBAGE})
    assert await engine.drain() == 1
    assert await redis.xlen(keys.dead_letter(0)) == 0
    [(_, fields)] = await redis.xrange(keys.dead_letter(1))
    assert_truncated(fields, GARBAGE, keys.commands(1))
    assert await redis.xpending(keys.commands(1), ENGINE_GROUP) == {
        "pending": 0,
        "min": None,
        "max": None,
        "consumers": [],
    }

    # An oversized entry on a feed: the projector sets it aside in the readers' dead letters.
    payload = b"\x81" + GARBAGE[1:]  # starts like a msgpack map, oversized anyway
    projector = Projector(redis, keys)
    await projector.setup()
    await redis.xadd(keys.feed(0), {FIELD: payload})
    assert await projector.drain() == 1
    dead = [f for _, f in await redis.xrange(keys.reader_dead_letter())]
    [fields] = [f for f in dead if f[b"group"] == PROJECTOR_GROUP.encode()]
    assert_truncated(fields, payload, keys.feed(0))
    assert b"too_large" in fields[b"reason"]
    assert len(dead) == 1


# -- d. what a finished game leaves -------------------------------------------------------
def key_kind(keys: Keys, name: str, game_ids: Sequence[str]) -> str | None:
    """The kind of a key, named only through `Keys`; None for a key nobody should leave."""
    for gid in game_ids:
        per_game = {
            keys.log(gid): "log",
            keys.view(gid): "view",
            keys.replies_memory(gid): "replies memory",
        }
        if name in per_game:
            return per_game[name]
    shared = {
        keys.processes(): "processes",
        keys.secret(): "server secret",
        keys.reader_dead_letter(): "reader dead letters",
        keys.bot_turns(BOT): "inbox",
    }
    for p in keys.all_partitions():
        shared |= {
            keys.commands(p): "commands",
            keys.feed(p): "feed",
            keys.dead_letter(p): "dead letters",
            keys.games(p): "games registry",
            keys.projector_seen(p): "projector seen",
            **{keys.lease(p, kind): "lease" for kind in ("engine", "projector", "dispatcher")},
            keys.index_time(p): "index",
            keys.bot_results(p, BOT): "bot results",
            keys.results(p, "teeko"): "results",
        }
        for prefix in (
            keys.index_status(p, ""),
            keys.index_game(p, ""),
            keys.index_player(p, ""),
        ):
            if name.startswith(prefix) and len(name) > len(prefix):
                return "index"
    return shared.get(name)


STREAM_KINDS = {"commands", "feed", "inbox"}
MODEL_KINDS = {"games registry", "projector seen", "index", "bot results", "results"}


async def test_a_finished_game_leaves_only_its_log_view_and_reply_memory(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    _, (gid,) = await play(redis, keys, "teeko", 1)

    names = sorted([k.decode() async for k in redis.scan_iter(match=f"{namespace}:*")])
    kinds: dict[str, str | None] = {n: key_kind(keys, n, [gid]) for n in names}
    assert {n: k for n, k in kinds.items() if k is None} == {}, "unexpected keys"

    per_game = {n: k for n, k in kinds.items() if k in ("log", "view", "replies memory")}
    assert per_game == {
        keys.log(gid): "log",
        keys.view(gid): "view",
        keys.replies_memory(gid): "replies memory",
    }
    assert await redis.pttl(keys.log(gid)) == -1
    assert await redis.pttl(keys.view(gid)) == -1
    assert 0 < await redis.pttl(keys.replies_memory(gid)) <= DAY_MS
    assert await redis.xlen(keys.log(gid)) > 8

    p = keys.partition(gid)
    present = set(kinds.values())
    # The partition's read models: exactly these, each holding the game.
    models = {n for n, k in kinds.items() if k in MODEL_KINDS}
    assert models == {
        keys.games(p),
        keys.projector_seen(p),
        keys.bot_results(p, BOT),
        keys.results(p, "teeko"),
        keys.index_status(p, "ended"),
        keys.index_game(p, "teeko"),
        keys.index_player(p, BOT),
        keys.index_time(p),
    }
    assert await redis.zscore(keys.games(p), gid) is not None
    assert await redis.zscore(keys.index_status(p, "ended"), gid) is not None
    assert await redis.hexists(keys.results(p, "teeko"), gid)
    for p_ in keys.all_partitions():
        assert await redis.exists(keys.clocks(p_)) == 0
    # Streams that stay (with their groups) are now empty or nearly so.
    lengths: dict[str, Any] = {
        n: await redis.xlen(n) for n, k in kinds.items() if k in STREAM_KINDS
    }
    assert len(lengths) == 2 * keys.partitions + 1
    assert {n: x for n, x in lengths.items() if x > 1} == {}
    # A clean game sets nothing aside.
    assert "dead letters" not in present and "reader dead letters" not in present
