"""Fair clocks and dead consumers, with real processes and real time.

A move is judged by when it reached the command stream, never by when an engine got to it:
a timeout claim loses to a move that arrived before the deadline, even one held by an
engine that stalled (a slow one that still beats, or one paused with SIGSTOP); a move that
arrives after the deadline is too late and the claim wins. A bot's clock runs from when its
turn reached it (the dispatcher's hand-over, then its worker's delivery), as its signed
deadline says. A bot worker killed with
-9 costs no game on time: its turns are taken over within about a second.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from bench.fleet import Fleet
from schemas.codec import FIELD_BYTES, decode_turn
from schemas.commands import CreateGame, PlayMove, SeatSpec
from schemas.events import GameEnded, MovePlayed
from schemas.tokens import SEND_GRACE_MS, bot_token, clock_key, stamped_deadline
from services.bus.clients import CommandClient, QueryClient
from services.bus.delivery import TOOK, Deliveries
from services.bus.keys import ENGINE_GROUP, WORKERS_GROUP, Keys
from services.bus.text import id_ms, now_ms
from services.cli.pipeline import ServiceSet, create_games, wait_until_ended
from services.dispatcher import LOOK_EVERY_MS, TIMEOUT_GRACE_MS, Dispatcher
from services.engine_service import EngineService
from services.projector import Projector, verify

SECRET = b"clock-test-secret"
#: Nobody serves this bot: the test plays its moves itself.
NOBODY = [SeatSpec(kind="bot", name="nobody"), SeatSpec(kind="bot", name="nobody")]


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace)


@pytest.fixture
def fleet(redis_url: str, keys: Keys) -> Iterator[Fleet]:
    """`agon` service processes on the test's Redis and prefix, stopped when the test ends."""
    secret = {"AGON_SECRET": SECRET.decode()}
    with Fleet(redis_url, keys.prefix, env=secret, name="clocks", ready_timeout_s=30) as fleet:
        yield fleet


async def poll(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s: {condition}")


async def new_game(redis: aioredis.Redis, keys: Keys, gid: str, move_time_ms: int) -> None:
    create = CreateGame(
        command_id=f"create:{gid}", game_id=gid, game="teeko", seats=NOBODY,
        move_time_ms=move_time_ms,
    )  # fmt: skip
    await CommandClient(redis, keys).send([create])


def first_move(keys: Keys, gid: str, clock: str = "") -> PlayMove:
    """Seat 1's first Teeko move (a drop), answering the game's start (seq 4)."""
    return PlayMove(
        command_id=f"move:{gid}",
        game_id=gid,
        seat=1,
        token=bot_token(SECRET, gid, 1),
        move="C3",
        expected_seq=4,
        clock=clock,
    )


async def deadline_of(redis: aioredis.Redis, keys: Keys, gid: str) -> int:
    """When seat 1's first move is due: its turn is taken from the inbox, as a worker would
    (`services.bus.delivery`), and its clock, due from now, is the dispatcher's to claim."""
    for _, fields in reversed(await redis.xrange(keys.bot_turns("nobody"))):
        turn = decode_turn(fields[FIELD_BYTES])
        if turn.game_id == gid:
            [given] = await Deliveries(redis, keys, clock_key(SECRET)).deliver([turn])
            assert given is not None, f"the clock of {gid} was claimed already"
            due = await redis.zscore(keys.clocks(keys.partition(gid)), f"{gid}|4|{TOOK}")
            assert due is not None, f"the dispatcher set no clock for {gid}"
            return int(due)
    raise AssertionError(f"no turn of {gid} in the inbox")


async def claim_when_due(dispatcher: Dispatcher, deadline_ms: int) -> int:
    """Wait until the deadline has passed (by the dispatcher's grace), then sweep the clocks."""
    while time.time() * 1000 < deadline_ms + TIMEOUT_GRACE_MS + 20:
        await asyncio.sleep(0.01)
    return await dispatcher.claim_timeouts()


async def test_a_claim_loses_to_a_move_held_by_a_slow_engine(
    redis: aioredis.Redis, keys: Keys
) -> None:
    query = QueryClient(redis, keys)
    fast = EngineService(redis, keys, consumer="fast", secret=SECRET)
    slow = EngineService(redis, keys, consumer="slow", secret=SECRET)
    dispatcher = Dispatcher(redis, keys, secret=SECRET)
    await new_game(redis, keys, "g1", move_time_ms=600)
    await fast.drain()
    await dispatcher.drain()  # the clock runs from the game's start
    view_deadline = await deadline_of(redis, keys, "g1")
    await CommandClient(redis, keys).send([first_move(keys, "g1")])
    # The slow engine takes the move, beats (it is alive, only slow), and does nothing.
    assert len(await slow.read_new(None)) == 1
    await slow.heartbeat()
    assert await claim_when_due(dispatcher, view_deadline) == 1
    await slow.heartbeat()
    assert await fast.drain() == 1  # the claim; the move comes from the stream, in time
    events = await query.events("g1")
    assert [type(e) for e in events[4:]] == [MovePlayed]
    assert fast.counts.in_time == 1
    # The claim was refused (stale_seq) and, as every refusal, not remembered.
    assert await slow.store.remembered_reply("g1", "clock timeout:g1:4") is None
    # The slow engine wakes up: its copy of the move appends nothing.
    await slow.process(await slow.reader.read(None, reclaim=True) or [])
    await slow.drain()
    assert len(await query.events("g1")) == 5
    assert (await redis.xpending(keys.commands(keys.partition("g1")), ENGINE_GROUP))["pending"] == 0


async def test_a_move_after_the_deadline_is_too_late_and_the_claim_wins(
    redis: aioredis.Redis, keys: Keys
) -> None:
    query = QueryClient(redis, keys)
    engine = EngineService(redis, keys, secret=SECRET)
    dispatcher = Dispatcher(redis, keys, secret=SECRET)
    await new_game(redis, keys, "g2", move_time_ms=300)
    await engine.drain()
    await dispatcher.drain()
    deadline = await deadline_of(redis, keys, "g2")
    while time.time() * 1000 <= deadline + 5:
        await asyncio.sleep(0.01)
    async with CommandClient(redis, keys) as client:
        answer = asyncio.create_task(client.submit(first_move(keys, "g2")))
        await poll(lambda: _pending_or_queued(redis, keys, "g2"))
        await engine.drain()
        reply = await answer
    assert reply.type == "rejected" and reply.code == "too_late", reply
    assert len(await query.events("g2")) == 4  # the late move changed nothing
    assert await claim_when_due(dispatcher, deadline) == 1
    await engine.drain()
    end = (await query.events("g2"))[-1]
    assert isinstance(end, GameEnded) and (end.reason, end.result) == ("time_forfeit", 2)


async def test_a_bot_s_clock_runs_from_the_hand_over(redis: aioredis.Redis, keys: Keys) -> None:
    """The dispatcher gets to the game 400 ms after it started (a backlog): the turn, taken
    from the inbox, gives the bot its whole move time from then, signed, and a move that uses
    it counts; the think time recorded is the bot's, from the hand-over."""
    query = QueryClient(redis, keys)
    engine = EngineService(redis, keys, secret=SECRET)
    dispatcher = Dispatcher(redis, keys, secret=SECRET)
    await new_game(redis, keys, "g4", move_time_ms=300)
    await engine.drain()
    started = (await query.events("g4"))[3].time
    await asyncio.sleep(0.4)
    await dispatcher.drain()
    [(entry_id, fields)] = await redis.xrange(keys.bot_turns("nobody"))
    turn = decode_turn(fields[FIELD_BYTES])
    handed_over = id_ms(entry_id)
    assert handed_over - 20 <= turn.deadline - 300 <= handed_over, (turn, handed_over)
    [given] = await Deliveries(redis, keys, clock_key(SECRET)).deliver([turn])
    assert given is not None and given.deadline >= turn.deadline
    turn = turn.model_copy(update={"deadline": given.deadline, "clock": given.clock})
    signed = given.deadline + SEND_GRACE_MS
    assert stamped_deadline(clock_key(SECRET), "g4", 4, turn.clock) == signed
    assert turn.deadline > started + 300 + 80  # the head event's deadline would be past
    await CommandClient(redis, keys).send([first_move(keys, "g4", turn.clock)])
    await engine.drain()
    events = await query.events("g4")
    assert [type(e) for e in events[4:]] == [MovePlayed], events[4:]
    move = events[4]
    assert isinstance(move, MovePlayed)
    # From the hand-over, not from the game's start 400 ms before: that lag is the platform's.
    assert 0 <= move.think_ms <= move.time - (turn.deadline - 300) < move.time - started - 300


async def test_an_engine_paused_with_sigstop_past_a_deadline(
    redis: aioredis.Redis, fleet: Fleet, keys: Keys
) -> None:
    """The move reaches a blocked engine that is then paused; a second engine and the
    dispatcher's claim must not forfeit the game."""
    query = QueryClient(redis, keys)
    paused = fleet.start("engine")
    await fleet.ready([paused])
    try:
        await new_game(redis, keys, "g3", move_time_ms=1000)
        await poll(lambda: _head_is(query, "g3", 4))
        dispatcher = Dispatcher(redis, keys, secret=SECRET)
        await dispatcher.drain()
        deadline = await deadline_of(redis, keys, "g3")
        fleet.pause(paused)
        await CommandClient(redis, keys).send([first_move(keys, "g3")])
        stream = keys.commands(keys.partition("g3"))
        # Redis hands the move to the paused engine's blocked read: it is pending there.
        await poll(lambda: _pending(redis, stream, 1))
        second = EngineService(redis, keys, consumer="second", secret=SECRET)
        stop_second = asyncio.Event()
        serving = asyncio.create_task(second.run(stop_second))
        try:
            assert await claim_when_due(dispatcher, deadline) == 1
            await poll(lambda: _head_is(query, "g3", 5))
            await asyncio.sleep(0.3)  # the claim, decided after the move, appends nothing
            events = await query.events("g3")
            assert [type(e) for e in events[4:]] == [MovePlayed]
        finally:
            stop_second.set()
            await serving
    finally:
        fleet.stop([paused])  # SIGCONT first: its copy of the move is a duplicate
    assert len(await query.events("g3")) == 5
    await Projector(redis, keys).drain()  # no projector ran: build the views to verify
    assert (await verify(redis, keys)).problems == []


async def test_a_bot_worker_killed_mid_play_loses_no_game_on_time(
    redis: aioredis.Redis, fleet: Fleet, keys: Keys
) -> None:
    services = ServiceSet(redis, keys, [])  # engine, projector, dispatcher; no workers
    workers = [fleet.start("bots", "--bot", "random") for _ in range(2)]
    await fleet.ready(workers)
    await services.start()
    try:
        specs = [("supply-chains", {})]
        ids = await create_games(redis, keys, specs, 8, ["random", "random"], move_time_ms=2000)
        query = QueryClient(redis, keys)

        async def some_moves() -> bool:
            return sum([await query.head(gid) for gid in ids]) >= 8 * 4 + 60

        await poll(some_moves)
        # Make sure the victim holds turns when it dies: paused, Redis still hands it turns
        # (its read is blocked at the server); then kill -9.
        fleet.pause(workers[0])
        await poll(lambda: _pending(redis, keys.bot_turns("random"), 1, group=WORKERS_GROUP))
        fleet.kill(workers[0])
        assert await wait_until_ended(redis, keys, ids, 120, services.failed) == []
    finally:
        await services.stop()
        fleet.stop(workers)
    longest = 0
    for gid in ids:
        events = await query.events(gid)
        end = events[-1]
        assert isinstance(end, GameEnded) and end.reason == "natural", (gid, end)
        times = [e.time for e in events]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(times)))
    assert longest <= 5000, f"a game stalled for {longest} ms"
    assert (await verify(redis, keys)).problems == []


async def _head_is(query: QueryClient, gid: str, seq: int) -> bool:
    return await query.head(gid) >= seq


async def _pending(redis: aioredis.Redis, stream: str, n: int, group: str = ENGINE_GROUP) -> bool:
    summary = await redis.xpending(stream, group)
    return int(summary["pending"]) >= n


async def _pending_or_queued(redis: aioredis.Redis, keys: Keys, gid: str) -> bool:
    return bool(await redis.xlen(keys.commands(keys.partition(gid))) >= 2)


async def test_a_sweep_skips_partitions_with_nothing_due_yet_but_no_delivered_clock(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """The dispatcher's sweeps look at a partition again only when its first clock may be
    due (`LOOK_EVERY_MS` at the latest): a clock it did not write itself, due at once, waits
    for that look (a full sweep, as `drain` runs, takes it at once). A bot's delivery, the
    one clock others write, comes due no sooner than that look, so the quickest clock
    there is (a 1 ms move) is claimed on time by the sweeps alone."""
    clock = {"now": now_ms()}
    engine = EngineService(redis, keys, secret=SECRET, clock=lambda: clock["now"])
    dispatcher = Dispatcher(redis, keys, secret=SECRET, clock=lambda: clock["now"])
    await new_game(redis, keys, "quick", move_time_ms=1)
    await engine.drain()
    await dispatcher.drain()
    assert await dispatcher.claim_timeouts(every=False) == 0
    p = keys.partition("quick")
    clock["now"] += 10
    [turn] = [
        t
        for _, fields in await redis.xrange(keys.bot_turns("nobody"))
        if (t := decode_turn(fields[FIELD_BYTES])).game_id == "quick"
    ]
    delivery = Deliveries(redis, keys, clock_key(SECRET), clock=lambda: clock["now"])
    [given] = await delivery.deliver([turn])
    assert given is not None
    due = int(await redis.zscore(keys.clocks(p), f"quick|4|{TOOK}"))
    assert due - clock["now"] <= LOOK_EVERY_MS + 1, "the test's clock is not the quickest"
    clock["now"] += 20
    await redis.zadd(keys.clocks(p), {"rogue|4": clock["now"] - 1000})
    assert await dispatcher.claim_timeouts(every=False) == 0, "swept a partition not due"
    await redis.zrem(keys.clocks(p), "rogue|4")
    while clock["now"] < due + TIMEOUT_GRACE_MS:
        clock["now"] += 10
        claimed = await dispatcher.claim_timeouts(every=False)
        assert claimed == 0 or clock["now"] >= due + TIMEOUT_GRACE_MS, "claimed early"
    assert claimed == 1, "the delivered clock was not claimed when due"
