"""A bot's clock starts when its turn reaches it: the platform's backlog is never the bot's.

The dispatcher hands a turn to a bot's inbox; the worker that takes it (part of the platform)
starts its clock then (`services.bus.delivery`). A turn that waited behind the platform past
the dispatcher's deadline is still the bot's whole allowance; a turn the platform never got
to its served bot in time ends the game as `interrupted` (not scored); a bot nobody serves,
or one that had its turn and overran it, loses on time. Real Redis, real time, services
driven in-process.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from bots.worker import BotWorker
from schemas.codec import FIELD_BYTES, decode_turn
from schemas.commands import CreateGame, SeatSpec
from schemas.events import GameEnded, MovePlayed
from schemas.tokens import MAX_GRACE_MS, SEND_GRACE_MS, clock_key, stamped_deadline
from services.bus.clients import CommandClient, QueryClient
from services.bus.delivery import Deliveries, latest
from services.bus.keys import Keys
from services.bus.reader import Entry
from services.bus.text import now_ms
from services.dispatcher import TAKEOVER_MS, TIMEOUT_GRACE_MS, Dispatcher
from services.engine_service import EngineService

SECRET = b"delivery-test-secret"
#: Random's move limit in these games.
LIMIT_MS = 300


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace)


class Arena:
    """An engine, a dispatcher and a worker of `random`, each drained by hand, on one
    clock that a test may move forward (`skip`)."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis, self.keys = redis, keys
        self.skipped = 0
        self.engine = EngineService(redis, keys, secret=SECRET, clock=self.now)
        self.dispatcher = Dispatcher(redis, keys, secret=SECRET, clock=self.now)
        self.worker = BotWorker(redis, "random", keys, clock_key=clock_key(SECRET), clock=self.now)
        self.query = QueryClient(redis, keys)

    def now(self) -> int:
        return now_ms() + self.skipped

    async def claim_at(self, due: int) -> int:
        """Move the clock past `due` (by the dispatcher's grace) and sweep the clocks."""
        self.skipped += max(0, due + TIMEOUT_GRACE_MS + 1 - self.now())
        return await self.dispatcher.claim_timeouts()

    async def start(self, gid: str) -> None:
        """A game of `random` against itself, its first turn in the inbox."""
        create = CreateGame(
            command_id=f"create:{gid}", game_id=gid, game="teeko",
            seats=[SeatSpec(kind="bot", name="random")] * 2, move_time_ms=LIMIT_MS,
        )  # fmt: skip
        await CommandClient(self.redis, self.keys).send([create])
        await self.engine.drain()
        await self.dispatcher.drain()

    async def clock(self, gid: str, seq: int = 4) -> dict[str, int]:
        """The game's clocks in the clock set: member kind ("" or "took") -> due time."""
        members = await self.redis.zrange(
            self.keys.clocks(self.keys.partition(gid)), 0, -1, withscores=True
        )
        out = {}
        for member, score in members:
            parts = member.decode().split("|")
            if parts[:2] == [gid, str(seq)]:
                out[parts[2] if len(parts) > 2 else ""] = int(score)
        return out

    async def end(self, gid: str) -> GameEnded:
        await self.engine.drain()
        last = (await self.query.events(gid))[-1]
        assert isinstance(last, GameEnded), last
        return last


async def test_a_turn_that_waited_behind_the_platform_gets_its_whole_time(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """The worker takes the turn 600 ms after the dispatcher handed it over, twice the move
    limit: the bot still has the whole limit from then, signed, and its move counts."""
    arena = Arena(redis, keys)
    await arena.start("g1")
    [(_, fields)] = await redis.xrange(keys.bot_turns("random"))
    turn = decode_turn(fields[FIELD_BYTES])
    assert await arena.clock("g1") == {"": latest(turn)}  # due once no delivery could be
    await asyncio.sleep(0.6)  # the platform's backlog: past the dispatcher's deadline
    assert await arena.worker.drain() == 1
    took = await arena.clock("g1")
    assert set(took) == {"took"}
    assert took["took"] >= turn.since + 600 + LIMIT_MS + SEND_GRACE_MS, (turn, took)
    await arena.engine.drain()
    events = await arena.query.events("g1")
    assert isinstance(events[4], MovePlayed), events[4:]
    # The bot's time is its own; the platform's lag is recorded beside it, for all to see.
    assert events[4].think_ms <= LIMIT_MS and events[4].lag_ms >= 600, events[4]
    assert arena.worker.stats()["lag_p50_ms"] >= 600


async def test_a_paced_worker_answers_no_sooner_than_its_pace_on_the_bot_s_clock(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """`--pace-ms`: the move leaves a pace after the turn was taken, and the pace is the
    bot's time (it thought that long), not the platform's lag."""
    arena = Arena(redis, keys)
    pace_ms = LIMIT_MS // 3
    arena.worker = BotWorker(
        redis, "random", keys, clock_key=clock_key(SECRET), clock=arena.now, pace_ms=pace_ms
    )
    await arena.start("g0")
    began = now_ms()
    assert await arena.worker.drain() == 1
    assert now_ms() - began >= pace_ms
    await arena.engine.drain()
    move = (await arena.query.events("g0"))[4]
    assert isinstance(move, MovePlayed), move
    assert pace_ms <= move.think_ms <= LIMIT_MS and move.lag_ms < pace_ms, move


async def test_a_batch_with_a_turn_a_master_held_back_is_not_paced(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A turn held back while its game's master failed over has had its clock running all
    along: the batch that answers it is not paced (the pace would be the bot's to pay)."""
    arena = Arena(redis, keys)
    pace_ms = 10_000
    arena.worker = BotWorker(
        redis, "random", keys, clock_key=clock_key(SECRET), clock=arena.now, pace_ms=pace_ms
    )
    await arena.worker.setup()
    for gid in ("h1", "h2"):
        await arena.start(gid)
    inbox = keys.bot_turns("random")
    held, fresh = [
        Entry(inbox, entry_id, fields[FIELD_BYTES])
        for entry_id, fields in await redis.xrange(inbox)
    ]
    arena.worker._held = [held]  # as a master that did not answer left it
    began = now_ms()
    await arena.worker.process([fresh])
    assert now_ms() - began < pace_ms // 2, "paced a batch holding a held-back turn"
    assert arena.worker.moves_sent == 2


async def test_a_served_bot_s_turn_the_platform_never_delivered_ends_as_interrupted(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """The worker is alive (it beats) but never took the turn before the deadline: the game
    ends as the platform's (`interrupted`), and the turn taken afterwards is dropped."""
    arena = Arena(redis, keys)
    await arena.start("g2")
    await arena.worker.setup()
    await arena.worker.heartbeat()
    assert await arena.claim_at((await arena.clock("g2"))[""]) == 1
    end = await arena.end("g2")
    assert (end.reason, end.result, end.fault) == ("interrupted", 0, 0), end
    assert "did not hand seat 1 its turn" in end.detail
    await arena.worker.drain()
    assert (arena.worker.stale, arena.worker.moves_sent) == (1, 0)


async def test_an_unserved_bot_or_one_that_overran_its_delivered_turn_loses_on_time(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """No worker of the bot beats: its undelivered turn is its loss. A turn delivered (its
    clock marked taken) and not answered in time is its loss too."""
    arena = Arena(redis, keys)
    await arena.start("g3")
    await arena.start("g4")
    [_, (_, fields)] = await redis.xrange(keys.bot_turns("random"))
    turn = decode_turn(fields[FIELD_BYTES])
    assert turn.game_id == "g4"
    [given] = await Deliveries(redis, keys, clock_key(SECRET)).deliver([turn])
    assert given is not None
    due = given.deadline + SEND_GRACE_MS  # the platform's lag on the way back is forgiven
    assert stamped_deadline(clock_key(SECRET), "g4", 4, given.clock) == due
    assert await arena.clock("g4") == {"took": due}
    assert await arena.claim_at(max(due, *(await arena.clock("g3")).values())) == 2
    for gid in ("g3", "g4"):
        end = await arena.end(gid)
        assert (end.reason, end.result, end.fault) == ("time_forfeit", 2, 1), (gid, end)


async def test_a_stuck_platform_gives_at_most_the_maximum_grace(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A turn delivered long after its event gets no more than `MAX_GRACE_MS` past the head
    event's deadline; a second delivery (another stream) keeps the first deadline."""
    arena = Arena(redis, keys)
    await arena.start("g5")
    [(_, fields)] = await redis.xrange(keys.bot_turns("random"))
    turn = decode_turn(fields[FIELD_BYTES])
    deliveries = Deliveries(redis, keys, clock_key(SECRET), clock=lambda: turn.since + 60_000)
    [first] = await deliveries.deliver([turn])
    assert first is not None and first.deadline == latest(turn) - SEND_GRACE_MS
    assert latest(turn) == turn.since + LIMIT_MS + MAX_GRACE_MS
    deliveries.clock = lambda: turn.since + 1
    [again] = await deliveries.deliver([turn])
    assert again == first


async def test_a_warm_up_holds_a_first_turn_once_and_reconnecting_buys_no_time(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """The gateway's warm-up holds a seat's first turn in its game (due at the latest) and
    starts it when the turn itself is delivered, on whichever stream, once: a stream that
    delivers without a hold (another stream, a reconnection with `?ready=`) starts it then,
    and nothing later starts it again. A later turn of the seat is never held."""
    arena = Arena(redis, keys)
    await arena.start("g6")
    [(_, fields)] = await redis.xrange(keys.bot_turns("random"))
    first = decode_turn(fields[FIELD_BYTES])
    now = [first.since + 10]
    deliveries = Deliveries(redis, keys, clock_key(SECRET), clock=lambda: now[0])
    [held] = await deliveries.deliver([first], hold=True)
    assert held is not None and held.deadline == latest(first) - SEND_GRACE_MS
    now[0] += 2_000  # the bot loads the game; or another stream gets the turn at once
    [given] = await deliveries.deliver([first])
    assert given is not None and given.deadline == now[0] + LIMIT_MS
    now[0] += 5_000  # a reconnection, a second warm-up: the clock is not started again
    for again in (
        await deliveries.deliver([first], hold=True),
        await deliveries.deliver([first]),
    ):
        assert again == [given]
    later = first.model_copy(update={"moves": ["C3", "D4"], "seq": 99})
    await redis.zadd(keys.clocks(keys.partition("g6")), {"g6|99": latest(later)})
    [not_held] = await deliveries.deliver([later], hold=True)
    assert not_held is not None and not_held.deadline == now[0] + LIMIT_MS


async def test_a_clock_set_again_for_a_delivered_turn_goes_and_a_claimed_one_is_counted(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A dispatcher that sends a delivered turn again (its cache lost) sets its plain clock
    again: the next delivery removes it, so it can never come due as undelivered. A turn
    whose clock was claimed first counts as one the platform did not deliver."""
    arena = Arena(redis, keys)
    await arena.start("g7")
    [(_, fields)] = await redis.xrange(keys.bot_turns("random"))
    turn = decode_turn(fields[FIELD_BYTES])
    deliveries = Deliveries(redis, keys, clock_key(SECRET), clock=arena.now)
    [given] = await deliveries.deliver([turn])
    clocks = keys.clocks(keys.partition("g7"))
    await redis.zadd(clocks, {"g7|4": latest(turn)})  # the turn sent again
    assert await deliveries.deliver([turn]) == [given]
    assert set(await arena.clock("g7")) == {"took"}
    await redis.zrem(clocks, "g7|4|took")
    await redis.zadd(clocks, {"g7|4|again": latest(turn)})  # claimed before delivery
    assert await deliveries.deliver([turn]) == [None]
    assert deliveries.lag.undelivered == 1
    await redis.zrem(clocks, "g7|4|again")  # the game moved on: nothing to count
    assert await deliveries.deliver([turn]) == [None]
    assert deliveries.lag.undelivered == 1


async def test_a_turn_taken_over_from_a_worker_that_died_with_it_gets_its_whole_time_again(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """A worker takes a turn (its clock starts) and is killed before it answers. Another
    worker claims the turn once the first counts as dead, past the first deadline: what the
    dead worker held was the platform's time, so the bot gets its whole time again from the
    takeover (signed), and its move counts instead of losing on time."""
    arena = Arena(redis, keys)
    await arena.start("g8")
    dead = BotWorker(redis, "random", keys, clock_key=clock_key(SECRET), clock=arena.now)
    await dead.setup()
    [entry] = await dead.reader.read(None)  # Redis delivered it to the doomed worker
    assert entry.data is not None and not entry.taken_over
    turn = decode_turn(entry.data)
    deliveries = Deliveries(redis, keys, clock_key(SECRET), clock=arena.now)
    [first] = await deliveries.deliver([turn])  # the turn reached it; then it died
    assert first is not None
    arena.skipped += LIMIT_MS + SEND_GRACE_MS + 100  # the takeover comes past that deadline
    await asyncio.sleep(0.6)  # pending long enough to be claimed; the dead one never beat
    assert await arena.worker.drain() == 1
    assert arena.worker.reader.claimed == 1 and arena.worker.moves_sent == 1
    took = (await arena.clock("g8"))["took"]
    assert took > first.deadline + SEND_GRACE_MS + LIMIT_MS, (first, took)
    await arena.engine.drain()
    events = await arena.query.events("g8")
    assert len(events) > 4 and isinstance(events[4], MovePlayed), events[4:]


async def test_a_clock_that_comes_due_with_a_dead_worker_waits_for_the_takeover(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """The worker that took the turn died, and its clock came due before a live worker took
    the turn over (a move limit shorter than that takes): the dispatcher claims nothing and
    sets the clock again for the takeover, whose delivery starts the bot's time anew."""
    arena = Arena(redis, keys)
    await arena.start("g9")
    dead = BotWorker(redis, "random", keys, clock_key=clock_key(SECRET), clock=arena.now)
    await dead.setup()
    [entry] = await dead.reader.read(None)
    assert entry.data is not None
    [first] = await Deliveries(redis, keys, clock_key(SECRET), clock=arena.now).deliver(
        [decode_turn(entry.data)]
    )
    assert first is not None
    await arena.worker.setup()
    await arena.worker.heartbeat()  # a live worker serves the bot
    assert await arena.claim_at(first.deadline + SEND_GRACE_MS) == 0
    assert (await arena.clock("g9"))["took"] >= arena.now() + TAKEOVER_MS - 100
    await asyncio.sleep(0.6)  # pending long enough to be claimed from the dead worker
    assert await arena.worker.drain() == 1 and arena.worker.moves_sent == 1
    await arena.engine.drain()
    events = await arena.query.events("g9")
    assert len(events) > 4 and isinstance(events[4], MovePlayed), events[4:]
    # A turn pending with a live worker that overran it is the bot's loss, as before.
    await arena.start("g10")
    read = await arena.worker.reader.read(None)  # the live worker has it, and overruns
    [held] = [t for e in read if e.data and (t := decode_turn(e.data)).game_id == "g10"]
    [given] = await Deliveries(redis, keys, clock_key(SECRET), clock=arena.now).deliver([held])
    assert given is not None
    await arena.worker.heartbeat()
    assert await arena.claim_at(given.deadline + SEND_GRACE_MS) == 1
    end = await arena.end("g10")
    assert (end.reason, end.fault) == ("time_forfeit", 1), end
