"""The event store against a real redis-server: atomic append, seq conflicts, idempotent
command ids, reads, the hash chain, and the key layout it relies on."""

from __future__ import annotations

import fnmatch
import re
import zlib

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from schemas.codec import decode_event, decode_reply, encode, event_hash
from schemas.commands import PlayMove, SeatSpec
from schemas.events import GameCreated, GameStarted, MovePlayed
from schemas.replies import Accepted, Rejected
from services.bus.clients import CommandClient, LogEntry, QueryClient
from services.bus.connection import plain_client as connect
from services.bus.keys import ENGINE_GROUP, Keys, partition_of
from services.engine_service import Commit, EventStore, SeqConflict
from services.gamelog.checks import chain_problems
from services.projector.models import all_patterns


def events_for(game_id: str, start_seq: int, prev_hash: str, moves: list[str]) -> list[bytes]:
    """Encoded, chained events from `start_seq` on: a creation and start, then moves."""
    out: list[bytes] = []
    seq, prev = start_seq, prev_hash
    common = {"game_id": game_id, "time": 1_700_000_000_000, "command_id": "c"}
    if seq == 1:
        for model in (
            GameCreated(
                **common,
                seq=1,
                prev_hash="",
                game="teeko",
                options={"markers": "8"},
                seats=[SeatSpec(kind="bot", name="random")] * 2,
                move_time_ms=0,
                seed=7,
                engine_version="1",
            ),
            GameStarted(**common, seq=2, prev_hash="", to_move=1, colours=[1, 2]),
        ):
            data = encode(model.model_copy(update={"prev_hash": prev}))
            out.append(data)
            prev = event_hash(data)
        seq = 3
    for i, move in enumerate(moves):
        ev = MovePlayed(
            **common,
            seq=seq,
            prev_hash=prev,
            ply=seq - 3,
            seat=1 + i % 2,
            colour=1 + i % 2,
            move=move,
            scores_after=None,
            colours=[1, 2],
            to_move=2 - i % 2,
        )
        data = encode(ev)
        out.append(data)
        prev = event_hash(data)
        seq += 1
    return out


def accepted(command_id: str, game_id: str, seq: int) -> bytes:
    return encode(Accepted(command_id=command_id, game_id=game_id, seq=seq))


@pytest.fixture
def store(redis: aioredis.Redis, namespace: str) -> EventStore:
    return EventStore(redis, Keys(prefix=namespace))


async def test_commit_appends_to_log_feed_and_registry(store: EventStore) -> None:
    events = events_for("g1", 1, "", ["A1", "B2"])
    done = await store.commit(
        Commit("g1", 0, "create", accepted("create", "g1", 4), events, time=123)
    )
    assert (done.head, done.duplicate) == (4, False)
    assert await QueryClient(store.redis, store.keys).head("g1") == 4
    raw = await QueryClient(store.redis, store.keys).log("g1")
    assert [e.seq for e in raw] == [1, 2, 3, 4]
    assert [e.data for e in raw] == events
    ids = await store.redis.xrange(store.keys.log("g1"))
    assert [i for i, _ in ids] == [b"1-0", b"2-0", b"3-0", b"4-0"]
    feed = await store.redis.xrange(store.keys.feed(store.keys.partition("g1")))
    assert [f[b"m"] for _, f in feed] == events
    assert await QueryClient(store.redis, store.keys).game_ids() == ["g1"]
    assert await store.redis.zscore(store.keys.games(store.keys.partition("g1")), "g1") == 123
    assert chain_problems("g1", raw) == []


async def test_read_from_a_seq(store: EventStore) -> None:
    events = events_for("g1", 1, "", ["A1", "B2", "C3"])
    await store.commit(Commit("g1", 0, "c1", accepted("c1", "g1", 5), events))
    tail = await QueryClient(store.redis, store.keys).events("g1", from_seq=4)
    assert [e.seq for e in tail] == [4, 5]
    assert [e.move for e in tail if isinstance(e, MovePlayed)] == ["B2", "C3"]
    assert await QueryClient(store.redis, store.keys).log("nope") == []
    assert await QueryClient(store.redis, store.keys).head("nope") == 0


async def test_same_command_twice_returns_first_reply_and_appends_nothing(
    store: EventStore,
) -> None:
    events = events_for("g1", 1, "", [])
    first = accepted("create", "g1", 2)
    await store.commit(Commit("g1", 0, "create", first, events))
    more = events_for("g1", 3, event_hash(events[-1]), ["A1"])
    # Same id, a different head and different events: still only the first reply.
    again = await store.commit(Commit("g1", 2, "create", accepted("create", "g1", 3), more))
    assert again.duplicate and again.reply == first
    assert await QueryClient(store.redis, store.keys).head("g1") == 2
    feed_len = await store.redis.xlen(store.keys.feed(store.keys.partition("g1")))
    assert feed_len == 2


async def test_seq_conflict_is_typed_and_changes_nothing(store: EventStore) -> None:
    events = events_for("g1", 1, "", ["A1"])
    await store.commit(Commit("g1", 0, "c1", accepted("c1", "g1", 3), events))
    stale = events_for("g1", 3, event_hash(events[-1]), ["B2"])
    with pytest.raises(SeqConflict) as info:
        await store.commit(Commit("g1", 2, "c2", accepted("c2", "g1", 3), stale))
    assert (info.value.expected, info.value.actual) == (2, 3)
    assert await QueryClient(store.redis, store.keys).head("g1") == 3
    # The conflicting command was not remembered: it can be retried on the new head.
    assert await store.remembered_reply("g1", "c2") is None
    fresh = events_for("g1", 4, event_hash(events[-1]), ["B2"])
    done = await store.commit(Commit("g1", 3, "c2", accepted("c2", "g1", 4), fresh))
    assert done.head == 4


async def test_a_commit_acknowledges_its_command_entry_only_when_done(
    store: EventStore,
) -> None:
    # A command nobody waits on is acknowledged by the script that commits it (or finds
    # it already done); a conflict leaves it pending for the retry.
    stream = store.keys.commands(store.keys.partition("g1"))
    await store.redis.xgroup_create(stream, ENGINE_GROUP, id="0", mkstream=True)
    ids = [await store.redis.xadd(stream, {"m": b"x"}) for _ in range(3)]
    await store.redis.xreadgroup(ENGINE_GROUP, "engine-1", {stream: ">"})
    events = events_for("g1", 1, "", [])
    await store.commit(Commit("g1", 0, "c0", accepted("c0", "g1", 2), events, ack=ids[0]))
    with pytest.raises(SeqConflict):
        await store.commit(Commit("g1", 0, "c1", accepted("c1", "g1", 2), events, ack=ids[1]))
    again = await store.commit(Commit("g1", 7, "c0", accepted("c0", "g1", 9), (), ack=ids[2]))
    assert again.duplicate
    pending = await store.redis.xpending_range(stream, ENGINE_GROUP, "-", "+", 10)
    assert [row["message_id"] for row in pending] == [ids[1]]


async def test_rejections_are_remembered_only_when_asked(store: EventStore) -> None:
    events = events_for("g1", 1, "", [])
    await store.commit(Commit("g1", 0, "c1", accepted("c1", "g1", 2), events))
    no = encode(Rejected(command_id="bad", game_id="g1", code="illegal_move", message="no", seq=2))
    await store.commit(Commit("g1", 2, "bad", no))
    assert await store.remembered_reply("g1", "bad") == no
    again = await store.commit(Commit("g1", 2, "bad", accepted("bad", "g1", 3)))
    assert again.duplicate and decode_reply(again.reply) == decode_reply(no)
    # An answer about a game that does not exist leaves no key behind.
    await store.commit(Commit("ghost", 0, "x", no, remember=False))
    assert await store.redis.exists(store.keys.replies_memory("ghost")) == 0
    assert await QueryClient(store.redis, store.keys).game_ids() == ["g1"]


async def test_commit_many_mixes_outcomes_and_survives_script_flush(store: EventStore) -> None:
    a = events_for("a", 1, "", ["A1"])
    b = events_for("b", 1, "", [])
    await store.commit(Commit("a", 0, "a0", accepted("a0", "a", 3), a))
    b_next = events_for("b", 3, event_hash(b[-1]), ["C3"])
    await store.redis.script_flush()
    results = await store.commit_many(
        [
            Commit("b", 0, "b0", accepted("b0", "b", 2), b),
            Commit("a", 0, "a0", accepted("a0", "a", 3), a),  # duplicate
            Commit("a", 1, "a1", accepted("a1", "a", 4), a),  # stale head
            Commit("b", 2, "b1", accepted("b1", "b", 3), b_next),
        ]
    )
    first, dup, conflict, chained = results
    assert not isinstance(first, SeqConflict) and first.head == 2
    assert not isinstance(dup, SeqConflict) and dup.duplicate
    assert isinstance(conflict, SeqConflict) and conflict.actual == 3
    # Commits in one pipeline run in order: b1 saw b0's events.
    assert not isinstance(chained, SeqConflict) and chained.head == 3
    assert chain_problems("b", await QueryClient(store.redis, store.keys).log("b")) == []


async def test_a_hiredis_packing_client_speaks_the_same_protocol(
    redis_url: str, namespace: str
) -> None:
    # The engine's client packs commands with hiredis: everything the store does must
    # work through it, multi-word commands and refusals included.
    fast = connect(redis_url)
    try:
        assert fast.connection_pool.connection_class.__name__.startswith("Hiredis")
        store = EventStore(fast, Keys(prefix=namespace))
        events = events_for("h1", 1, "", ["A1", "B2"])
        done = await store.commit(Commit("h1", 0, "c0", accepted("c0", "h1", 4), events))
        assert (
            done.head == 4
            and [e.data for e in await QueryClient(store.redis, store.keys).log("h1")] == events
        )
        await fast.xgroup_create(store.keys.log("h1"), "g", id="0")
        groups = await fast.xinfo_groups(store.keys.log("h1"))  # "XINFO GROUPS": two words
        assert [g["name"] for g in groups] == [b"g"]
        await fast.set(f"{namespace}:x", "é")
        assert await fast.get(f"{namespace}:x") == "é".encode()
        with pytest.raises(redis.exceptions.DataError):
            await fast.set(f"{namespace}:y", True)  # type: ignore[arg-type]
    finally:
        await fast.aclose()


async def test_chain_problems_catch_an_edited_event(store: EventStore) -> None:
    events = events_for("g1", 1, "", ["A1", "B2", "C3"])
    entries = [LogEntry(i, d) for i, d in enumerate(events, start=1)]
    assert chain_problems("g1", entries) == []
    edited = decode_event(events[3]).model_copy(update={"move": "D4"})
    tampered = [*entries[:3], LogEntry(4, encode(edited)), entries[4]]
    problems = chain_problems("g1", tampered)
    # The edit keeps entry 4's own link intact but breaks entry 5's.
    assert len(problems) == 1 and problems[0].startswith("game g1 entry 5: prev_hash")
    gap = [*entries[:2], *entries[3:]]
    assert any("expected 3" in p for p in chain_problems("g1", gap))
    garbage = [*entries[:4], LogEntry(5, b"\xc1")]
    assert "undecodable" in chain_problems("g1", garbage)[0]
    assert "belongs to game g1" in chain_problems("other", entries[:1])[0]


async def test_the_command_client_routes_a_command_to_its_partition(store: EventStore) -> None:
    cmd = PlayMove(command_id="c", game_id="g1", seat=1, token="t", move="A1", expected_seq=2)
    await CommandClient(store.redis, store.keys).send([cmd])
    entries = await store.redis.xrange(store.keys.commands_for("g1"))
    assert len(entries) == 1 and entries[0][1][b"m"] == encode(cmd)


def test_partition_is_a_stable_crc32() -> None:
    # Pinned values: a change here would strand every existing game in the wrong partition.
    assert [partition_of(g) for g in ("g1", "game-42", "x", "abc")] == [5, 3, 3, 2]
    assert Keys(partitions=4).partition("g1") == zlib.crc32(b"g1") % 4


def test_every_partition_key_carries_its_hash_tag() -> None:
    k = Keys(prefix="t")
    p = k.partition("abc")
    tag = f"{{{p}}}"
    for key in (
        k.log("abc"),
        k.replies_memory("abc"),
        k.view("abc"),
        k.commands(p),
        k.feed(p),
        k.games(p),
        k.dead_letter(p),
        k.clocks(p),
        k.projector_seen(p),
        k.index_time(p),
    ):
        assert key.startswith("t:") and re.findall(r"\{[^}]*\}", key) == [tag], key
    assert k.log("abc") == f"t:{tag}:game:abc:log"
    assert k.bot_turns("random") == "t:bot:{random}:turns"


def test_the_read_model_patterns_match_read_models_only() -> None:
    # `agon rebuild` sweeps and `agon verify` compares what these match: never a log.
    k = Keys(prefix="t")
    p = k.partition("abc")
    patterns = all_patterns(k)
    models = [
        k.view("abc"),
        k.projector_seen(p),
        k.index_time(p),
        k.index_status(p, "live"),
        k.index_game(p, "teeko"),
        k.index_player(p, "ann"),
        k.bot_results(p, "random"),
    ]
    sources = [
        k.log("abc"),
        k.commands(p),
        k.feed(p),
        k.games(p),
        k.replies_memory("abc"),
        k.dead_letter(p),
        k.clocks(p),
    ]
    assert all(any(fnmatch.fnmatchcase(key, pat) for pat, _ in patterns) for key in models)
    assert not any(fnmatch.fnmatchcase(key, pat) for pat, _ in patterns for key in sources)
