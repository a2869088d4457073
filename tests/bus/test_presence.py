"""Presence: one beat, one rule for alive, one way to read a group's backlog; and the
consumer settings every service kind builds once.

Against the session's real redis-server, one key prefix per test. A beat is written with
a chosen time rather than waited for, so nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest
import redis.asyncio as aioredis

from bots.worker import BotWorker
from services.bus.admission import PlatformLag, platform_lag
from services.bus.clients import QueryClient
from services.bus.consumer import ConsumerSettings
from services.bus.keys import ENGINE_GROUP, WORKERS_GROUP, Keys
from services.bus.presence import (
    ALIVE_MS,
    Beat,
    GroupRow,
    alive,
    beat,
    beat_value,
    beating,
    beats_of,
    group_rows,
    group_totals,
    newest,
    processes,
)
from services.bus.reader import GroupReader
from services.bus.text import now_ms
from services.cli.status import collect
from services.dispatcher import Dispatcher
from services.engine_service import EngineService


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace, partitions=2)


def stored(role: str, group: str, time: int, **stats: int) -> str:
    """A beat as a process of another host wrote it at `time`."""
    return json.dumps({"role": role, "group": group, "time": time, "pid": 7, "host": "h", **stats})


# -- the beat --------------------------------------------------------------------------------
def test_a_beat_reads_back_as_written_with_the_rest_in_its_stats() -> None:
    b = Beat.parse(beat_value("bot-random", WORKERS_GROUP, moves=3, lag_p99_ms=40))
    assert b is not None
    assert (b.role, b.group, b.pid, b.host) == (
        "bot-random", WORKERS_GROUP, os.getpid(), socket.gethostname(),
    )  # fmt: skip
    assert abs(b.time - now_ms()) < 60_000
    assert b.stats == {"moves": 3, "lag_p99_ms": 40}


@pytest.mark.parametrize("raw", [None, "", "not json", "[1, 2]", "5"])
def test_what_is_not_a_beat_parses_to_none(raw: str | None) -> None:
    assert Beat.parse(raw) is None


def test_a_beat_that_does_not_say_when_is_never_alive() -> None:
    b = Beat.parse(json.dumps({"role": "engine"}))
    assert b is not None and b.time == 0
    assert not alive(b, now_ms())


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every raw value `Beat.parse` is given from now on."""
    seen: list[object] = []
    parse = Beat.parse.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        Beat, "parse", classmethod(lambda cls, raw: seen.append(raw) or parse(cls, raw))
    )
    return seen


def test_copies_merge_to_each_process_s_latest_beat_each_parsed_once(
    parsed: list[object],
) -> None:
    def stored(at: int) -> str:
        return json.dumps({"role": "engine", "time": at})

    # Two copies of the beats (two masters): each process's latest wins, whichever copy
    # holds it; one readable in no copy stays, as None (for `forget_old` to drop).
    copies = [
        {b"a": stored(5), b"b": stored(9), b"c": "not json"},
        {b"a": stored(7), b"b": stored(8), b"c": "nor this", b"d": stored(1)},
    ]
    merged = newest(copies)
    assert {k: (b.time if b else None) for k, b in merged.items()} == {
        "a": 7, "b": 9, "c": None, "d": 1,
    }  # fmt: skip
    assert len(parsed) == 7, "every stored beat parsed once (a round reads them all)"
    assert set(beats_of(merged)) == {"a", "b", "d"}


def test_a_member_parses_only_the_beats_of_its_own_kind(parsed: list[object]) -> None:
    # Every process of every kind beats into the same hash, and every member of a
    # partitioned kind reads it every round: it parses only its own kind's beats.
    copies = [
        {
            b"e1": beat_value("engine", "engine"),
            b"e2": beat_value("engine", "engine", note='"role": "projector"'),
            b"p1": beat_value("projector", "projector"),
            b"g1": beat_value("gateway", "", url="http://x"),
            b"x": "not json",
        }
    ] * 2
    assert set(newest(copies, "engine")) == {"e1", "e2"}
    assert len(parsed) == 4, "a beat of another kind was parsed"
    parsed.clear()
    assert set(newest(copies, "projector")) == {"p1"}  # (e2's note is escaped: not a role)
    assert len(parsed) == 2


def test_alive_is_one_threshold() -> None:
    now = 1_800_000_000_000
    assert alive(Beat("engine", time=now - ALIVE_MS), now)
    assert not alive(Beat("engine", time=now - ALIVE_MS - 1), now)
    assert not alive(None, now)


async def test_processes_reads_every_beat_and_leaves_out_what_is_not_one(
    redis: aioredis.Redis, keys: Keys
) -> None:
    await beat(redis, keys, "e1", "engine", ENGINE_GROUP, moves=2)
    await redis.hset(keys.processes(), "junk", "{")
    beats = await processes(redis, keys)
    assert list(beats) == ["e1"]
    assert beats["e1"].role == "engine" and beats["e1"].stats == {"moves": 2}


async def test_beating_beats_while_inside_and_removes_the_beat_on_the_way_out(
    redis: aioredis.Redis, keys: Keys
) -> None:
    sent = 0

    async def send() -> None:
        nonlocal sent
        sent += 1
        await beat(redis, keys, "d1", "director", "")

    async with beating(redis, keys, "d1", send):
        while not sent:
            await asyncio.sleep(0.01)
        assert "d1" in await processes(redis, keys)
    assert "d1" not in await processes(redis, keys)


# -- one rule, for everyone who asks -----------------------------------------------------------
async def test_a_beat_past_the_threshold_is_dead_to_every_reader(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A worker that beat 1.5 s ago: the claim sweep, bot health, admission and `agon
    status` all take it for gone (they once used 1 s and 2 s); a fresh one for alive."""
    now = now_ms()
    late = stored("bot-random", WORKERS_GROUP, now - ALIVE_MS - 500, lag_p99_ms=900)
    # A beat from a clock ahead stays fresh however slowly the checks below run.
    fresh = stored("bot-greedy", WORKERS_GROUP, now + 60_000, lag_p99_ms=40)
    await redis.hset(keys.processes(), mapping={"w-late": late, "w-fresh": fresh})
    query = QueryClient(redis, keys)

    assert (await query.bot_health("random")).workers == 0
    assert (await query.bot_health("greedy")).workers == 1
    assert platform_lag(await query.processes()) == PlatformLag(lag_ms=40)
    reader = GroupReader(
        redis, [keys.bot_turns("random")], WORKERS_GROUP, "w-other", heartbeats=keys.processes()
    )
    assert await reader.dead_consumers({"w-late", "w-fresh"}) == {"w-late"}
    status = await collect(redis, keys)
    shown = {p["name"]: p["alive"] for p in status["processes"]}
    assert shown == {"w-late": False, "w-fresh": True}


# -- a group's backlog --------------------------------------------------------------------------
async def test_group_rows_and_their_sums_per_group(redis: aioredis.Redis, keys: Keys) -> None:
    a, b, missing = keys.commands(0), keys.commands(1), keys.feed(0)
    for stream in (a, b):
        await redis.xgroup_create(stream, ENGINE_GROUP, id="0", mkstream=True)
    await redis.xgroup_create(a, "other", id="$")
    for stream, n in ((a, 3), (b, 2)):
        for i in range(n):
            await redis.xadd(stream, {"m": str(i)})
    await redis.xreadgroup(ENGINE_GROUP, "c1", {a: ">"}, count=1)  # one pending on a

    rows = await group_rows(redis, [a, b, missing])
    assert sorted(rows, key=lambda r: (r.stream, r.group)) == [
        GroupRow(a, ENGINE_GROUP, 1, 2, 1),
        GroupRow(a, "other", 0, 3, 0),
        GroupRow(b, ENGINE_GROUP, 0, 2, 0),
    ]
    assert group_totals(rows) == {ENGINE_GROUP: (4, 1), "other": (3, 0)}


# -- consumer settings --------------------------------------------------------------------------
async def test_a_kind_starts_from_its_defaults_and_keywords_change_them(
    redis: aioredis.Redis, keys: Keys
) -> None:
    engine = EngineService(redis, keys, batch=3, replicas=1, consumer="e1")
    assert engine.settings == ConsumerSettings(
        batch=3, claim_idle_ms=10_000, cache_size=10_000, replicas=1, consumer="e1"
    )
    assert (engine.reader.count, engine.reader.consumer, engine.store.replicas) == (3, "e1", 1)
    given = ConsumerSettings(batch=7, block_ms=5_000, replica_timeout_ms=250)
    worker = BotWorker(redis, "random", keys, settings=given, block_ms=50)
    assert worker.settings == ConsumerSettings(batch=7, block_ms=50, replica_timeout_ms=250)
    assert (worker.reader.count, worker.block_ms, worker.replica_timeout_ms) == (7, 50, 250)
    # The dispatcher wakes at least once per clock sweep, whatever it was given.
    assert Dispatcher(redis, keys, settings=given).block_ms == 100
    assert BotWorker(redis, "random", keys).settings.batch == 200
