"""Bots, bot workers and the dispatcher against a real redis-server.

The random bot's choices are legal and reproducible; a worker answers a turn request with
the expected seq and a command id that makes duplicates harmless, drops stale requests
(log moved on, deadline passed) and survives broken inbox entries, a bot answer no command
can carry and its inbox being deleted; the dispatcher writes turn requests only for bots,
sets aside feed entries that do not fold, and claims a timeout when a seat overruns its move
clock, keeping the clock when the claim cannot be written.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from bots import TurnContext, bot_names, load_bot
from bots.worker import BotWorker
from engine import State, load_game
from schemas.codec import FIELD, FIELD_BYTES, decode_command, decode_turn, encode, unpack
from schemas.commands import ClaimTimeout, CreateGame, PlayMove, SeatPlayer, SeatSpec
from schemas.tokens import bot_token
from schemas.turns import TurnRequest
from services.bus.keys import DISPATCHER_GROUP, WORKERS_GROUP, Keys
from services.bus.secret import shared_secret
from services.cli.pipeline import ServiceSet, create_games
from services.dispatcher import AWAY_PAUSE_S, TIMEOUT_GRACE_MS, Dispatcher
from services.engine_service import EngineService
from tests.conftest import PrimaryAndReplica

KEYS = Keys()

#: Every service of these tests takes its secret from the environment, as a deployment may.
SECRET = b"bots-test-secret"


@pytest.fixture(autouse=True)
def agon_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGON_SECRET", SECRET.decode())


def test_the_registry_knows_the_random_bot_and_refuses_strangers() -> None:
    assert "random" in bot_names()
    assert load_bot("random").name == "random"
    with pytest.raises(ValueError, match=r"unknown bot 'nobody'; known: .*random"):
        load_bot("nobody")


@pytest.mark.parametrize("game", ["teeko", "supply-chains", "overflow", "hexade"])
def test_the_random_bot_plays_legal_reproducible_moves(game: str) -> None:
    bot = load_bot("random")
    state = load_game(game).new_initial_state()
    seq = 4
    while not state.is_terminal and state.ply < 60:
        context = TurnContext("g1", state.seat_of(state.current_player), seq, 0)
        move = bot.choose(state.clone(), context)
        assert move == bot.choose(state.clone(), context), "same game and seq, same move"
        assert move in {str(m) for m in state.legal_moves()}
        state.apply(move)
        seq += 1


def test_the_random_bot_varies_between_games() -> None:
    bot = load_bot("random")
    state = load_game("teeko").new_initial_state()
    moves = {bot.choose(state, TurnContext(f"g{i}", 1, 4, 0)) for i in range(30)}
    assert len(moves) > 5


async def start_game(redis: aioredis.Redis, engine: EngineService, gid: str = "g1") -> None:
    create = CreateGame(
        command_id=f"create-{gid}",
        game_id=gid,
        game="teeko",
        seats=[SeatSpec(kind="bot", name="random")] * 2,
    )
    await redis.xadd(KEYS.commands_for(gid), {FIELD: encode(create)})
    await engine.drain()


def request(gid: str, seq: int, moves: list[str], **kw: Any) -> TurnRequest:
    seat = 1 + len(moves) % 2
    fields: dict[str, Any] = {
        "game_id": gid,
        "game": "teeko",
        "options": {"markers": "8"},
        "moves": moves,
        "seq": seq,
        "seat": seat,
        "colour": seat,
        "bot": "random",
        "token": bot_token(SECRET, gid, seat),
    }
    return TurnRequest(**(fields | kw))


async def commands(redis: aioredis.Redis, gid: str) -> list[PlayMove]:
    rows = await redis.xrange(KEYS.commands_for(gid))
    out = [decode_command(f[FIELD_BYTES]) for _, f in rows]
    return [c for c in out if isinstance(c, PlayMove)]


async def test_a_worker_answers_with_the_expected_seq(redis: aioredis.Redis) -> None:
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    worker = BotWorker(redis, "random", KEYS)
    turn = request("g1", head, [], clock="1800000000000.c0ffee")  # the turn's signed deadline
    await redis.xadd(KEYS.bot_turns("random"), {FIELD: encode(turn)})
    assert await worker.drain() == 1
    [cmd] = await commands(redis, "g1")
    assert (cmd.expected_seq, cmd.seat, cmd.command_id) == (head, 1, f"random:g1:{head}")
    assert cmd.clock == turn.clock  # sent back: the clock runs from the hand-over
    await engine.drain()
    assert await redis.xlen(KEYS.log("g1")) == head + 1
    assert (await redis.xpending(KEYS.bot_turns("random"), WORKERS_GROUP))["pending"] == 0


async def test_a_duplicated_turn_appends_one_move(redis: aioredis.Redis) -> None:
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    worker = BotWorker(redis, "random", KEYS)
    other = BotWorker(redis, "random", KEYS)
    data = encode(request("g1", head, []))
    # Two copies, taken by two workers before the engine runs: both answer, one counts.
    await redis.xadd(KEYS.bot_turns("random"), {FIELD: data})
    await worker.drain()
    await redis.xadd(KEYS.bot_turns("random"), {FIELD: data})
    await other.drain()
    assert len(await commands(redis, "g1")) == 2
    await engine.drain()
    assert await redis.xlen(KEYS.log("g1")) == head + 1
    assert engine.counts.duplicates == 1


async def test_stale_turn_requests_are_dropped(redis: aioredis.Redis) -> None:
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    now = 1_800_000_000_000
    worker = BotWorker(redis, "random", KEYS, clock=lambda: now)
    inbox = KEYS.bot_turns("random")
    await redis.xadd(inbox, {FIELD: encode(request("g1", head - 1, []))})  # log moved on
    # Its clock was claimed before the worker took it (no clock is set for it any more).
    late = request("g1", head, [], deadline=now - 1, since=now - 301, allowance=300)
    await redis.xadd(inbox, {FIELD: encode(late)})
    await redis.xadd(inbox, {FIELD: encode(request("nogame", 3, []))})  # no such log
    assert await worker.drain() == 3
    assert await commands(redis, "g1") == []
    assert worker.stale == 3
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 0


@pytest.mark.parametrize(
    "fields",
    [
        {FIELD: b"\xc1"},
        {FIELD: encode(request("g1", 4, [])).replace(b"turn_request", b"turn_rekwest")},
        {"other": b"x"},
        {FIELD: b"\xa3abc" * 30_000},
    ],
    ids=["not-msgpack", "unknown-type", "no-field", "too-large"],
)
async def test_a_broken_inbox_entry_is_dropped_and_the_worker_goes_on(
    redis: aioredis.Redis, fields: dict[str, bytes]
) -> None:
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    inbox = KEYS.bot_turns("random")
    await redis.xadd(inbox, fields)
    await redis.xadd(inbox, {FIELD: encode(request("g1", head, []))})
    worker = BotWorker(redis, "random", KEYS)
    assert await worker.drain() == 2
    assert len(await commands(redis, "g1")) == 1
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 0


async def test_the_worker_replays_only_new_moves(redis: aioredis.Redis) -> None:
    """A cached position is extended by the request's new moves, never reused wrongly."""
    worker = BotWorker(redis, "random", KEYS)
    state = load_game("teeko").new_initial_state()
    moves: list[str] = []
    for seq in range(4, 12):
        position = worker._position(request("g9", seq, moves))
        assert position.board_string() == state.board_string()
        chosen = worker.bot.choose(position, TurnContext("g9", 1, seq, 0))
        state.apply(chosen)
        moves.append(chosen)
    # A request for an older position (fewer moves than cached) starts again from scratch.
    assert worker._position(request("g9", 5, moves[:1])).ply == 1


async def test_the_dispatcher_sends_turns_to_bots_only(redis: aioredis.Redis) -> None:
    engine = EngineService(redis, KEYS)
    create = CreateGame(
        command_id="c",
        game_id="mixed",
        game="teeko",
        seats=[SeatSpec(kind="bot", name="random"), SeatSpec(kind="human", name="")],
        seed=3,
    )
    await redis.xadd(KEYS.commands_for("mixed"), {FIELD: encode(create)})
    await engine.drain()
    dispatcher = Dispatcher(redis, KEYS)
    await dispatcher.drain()
    # Seat 2 is an open human seat: the game has not started, nobody is to move.
    assert await redis.xlen(KEYS.bot_turns("random")) == 0


async def test_the_dispatcher_writes_a_complete_turn_request(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, ["random", "random"])
    await services.engines[0].drain()
    await services.dispatcher.drain()
    [(_, fields)] = await redis.xrange(KEYS.bot_turns("random"))
    turn = decode_turn(fields[FIELD_BYTES])
    head = await redis.xlen(KEYS.log(gid))
    assert (turn.game_id, turn.seq, turn.seat, turn.colour, turn.moves) == (gid, head, 1, 1, [])
    assert turn.token == bot_token(await shared_secret(redis, KEYS), gid, 1)
    assert turn.token == bot_token(SECRET, gid, 1)
    assert turn.deadline == 0, "no move clock was asked for"


async def test_a_seat_that_overruns_its_clock_forfeits(redis: aioredis.Redis) -> None:
    """A human who never moves: the dispatcher claims the timeout, the engine ends the game."""
    clock = {"now": 1_800_000_000_000}
    engine = EngineService(redis, KEYS, clock=lambda: clock["now"])
    dispatcher = Dispatcher(redis, KEYS, clock=lambda: clock["now"])
    reply = KEYS.reply_stream("t")
    create = CreateGame(
        command_id="c",
        reply_to=reply,
        game_id="slow",
        game="teeko",
        seats=[SeatSpec(kind="human", name="ada"), SeatSpec(kind="bot", name="random")],
        move_time_ms=1000,
    )
    await redis.xadd(KEYS.commands_for("slow"), {FIELD: encode(create)})
    seat = SeatPlayer(command_id="s", reply_to=reply, game_id="slow", seat=1, name="ada")
    await redis.xadd(KEYS.commands_for("slow"), {FIELD: encode(seat)})
    await engine.drain()
    head = await redis.xlen(KEYS.log("slow"))
    await dispatcher.drain()
    clocks = KEYS.clocks(KEYS.partition("slow"))
    assert await redis.zscore(clocks, f"slow|{head}") == clock["now"] + 1000
    clock["now"] += 1000 + TIMEOUT_GRACE_MS - 1
    assert await dispatcher.claim_timeouts() == 0, "not late yet"
    clock["now"] += 1
    assert await dispatcher.claim_timeouts() == 1
    assert await dispatcher.claim_timeouts() == 0, "a clock is claimed once"
    await engine.drain()
    rows = await redis.xrange(KEYS.log("slow"))
    last = unpack(rows[-1][1][FIELD_BYTES])
    assert (last["type"], last["reason"], last["result"]) == ("game_ended", "time_forfeit", 2)
    await dispatcher.drain()
    assert await redis.zcard(clocks) == 0


# -- bad input never stops a consumer, and nothing acknowledged is lost ----------------------
class LongWindedBot:
    """Answers game "rambling" with a move text the command schema refuses (too long)."""

    name = "random"

    def __init__(self) -> None:
        self.plain = load_bot("random")

    def choose(self, state: State, context: TurnContext) -> str:
        if context.game_id == "rambling":
            return "a1" * 40
        return self.plain.choose(state, context)


async def test_a_move_the_schema_refuses_costs_only_its_own_turn(redis: aioredis.Redis) -> None:
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine, "g1")
    await start_game(redis, engine, "rambling")
    head = await redis.xlen(KEYS.log("g1"))
    inbox = KEYS.bot_turns("random")
    await redis.xadd(inbox, {FIELD: encode(request("rambling", head, []))})
    await redis.xadd(inbox, {FIELD: encode(request("g1", head, []))})
    worker = BotWorker(redis, LongWindedBot(), KEYS)
    assert await worker.drain() == 2
    assert [c.game_id for c in await commands(redis, "g1")] == ["g1"]
    assert await commands(redis, "rambling") == []
    assert worker.failed == 1
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 0


async def test_a_feed_entry_that_does_not_fold_is_set_aside(redis: aioredis.Redis) -> None:
    """An event without a seq: the dispatcher dead-letters it and serves the rest of the batch."""
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine, "g1")
    feed = KEYS.feed(KEYS.partition("g1"))
    bogus = msgpack.packb({"type": "move_played", "game_id": "ghost"})
    bogus_id = await redis.xadd(feed, {FIELD: bogus})
    dispatcher = Dispatcher(redis, KEYS)
    await dispatcher.drain()
    [(_, fields)] = await redis.xrange(KEYS.bot_turns("random"))
    assert decode_turn(fields[FIELD_BYTES]).game_id == "g1"
    [(_, dead)] = await redis.xrange(KEYS.reader_dead_letter())
    assert (dead[b"stream"], dead[b"id"], dead[FIELD_BYTES]) == (feed.encode(), bogus_id, bogus)
    assert (await redis.xpending(feed, DISPATCHER_GROUP))["pending"] == 0


async def test_a_timeout_claim_that_cannot_be_sent_keeps_its_clock(redis: aioredis.Redis) -> None:
    """The clock goes only together with the claim: a failed write leaves it for the next try."""
    dispatcher = Dispatcher(redis, KEYS, clock=lambda: 1_800_000_000_000)
    clocks = KEYS.clocks(KEYS.partition("slow"))
    await redis.zadd(clocks, {"slow|3": 1_700_000_000_000})
    await redis.set(KEYS.commands_for("slow"), "not a stream")  # every XADD to it fails
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await dispatcher.claim_timeouts()
    assert await redis.zscore(clocks, "slow|3") is not None
    await redis.delete(KEYS.commands_for("slow"))
    assert await dispatcher.claim_timeouts() == 1
    [(_, fields)] = await redis.xrange(KEYS.commands_for("slow"))
    claim = decode_command(fields[FIELD_BYTES])
    assert isinstance(claim, ClaimTimeout) and claim.expected_seq == 3
    # The clock is replaced by its re-check, a second later: the engine may refuse a claim.
    assert [m for m, _ in await redis.zrange(clocks, 0, -1, withscores=True)] == [b"slow|3|again"]


async def test_a_worker_outlives_its_inbox(redis: aioredis.Redis) -> None:
    """The inbox and its group deleted under a running worker: it makes them again."""
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    inbox = KEYS.bot_turns("random")
    worker = BotWorker(redis, "random", KEYS, block_ms=20)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        while not await redis.exists(inbox):
            await asyncio.sleep(0.01)
        await redis.delete(inbox)
        await redis.xadd(inbox, {FIELD: encode(request("g1", head, []))})
        async with asyncio.timeout(10):
            while not await commands(redis, "g1"):
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
    assert worker.moves_sent == 1


# -- the dispatcher through failed writes and failovers -----------------------------------------
async def turns(redis: aioredis.Redis) -> list[TurnRequest]:
    return [decode_turn(f[FIELD_BYTES]) for _, f in await redis.xrange(KEYS.bot_turns("random"))]


async def test_an_event_that_replaced_the_cached_one_is_folded_from_the_log(
    redis: aioredis.Redis,
) -> None:
    # A failover: the head event the dispatcher read is lost with its master, and the new
    # master's log holds another event of that seq (the same command, at another time).
    await start_game(redis, EngineService(redis, KEYS))
    dispatcher = Dispatcher(redis, KEYS)
    await dispatcher.drain()
    [sent] = await turns(redis)
    rows = await redis.xrange(KEYS.log("g1"))
    head = unpack(rows[-1][1][FIELD_BYTES])
    other = msgpack.packb(head | {"time": head["time"] + 1}, use_bin_type=True)
    await redis.delete(KEYS.log("g1"))
    for entry_id, fields in rows[:-1]:
        await redis.xadd(KEYS.log("g1"), fields, id=entry_id)
    await redis.xadd(KEYS.log("g1"), {FIELD: other}, id=rows[-1][0])
    await redis.xadd(KEYS.feed(KEYS.partition("g1")), {FIELD: other})
    await dispatcher.drain()
    again = (await turns(redis))[1:]
    assert [(t.game_id, t.seq) for t in again] == [(sent.game_id, sent.seq)], again


async def test_with_replicas_a_batch_is_acknowledged_once_a_replica_holds_its_turns(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    redis, replica = primary_and_replica.redis, primary_and_replica.replica
    await start_game(redis, EngineService(redis, KEYS))
    feed = KEYS.feed(KEYS.partition("g1"))
    dispatcher = Dispatcher(redis, KEYS, replicas=1, replica_timeout_ms=100)
    await dispatcher.drain()  # the server has no replica to confirm them: held
    assert (await redis.xpending(feed, DISPATCHER_GROUP))["pending"] == await redis.xlen(feed)
    assert dispatcher.turns_sent == 0
    await primary_and_replica.follow()
    await asyncio.sleep(AWAY_PAUSE_S)  # then read again
    await dispatcher.drain()
    assert (await redis.xpending(feed, DISPATCHER_GROUP))["pending"] == 0
    # The turn again: the failed batch's (on the server, unconfirmed) is not trusted.
    assert await replica.xlen(KEYS.bot_turns("random")) == 2


async def test_with_replicas_a_worker_acknowledges_a_turn_once_a_replica_holds_its_move(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    redis, replica = primary_and_replica.redis, primary_and_replica.replica
    await start_game(redis, EngineService(redis, KEYS))
    inbox = KEYS.bot_turns("random")
    await redis.xadd(inbox, {FIELD: encode(request("g1", await redis.xlen(KEYS.log("g1")), []))})
    worker = BotWorker(redis, "random", KEYS, replicas=1, replica_timeout_ms=100)
    await worker.drain()  # the server has no replica to confirm the move: kept for later
    assert [decode_turn(e.data).game_id for e in worker._held if e.data] == ["g1"]
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 1
    await primary_and_replica.follow()
    worker.reader.recover()  # as the loop does after a failed batch
    worker.forget()
    await worker.drain()
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 0
    # Answered again under the same command id: the engine takes the first only.
    rows = await replica.xrange(KEYS.commands_for("g1"))
    moves = [decode_command(f[FIELD_BYTES]) for _, f in rows]
    ids = [c.command_id for c in moves if isinstance(c, PlayMove)]
    assert len(ids) == 2 and len(set(ids)) == 1, ids


async def test_with_replicas_a_turn_whose_unconfirmed_move_was_played_is_held_not_dropped(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    # The move reached the master and the engine played it, but no replica holds either:
    # the log's head past the turn may die with its master. The turn is not done until a
    # replica holds the move: its command is sent again as it was, and the turn held.
    redis, replica = primary_and_replica.redis, primary_and_replica.replica
    engine = EngineService(redis, KEYS)
    await start_game(redis, engine)
    head = await redis.xlen(KEYS.log("g1"))
    inbox = KEYS.bot_turns("random")
    await redis.xadd(inbox, {FIELD: encode(request("g1", head, []))})
    worker = BotWorker(redis, "random", KEYS, replicas=1, replica_timeout_ms=100)
    await worker.drain()  # no replica confirms the move: held
    await engine.drain()
    assert await redis.xlen(KEYS.log("g1")) == head + 1
    await worker.tick()
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 1, "acknowledged unheld"
    await primary_and_replica.follow()
    await worker.tick()
    assert (await redis.xpending(inbox, WORKERS_GROUP))["pending"] == 0
    assert await replica.xlen(KEYS.log("g1")) == head + 1
    first, *again = await commands(replica, "g1")
    assert again and all(c == first for c in again), "not the same command sent again"
