"""The bus: the command and query clients, dead consumers, and read models by registry.

Against the session's real redis-server, one key prefix per test.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MovedError, RedisClusterException

from schemas.commands import CreateGame, SeatSpec
from services.bus import reader as reader_module
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import ReplicasBehind
from services.bus.consumer import StreamConsumer
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.presence import ALIVE_MS, beat
from services.bus.reader import Entry, GroupReader
from services.bus.scripts import Script, confirmed, each_confirmed
from services.bus.text import now_ms
from services.cli.pipeline import ServiceSet, create_games
from services.engine_service import EngineService
from services.gamelog.fold import GameFold
from services.projector import Projector, models, rebuild, verify
from tests.conftest import PrimaryAndReplica
from tests.support.commandstats import calls
from tests.support.gate import Gate

BOTS = [SeatSpec(kind="bot", name="random"), SeatSpec(kind="bot", name="random")]


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace, partitions=4)


@pytest.fixture
async def closing() -> AsyncIterator[Callable[[GroupReader], GroupReader]]:
    """Readers closed at the end of the test: a claim pass a read started stops with it."""
    opened: list[GroupReader] = []

    def add(reader: GroupReader) -> GroupReader:
        opened.append(reader)
        return reader

    yield add
    for reader in opened:
        await reader.close()


def create(gid: str) -> CreateGame:
    return CreateGame(command_id=f"create-{gid}", game_id=gid, game="teeko", seats=BOTS)


async def g1_sent(redis: aioredis.Redis, keys: Keys) -> str:
    """Game g1's creation sent to the engines; the command stream it waits in."""
    await CommandClient(redis, keys).send([create("g1")])
    return keys.commands(keys.partition("g1"))


def engine_reader(redis: aioredis.Redis, keys: Keys, stream: str, name: str) -> GroupReader:
    """A reader of `stream` in the engines' group, as consumer `name`."""
    return GroupReader(redis, [stream], ENGINE_GROUP, name, heartbeats=keys.processes())


async def test_a_late_reply_is_asked_for_again_with_the_same_id(
    redis: aioredis.Redis, keys: Keys
) -> None:
    engine = EngineService(redis, keys, secret=b"s")
    async with CommandClient(redis, keys, timeout_s=0.2) as client:
        asking = asyncio.create_task(client.submit(create("g1"), timeout_s=0.2))
        stream = keys.commands(keys.partition("g1"))
        async with asyncio.timeout(10):  # the first wait runs out: the command is sent again
            while await redis.xlen(stream) < 2:
                await asyncio.sleep(0.02)
        # Every copy (a slow first drain lets the client send a third) ...
        copies = await engine.drain()
        reply = await asking
    assert copies >= 2
    assert reply.type == "accepted" and reply.seq == 4
    assert await QueryClient(redis, keys).head("g1") == 4  # ... created the game once
    assert engine.counts.duplicates == copies - 1


async def test_no_reply_at_all_is_a_timeout_naming_the_command(
    redis: aioredis.Redis, keys: Keys
) -> None:
    async with CommandClient(redis, keys) as client:
        with pytest.raises(TimeoutError, match="create-g1"):
            await client.submit_many([create("g1")], timeout_s=0.05, retries=1)


async def test_single_commands_sent_together_each_land_once_and_fail_alone(
    redis: aioredis.Redis, keys: Keys
) -> None:
    """Concurrent one-command sends go out in one pipeline; each lands once, and a failing
    XADD (here to a partition's command stream that is no stream) fails its own senders
    only."""
    ids = [f"g{i}" for i in range(40)]
    broken = keys.commands_for(ids[7])
    await redis.set(broken, "not a stream")
    client = CommandClient(redis, keys)
    results = await asyncio.gather(
        *(client.send([create(gid)]) for gid in ids), return_exceptions=True
    )
    failed = [gid for gid, r in zip(ids, results, strict=True) if isinstance(r, Exception)]
    lost = [gid for gid in ids if keys.commands_for(gid) == broken]
    assert failed == lost and 0 < len(lost) < len(ids)
    assert all("WRONGTYPE" in str(results[ids.index(gid)]) for gid in lost)
    sent: list[str] = []
    for p in keys.all_partitions():
        if keys.commands(p) != broken:
            for _, fields in await redis.xrange(keys.commands(p)):
                sent.append(CreateGame.model_validate(msgpack.unpackb(fields[b"m"])).game_id)
    assert sorted(sent) == sorted(set(ids) - set(lost))


async def test_closing_a_client_stops_the_sends_it_has_in_flight(
    redis_server: EmbeddedRedis, redis_db: int, keys: Keys
) -> None:
    """A send whose sender gave up (a driver cancelled) while Redis had not answered is
    stopped when the client closes, its connection with it: nothing of it outlives the
    client, to be collected later with a socket still open; one waiting for the next
    pipeline, or coming while the client closes, is told it was not sent."""
    async with Gate(redis_server.port) as gate:
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{gate.port}/{redis_db}")
        await gate.waves(asyncio.gather(redis.ping(), redis.ping()))  # two connections
        client = CommandClient(redis, keys)
        sender = asyncio.create_task(client.send([create("g1")]))
        async with asyncio.timeout(10):
            while not gate.holds(b"XADD"):
                await asyncio.sleep(0.01)
        queued = asyncio.create_task(client.send([create("g2")]))  # for the next pipeline
        await asyncio.sleep(0)
        assert client._outbox, "the second send did not wait for the next pipeline"
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        closing = asyncio.create_task(client.close())
        await asyncio.sleep(0)  # the close under way, stopping the XADD on its way ...
        late = asyncio.create_task(client.send([create("g3")]))  # ... a sender comes
        async with asyncio.timeout(10):
            while not gate.holds(b"DEL"):  # its last word to Redis (on a connection made anew)
                assert not closing.done(), "the client closed without deleting its reply stream"
                gate.release(but=b"XADD")
                await asyncio.sleep(0.01)
        sends = sum("_send_batch" in repr(t.get_coro()) for t in asyncio.all_tasks())
        gate.release()
        await closing
        await redis.aclose()
    assert sends == 0, f"{sends} sends outlive their client"
    with pytest.raises(ConnectionError, match="closed before sending"):
        await queued
    with pytest.raises(ConnectionError):
        await late


async def test_a_closed_client_sends_again(redis: aioredis.Redis, keys: Keys) -> None:
    """Closing stops the sends of that moment only: concurrent sends afterwards, queued
    behind one another's pipelines, all land."""
    client = CommandClient(redis, keys)
    await client.send([create("g0")])
    await client.close()
    ids = [f"g{i}" for i in range(1, 21)]
    sends = [asyncio.create_task(client.send([create(gid)])) for gid in ids[:10]]
    while not client._flushing:  # a pipeline on its way ...
        await asyncio.sleep(0)
    sends += [asyncio.create_task(client.send([create(gid)])) for gid in ids[10:]]  # ... behind
    await asyncio.gather(*sends)
    sent = {
        CreateGame.model_validate(msgpack.unpackb(fields[b"m"])).game_id
        for p in keys.all_partitions()
        for _, fields in await redis.xrange(keys.commands(p))
    }
    assert sent == {"g0", *ids}


async def test_the_game_list_filters_and_pages_across_partitions(
    redis: aioredis.Redis, keys: Keys
) -> None:
    specs = [("teeko", {}), ("overflow", {"size": "3"})]
    ids = await create_games(redis, keys, specs, 6, ["random", "random"])
    await ServiceSet(redis, keys, ["random"]).drain()
    query = QueryClient(redis, keys)
    assert len({keys.partition(gid) for gid in ids}) > 1  # the list must merge partitions

    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = await query.games(limit=5, cursor=cursor)
        seen += [v["game_id"] for v in page.games]
        cursor = page.cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == len(set(seen)) == 12
    created = [(v["created"], v["game_id"]) for v in await query.views(seen)]  # type: ignore[index]
    assert created == sorted(created, reverse=True)  # newest first

    teeko = await query.games(game="teeko", limit=50)
    assert {v["game"] for v in teeko.games} == {"teeko"} and len(teeko.games) == 6
    ended_overflow = await query.games(status="ended", game="overflow", limit=50)
    assert len(ended_overflow.games) == 6
    assert {v["status"] for v in ended_overflow.games} == {"ended"}
    assert (await query.games(status="playing", limit=50)).games == []
    assert len((await query.games(player="random", limit=50)).games) == 12
    assert (await query.games(player="nobody", limit=50)).games == []
    with pytest.raises(ValueError, match="status"):
        await query.games(status="over")
    with pytest.raises(ValueError, match="cursor"):
        await query.games(cursor="yesterday")
    results = await query.bot_results("random")
    assert results["games"] == 24  # both seats, every game
    assert results["wins"] + results["losses"] + results["draws"] + results["aborted"] == 24


async def test_entries_delivered_to_a_reader_whose_answer_was_lost_are_taken_back(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    await CommandClient(redis, keys).send([create("g1"), create("g2")])
    stream = keys.commands(keys.partition("g1"))
    reader = closing(engine_reader(redis, keys, stream, "alive"))
    await reader.setup()
    # Redis delivers to "alive", but the answer never reaches its reader (a dropped
    # connection, and the client retried the read): the entries wait with nobody on them.
    lost: Any = await redis.xreadgroup(ENGINE_GROUP, "alive", {stream: ">"})
    assert lost and await reader.read(None) == []
    await asyncio.sleep(0.6)  # idle past dead_idle_ms, far short of claim_idle_ms
    taken = await reader.reclaim()
    assert sorted(e.entry_id for e in taken) == sorted(i for i, _ in lost[0][1])
    assert not any(e.taken_over for e in taken), "its own, from no consumer that died"
    assert await reader.reclaim() == [], "entries it received are its own work, not lost"


async def test_a_reader_of_many_streams_remembers_every_entry_of_its_reads(
    redis: aioredis.Redis,
    keys: Keys,
    closing: Callable[[GroupReader], GroupReader],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a reader remembers having received grows with its streams: a whole read still
    in hand (here 24 entries, against a floor of 4) is its own work, not entries whose
    answer was lost (a fixed 20,000 ids fell short of two reads of 64 partitions at 256)."""
    monkeypatch.setattr(reader_module, "SEEN_IDS", 4)
    streams = [keys.commands(p) for p in range(3)]
    for stream in streams:
        for _ in range(8):
            await redis.xadd(stream, {"m": b"x"})
    reader = closing(
        GroupReader(redis, streams, ENGINE_GROUP, "many", heartbeats=keys.processes(), count=8)
    )
    await reader.setup()
    assert len(await reader.read(None)) == 24
    await asyncio.sleep(0.6)  # idle past dead_idle_ms, far short of claim_idle_ms
    assert await reader.reclaim() == []


async def test_only_entries_of_a_consumer_that_died_count_as_taken_over(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    """An entry stuck with a live consumer (`claim_idle_ms`) is claimed too, but what that
    consumer did with it is not lost: it is no takeover (a bot's clock keeps running)."""
    stream = await g1_sent(redis, keys)
    stuck = closing(engine_reader(redis, keys, stream, "stuck"))
    assert len(await stuck.read(None)) == 1
    await beat(redis, keys, "stuck", "engine", ENGINE_GROUP)
    other = closing(
        GroupReader(
            redis, [stream], ENGINE_GROUP, "other", heartbeats=keys.processes(), claim_idle_ms=300
        )
    )
    await asyncio.sleep(0.4)  # past claim_idle_ms; "stuck" beat 0.4 s ago: alive
    [taken] = await other.reclaim()
    assert not taken.taken_over


async def test_a_stopped_reader_that_goes_on_reads_first_what_it_was_delivered(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    # A service stopped mid-read (its lane cancelled after Redis delivered, before the
    # answer came), then drained: the drain must handle what is pending with its consumer.
    stream = await g1_sent(redis, keys)
    reader = closing(engine_reader(redis, keys, stream, "alive"))
    await reader.setup()
    lost: Any = await redis.xreadgroup(ENGINE_GROUP, "alive", {stream: ">"})
    await reader.close()
    again = await reader.read(None)
    assert [e.entry_id for e in again] == [i for i, _ in lost[0][1]]


async def started(reader: GroupReader) -> GroupReader:
    """The reader with its groups made."""
    await reader.setup()
    return reader


async def read_ahead(
    redis: aioredis.Redis, reader: GroupReader, meanwhile: Callable[[], None] = lambda: None
) -> None:
    """A write's round trip (a PING here) with the reader's next read riding in it."""
    pipe = redis.pipeline(transaction=False)
    pipe.ping()
    take = reader.read_ahead(pipe)
    assert take is not None, "a single server: the read rides"
    answers = await pipe.execute()
    meanwhile()
    take(answers.pop())


async def test_entries_read_ahead_in_a_writes_round_trip_need_no_read_of_their_own(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    stream = keys.commands(0)
    reader = await started(closing(engine_reader(redis, keys, stream, "r")))
    sent = [await redis.xadd(stream, {"m": b"x"}) for _ in range(3)]
    await read_ahead(redis, reader)
    before = await calls(redis, "xreadgroup")
    assert [e.entry_id for e in await reader.read(None)] == sent
    assert await calls(redis, "xreadgroup") == before, "handed over with no read of its own"
    assert await reader.read(None) == [], "and only once"


async def test_an_ack_carries_the_next_read(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    stream = keys.commands(0)
    reader = await started(closing(engine_reader(redis, keys, stream, "r")))
    await redis.xadd(stream, {"m": b"a"})
    first = await reader.read(None)
    later = await redis.xadd(stream, {"m": b"b"})
    reads = await calls(redis, "xreadgroup")
    await reader.ack(first)
    assert await calls(redis, "xreadgroup") == reads + 1, "the next read rode with the ack"
    assert (await redis.xpending(stream, ENGINE_GROUP))["pending"] == 1, "the ack landed"
    assert [e.entry_id for e in await reader.read(None)] == [later]
    assert await calls(redis, "xreadgroup") == reads + 1, "and no read of its own"


async def test_entries_read_ahead_while_their_stream_came_to_recover_come_once(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    stream = keys.commands(0)
    reader = await started(closing(engine_reader(redis, keys, stream, "r")))
    sent = await redis.xadd(stream, {"m": b"x"})
    # A claim beside the loop took entries while the write was under way.
    await read_ahead(redis, reader, meanwhile=reader.recover)
    [own] = await reader.read(None)
    assert own.entry_id == sent
    await reader.ack([own])
    assert await reader.read(None) == [], "it came once"


async def test_entries_read_ahead_come_once_after_a_recovery_and_stay_for_a_new_owner(
    redis: aioredis.Redis, keys: Keys, closing: Callable[[GroupReader], GroupReader]
) -> None:
    s0, s1 = keys.commands(0), keys.commands(1)
    reader = closing(GroupReader(redis, [s0, s1], ENGINE_GROUP, "r", heartbeats=keys.processes()))
    await reader.setup()
    a, b = await redis.xadd(s0, {"m": b"a"}), await redis.xadd(s1, {"m": b"b"})
    await read_ahead(redis, reader)
    # A write of s0's batch failed: its pending entries, a among them, are read again.
    reader.recover([s0])
    [own] = await reader.read(None)
    assert own.entry_id == a
    await reader.ack([own])
    later = await reader.read(None)
    assert [e.entry_id for e in later] == [b], "a came once"
    await reader.ack(later)
    # Read ahead, then s1 given up (another member took its partition): what was read
    # ahead there stays pending with this consumer, for the new owner to claim.
    c, d = await redis.xadd(s0, {"m": b"c"}), await redis.xadd(s1, {"m": b"d"})
    await read_ahead(redis, reader)
    await reader.set_streams([s0])
    assert [e.entry_id for e in await reader.read(None)] == [c]
    [row] = await redis.xpending_range(s1, ENGINE_GROUP, "-", "+", 10, consumername="r")
    assert row["message_id"] == d


async def test_what_was_acknowledged_on_a_master_that_died_is_read_again_at_once(
    redis: aioredis.Redis, keys: Keys
) -> None:
    # A master died after the engine acknowledged a command there but before its replica
    # had the XACK: on the replica that took over, the command is pending with the engine
    # again. Told that the master was away (the cluster client's outage hook), the engine
    # reads its own pending there first, not a claim period (30 s) later.
    stream = await g1_sent(redis, keys)
    engine = EngineService(redis, keys, consumer="alive", secret=b"s")
    await engine.heartbeat()
    await engine.setup()
    await redis.xreadgroup(ENGINE_GROUP, "alive", {stream: ">"})  # its XACK lost
    try:
        assert await engine.reader.read(None) == []  # ">" never hands it back
        now = now_ms()
        engine.master_away((now - 1000, now), frozenset({key_slot(stream.encode())}))
        assert await engine.reader.read(None) != []
    finally:
        await engine.reader.close()  # (and the claim pass its reads started)


async def test_a_claim_pass_that_failed_is_not_reported_when_its_stopped_reader_is_collected(
    redis_server_factory: Callable[..., EmbeddedRedis], keys: Keys
) -> None:
    # asyncio reports a task's unretrieved failure when the task is collected, from inside
    # whatever code runs then: its traceback formatting (ast.parse) nested in another
    # ast.parse broke that one with "AST constructor recursion depth mismatch" (CPython 3.11).
    server = redis_server_factory()
    redis = aioredis.Redis.from_url(server.url)
    reader = GroupReader(redis, [keys.commands(0)], ENGINE_GROUP, "r", heartbeats=keys.processes())
    await reader.setup()
    server.kill()
    with pytest.raises(RedisConnectionError):
        await reader.read(None)  # a claim pass starts beside the read, and fails too
    claiming = reader._claiming
    assert claiming is not None
    await asyncio.wait([claiming], timeout=10)
    # (its repr shows the failure without marking it seen, as .exception() would)
    assert "exception=" in repr(claiming), claiming
    reports: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reports.append(context))
    try:
        del reader, claiming
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    await redis.aclose()
    assert [r["message"] for r in reports] == []


async def test_a_dead_consumers_work_is_taken_and_it_leaves_the_group(
    redis: aioredis.Redis, keys: Keys
) -> None:
    stream = await g1_sent(redis, keys)
    # "ghost" takes the command, never beats, never acks: it died
    ghost = engine_reader(redis, keys, stream, "ghost")
    assert len(await ghost.read(None)) == 1
    engine = EngineService(redis, keys, consumer="alive", secret=b"s")
    await engine.heartbeat()
    assert await engine.reader.reclaim() == []  # too fresh to take yet (dead_idle_ms)
    await asyncio.sleep(0.6)
    taken = await engine.reader.reclaim()
    assert [e.entry_id for e in taken] and engine.reader.claimed == 1
    assert all(e.taken_over for e in taken)
    await engine.process(taken)
    assert await QueryClient(redis, keys).head("g1") == 4

    names = {c["name"] for c in await redis.xinfo_consumers(stream, ENGINE_GROUP)}
    assert names == {b"ghost", b"alive"}
    await asyncio.sleep(1.1)  # past dead_after_ms: the ghost is idle and holds nothing
    await engine.heartbeat()
    assert await engine.reader.forget_dead_consumers() == 1
    names = {c["name"] for c in await redis.xinfo_consumers(stream, ENGINE_GROUP)}
    assert names == {b"alive"}


@pytest.mark.parametrize("dead_idle_ms", [1, 300], ids=["idle", "only-fresh"])
async def test_a_consumer_that_dies_holding_entries_has_them_taken_as_it_dies(
    redis: aioredis.Redis, keys: Keys, dead_idle_ms: int
) -> None:
    """A sweep that finds a live consumer holding entries comes again as that consumer
    would die by its beat, not a sweep period later: a killed bot worker's turns were
    taken up to half a second late. It learns so from every entry the consumer holds, the
    fresh ones too (`only-fresh`: fresher than `dead_idle_ms` at the first sweep): a
    worker killed a moment after its turns came had them taken only by a sweep after they
    grew idle past `dead_idle_ms` (in a kill-host run, 0.3-0.5 s after it died)."""
    stream = await g1_sent(redis, keys)
    ghost = engine_reader(redis, keys, stream, "ghost")
    await beat(redis, keys, "ghost", ENGINE_GROUP, ENGINE_GROUP)  # its last beat
    last = now_ms()
    assert len(await ghost.read(None)) == 1
    await asyncio.sleep(0.01)  # (idle past 1 ms, not past 300)
    reader = GroupReader(
        redis, [stream], ENGINE_GROUP, "alive", heartbeats=keys.processes(),
        dead_idle_ms=dead_idle_ms, claim_every_s=10.0,
    )  # fmt: skip
    taken: list[Entry] = []
    async with asyncio.timeout(5):
        while not taken:  # (its first sweep comes at once)
            taken = await reader.read(2000)
    waited_ms = now_ms() - last
    assert [e.taken_over for e in taken] == [True]
    assert ALIVE_MS <= waited_ms < ALIVE_MS + 1000, waited_ms  # the next sweep: 10 s


async def test_a_drain_handles_what_a_claim_pass_beside_the_reads_took(
    redis: aioredis.Redis, keys: Keys
) -> None:
    stream = await g1_sent(redis, keys)
    ghost = engine_reader(redis, keys, stream, "ghost")
    assert len(await ghost.read(None)) == 1  # it died holding the command
    await asyncio.sleep(0.6)  # past dead_idle_ms
    engine = EngineService(redis, keys, consumer="alive", secret=b"s")
    await engine.heartbeat()
    assert await engine.reader.read(None) == []  # a claim pass starts beside the read ...
    claiming = engine.reader._claiming
    assert claiming is not None
    await asyncio.wait([claiming])  # ... and takes the command for "alive" before a drain
    assert await engine.drain() == 1
    assert await QueryClient(redis, keys).head("g1") == 4
    assert (await redis.xpending(stream, ENGINE_GROUP))["pending"] == 0


async def test_a_drain_after_a_run_serves_every_partition_unfenced(
    redis: aioredis.Redis, keys: Keys
) -> None:
    # The services ran (holding leases) and stopped (giving them back): what comes after
    # is still decided, projected and answered by a drain, as before they ran.
    services = ServiceSet(redis, keys, [], director=False)
    await services.start()
    await asyncio.sleep(0.3)  # a round: each holds its share
    await services.stop()
    ids = await create_games(redis, keys, [("teeko", {})], 8, ["random", "random"])
    await services.drain()
    query = QueryClient(redis, keys)
    assert [await query.head(g) for g in ids] == [4] * 8
    assert (await verify(redis, keys)).problems == []


class MoveCounts:
    """A read model no code knows of: each game's number of moves, as a string key."""

    name = "move-counts"
    kind: models.Kind = "string"

    def patterns(self, keys: Keys) -> list[str]:
        return [keys.any_partition("movecount:*")]

    def cells(self, keys: Keys, game: GameFold) -> list[models.Cell]:
        name = f"{keys.prefix}:{{{keys.partition(game.game_id)}}}:movecount:{game.game_id}"
        return [models.Cell("string", name, "", str(game.ply).encode())]


@pytest.fixture
def move_counts(monkeypatch: pytest.MonkeyPatch) -> Iterator[MoveCounts]:
    model = MoveCounts()
    monkeypatch.setattr(models, "READ_MODELS", [*models.READ_MODELS, model])
    yield model


async def test_a_new_read_model_is_projected_verified_and_rebuilt_with_no_other_code(
    redis: aioredis.Redis, keys: Keys, move_counts: MoveCounts
) -> None:
    ids = await create_games(redis, keys, [("teeko", {})], 3, ["random", "random"])
    await ServiceSet(redis, keys, ["random"]).drain()
    query = QueryClient(redis, keys)
    (gid, *_) = ids
    name = move_counts.cells(keys, GameFold.start((await query.events(gid))[0].model_dump()))[0]
    count = await redis.get(name.key)
    assert count is not None and int(count) == (await query.view(gid) or {})["ply"] > 0
    assert (await verify(redis, keys)).problems == []

    await redis.set(name.key, b"999")
    problems = (await verify(redis, keys)).problems
    assert len(problems) == 1 and name.key in problems[0]
    await rebuild(redis, keys)
    assert await redis.get(name.key) == count
    assert (await verify(redis, keys)).problems == []
    # The live projector keeps it too: a game folded again writes its cell.
    await redis.delete(name.key)
    await redis.hdel(keys.projector_seen(keys.partition(gid)), gid)
    await Projector(redis, keys).drain()
    await rebuild(redis, keys)
    assert await redis.get(name.key) == count


async def test_a_replicated_script_call_after_script_flush_loads_it_and_is_confirmed(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    redis, replica = primary_and_replica.redis, primary_and_replica.replica
    await primary_and_replica.follow()
    incr = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    await redis.script_flush()  # as a failover leaves the new master: no scripts
    calls = [(["a"], [2]), (["b"], [5])]
    assert await incr.run_replicated(redis, calls, 1, 1000) == [(2, True), (5, True)]
    assert await replica.mget("a", "b") == [b"2", b"5"]
    # A replica fewer than asked for: done, but not confirmed.
    assert await incr.run_replicated(redis, calls[:1], 2, 50) == [(4, False)]


class Stopper(StreamConsumer):
    """Acknowledges what it reads; in its first batch one more entry comes, and its stop."""

    role = "stopper"

    def __init__(self, redis: aioredis.Redis, keys: Keys, stream: str, stop: asyncio.Event) -> None:
        self.join(redis, keys, [stream], "g")
        self.stop = stop
        self.seen: list[bytes] = []

    async def process(self, entries: Sequence[Entry]) -> None:
        self.seen += [e.entry_id for e in entries]
        if len(self.seen) == 1:
            await self.redis.xadd(self.reader.streams[0], {"m": b"late"})
            self.stop.set()
        await self.reader.ack(entries)


async def test_a_consumer_that_stops_handles_what_its_last_ack_read_ahead(
    redis: aioredis.Redis, keys: Keys
) -> None:
    stream = f"{keys.prefix}:work"
    await redis.xadd(stream, {"m": b"first"})
    stop = asyncio.Event()
    consumer = Stopper(redis, keys, stream, stop)
    async with asyncio.timeout(10):
        await consumer.run(stop)
    assert len(consumer.seen) == 2, "what its last ack read ahead was handled"
    assert (await redis.xpending(stream, "g"))["pending"] == 0


class SlotLost(StreamConsumer):
    """A consumer whose batches meet a cluster client that lost track of a slot."""

    role = "slot-lost"

    def __init__(self, redis: aioredis.Redis, keys: Keys, stream: str) -> None:
        self.join(redis, keys, [stream], "g")

    async def process(self, entries: Sequence[Entry]) -> None:
        raise RedisClusterException("Slot 12 not covered by the cluster")


async def test_a_batch_that_meets_a_cluster_map_behind_is_read_again_never_set_aside(
    redis: aioredis.Redis, keys: Keys
) -> None:
    # The map of the slots is the client's, never the entry's: an entry set aside for it
    # was a turn or a move lost for good (its game waited for ever).
    stream = f"{keys.prefix}:work"
    consumer = SlotLost(redis, keys, stream)
    await consumer.setup()
    await redis.xadd(stream, {"m": b"x"})
    [entry] = await consumer.reader.read(None)
    with pytest.raises(RedisClusterException):
        await consumer.handle([entry])
    assert consumer.entries_set_aside == 0
    assert not await redis.exists(keys.reader_dead_letter())
    assert (await redis.xpending(stream, "g"))["pending"] == 1


def test_a_write_that_met_moved_is_unconfirmed_never_an_error_to_raise() -> None:
    moved = MovedError("3999 127.0.0.1:6381")
    assert each_confirmed([(moved, False), (b"OK", False)], "x")[0] is moved
    with pytest.raises(ReplicasBehind):
        confirmed([(moved, False)], "turns lack 1 replicas")


async def test_an_entry_its_own_consumer_read_again_after_failed_batches_is_never_poison(
    redis: aioredis.Redis, keys: Keys
) -> None:
    # A master away for a while: each failed batch is read again (every read counted as a
    # delivery), then the entry idles past `claim_idle_ms` and the sweep takes it back. It
    # went to the dead letters as an entry that kills whoever takes it: a turn lost.
    stream = f"{keys.prefix}:work"
    reader = GroupReader(redis, [stream], "g", "c1", heartbeats=keys.processes(), claim_idle_ms=50)
    await reader.setup()
    await redis.xadd(stream, {"m": b"x"})
    assert len(await reader.read(None)) == 1
    for _ in range(reader.max_deliveries + 1):
        reader.recover()
        assert len(await reader.read(None)) == 1
    await asyncio.sleep(0.1)
    assert len(await reader.reclaim()) == 1
    assert reader.poison == []
