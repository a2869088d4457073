"""The projector against a real redis-server: views, index, results, rebuild and verify.

Games are played through the whole pipeline in drain mode (engine, dispatcher, random
workers, projector), then the read models are checked: the view of every game (with the
surplus display for the chains games), the game index, per-bot results, that `rebuild`
reproduces them byte for byte, that replaying the feed changes nothing, that `verify`
finds an edited event and an edited view, and that a projector whose partition's lease
another took writes nothing there (fencing).
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from schemas.codec import (
    FIELD,
    FIELD_BYTES,
    decode_reply,
    encode,
    event_hash,
    unpack,
    unpack_event,
)
from schemas.commands import CreateGame, PlayMove, SeatPlayer, SeatSpec
from services.bus.clients import QueryClient
from services.bus.connection import ReplicasBehind
from services.bus.keys import PROJECTOR_GROUP, Keys
from services.bus.ownership import Ownership
from services.bus.reader import Entry
from services.cli.pipeline import ServiceSet, create_games, wait_until_ended
from services.engine_service import EngineService
from services.gamelog.fold import GameFold, fold
from services.projector import (
    Projector,
    compare_read_models,
    models,
    rebuild,
    snapshot,
    verify,
    write,
)
from services.projector.rebuild import _start, rebuild_write
from tests.conftest import PrimaryAndReplica
from tests.support.faults import hold_share

ROOT = Path(__file__).resolve().parents[2]
KEYS = Keys()
BOTS = ["random", "random"]
#: Every game once, on small boards where there is a choice, so drains stay short.
SPECS: list[tuple[str, dict[str, str]]] = [
    ("supply-chains", {}),
    ("supplier-sabotage", {}),
    ("teeko", {}),
    ("hexade", {}),
    ("overflow", {"size": "3"}),
]


async def play(redis: aioredis.Redis, specs: Any = SPECS, count: int = 1) -> list[str]:
    services = ServiceSet(redis, KEYS, ["random"])
    ids = await create_games(redis, KEYS, specs, count, BOTS)
    await services.drain()
    return ids


async def turns(services: ServiceSet, rounds: int) -> None:
    """`rounds` turns of every game: the engine decides, the dispatcher hands the next turn
    over, the worker answers; the projector is left to the test."""
    for _ in range(rounds):
        await services.engines[0].drain()
        await services.dispatcher.drain()
        await services.workers[0].drain()


async def view(redis: aioredis.Redis, game_id: str) -> dict[str, Any]:
    raw = await redis.get(KEYS.view(game_id))
    assert raw is not None, f"no view of {game_id}"
    result: dict[str, Any] = json.loads(raw)
    return result


async def test_every_game_ends_and_its_view_matches_its_log(redis: aioredis.Redis) -> None:
    ids = await play(redis)
    for gid in ids:
        v = await view(redis, gid)
        log = await redis.xrange(KEYS.log(gid))
        last = unpack(log[-1][1][FIELD_BYTES])
        assert v["status"] == "ended"
        assert v["seq"] == len(log)
        assert last["type"] == "game_ended"
        assert v["result"]["winner"] == last["result"]
        assert v["to_move"] == 0
        moves = [unpack(f[FIELD_BYTES]) for _, f in log]
        moves = [m for m in moves if m["type"] == "move_played"]
        assert v["ply"] == len(moves)
        assert v["last_move"]["move"] == moves[-1]["move"]
        assert v["position"], "a board position"


async def test_chains_views_carry_the_surplus_display(redis: aioredis.Redis) -> None:
    [gid] = await play(redis, [("supply-chains", {})])
    display = (await view(redis, gid))["display"]
    assert display["chains"], "an ended Supply Chains game has chains"
    for chain in display["chains"]:
        assert chain["surplus"] == len(chain["suppliers_around"]) - len(chain["warehouses"])
        assert set(chain["warehouses"]) <= set(chain["cells"])
    assert set(display["deficit_warehouses"]) == {"1", "2"}
    [teeko] = await play(redis, [("teeko", {})])
    assert "display" not in await view(redis, teeko)


async def test_index_and_bot_results(redis: aioredis.Redis) -> None:
    ids = await play(redis, [("teeko", {})], count=4)
    p_of = {gid: KEYS.partition(gid) for gid in ids}
    for gid, p in p_of.items():
        assert await redis.zscore(KEYS.index_status(p, "ended"), gid) is not None
        assert await redis.zscore(KEYS.index_status(p, "playing"), gid) is None
        assert await redis.zscore(KEYS.index_game(p, "teeko"), gid) is not None
        assert await redis.zscore(KEYS.index_player(p, "random"), gid) is not None
        assert await redis.zscore(KEYS.index_time(p), gid) is not None
    totals = await QueryClient(redis, KEYS).bot_results("random")
    # Both seats are "random": every game counts twice, and a decided game is a win and a loss.
    assert totals["games"] == 8
    assert totals.get("wins", 0) == totals.get("losses", 0)
    assert totals.get("wins", 0) + totals.get("losses", 0) + totals.get("draws", 0) == 8


async def test_rebuild_is_byte_identical_to_the_live_projection(redis: aioredis.Redis) -> None:
    ids = await play(redis, count=2)
    live = await snapshot(redis, KEYS)
    assert len([k for k in live if ":view:" in k]) == len(ids)
    stats = await rebuild(redis, KEYS)
    assert (stats.games, stats.skipped) == (len(ids), [])
    rebuilt = await snapshot(redis, KEYS)
    assert compare_read_models(live, rebuilt) == []
    assert rebuilt == live


async def test_rebuild_sweeps_away_the_models_of_a_game_that_is_gone(
    redis: aioredis.Redis,
) -> None:
    ids = await play(redis, count=3)
    gone = ids[1]
    before = await snapshot(redis, KEYS)
    assert any(gone in k for k in before)
    await redis.zrem(KEYS.games(KEYS.partition(gone)), gone)  # unregistered, log deleted
    await redis.delete(KEYS.log(gone))
    stats = await rebuild(redis, KEYS)
    assert stats.games == len(ids) - 1
    # its view, its index entries and its bots' results: at least 1 + 3 + 2 cells
    assert stats.swept >= 6
    after = await snapshot(redis, KEYS)
    assert not any(gone in k for k in after)
    assert all(gone not in json.dumps(v, default=str) for v in after.values())
    assert (await verify(redis, KEYS)).problems == []


async def test_rebuild_in_worker_processes_in_small_chunks(
    redis: aioredis.Redis, redis_url: str
) -> None:
    # Forked workers, and chunks small enough that reads, folds and writes overlap.
    ids = await play(redis, count=2)
    create = CreateGame(
        command_id="create",
        reply_to=KEYS.reply_stream("test"),
        game_id="human-2",
        game="supply-chains",
        seats=[SeatSpec(kind="human", name="ada"), SeatSpec(kind="bot", name="random")],
    )
    await redis.xadd(KEYS.commands_for("human-2"), {FIELD: encode(create)})
    await ServiceSet(redis, KEYS, ["random"]).drain()
    assert (await view(redis, "human-2"))["status"] == "waiting"
    live = await snapshot(redis, KEYS)
    stats = await rebuild(redis, KEYS, chunk=2, workers=2, url=redis_url)
    assert (stats.games, stats.skipped) == (len(ids) + 1, [])
    assert compare_read_models(live, await snapshot(redis, KEYS)) == []
    # A log with a hole does not fold: that game is reported, every other one rebuilt.
    broken = ids[0]
    rows = await redis.xrange(KEYS.log(broken))
    await redis.xdel(KEYS.log(broken), rows[3][0])
    stats = await rebuild(redis, KEYS, chunk=2, workers=2, url=redis_url)
    assert stats.games == len(ids)
    assert len(stats.skipped) == 1 and stats.skipped[0].startswith(f"game {broken}: ")
    assert "event seq 5 after 3" in stats.skipped[0]
    # Rebuild deletes nothing it cannot recompute: the game keeps its last view, reported.
    assert await redis.get(KEYS.view(broken)) == live[KEYS.view(broken)]
    for gid in ids[1:]:
        assert await redis.get(KEYS.view(gid)) == live[KEYS.view(gid)]


async def test_a_rebuild_read_or_write_dropped_after_a_failure_is_not_reported() -> None:
    # When Redis goes away mid-rebuild, the read or write awaited next raises and the other
    # fails alike, unawaited: asyncio must not log it, traceback and all, when it is
    # collected (after `agon rebuild`'s one-line error, or inside whatever code runs then).
    async def gone() -> None:
        raise RedisConnectionError("Connection closed by server.")

    tasks: list[asyncio.Future[Any]] = []
    awaited, dropped = _start(tasks, gone()), _start(tasks, gone())
    with pytest.raises(RedisConnectionError):
        await awaited
    await asyncio.wait([dropped])
    reports: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reports.append(context))
    try:
        del tasks, awaited, dropped
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert [r["message"] for r in reports] == []


async def test_folding_in_any_batches_gives_the_same_view(redis: aioredis.Redis) -> None:
    # Rebuild folds a log in one pass, keeping only the last move's facts; the live
    # projector folds whatever each feed batch brings. Both must give the same bytes.
    ids = await play(redis, [("supply-chains", {}), ("hexade", {})])
    for gid in ids:
        events = [unpack(f[FIELD_BYTES]) for _, f in await redis.xrange(KEYS.log(gid))]
        whole = fold(gid, events).view_bytes()
        assert whole == await redis.get(KEYS.view(gid))
        for size in (1, 2, 3, 7):
            proj = GameFold.start(events[0])
            for start in range(1, len(events), size):
                proj.extend(events[start : start + size])
            assert proj.view_bytes() == whole, f"{gid} folded {size} events at a time"
        # Mid-game views too: a move's facts must not leak past the event that follows it.
        for end in range(2, len(events)):
            one_by_one = GameFold.start(events[0])
            for ev in events[1:end]:
                one_by_one.apply(ev)
            assert fold(gid, events[:end]).view_bytes() == one_by_one.view_bytes()


async def test_replaying_the_feed_changes_nothing(redis: aioredis.Redis) -> None:
    await play(redis, [("teeko", {}), ("hexade", {})], count=2)
    before = await snapshot(redis, KEYS)
    # A new projector with an empty cache reads every feed again from the start: the
    # `seen` guard must make every event a no-op (no double-counted results).
    for p in KEYS.all_partitions():
        await redis.xgroup_setid(KEYS.feed(p), PROJECTOR_GROUP, "0")
    again = Projector(redis, KEYS)
    assert await again.drain() > 0
    assert again.writes == 0
    assert await snapshot(redis, KEYS) == before


async def test_a_stale_cache_loses_the_race_and_refolds(redis: aioredis.Redis) -> None:
    """Two projectors of one group: the one holding an old position must not overwrite."""
    services = ServiceSet(redis, KEYS, ["random"])
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, BOTS)
    feed = KEYS.feed(KEYS.partition(gid))
    # Play a few moves and let projector A cache the game.
    await turns(services, 3)
    a = services.projector
    await a.drain()
    seq_a = (await view(redis, gid))["seq"]
    # Projector B projects the next events; A then gets a (redelivered) copy of them.
    await turns(services, 1)
    await services.engines[0].drain()
    b = Projector(redis, KEYS)
    await b.drain()
    seq_b = (await view(redis, gid))["seq"]
    assert seq_b > seq_a
    rows = await redis.xrange(feed)
    copies = [Entry(feed, eid, f[FIELD_BYTES]) for eid, f in rows]
    await a.process(copies)
    assert (await view(redis, gid))["seq"] == seq_b
    await services.drain()
    report = await verify(redis, KEYS)
    assert report.problems == []


async def test_a_human_to_move_sees_the_legal_moves(redis: aioredis.Redis) -> None:
    services = ServiceSet(redis, KEYS, ["random"])
    reply_to = KEYS.reply_stream("test")
    create = CreateGame(
        command_id="create",
        reply_to=reply_to,
        game_id="human-1",
        game="teeko",
        seats=[SeatSpec(kind="human", name="ada"), SeatSpec(kind="bot", name="random")],
    )
    await redis.xadd(KEYS.commands_for("human-1"), {FIELD: encode(create)})
    await services.drain()
    assert (await view(redis, "human-1"))["status"] == "waiting"
    seat = SeatPlayer(command_id="seat", reply_to=reply_to, game_id="human-1", seat=1, name="ada")
    await redis.xadd(KEYS.commands_for("human-1"), {FIELD: encode(seat)})
    await services.drain()
    replies = [decode_reply(f[FIELD_BYTES]) for _, f in await redis.xrange(reply_to)]
    token = replies[-1].token  # type: ignore[union-attr]
    assert token
    v = await view(redis, "human-1")
    assert (v["status"], v["to_move"]) == ("playing", 1)
    assert v["seats"][0] == {"seat": 1, "kind": "human", "name": "ada", "colour": 1, "seated": True}
    assert len(v["legal"]) == 25, "Teeko's first move: any of the 25 cells"
    move = PlayMove(
        command_id="m1",
        game_id="human-1",
        seat=1,
        token=token,
        move=v["legal"][0],
        expected_seq=v["seq"],
    )
    await redis.xadd(KEYS.commands_for("human-1"), {FIELD: encode(move)})
    await services.drain()
    v = await view(redis, "human-1")
    # The bot answered, so the human is to move again.
    assert (v["ply"], v["to_move"]) == (2, 1)
    p = KEYS.partition("human-1")
    assert await redis.zscore(KEYS.index_player(p, "ada"), "human-1") is not None
    assert await redis.zscore(KEYS.index_status(p, "playing"), "human-1") is not None


async def test_verify_passes_on_a_clean_pipeline(redis: aioredis.Redis) -> None:
    ids = await play(redis)
    report = await verify(redis, KEYS)
    assert report.problems == []
    assert report.games == len(ids)


async def test_verify_catches_an_edited_event(redis: aioredis.Redis) -> None:
    [gid] = await play(redis, [("teeko", {})])
    log_key = KEYS.log(gid)
    rows = await redis.xrange(log_key)
    events = [unpack(f[FIELD_BYTES]) for _, f in rows]
    target = next(i for i, e in enumerate(events) if e["type"] == "move_played")
    # Forge the first move as the cell the second move took: entries still decode, but the
    # chain breaks after the edit and the second move lands on an occupied cell.
    edited = dict(events[target], move=events[target + 1]["move"])
    datas = [f[FIELD_BYTES] for _, f in rows]
    datas[target] = msgpack.packb(edited, use_bin_type=True)
    await redis.delete(log_key)
    for (eid, _), data in zip(rows, datas, strict=True):
        await redis.xadd(log_key, {FIELD: data}, id=eid)
    problems = (await verify(redis, KEYS)).problems
    seq = target + 1
    assert f"game {gid} entry {seq + 1}: prev_hash" in problems[0]
    assert f"sha256 of entry {seq} ({event_hash(datas[target])})" in problems[0]
    assert f"game {gid} seq {seq + 1}: move {edited['move']!r} rejected by the rules" in problems[1]


async def test_verify_catches_an_edited_view(redis: aioredis.Redis) -> None:
    [gid] = await play(redis, [("teeko", {})])
    v = await view(redis, gid)
    v["scores"] = [99, 0]
    await redis.set(KEYS.view(gid), json.dumps(v, sort_keys=True, separators=(",", ":")))
    report = await verify(redis, KEYS)
    assert len(report.problems) == 1
    [problem] = report.problems
    assert KEYS.view(gid) in problem and "scores" in problem and "[99, 0]" in problem


async def test_verify_catches_a_missing_view_and_an_extra_result(redis: aioredis.Redis) -> None:
    [gid] = await play(redis, [("teeko", {})])
    p = KEYS.partition(gid)
    await redis.delete(KEYS.view(gid))
    await redis.hincrby(KEYS.bot_results(p, "random"), "wins", 1)
    problems = (await verify(redis, KEYS)).problems
    assert any(KEYS.view(gid) in x and "missing" in x for x in problems)
    assert any(KEYS.bot_results(p, "random") in x and "differs" in x for x in problems)


async def test_a_model_write_lands_only_where_the_log_holds_the_event_it_folded(
    redis: aioredis.Redis,
) -> None:
    # After a failover the new master may hold another event of the same seq, or none:
    # a write naming its fold's last entry (`Write.head`) is refused unless this log holds it.
    [gid] = await play(redis, [("teeko", {})])
    rows = await redis.xrange(KEYS.log(gid))
    game = fold(gid, [unpack_event(f[FIELD_BYTES]) for _, f in rows])
    n = game.seq

    async def written(head: str) -> bool:
        await redis.delete(KEYS.view(gid))
        [(result, _)] = await write.write(redis, KEYS, [write.Write(game, n, n, head=head)])
        assert (result == -1) == (await redis.get(KEYS.view(gid)) is not None)
        return result == -1

    assert not await written(write.head_of(rows[0][1][FIELD_BYTES]))  # another event
    assert await written(write.head_of(rows[-1][1][FIELD_BYTES]))
    await redis.xdel(KEYS.log(gid), rows[-1][0])
    assert not await written(write.head_of(rows[-1][1][FIELD_BYTES]))  # no such entry


async def test_with_replicas_a_batch_is_acknowledged_once_a_replica_holds_its_models(
    primary_and_replica: PrimaryAndReplica,
) -> None:
    redis, replica = primary_and_replica.redis, primary_and_replica.replica
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, BOTS)
    await EngineService(redis, KEYS).drain()
    feed = KEYS.feed(KEYS.partition(gid))
    projector = Projector(redis, KEYS, replicas=1, replica_timeout_ms=100)
    with pytest.raises(ReplicasBehind):  # the server has no replica to confirm it
        await projector.drain()
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == await redis.xlen(feed)
    await primary_and_replica.follow()
    projector.reader.recover()  # as the loop does after a failed batch
    await projector.drain()
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == 0
    assert await replica.get(KEYS.view(gid)) == await redis.get(KEYS.view(gid)) is not None


@pytest.mark.parametrize("bad", [b"\xc1not msgpack", b"\x93\x01\x02\x03", None])
async def test_a_broken_feed_entry_is_skipped_and_acknowledged(
    redis: aioredis.Redis, bad: bytes | None
) -> None:
    feed = KEYS.feed(0)
    projector = Projector(redis, KEYS)
    await projector.reader.setup()
    await redis.xadd(feed, {FIELD: bad} if bad is not None else {"x": b"1"})
    await play(redis, [("teeko", {})])
    await projector.drain()
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == 0
    assert (await verify(redis, KEYS)).problems == []


async def test_a_feed_entry_that_fails_alone_is_set_aside_not_retried(
    redis: aioredis.Redis,
) -> None:
    # It decodes and routes like an event, but lacks fields the view needs: the batch it
    # arrives in fails, and the projector must set this one entry aside and project the rest.
    bad = {"type": "game_created", "game_id": "bad-1", "seq": 1, "time": 1, "game": "teeko"}
    bad |= {"options": {}, "seats": [{"kind": "bot", "name": "random"}] * 2}
    feed = KEYS.feed(KEYS.partition("bad-1"))
    projector = Projector(redis, KEYS)
    await projector.reader.setup()
    bad_id = await redis.xadd(feed, {FIELD: msgpack.packb(bad, use_bin_type=True)})
    ids = await play(redis, [("teeko", {})], count=3)
    assert await projector.drain() == 0, "the services' projector took every entry"
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == 0
    assert await redis.get(KEYS.view("bad-1")) is None
    for gid in ids:
        assert (await view(redis, gid))["status"] == "ended"
    dead = [f for _, f in await redis.xrange(KEYS.reader_dead_letter())]
    mine = [f for f in dead if f[b"group"] == PROJECTOR_GROUP.encode()]
    assert [(f[b"stream"].decode(), f[b"id"]) for f in mine] == [(feed, bad_id)]
    assert b"KeyError" in mine[0][b"reason"]
    assert (await verify(redis, KEYS)).problems == []


async def test_rebuild_while_play_goes_on_leaves_every_read_model_right(
    redis: aioredis.Redis, redis_url: str
) -> None:
    """`agon rebuild` (its own processes) and in-process rebuilds race a live pipeline; once
    play stops, verify finds every read model equal to what the logs imply."""
    services = ServiceSet(redis, KEYS, ["random"])
    await services.start()
    try:
        ids = await create_games(redis, KEYS, [("supply-chains", {}), ("teeko", {})], 15, BOTS)
        rebuilds = 0
        while await wait_until_ended(redis, KEYS, ids, 0.01, services.failed):
            if rebuilds % 2:
                await rebuild(redis, KEYS)
            else:
                run = subprocess.run(
                    [sys.executable, "-m", "services.cli", "rebuild", "--redis-url", redis_url],
                    cwd=ROOT, capture_output=True, text=True, timeout=120,
                )  # fmt: skip
                assert run.returncode == 0, run.stderr
            rebuilds += 1
        assert rebuilds >= 2, "play ended before a rebuild could race it"
    finally:
        await services.stop()
    report = await verify(redis, KEYS)
    assert report.problems == []
    assert report.games == len(ids)


@pytest.mark.parametrize("optimistic", [False, True], ids=["script", "watched"])
async def test_a_rebuild_write_from_an_older_log_never_overwrites_newer_models(
    redis: aioredis.Redis, optimistic: bool
) -> None:
    """The race above, made certain: a rebuild folds the logs mid-play, the games then end
    and are projected, and only then does the rebuild write what it folded."""
    services = ServiceSet(redis, KEYS, ["random"])
    ids = await create_games(redis, KEYS, [("teeko", {})], 4, BOTS)
    for _ in range(6):  # part of each game
        await services.engines[0].drain()
        await services.dispatcher.drain()
        await services.workers[0].drain()
    await services.projector.drain()
    query = QueryClient(redis, KEYS)
    stale = [fold(gid, [unpack_event(e.data) for e in await query.log(gid)]) for gid in ids]
    assert all(game.status == "playing" for game in stale)
    await services.drain()
    assert all(v is not None and v["status"] == "ended" for v in await query.views(ids))
    writes = [rebuild_write(g) for g in stale]
    results = await write.write(redis, KEYS, writes, optimistic=optimistic)
    assert all(refused != -1 for refused, _ in results)  # the stored models are newer
    assert (await verify(redis, KEYS)).problems == []


async def test_a_watched_write_interrupted_by_another_write_writes_nothing(
    redis: aioredis.Redis,
) -> None:
    """Rebuild's optimistic transaction: a live write landing between its guard read and
    its EXEC (here the script writing the newer fold) aborts it whole; `write` then goes
    through the script, whose guard refuses the older fold."""
    services = ServiceSet(redis, KEYS, ["random"])
    (gid,) = await create_games(redis, KEYS, [("teeko", {})], 1, BOTS)
    for _ in range(4):
        await services.engines[0].drain()
        await services.dispatcher.drain()
        await services.workers[0].drain()
    await services.projector.drain()
    query = QueryClient(redis, KEYS)
    stale = fold(gid, [unpack_event(e.data) for e in await query.log(gid)])
    await services.drain()
    newer = fold(gid, [unpack_event(e.data) for e in await query.log(gid)])
    assert newer.seq > stale.seq
    p = KEYS.partition(gid)
    await redis.hdel(KEYS.projector_seen(p), gid)  # as before any projection: guards hold

    async def live_write() -> None:
        ((done, _),) = await write.write(redis, KEYS, [rebuild_write(newer)])
        assert done == -1

    cells = [models.game_cells(KEYS, stale)]
    got = await write._watched(redis, KEYS, p, [rebuild_write(stale)], cells, between=live_write)
    assert got is None
    assert await redis.hget(KEYS.projector_seen(p), gid) == str(newer.seq).encode()
    assert await redis.get(KEYS.view(gid)) == newer.view_bytes()
    ((refused, _),) = await write.write(redis, KEYS, [rebuild_write(stale)], optimistic=True)
    assert refused == newer.seq
    assert (await verify(redis, KEYS)).problems == []


async def test_a_projector_paused_past_its_lease_writes_nothing_after_it_resumes(
    redis: aioredis.Redis,
) -> None:
    """The attack fencing stops, as for the engine (`tests/bus/test_ownership.py`): projector
    A owns partition p, stalls past its lease; B takes p; A wakes up and projects p's feed.
    Nothing of it may land, and its entries stay pending for B, whose epoch writes."""
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, BOTS)
    await EngineService(redis, KEYS).drain()
    p = KEYS.partition(gid)
    feed = KEYS.feed(p)
    events = await redis.xlen(feed)
    old = Projector(redis, KEYS)
    old.ownership = Ownership(redis, KEYS, Projector.role, old.reader.consumer, lease_ms=200)
    await hold_share(old.ownership)
    epoch = old.ownership.epoch(p)
    assert epoch > 0
    await asyncio.sleep(0.3)  # A's lease lapses while it sleeps
    new = Projector(redis, KEYS)
    new.ownership = Ownership(redis, KEYS, Projector.role, new.reader.consumer)
    await hold_share(new.ownership)
    assert new.ownership.epoch(p) == epoch + 1
    assert await old.drain() == events
    assert await snapshot(redis, KEYS) == {}, "a fenced projector wrote read models"
    assert await redis.hget(KEYS.projector_seen(p), gid) is None
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == events
    assert (old.stats()["fenced"], old.writes) == (1, 0)
    assert p not in old.ownership.owned
    assert await new.reader.claim_strays([feed]) == events
    await new.drain()
    assert (await view(redis, gid))["seq"] == await redis.xlen(KEYS.log(gid))
    assert (await redis.xpending(feed, PROJECTOR_GROUP))["pending"] == 0
    assert new.stats()["fenced"] == 0


async def test_events_that_come_again_are_projected_where_the_stored_models_lack_them(
    redis: aioredis.Redis,
) -> None:
    """A master dies holding model writes no replica has: the new master's log gets the same
    seqs again (commands sent again) and the projector reads them again, while its fold
    already holds them. What is stored decides: the models are written again."""
    services = ServiceSet(redis, KEYS, ["random"])
    [gid] = await create_games(redis, KEYS, [("teeko", {})], 1, BOTS)
    await turns(services, 3)
    a = services.projector
    await a.drain()
    seq = (await view(redis, gid))["seq"]
    assert seq > 4
    # The failover lost every model write of the game; its events come again.
    await redis.delete(KEYS.view(gid))
    await redis.hdel(KEYS.projector_seen(KEYS.partition(gid)), gid)
    feed = KEYS.feed(KEYS.partition(gid))
    await a.process([Entry(feed, eid, f[FIELD_BYTES]) for eid, f in await redis.xrange(feed)])
    assert (await view(redis, gid))["seq"] == seq
    await services.drain()
    assert (await verify(redis, KEYS)).problems == []
