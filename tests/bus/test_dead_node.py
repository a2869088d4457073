"""A dead master costs only its own slots, on a real Redis Cluster of three masters.

When a host dies, its master's commands cannot be answered until a replica takes over; the
other masters' must go on being. The stock cluster pipeline failed the whole pipeline and
closed every connection of the client (every other task's reads too) while it retried; the
reader re-read its own pending entries of every stream in one pipeline, so one dead
stream held back the live ones; the beats lived on one master, and right after they came
back, everyone looked dead.
Each test is the attack on one of these: a master SIGKILLed with no replica to take over
(its slots stay dead for the test), and what still has to work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from bots.worker import BotWorker
from schemas.codec import FIELD, FIELD_BYTES, decode_command, decode_turn, encode
from schemas.commands import PlayMove
from schemas.tokens import bot_token
from schemas.turns import TurnRequest
from services.bus import presence
from services.bus.clients import CommandClient
from services.bus.connection import (
    NEVER,
    NODE_READ_TIMEOUT_S,
    TRANSIENT_ERRORS,
    AgonCluster,
    _failing,
    _nodes,
    best_replica,
    connect,
    pause_after_failure,
    replica_offset,
    takeover,
)
from services.bus.keys import ENGINE_GROUP, PROJECTOR_GROUP, WORKERS_GROUP, Keys
from services.bus.outages import partition_spells, record
from services.bus.ownership import Ownership
from services.bus.presence import (
    ALIVE_MS,
    COPY_GRACE_S,
    SETTLE_MS,
    Answers,
    Sight,
    ask_each,
    beat,
    beat_keys,
    beat_value,
    processes,
)
from services.bus.reader import Entry, GroupReader
from services.bus.text import now_ms
from services.cli.pipeline import create_games
from services.engine_service import EngineService
from services.projector.live import Projector
from tests.services.test_dispatcher_fencing import BOT, SECRET, dispatcher
from tests.support.cluster import RedisClusterProcesses

TAGS = range(12)


@contextlib.asynccontextmanager
async def running_cluster(
    replicas: int = 0, node_timeout_ms: int = 1000
) -> AsyncIterator[tuple[RedisClusterProcesses, AgonCluster]]:
    """Three masters and a client of them; the others serve their slots while one is away,
    as a deployment that scales out should."""
    options = ("--cluster-require-full-coverage", "no")
    with RedisClusterProcesses(
        masters=3, replicas=replicas, node_timeout_ms=node_timeout_ms, options=options
    ) as nodes:
        client = await connect(nodes.url)
        assert isinstance(client, AgonCluster)
        try:
            yield nodes, client
        finally:
            await client.aclose()


@pytest.fixture
async def cluster() -> AsyncIterator[tuple[RedisClusterProcesses, AgonCluster]]:
    async with running_cluster() as both:
        yield both


def port_of(client: AgonCluster, key: str) -> int:
    node = client.get_node_from_key(key)
    assert node is not None
    return int(node.port)


def victim_of(nodes: RedisClusterProcesses, client: AgonCluster, keys: list[str]) -> int:
    """A master that serves some of `keys` and is not the one the client's URL names."""
    ports = {port_of(client, k) for k in keys} - {nodes.ports[0]}
    return sorted(ports)[0]


async def test_a_pipeline_fails_only_the_dead_masters_commands_and_no_other_read(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    nodes, client = cluster
    keys = [f"dn:{{{t}}}:k" for t in TAGS]
    for key in keys:
        await client.set(key, key)
    victim = victim_of(nodes, client, keys)
    live = [k for k in keys if port_of(client, k) != victim]
    feed = f"{next(k for k in live if port_of(client, k) != nodes.ports[0])}:feed"
    # A blocking read on a live master, in flight while the other master stops answering
    # (a host whose link went down: no refusal comes back).
    reading = asyncio.create_task(client.xread({feed: "$"}, block=8000))
    await asyncio.sleep(0.2)
    nodes.pause(victim)
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)
        answers = await pipe.execute(raise_on_error=False)
        for key, answer in zip(keys, answers, strict=True):
            if port_of(client, key) == victim:
                assert isinstance(answer, RedisConnectionError | RedisTimeoutError), answer
            else:
                assert answer == key.encode(), (key, answer)

        with pytest.raises((RedisConnectionError, RedisTimeoutError)):
            pipe = client.pipeline(transaction=False)  # all or nothing: the caller's choice
            for key in keys:
                pipe.get(key)
            await pipe.execute()

        await client.xadd(feed, {"m": b"after"})
        got: Any = await reading  # the dead master closed no connection of a live one
        assert got and got[0][1][0][1] == {b"m": b"after"}
        pipe = client.pipeline(transaction=False)
        for key in live:
            pipe.get(key)
        assert await pipe.execute() == [k.encode() for k in live]
    finally:
        nodes.resume(victim)


async def test_a_reader_recovers_its_pending_entries_of_live_streams_beside_a_dead_one(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    nodes, client = cluster
    streams = [f"dn:{{{t}}}:commands" for t in TAGS]
    reader = GroupReader(client, streams, "g", "c1", heartbeats="dn:processes")
    await reader.setup()
    for stream in streams:
        await client.xadd(stream, {"m": stream.encode()})
    assert len(await reader.read(None)) == len(streams)  # now pending with c1, unacknowledged
    victim = victim_of(nodes, client, streams)
    nodes.kill(victim)

    reader.recover()  # a batch failed: its entries are read again first
    again = await reader.read(None)
    alive = {s for s in streams if port_of(client, s) != victim}
    assert {e.stream for e in again} == alive
    assert len(again) == len(alive)


async def test_a_reader_reads_on_after_its_client_lost_track_of_the_streams_slot(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    # No node serves the stream's slot for a moment (resharding, or the map a client
    # learns amid a failover): redis-py raises RedisClusterException, neither a reply nor
    # a transient error. The lane that read the stream ended there, and the stream was
    # never read again, its slot back or not.
    _, client = cluster
    stream = "dn:{0}:commands"
    owner = client.get_node_from_key(stream)
    assert owner is not None
    reader = GroupReader(client, [stream], "g", "c1", heartbeats="dn:processes")
    await reader.setup()
    slot = client.keyslot(stream)
    try:
        for node in client.get_primaries():
            await node.execute_command("CLUSTER", "DELSLOTS", slot)
        assert await reader.read(300) == []
        await owner.execute_command("CLUSTER", "ADDSLOTS", slot)
        got: list[Any] = []
        async with asyncio.timeout(15):
            while True:  # until every node has heard that the owner serves it again
                with contextlib.suppress(RedisClusterException):
                    await client.xadd(stream, {"m": b"back"})
                    break
                await asyncio.sleep(0.1)
            while not got:
                got = await reader.read(300)
        assert [e.data for e in got] == [b"back"]
    finally:
        await reader.close()


def test_nobody_is_judged_dead_right_after_the_beats_come_back() -> None:
    sight = Sight()
    assert sight.read(1_000)  # never blind: judge at once
    sight.failed()  # the beats' master fails over: no one can beat meanwhile
    assert not sight.read(5_000)
    assert not sight.read(5_000 + SETTLE_MS - 1)
    assert sight.read(5_000 + SETTLE_MS)  # everyone alive has beaten again by now
    # A read that hung through the outage instead of failing counts as blind too ...
    assert not sight.read(9_000, took_ms=ALIVE_MS)
    assert sight.read(9_000 + SETTLE_MS, took_ms=1)
    # ... one copy of two answering alone too, but not both: each beat is the newer of its
    # copies, and one of them was written to throughout.
    both, first = Answers([{}, {}], 2, (0, 1)), Answers([{}], 2, (0,))
    assert sight.read(20_000, took_ms=ALIVE_MS, answers=both)
    assert not sight.read(20_100, took_ms=ALIVE_MS, answers=first)


def test_a_reader_that_stops_judging_who_is_dead_says_why_once_and_when_it_judges_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A dead process's work moves no sooner than its readers judge the beats again: with
    `-v` each says why it stopped (a kill-host run's late takeovers left no trace of it)."""
    caplog.set_level(logging.INFO, logger="agon.bus")
    sight = Sight()
    assert sight.read(1_000)
    sight.failed()
    assert not sight.read(5_000)
    assert not sight.read(5_100)
    assert sight.read(5_000 + SETTLE_MS)
    assert [r.getMessage() for r in caplog.records] == [
        f"nobody is judged dead by their beats for now: the beats read again after an outage:"
        f" settling {SETTLE_MS} ms",
        f"the beats say who is dead again (after the beats read again after an outage:"
        f" settling {SETTLE_MS} ms)",
    ]


def test_a_copy_that_answers_alone_judges_once_it_has_answered_every_read_for_a_settle() -> None:
    """A copy back from an outage may be a replica promoted a moment ago, holding the beats
    of everyone who has not beaten again since as old as the failover: alone, it judges
    only once it has answered every read for `SETTLE_MS`. A copy that answered all along
    judges alone at once, however the other comes and goes (at a whole CPU quota it often
    answers after the grace): a settle at each such read would leave the dead unjudged."""
    both, first, second = (
        Answers([{}, {}], 2, (0, 1)),
        Answers([{}], 2, (0,)),
        Answers([{}], 2, (1,)),
    )
    sight = Sight()
    assert sight.read(0, answers=both)  # every copy answered: judged at once
    assert not sight.read(100, answers=first)  # copy 0 has answered for 100 ms only
    assert sight.read(SETTLE_MS, answers=first)
    assert sight.read(SETTLE_MS + 100, answers=both)
    assert sight.read(SETTLE_MS + 200, answers=first)  # the other flaps: still judged
    assert not sight.read(SETTLE_MS + 300, answers=second)  # copy 1 missed the last read
    assert not sight.read(2 * SETTLE_MS + 299, answers=second)
    assert sight.read(2 * SETTLE_MS + 300, answers=second)


async def test_the_beats_outlive_the_master_that_holds_one_copy(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    nodes, client = cluster
    keys = Keys(prefix="dn")
    assert beat_keys(client, keys) == [keys.processes(), keys.processes_copy()]
    victim = port_of(client, keys.processes())
    assert port_of(client, keys.processes_copy()) != victim
    await beat(client, keys, "engine-a", "engine", "engine")
    nodes.kill(victim)

    await beat(client, keys, "engine-b", "engine", "engine")  # one copy takes it
    assert {"engine-a", "engine-b"} <= set(await processes(client, keys))
    reader = GroupReader(client, [], "g", "c", heartbeats=beat_keys(client, keys))
    # One copy answers where both did: the reader waits for the live to beat into it ...
    assert await reader.dead_consumers({"engine-a", "engine-b", "gone"}) == set()
    await asyncio.sleep(SETTLE_MS / 1000)
    await beat(client, keys, "engine-a", "engine", "engine")
    await beat(client, keys, "engine-b", "engine", "engine")
    # ... and then judges by it alone.
    assert await reader.dead_consumers({"engine-a", "engine-b", "gone"}) == {"gone"}


async def test_a_copy_of_the_beats_that_answers_alone_with_old_beats_judges_nobody(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """The master of one copy died; the copy that answers is a replica promoted after its
    own master died, holding beats as old as that failover. Judged by it alone, every
    process is dead (and every member takes every partition whose lease lapsed meanwhile)."""
    nodes, client = cluster
    keys = Keys(prefix="stale")
    stale, live = keys.processes(), keys.processes_copy()
    victim = port_of(client, live)
    old = now_ms() - 3 * ALIVE_MS
    for name in ("engine-a", "engine-b", "reader"):
        value = json.loads(beat_value("engine", "g"))
        await client.hset(stale, name, json.dumps({**value, "time": old}))
    nodes.kill(victim)
    reader = GroupReader(client, [], "g", "reader", heartbeats=beat_keys(client, keys))
    assert await reader.dead_consumers({"engine-a", "engine-b"}) == set()
    # Once the copy holds fresh beats (the reader's own), it judges again, after the settle.
    await asyncio.sleep(SETTLE_MS / 1000)
    await beat(client, keys, "reader", "engine", "g")
    assert await reader.dead_consumers({"engine-a", "engine-b"}) == set()  # settling
    await asyncio.sleep(SETTLE_MS / 1000)
    await beat(client, keys, "reader", "engine", "g")
    assert await reader.dead_consumers({"engine-a", "engine-b"}) == {"engine-a", "engine-b"}


async def test_a_member_keeps_its_peers_while_one_copy_of_the_beats_answers_alone(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """The copy that answers alone may be a replica promoted a moment ago: it holds the
    beats of everyone who has not beaten again since as old as the failover, beside fresh
    ones. Judged by it alone at once, a live peer was dead, and its partitions free to take
    (a kill-host run: a dispatcher wanted every other member's partitions), or its turns
    (a bot worker claimed two live workers' turns)."""
    nodes, client = cluster
    keys = Keys(prefix="promoted")
    promoted, other = keys.processes(), keys.processes_copy()
    await beat(client, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    await beat(client, keys, "engine-b", ENGINE_GROUP, ENGINE_GROUP)
    b = Ownership(client, keys, ENGINE_GROUP, "engine-b")
    assert await b.members() == ["engine-a", "engine-b"]
    value = json.loads(beat_value(ENGINE_GROUP, ENGINE_GROUP))
    await client.hset(promoted, "engine-a", json.dumps({**value, "time": now_ms() - 5_000}))
    nodes.kill(port_of(client, other))
    await beat(client, keys, "engine-b", ENGINE_GROUP, ENGINE_GROUP)  # b's own: fresh
    assert await b.members() == ["engine-a", "engine-b"], "a peer dropped by one copy"
    reader = GroupReader(client, [], "g", "engine-b", heartbeats=beat_keys(client, keys))
    assert await reader.dead_consumers({"engine-a"}) == set(), "a live consumer judged dead"
    # Once the live have beaten into it, the copy judges alone: not for ever a member.
    await asyncio.sleep(SETTLE_MS / 1000)
    await beat(client, keys, "engine-b", ENGINE_GROUP, ENGINE_GROUP)
    assert await b.members() == ["engine-b"]
    assert await reader.dead_consumers({"engine-a"}) == {"engine-a"}


@pytest.mark.parametrize("reader", ["ownership", "claims"])
async def test_a_read_of_the_beats_waits_a_moment_for_the_copy_that_answered_every_read(
    cluster: tuple[RedisClusterProcesses, AgonCluster], reader: str
) -> None:
    """After a failover the copy back a moment ago (the promoted replica) answered first,
    and the copy that had answered every read, its host starved, missed the grace: the
    first alone judges nobody until it has answered for a settle, and at every such read
    nobody was judged dead (a kill-host run's engine took a dead member's partitions 1.5 s
    late). A read waits a moment for the copy that answered every read."""
    nodes, client = cluster
    keys = Keys(prefix="settled")
    ports = [port_of(client, k) for k in beat_keys(client, keys)]
    for name in ("engine-a", "engine-b", "engine-c"):
        await beat(client, keys, name, ENGINE_GROUP, ENGINE_GROUP)
    member = Ownership(client, keys, ENGINE_GROUP, "engine-b")
    claims = GroupReader(client, [], "g", "engine-b", heartbeats=beat_keys(client, keys))

    async def dead() -> set[str]:
        if reader == "claims":
            return await claims.dead_consumers({"engine-a", "engine-c"})
        return {"engine-a", "engine-b", "engine-c"} - set(await member.members())

    assert await dead() == set()  # both copies answer
    value = json.loads(beat_value(ENGINE_GROUP, ENGINE_GROUP))
    for copy in beat_keys(client, keys):  # engine-c dies
        await client.hset(copy, "engine-c", json.dumps({**value, "time": now_ms() - 5_000}))
    nodes.pause(ports[1])  # the second copy misses a read: the first answers alone ...
    try:
        assert await dead() == set(), "judged by one copy that answered alone"
    finally:
        nodes.resume(ports[1])
    await asyncio.sleep(SETTLE_MS / 1000)  # ... for a settle: it answered every read
    for name in ("engine-a", "engine-b"):
        await beat(client, keys, name, ENGINE_GROUP, ENGINE_GROUP)
    # The second copy (back a moment ago) answers at once, the first (slow) after the grace.
    nodes.pause(ports[0])
    asyncio.get_running_loop().call_later(2 * COPY_GRACE_S, nodes.resume, ports[0])
    assert await dead() == {"engine-c"}


async def test_a_read_of_the_beats_by_a_deadline_keeps_what_answered_by_then(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A read waiting for the copy that answered every read (its master stalled) ends at its
    deadline with the copy that did answer: failing it instead (a member's round bounds its
    read) would stop the reader judging for a settle."""
    nodes, client = cluster
    keys = Keys(prefix="deadline")
    copies = beat_keys(client, keys)
    await beat(client, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
    stalled = port_of(client, copies[1])
    nodes.pause(stalled)
    try:
        answers = await ask_each(client, copies, "HGETALL", prefer={1}, wait_s=0.2)
    finally:
        nodes.resume(stalled)
    assert (answers.answered, answers.asked) == ((0,), 2)
    assert set(answers.answers[0]) == {b"engine-a"}


async def test_a_member_judges_by_a_copy_whose_newest_beat_is_young_beside_its_lease(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A member is judged dead by its lease, not `ALIVE_MS`: a copy answering alone whose
    newest beat is under half the lease old was written to lately enough. (After a kill at
    a whole quota every beat took 0.3-0.6 s; the live copy held no engine's beat younger
    than half `ALIVE_MS`, and every engine stopped judging for a settle.)"""
    nodes, client = cluster
    keys = Keys(prefix="lease")
    live, dead = beat_keys(client, keys)
    for name in ("engine-a", "engine-b", "engine-c"):
        await beat(client, keys, name, ENGINE_GROUP, ENGINE_GROUP)
    member = Ownership(client, keys, ENGINE_GROUP, "engine-b", lease_ms=4 * ALIVE_MS)
    assert await member.members() == ["engine-a", "engine-b", "engine-c"]
    nodes.kill(port_of(client, dead))
    ends = time.monotonic() + SETTLE_MS / 1000
    while time.monotonic() < ends:  # the live copy answers alone, every read, for a settle
        assert await member.members() == ["engine-a", "engine-b", "engine-c"]
    value, now = json.loads(beat_value(ENGINE_GROUP, ENGINE_GROUP)), now_ms()
    ages = {"engine-a": ALIVE_MS, "engine-b": ALIVE_MS, "engine-c": 10 * ALIVE_MS}
    for name, age in ages.items():
        await client.hset(live, name, json.dumps({**value, "time": now - age}))
    assert await member.members() == ["engine-a", "engine-b"]


async def test_a_heartbeat_waits_for_no_spell_it_writes(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A consumer's heartbeat writes the spells a failover left beside its beat: after a
    kill those writes, on a master promoted a moment ago, took up to 0.4 s, and a beat
    that waited for them was that much older when it landed (its kind's members, finding
    no fresh beat, stopped judging who is dead)."""
    nodes, client = cluster
    keys = Keys(prefix="spell")
    beats = {port_of(client, copy) for copy in beat_keys(client, keys)}
    p = next(p for p in keys.all_partitions() if port_of(client, keys.outages(p)) not in beats)
    projector = Projector(client, keys)
    projector.master_away((0, 1), frozenset({keys.slot(p)}))
    slow = port_of(client, keys.outages(p))
    nodes.pause(slow)  # the spell's master answers late
    try:
        heartbeat = asyncio.ensure_future(projector.heartbeat())
        async with asyncio.timeout(5):
            while projector.reader.consumer not in await processes(client, keys):
                await asyncio.sleep(0.01)
        assert not heartbeat.done()  # the spell is still being written
    finally:
        nodes.resume(slow)
    await heartbeat
    assert projector.spells_unwritten == []
    assert (await partition_spells(client, keys, [p]))[p] == [(0, 1)]


async def turns_on_two_masters(
    nodes: RedisClusterProcesses, client: AgonCluster, prefix: str
) -> tuple[BotWorker, Keys, str, str, int]:
    """A bot worker, and a due turn in its inbox of game `dead`, on master `victim` (not the
    inbox's), and of game `live`, on another (not the inbox's either)."""
    keys = Keys(prefix=prefix)
    inbox = port_of(client, keys.bot_turns("random"))
    logs = {f"g{i}": port_of(client, keys.log(f"g{i}")) for i in range(64)}
    victim = next(port for port in nodes.ports[1:] if port != inbox)
    dead = next(g for g, port in logs.items() if port == victim)
    live = next(g for g, port in logs.items() if port not in (victim, inbox))
    worker = BotWorker(client, "random", keys, clock_key=b"k" * 32)
    await worker.setup()
    for game_id in (dead, live):
        await client.xadd(keys.log(game_id), {"e": "1"})  # the log at seq 1: its turn is due
        turn = TurnRequest(
            game_id=game_id, game="teeko", options={}, moves=[], seq=1, seat=1, colour=1,
            bot="random", token=bot_token(b"s" * 32, game_id, 1),
        )  # fmt: skip
        await client.xadd(keys.bot_turns("random"), {FIELD: encode(turn)})
    return worker, keys, dead, live, victim


async def test_a_bot_worker_answers_the_games_of_live_masters_and_holds_the_dead_ones(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """One inbox carries every game's turns; a turn whose game's master died is kept for
    later, unacknowledged, and holds back none of the others (it held back the whole
    batch, every game of the bot, until the failover)."""
    nodes, client = cluster
    worker, keys, dead, live, victim = await turns_on_two_masters(nodes, client, "held")
    nodes.kill(victim)

    await worker.drain()
    sent = await client.xrange(keys.commands_for(live))
    assert [decode_command(f[FIELD_BYTES]).game_id for _, f in sent] == [live]
    pending = await client.xpending(keys.bot_turns("random"), WORKERS_GROUP)
    assert pending["pending"] == 1, "the dead master's turn was acknowledged, or the live one not"
    assert [decode_turn(e.data).game_id for e in worker._held if e.data] == [dead]
    # Claimed again while held (idle past the claim time): still held once, not twice.
    await worker.process(list(worker._held))
    assert [decode_turn(e.data).game_id for e in worker._held if e.data] == [dead]


async def test_a_bot_worker_waits_on_a_master_that_answers_nothing_only_for_a_moment(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A host that dies answers nothing (its link down: no refusal comes back), and until
    the masters agree that it failed, every command there waits. A kill-host run's bot
    workers stood still that long (1.3 s), every game of theirs: a batch waited for its
    slowest master. Now the other games' moves go at once, the silent master's turn is kept,
    and trying it again holds the next batch back no longer than `NODE_PATIENCE_S`, as no
    node answers such a retry."""
    nodes, client = cluster
    worker, keys, dead, live, victim = await turns_on_two_masters(nodes, client, "patient")
    entries = await worker.reader.read(None)
    nodes.pause(victim)
    try:
        began = time.monotonic()
        await worker.process(entries)
        answered_s = time.monotonic() - began
        sent = await client.xrange(keys.commands_for(live))
        began = time.monotonic()
        await worker.tick()  # the kept turn, tried again while its master is still silent
        retried_s = time.monotonic() - began
    finally:
        nodes.resume(victim)
        await worker.reader.close()  # (its claim pass must not outlive the test)
    assert [decode_command(f[FIELD_BYTES]).game_id for _, f in sent] == [live]
    assert [decode_turn(e.data).game_id for e in worker._held if e.data] == [dead]
    # Bounds by the rule, far below the read timeout the batch waited out before.
    assert answered_s < NODE_READ_TIMEOUT_S / 2, f"the batch waited {answered_s:.2f} s"
    assert retried_s < NODE_READ_TIMEOUT_S / 2, f"the retry waited {retried_s:.2f} s"


async def test_a_command_client_sends_to_live_masters_while_one_answers_nothing(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A bot worker's moves (and a gateway's people's moves) share one command client,
    which had one pipeline in flight at a time: a move to a master that answers nothing
    (its host died) held back every later move, to every master, until the masters agreed
    that it failed. Each master has its own now."""
    nodes, client = cluster
    keys = Keys(prefix="outbox")
    games = {f"g{i}": port_of(client, keys.commands_for(f"g{i}")) for i in range(64)}
    victim = victim_of(nodes, client, [keys.commands_for(g) for g in games])
    dead = next(g for g, port in games.items() if port == victim)
    live = next(g for g, port in games.items() if port != victim)

    def move(game_id: str) -> PlayMove:
        return PlayMove(
            command_id=game_id, game_id=game_id, seat=1, token="t", move="A1", expected_seq=1
        )

    commands = CommandClient(client, keys)
    nodes.pause(victim)
    try:
        stuck = asyncio.ensure_future(commands.send([move(dead)]))
        await asyncio.sleep(0.05)  # on its way, unanswered
        began = time.monotonic()
        await commands.send([move(live)])
        took = time.monotonic() - began
        waiting = not stuck.done()
    finally:
        nodes.resume(victim)
        with contextlib.suppress(*TRANSIENT_ERRORS):
            await stuck
        await commands.close()
    assert took < NODE_READ_TIMEOUT_S / 3, f"the live master's move waited {took:.2f} s"
    assert waiting, "the silent master's move was answered"
    assert [decode_command(f[FIELD_BYTES]).game_id for _, f in await client.xrange(
        keys.commands_for(live))] == [live]  # fmt: skip


def test_only_a_failure_the_masters_agreed_on_counts_without_asking_the_node() -> None:
    """`fail` (the masters agreed) marks a node down at once; `fail?` (one master's
    suspicion: on a starved host, a slow peer) only has it PINGed first."""
    nodes = (
        "07c3 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n"
        "67ed 10.0.0.2:7001@17001 master,fail? - 0 1795000000123 2 connected 5461-10922\n"
        "292f 10.0.0.3:7002@17002,h3 master,fail - 0 0 3 connected 10923-16383\n"
        "6ec2 10.0.0.4:7003@17003 slave 292f 0 0 3 connected\n"
    )
    assert _failing(nodes.encode()) == {"10.0.0.2:7001": False, "10.0.0.3:7002": True}
    parsed = {
        "10.0.0.1:7000@17000": {"flags": "myself,master"},
        "10.0.0.2:7001@17001": {"flags": "master,fail?"},
    }
    assert _failing(parsed) == {"10.0.0.2:7001": False}
    # when the node asked last heard from each (an outage of its partitions began then)
    assert {a: seen.pong for a, seen in _nodes(nodes).items()} == {
        "10.0.0.1:7000": 0,
        "10.0.0.2:7001": 1795000000123,
        "10.0.0.3:7002": 0,
        "10.0.0.4:7003": 0,
    }
    assert [a for a, seen in _nodes(nodes).items() if seen.serves] == [
        "10.0.0.1:7000",
        "10.0.0.2:7001",
        "10.0.0.3:7002",
    ]


async def test_a_reader_that_failed_on_a_node_waits_for_its_probe_not_a_fixed_pause(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A connection failed on a master that still answers: the pause before reading again
    ends with the probe's PING, not after the caller's whole pause."""
    _, client = cluster
    node = client.get_primaries()[1]
    client.node_failed(node)
    began = time.monotonic()
    await pause_after_failure(client, 60.0)
    assert time.monotonic() - began < 30.0, "waited the whole pause"
    assert not client.is_down(node) and not client.probes


async def test_a_failure_just_after_a_failover_settled_is_tried_again_at_once(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A command that waited for a down node's probe fails as the probe ends (the node is
    back, or its replica took over): the caller tries again at once, not after its whole
    pause (0.5 s for a reader, on every lane of a failover's master). Without a failover
    just settled, a failure still pauses the whole pause."""
    _, client = cluster
    began = time.monotonic()
    await pause_after_failure(client, 0.3)
    assert time.monotonic() - began >= 0.3, "a failure with no failover paused less"
    node = client.get_primaries()[1]
    probe = client.probes[node.name] = asyncio.ensure_future(client._probe(node, False))
    await probe  # counted down at once, then found back
    assert not client.probes and not client.is_down(node)
    began = time.monotonic()
    await pause_after_failure(client, 60.0)
    assert time.monotonic() - began < 30.0, "waited the whole pause after the failover"


async def test_learning_the_slots_again_asks_no_dead_node_for_the_commands(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """After a failed command the client learns the slots again. redis-py then also asks
    its default node for the server's commands, and when that is the dead master the
    whole client failed and closed every connection, a live master's read in flight too."""
    nodes, client = cluster
    keys = [f"dn:{{{t}}}:k" for t in TAGS]
    for key in keys:
        await client.set(key, key)
    victim = victim_of(nodes, client, keys)
    dead = next(n for n in client.get_primaries() if int(n.port) == victim)
    cache = client.nodes_manager.nodes_cache
    for name in [n for n in cache if n != dead.name]:
        cache[name] = cache.pop(name)  # first in the cache: the default node it picks again
    client.nodes_manager.default_node = dead
    live = next(k for k in keys if port_of(client, k) not in (victim, nodes.ports[0]))
    feed = f"{live}:feed"
    reading = asyncio.create_task(client.xread({feed: "$"}, block=8000))
    await asyncio.sleep(0.2)
    nodes.kill(victim)
    client._initialize = True  # what a command that failed on the dead master leaves
    assert await client.get(live) == live.encode()
    await client.xadd(feed, {"m": b"after"})
    got: Any = await reading  # its connection was not closed under it
    assert got and got[0][1][0][1] == {b"m": b"after"}


async def test_a_probe_of_a_node_the_client_no_longer_knows_leaves_no_connection_open(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A killed master came back as its replica's replica: the client knows it again under
    a new object, and the probe's PING that found it answering left the old object's
    connection open, owned by nobody (a ResourceWarning when collected). Here the node
    the probe asks is a live master under a name no node reports."""
    nodes, client = cluster
    gone = ClusterNode("127.0.0.1", nodes.ports[1], **client.nodes_manager.connection_kwargs)
    client.node_failed(gone)
    await asyncio.wait([client.probes[gone.name]], timeout=10)
    await asyncio.sleep(0.1)
    assert gone._connections, "the probe asked it"
    assert not any(c.is_connected for c in gone._connections), "left open"


async def test_a_failover_is_a_spell_of_the_dead_masters_partitions_only() -> None:
    """The time a master took to fail over is the platform's, for the games it held: a
    consumer that saw it records a spell (`services.bus.outages`) for the partitions that
    master served, from before it died to after its replica took over, and for no other
    partition, whose clocks ran on a live master all along."""
    async with running_cluster(replicas=1) as (nodes, client):
        keys, stop = Keys(prefix="sp"), asyncio.Event()
        projector = Projector(client, keys, block_ms=100)
        running = asyncio.create_task(projector.run(stop))
        try:
            for _ in range(100):  # ready: reading every partition
                if len(projector.reader.streams) == keys.partitions:
                    break
                await asyncio.sleep(0.1)
            victim = port_of(client, keys.feed(0))
            hit = {p for p in keys.all_partitions() if port_of(client, keys.feed(p)) == victim}
            killed = now_ms()
            nodes.kill(victim)
            read: dict[int | None, list[tuple[int, int]]] = {}
            for _ in range(200):
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    read = await partition_spells(client, keys, keys.all_partitions())
                    if all(read.get(p) for p in hit):
                        break
                await asyncio.sleep(0.1)
            served = now_ms()
        finally:
            stop.set()
            await running
    assert {p for p, spells in read.items() if spells} == hit
    for p in hit:
        (began, ended), *_ = read[p]
        assert began <= killed and killed + 1000 <= ended <= served, (killed, read[p], served)


async def test_a_probe_learns_the_slots_again_only_once_a_replica_took_over(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """While a master is down and still holds its slots, learning the slots again gives
    nothing and costs every process of a host (16,384 slots, every connection marked to
    reconnect): every 0.1 s that starved the survivors of a host's death for seconds. The
    probe asks a live master whether the dead one still serves slots instead."""
    nodes, client = cluster
    victim = client.get_primaries()[1]
    learnt = client.nodes_manager._epoch
    nodes.pause(int(victim.port))
    try:
        client.node_failed(victim)
        await asyncio.sleep(1.5)
        assert client.is_down(victim), "the probe's PING should have gone unanswered"
        assert client.nodes_manager._epoch == learnt, "learnt the slots again meanwhile"
    finally:
        nodes.resume(int(victim.port))
    await asyncio.wait([client.probes[victim.name]], timeout=10)
    assert not client.is_down(victim)


async def test_the_spells_of_a_dead_masters_partitions_hold_back_no_other_partitions(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """The engine reads its partitions' spells before judging a late move or a timeout
    claim; a master that does not answer (it is failing over) must fail that read for its
    own partitions only, not the round of every other game."""
    nodes, client = cluster
    keys = Keys(prefix="sp")
    for p in keys.all_partitions():
        await record(client, keys, (1000, 2000), [p])
    victim = victim_of(nodes, client, [keys.outages(p) for p in keys.all_partitions()])
    nodes.pause(victim)
    try:
        read = await partition_spells(client, keys, keys.all_partitions())
    finally:
        nodes.resume(victim)
    live = {p for p in keys.all_partitions() if port_of(client, keys.outages(p)) != victim}
    assert live and set(read) == live
    assert all(read[p] == [(1000, 2000)] for p in live)


async def test_a_master_that_does_not_answer_holds_back_no_take_on_the_others() -> None:
    """On a replicated cluster a take waits for a replica (WAIT). A master whose host died,
    before anyone counts it down, answers nothing: the takes of the partitions on the live
    masters (a dead member's share, the moment its leases lapse) must not wait for it. Seen
    in a kill-host run: every take of a round failed with the dead master's, and a
    survivor's partitions stood still a second longer than their leases."""
    async with running_cluster(replicas=1, node_timeout_ms=5000) as (nodes, client):
        keys = Keys(prefix="take")
        await beat(client, keys, "engine-a", ENGINE_GROUP, ENGINE_GROUP)
        owner = Ownership(client, keys, ENGINE_GROUP, "engine-a", replicas=1)
        # A running member's client knows every master and its scripts already: a first
        # round of another kind connects, loads them and waits for each replica once.
        await beat(client, keys, "projector-a", PROJECTOR_GROUP, PROJECTOR_GROUP)
        warm = Ownership(client, keys, PROJECTOR_GROUP, "projector-a", replicas=1)
        async with asyncio.timeout(10):
            while len(warm.owned) < keys.partitions:
                await warm.round()
        leases = {p: keys.lease(p, ENGINE_GROUP) for p in keys.all_partitions()}
        victim = victim_of(nodes, client, list(leases.values()))
        away = {p for p, key in leases.items() if port_of(client, key) == victim}
        nodes.pause(victim)
        try:
            change = await owner.round()
        finally:
            nodes.resume(victim)
        assert away and set(change.taken) == set(leases) - away


async def test_a_dispatcher_hands_out_the_turns_of_live_masters_and_holds_the_dead_ones(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
) -> None:
    """A dispatcher's batch spans partitions on every master. One master stops answering:
    its partitions' clock writes fail, and so did the whole batch, every partition's turns
    held back until the failover. Now only its own partitions' entries stay pending, read
    again (and their turns handed out) once it answers."""
    nodes, client = cluster
    keys = Keys(prefix="dheld")
    games = await create_games(
        client, keys, [("teeko", {})], 24, [BOT, BOT], move_time_ms=60_000, run_id="held"
    )
    await EngineService(client, keys, secret=SECRET).drain()
    d = await dispatcher(client, keys, "dispatcher-a")
    entries = []
    while batch := await d.reader.read(None):
        entries += batch
    at = {g: port_of(client, keys.feed(keys.partition(g))) for g in games}
    spare = {nodes.ports[0], port_of(client, keys.bot_turns(BOT))}
    victim = next(port for port in sorted(set(at.values())) if port not in spare)
    live = sorted(g for g in games if at[g] != victim)

    async def handed_out() -> list[str]:
        rows: Any = await client.xrange(keys.bot_turns(BOT))
        return sorted(decode_turn(f[FIELD_BYTES]).game_id for _, f in rows)

    nodes.pause(victim)
    try:
        await d.process(entries)
        assert await handed_out() == live
    finally:
        nodes.resume(victim)
    async with asyncio.timeout(10):
        while await handed_out() != sorted(games):
            # the victim is counted down until its probe hears it again
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await d.process(await d.reader.read(None))
            await pause_after_failure(client, 0.05)
    assert d.stats()["fenced"] == 0


TAKEOVER_LOG = "Taking over the master (user request)"


def test_a_replica_is_had_to_take_over_only_once_the_masters_agreed() -> None:
    """`takeover`: the masters' verdict (`fail`), never one master's suspicion (`fail?`);
    and not while a replica is only suspected: it may hold what WAIT confirmed."""
    head = "07c3 10.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n"

    def view(flags: str, *replicas: str) -> dict[str, Any]:
        lines = [f"292f 10.0.0.3:7002@17002 {flags} - 0 0 3 connected 10923-16383"]
        for replica in replicas:  # "id host:port [flags]"
            node_id, address, *its = replica.split()
            lines.append(f"{node_id} {address}@1 {its[0] if its else 'slave'} 292f 0 0 3 connected")
        return _nodes((head + "\n".join(lines)).encode())

    one = view("master,fail", "6ec2 10.0.0.4:7003")
    assert takeover("10.0.0.3:7002", one) == ["10.0.0.4:7003"]
    assert takeover("10.0.0.3:7002", view("master,fail?", "6ec2 10.0.0.4:7003")) == []
    assert takeover("10.0.0.3:7002", view("master,fail")) is None
    two = view("master,fail", "81aa 10.0.0.5:7004", "6ec2 10.0.0.4:7003")
    assert takeover("10.0.0.3:7002", two) == ["10.0.0.4:7003", "10.0.0.5:7004"]
    suspected = view("master,fail", "81aa 10.0.0.5:7004", "6ec2 10.0.0.4:7003 slave,fail?")
    assert takeover("10.0.0.3:7002", suspected) == []
    failed = view("master,fail", "81aa 10.0.0.5:7004", "6ec2 10.0.0.4:7003 slave,fail")
    assert takeover("10.0.0.3:7002", failed) == ["10.0.0.5:7004"]
    assert takeover("10.0.0.1:7000", two) is None  # it has no replica


def test_the_replica_chosen_is_the_one_redis_ranks_first_and_may_stand() -> None:
    """`replica_offset` and `best_replica`: the most writes, then the lowest address (every
    client the same); none that Redis's election would not let stand."""
    config = {
        "cluster-replica-no-failover": "no",
        "cluster-replica-validity-factor": "10",
        "cluster-node-timeout": "1000",
        "repl-ping-replica-period": "10",
    }
    down = {"master_link_status": "down", "master_link_down_since_seconds": "2"}
    assert replica_offset(config, {**down, "slave_repl_offset": "4096"}) == 4096
    assert replica_offset({**config, "cluster-replica-no-failover": "yes"}, down) == NEVER
    stale = {**down, "master_link_down_since_seconds": "30", "slave_repl_offset": "4096"}
    assert replica_offset(config, stale) == NEVER  # 29 s old: over 10 x 1 s + 10 s
    assert replica_offset({**config, "cluster-replica-validity-factor": "0"}, stale) == 4096
    up = {"master_link_status": "up", "master_last_io_seconds_ago": "30", "slave_repl_offset": 9}
    assert replica_offset(config, up) == NEVER
    assert best_replica({"10.0.0.5:7004": 90, "10.0.0.4:7003": 100}) == "10.0.0.4:7003"
    assert best_replica({"10.0.0.5:7004": 100, "10.0.0.4:7003": 100}) == "10.0.0.4:7003"
    assert best_replica({"10.0.0.4:7003": NEVER, "10.0.0.5:7004": 0}) == "10.0.0.5:7004"
    assert best_replica({"10.0.0.4:7003": NEVER}) is None
    assert best_replica({}) is None


async def until_served_by(client: AgonCluster, victim: int, within_s: float) -> float:
    """Seconds until the client's slots no longer name the master on port `victim` (its
    watch sees the masters flag it, and probes it)."""
    began = time.monotonic()
    async with asyncio.timeout(within_s):
        while any(int(n.port) == victim for n in client.get_primaries()):
            await asyncio.sleep(0.05)
    return time.monotonic() - began


def kill_and_probe(nodes: RedisClusterProcesses, client: AgonCluster, victim: int) -> None:
    """SIGKILL the master on port `victim`, and have the client meet it at once (as a
    service with traffic there does: its next command to it is refused)."""
    nodes.kill(victim)
    client.node_failed(next(n for n in client.get_primaries() if int(n.port) == victim))


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_dead_masters_replica_takes_over_once_the_masters_agree_not_after_a_wait(
    replicas: int,
) -> None:
    """Redis's own election waits 0.5-1 s after the masters agree that a master failed
    (more per rank): every game on it stood still that long. A client that sees the
    verdict has the master's best replica take over at once, and only that one."""
    async with running_cluster(replicas=replicas, node_timeout_ms=1000) as (nodes, client):
        victim = int(client.get_primaries()[1].port)
        followers = nodes.replicas_of(victim)
        kill_and_probe(nodes, client, victim)
        await until_served_by(client, victim, within_s=20)
        logs = [nodes.log_of(port) for port in followers]
        assert len(logs) == replicas
        assert sum(TAKEOVER_LOG in log for log in logs) == 1, [log[-1500:] for log in logs]
        assert not any("Failover election won" in log for log in logs)


async def test_a_master_only_this_client_cannot_reach_is_not_taken_over() -> None:
    """The attack on the shortcut: a master that answers no client (CLIENT PAUSE) but the
    cluster (its bus) is counted down by this client, and must not lose its slots: only
    the masters' verdict counts."""
    async with running_cluster(replicas=1, node_timeout_ms=1000) as (nodes, client):
        victim = client.get_primaries()[1]
        replica = nodes.replica_of(int(victim.port))
        other = next(n for n in client.get_primaries() if n is not victim)
        await victim.execute_command("CLIENT", "PAUSE", "3000", "ALL")
        client.node_failed(victim)
        await asyncio.sleep(1.0)
        assert client.is_down(victim), "its PING should have gone unanswered"
        await asyncio.sleep(2.5)  # over twice the node timeout, the client probing it
        assert TAKEOVER_LOG not in nodes.log_of(replica)
        rows = _nodes(await other.execute_command("CLUSTER NODES"))
        assert rows[victim.name].serves and "master" in rows[victim.name].flags


async def test_a_replica_an_operator_keeps_from_standing_is_not_had_to_take_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`cluster-replica-no-failover yes`: an operator fails that master over by hand (a
    replica in another data centre, say). Redis's election leaves it alone; so must the
    clients, even once the masters agree that its master failed."""
    caplog.set_level(logging.INFO, logger="agon.bus")
    async with running_cluster(replicas=1, node_timeout_ms=1000) as (nodes, client):
        victim = int(client.get_primaries()[1].port)
        replica = nodes.replica_of(victim)
        held = ClusterNode("127.0.0.1", replica)
        await held.execute_command("CONFIG", "SET", "cluster-replica-no-failover", "yes")
        await held.disconnect()
        kill_and_probe(nodes, client, victim)
        async with asyncio.timeout(20):  # the masters' verdict, then a second more
            while not any(
                int(row["port"]) == victim and "fail" in row["flags"].split(",")
                for row in nodes.cluster_nodes(replica)
            ):
                await asyncio.sleep(0.05)
        async with asyncio.timeout(10):  # the client saw the verdict and asked the replica
            while "no replica of it may stand" not in caplog.text:
                await asyncio.sleep(0.05)
        assert any(int(n.port) == victim for n in client.get_primaries())
        assert TAKEOVER_LOG not in nodes.log_of(replica)


async def test_learning_the_slots_again_does_not_ask_a_master_counted_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """redis-py learns the slots again after a failure from the nodes it knows in a random
    order, and a dead one before a live one costs a connect timeout (a read timeout
    here) with every command of the process waiting: in kill-host runs a member's beats
    and renewals stopped for over a second, and the others took its partitions. A master
    the client counted down is not asked. Here the order is the worst: it comes first."""
    import redis.asyncio.cluster as redis_cluster

    async with running_cluster() as (nodes, client):
        # not the node the URL names: the client keeps that one's own object
        victim = next(n for n in client.get_primaries() if int(n.port) != nodes.ports[0])
        monkeypatch.setattr(
            redis_cluster.random,
            "shuffle",
            lambda ns: ns.sort(key=lambda n: n.name != victim.name),
        )
        nodes.pause(int(victim.port))
        try:
            client.node_failed(victim)
            async with asyncio.timeout(5):
                while not client.is_down(victim):
                    await asyncio.sleep(0.05)
            client._initialize = True  # as after any command's connection error
            async with asyncio.timeout(NODE_READ_TIMEOUT_S):  # no node's read timeout
                await client.initialize()
        finally:
            nodes.resume(int(victim.port))
        assert client._initialize is False


@pytest.mark.parametrize("own_read", ["first", "after the claim"])
async def test_a_master_back_from_away_has_a_waiting_reader_sweep_at_once(
    cluster: tuple[RedisClusterProcesses, AgonCluster],
    monkeypatch: pytest.MonkeyPatch,
    own_read: str,
) -> None:
    """A dead consumer's entries on a master that failed over cannot be claimed while it
    is away (a killed host's bot worker held turns on its inbox's master). Told the master
    is back (`master_away`), a consumer sweeps at once, even while its read waits for new
    entries, not a sweep period later.

    `master_away` also reads the consumer's own pending entries there again, beside the
    sweep: Redis may answer that read after the sweep's XCLAIM (its pipeline opening a
    connection first, the lanes holding the others; once in a run of the file), and the
    entry is then pending with this consumer too; it is handed over as taken over all the
    same, and once."""
    _, client = cluster
    # Every master answers here: the sweep's one read of the beats must judge, as there is
    # no other sweep within the test (`claim_every_s`). It waits for both copies, not the
    # `COPY_GRACE_S` (0.1 s) a dead master's copy gets after the other answered: a stall of
    # this process there (a full garbage collection takes 0.1-0.2 s once the whole file
    # has run) can cut the live copy off, the one read alone holds no fresh beat (nobody
    # beats here), and the sweep judges nobody dead; the next one is 30 s away.
    monkeypatch.setattr(presence, "COPY_GRACE_S", 60.0)
    keys = Keys(prefix="away", partitions=4)
    engine = EngineService(client, keys, consumer="alive", secret=SECRET)
    engine.reader.claim_every_s = 30.0
    await engine.setup()
    assert await engine.reader.read(None) == []  # and its first sweep, beside the read
    first = engine.reader._claiming
    assert first is not None
    await asyncio.wait([first])
    stream = keys.commands(0)
    ghost = GroupReader(client, [stream], ENGINE_GROUP, "ghost", heartbeats=beat_keys(client, keys))
    await client.xadd(stream, {FIELD: b"x"})
    (held,) = await ghost.read(None)  # it dies holding the entry: it never beats
    await asyncio.sleep(0.6)  # past dead_idle_ms
    if own_read == "after the claim":
        own_pending = engine.reader._own_pending

        async def after_the_claim() -> list[Entry]:
            monkeypatch.setattr(engine.reader, "_own_pending", own_pending)  # (once)
            async with asyncio.timeout(3):
                while not await client.xpending_range(
                    stream, ENGINE_GROUP, "-", "+", 1, consumername="alive"
                ):
                    await asyncio.sleep(0.01)
            return await own_pending()

        monkeypatch.setattr(engine.reader, "_own_pending", after_the_claim)
    reading = asyncio.ensure_future(engine.reader.read(10_000))
    await asyncio.sleep(0.2)
    assert not reading.done()
    try:
        engine.master_away((now_ms() - 1000, now_ms()), frozenset({keys.slot(0)}))
        async with asyncio.timeout(3):
            taken = await reading
            while not taken:
                taken = await engine.reader.read(10_000)
        # (handed over as taken from a dead consumer, and once: never also as its own)
        assert [(e.entry_id, e.taken_over) for e in taken] == [(held.entry_id, True)]
        await engine.reader.ack(taken)
        assert await engine.reader.read(None) == []
    finally:
        reading.cancel()
        await ghost.close()
        await engine.reader.close()
