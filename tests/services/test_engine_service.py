"""The engine service against a real redis-server: commands in, validated events out.

Covers whole games, every rejection code, idempotent command ids, malformed and
oversized entries, two engines racing on one game, consumers dying with pending
entries (in process and killed with SIGKILL), clocks, and rebuilding cached games.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis.asyncio as aioredis

from engine import State, game_names, load_game
from schemas.codec import MAX_ENTRY_BYTES, decode_command, decode_reply, encode
from schemas.commands import (
    Abort,
    ClaimTimeout,
    Command,
    CreateGame,
    PlayMove,
    Resign,
    SeatPlayer,
    SeatSpec,
)
from schemas.events import GameCreated, GameEnded, GameStarted, MovePlayed, PlayerSeated
from schemas.replies import Accepted, Rejected, Reply
from schemas.tokens import (
    MAX_GRACE_MS,
    SEND_GRACE_MS,
    admin_token,
    bot_token,
    clock_key,
    clock_stamp,
    late_stamp,
    token_hash,
)
from services.bus import outages
from services.bus.clients import CommandClient, QueryClient
from services.bus.keys import ENGINE_GROUP, Keys
from services.engine_service import MAX_DELIVERIES, EngineService, EventStore, GameRecord
from services.engine_service.store import _COMMIT as COMMIT_SCRIPT
from services.gamelog.checks import chain_problems
from services.gamelog.fold import _rules as fold_rules
from tests.conftest import PrimaryAndReplica
from tests.support.commandstats import calls

SECRET = b"test-secret"
ROOT = Path(__file__).resolve().parents[2]
BOTS = [SeatSpec(kind="bot", name="random"), SeatSpec(kind="bot", name="random")]


class Harness:
    """A client of the engine: sends commands, reads its reply stream, inspects logs."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.store = EventStore(redis, keys)
        self.query = QueryClient(redis, keys)
        self.client = CommandClient(redis, keys)
        self.reply_to = keys.reply_stream("test")
        self._n = 0
        self._replies: dict[str, list[Reply]] = {}
        self._last = "0-0"

    def cid(self) -> str:
        self._n += 1
        return f"c{self._n}"

    async def send(self, cmd: Command) -> str:
        await self.client.send([cmd])
        return cmd.command_id

    async def replies(self) -> dict[str, list[Reply]]:
        """Every reply so far by command id (read on from where the last call stopped)."""
        for entry_id, fields in await self.redis.xrange(self.reply_to, f"({self._last}", "+"):
            reply = decode_reply(fields[b"m"])
            self._replies.setdefault(reply.command_id, []).append(reply)
            self._last = entry_id.decode()
        return self._replies

    async def reply(self, command_id: str) -> Reply:
        got = (await self.replies())[command_id]
        assert len({encode(r) for r in got}) == 1, got
        return got[0]

    async def create(self, game_id: str, game: str = "teeko", **kw: Any) -> str:
        cmd = CreateGame(
            command_id=self.cid(),
            reply_to=self.reply_to,
            game_id=game_id,
            game=game,
            seats=kw.pop("seats", BOTS),
            **kw,
        )
        return await self.send(cmd)

    def move(self, game_id: str, seat: int, move: str, seq: int, **kw: Any) -> PlayMove:
        return PlayMove(
            command_id=kw.pop("command_id", None) or self.cid(),
            reply_to=self.reply_to,
            game_id=game_id,
            seat=seat,
            token=kw.pop("token", None) or bot_token(SECRET, game_id, seat),
            move=move,
            expected_seq=seq,
            clock=kw.pop("clock", ""),
        )

    async def log(self, game_id: str) -> list[Any]:
        return await self.query.events(game_id)

    async def pending(self) -> int:
        total = 0
        for p in self.keys.all_partitions():
            stream = self.keys.commands(p)
            if await self.redis.exists(stream):
                total += (await self.redis.xpending(stream, ENGINE_GROUP))["pending"]
        return total


@pytest.fixture
def keys(namespace: str) -> Keys:
    return Keys(prefix=namespace, partitions=4)


@pytest.fixture
def h(redis: aioredis.Redis, keys: Keys) -> Harness:
    return Harness(redis, keys)


@pytest.fixture
def make_engine(
    redis_factory: Callable[..., aioredis.Redis], keys: Keys
) -> Callable[..., EngineService]:
    names = iter(range(1, 100))

    def make(**kw: Any) -> EngineService:
        kw.setdefault("consumer", f"e{next(names)}")
        return EngineService(redis_factory(), keys, secret=SECRET, **kw)

    return make


@pytest.fixture
def engine(make_engine: Callable[..., EngineService]) -> EngineService:
    return make_engine()


Moves = list[tuple[int, str]]


def random_moves(game: str, seed: int, **options: str) -> tuple[Moves, State]:
    """A seeded random game as (seat, move) pairs (turn order is the game's, e.g. 1 2 2 1)."""
    state = load_game(game, **options).new_initial_state()
    rng = random.Random(seed)
    moves = []
    while not state.is_terminal:
        move = rng.choice(state.legal_moves())
        moves.append((state.seat_of(state.current_player), str(move)))
        state.apply(move)
    return moves, state


async def play_out(
    h: Harness, engine: EngineService, game_id: str, moves: Moves, first_seq: int
) -> None:
    """Play `moves` one command at a time, each answering the seq of the previous one."""
    seq = first_seq
    for seat, move in moves:
        cid = await h.send(h.move(game_id, seat, move, seq))
        await engine.drain()
        reply = await h.reply(cid)
        assert isinstance(reply, Accepted), reply
        seq = reply.seq


@pytest.mark.parametrize("replicas", [0, 1])
async def test_an_engine_reads_its_next_batch_in_its_commits_round_trip(
    keys: Keys, primary_and_replica: PrimaryAndReplica, replicas: int
) -> None:
    """The commit carries the next read, with or without a replica to wait for."""
    redis = primary_and_replica.redis
    if replicas:
        await primary_and_replica.follow()
    h = Harness(redis, keys)
    engine = EngineService(redis, keys, secret=SECRET, replicas=replicas, consumer="e1")
    try:
        await h.create("g1")
        first = await engine.read_new(None)
        cid = await h.create("g2")  # sent while the first batch is decided
        reads = await calls(redis, "xreadgroup")
        await engine.process(first)
        assert await calls(redis, "xreadgroup") == reads + 1, "the next read rode with the commit"
        [second] = await engine.read_new(None)
        assert await calls(redis, "xreadgroup") == reads + 1, "and no read of its own"
        assert second.data is not None and decode_command(second.data).command_id == cid
        await engine.process([second])
        assert isinstance(await h.reply(cid), Accepted)
    finally:
        await engine.reader.close()


# -- whole games -------------------------------------------------------------------------
async def test_create_a_bot_game_seats_both_bots_and_starts(
    h: Harness, engine: EngineService
) -> None:
    cid = await h.create("g1", seed=3, move_time_ms=500)
    assert await engine.drain() == 1
    reply = await h.reply(cid)
    assert reply == Accepted(command_id=cid, game_id="g1", seq=4)
    log = await h.log("g1")
    assert [type(e) for e in log] == [GameCreated, PlayerSeated, PlayerSeated, GameStarted]
    created = log[0]
    assert (created.game, created.options, created.seed, created.move_time_ms) == (
        "teeko",
        {"markers": "8"},  # defaults are filled in, so a replay needs nothing else
        3,
        500,
    )
    assert log[1].token_hash == token_hash(bot_token(SECRET, "g1", 1))
    assert (log[3].to_move, log[3].colours) == (1, [1, 2])
    assert {e.command_id for e in log} == {cid}
    assert chain_problems("g1", await h.query.log("g1")) == []
    assert await h.query.game_ids() == ["g1"]
    assert await h.pending() == 0


@pytest.mark.parametrize(("game", "options"), [("teeko", {}), ("supply-chains", {})])
async def test_a_whole_game_through_the_engine(
    h: Harness, engine: EngineService, game: str, options: dict[str, str]
) -> None:
    moves, final = random_moves(game, seed=11, **options)
    await h.create("g1", game=game, options=options)
    await engine.drain()
    await play_out(h, engine, "g1", moves, first_seq=4)
    log = await h.log("g1")
    played = [e for e in log if isinstance(e, MovePlayed)]
    assert [(e.seat, e.move) for e in played] == moves
    assert [e.ply for e in played] == list(range(len(moves)))
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    assert played[-1].to_move == 0 and played[0].to_move == 2
    end = log[-1]
    outcome = final.outcome()
    assert outcome is not None and isinstance(end, GameEnded)
    assert (end.result, end.reason, end.detail) == (outcome.winner, "natural", outcome.reason)
    expected_scores = None if outcome.scores is None else list(outcome.scores)
    assert end.scores == expected_scores == played[-1].scores_after
    assert chain_problems("g1", await h.query.log("g1")) == []
    # A move after the end is refused and leaves the log alone.
    cid = await h.send(h.move("g1", 1, moves[0][1], end.seq))
    await engine.drain()
    assert (await h.reply(cid)).code == "game_over"
    assert len(await h.log("g1")) == len(log)


async def test_notation_is_stored_canonically(h: Harness, engine: EngineService) -> None:
    await h.create("g1")
    await engine.drain()
    legal = [str(m) for m in load_game("teeko").new_initial_state().legal_moves()]
    cid = await h.send(h.move("g1", 1, legal[0].lower(), 4))
    await engine.drain()
    assert isinstance(await h.reply(cid), Accepted)
    assert (await h.log("g1"))[-1].move == legal[0]


# -- human seats -------------------------------------------------------------------------
async def test_human_seats_get_tokens_and_the_game_starts_when_full(
    h: Harness, engine: EngineService
) -> None:
    seats = [SeatSpec(kind="human", name="ann"), SeatSpec(kind="human")]
    await h.create("g1", seats=seats)
    await engine.drain()
    assert len(await h.log("g1")) == 1

    def seat(n: int, name: str) -> SeatPlayer:
        return SeatPlayer(command_id=h.cid(), reply_to=h.reply_to, game_id="g1", seat=n, name=name)

    wrong_name = await h.send(seat(1, "bob"))
    ann = await h.send(seat(1, "ann"))
    await engine.drain()
    assert (await h.reply(wrong_name)).code == "bad_token"
    ann_reply = await h.reply(ann)
    assert isinstance(ann_reply, Accepted) and ann_reply.token and ann_reply.seq == 2
    early = await h.send(h.move("g1", 1, "A1", 2, token=ann_reply.token))
    taken = await h.send(seat(1, "zed"))
    bob = await h.send(seat(2, "bob"))
    await engine.drain()
    assert (await h.reply(early)).code == "not_your_turn"
    assert (await h.reply(taken)).code == "bad_token"
    bob_reply = await h.reply(bob)
    assert isinstance(bob_reply, Accepted) and bob_reply.seq == 4
    log = await h.log("g1")
    assert [type(e) for e in log] == [GameCreated, PlayerSeated, PlayerSeated, GameStarted]
    # Tokens never reach the log, only their hashes.
    assert log[1].token_hash == token_hash(ann_reply.token)
    assert ann_reply.token.encode() not in b"".join(e.data for e in await h.query.log("g1"))
    ok = await h.send(h.move("g1", 1, "A1", 4, token=ann_reply.token))
    await engine.drain()
    assert isinstance(await h.reply(ok), Accepted)


# -- rejections ----------------------------------------------------------------------------
async def test_every_rejection_leaves_the_log_unchanged_with_a_clear_reply(
    h: Harness, engine: EngineService
) -> None:
    await h.create("g1")
    await engine.drain()
    before = await h.query.log("g1")
    legal = [str(m) for m in load_game("teeko").new_initial_state().legal_moves()]
    cases = {
        "illegal_move": h.move("g1", 1, "A1-B2", 4),
        "invalid_move": h.move("g1", 1, "Z99", 4),
        "stale_seq": h.move("g1", 1, legal[0], 3),
        "not_your_turn": h.move("g1", 2, legal[0], 4),
        "bad_token": h.move("g1", 1, legal[0], 4, token="forged"),
        "unknown_game": h.move("nope", 1, legal[0], 4),
    }
    ids = {code: await h.send(cmd) for code, cmd in cases.items()}
    await engine.drain()
    for code, cid in ids.items():
        reply = await h.reply(cid)
        assert isinstance(reply, Rejected) and reply.code == code, (code, reply)
        assert reply.message
    assert "at ply 0" in (await h.reply(ids["illegal_move"])).message
    assert (await h.reply(ids["stale_seq"])).seq == 4
    assert await h.query.log("g1") == before
    assert await h.redis.exists(h.keys.log("nope")) == 0
    assert await h.redis.exists(h.keys.replies_memory("nope")) == 0
    assert engine.counts.rejected == len(cases)


async def test_a_token_once_verified_is_still_checked_on_every_move(
    h: Harness, engine: EngineService
) -> None:
    # The engine remembers a seat's last good token to skip hashing it again; a forged
    # token after good ones must still be refused, and the good one still accepted.
    await h.create("g1")
    await engine.drain()
    state = load_game("teeko").new_initial_state()
    seq = 4
    for seat in (1, 2):
        move = str(state.legal_moves()[0])
        cid = await h.send(h.move("g1", seat, move, seq))
        await engine.drain()
        assert isinstance(await h.reply(cid), Accepted)
        state.apply(move)
        seq += 1
    move = str(state.legal_moves()[0])
    forged = await h.send(h.move("g1", 1, move, seq, token=bot_token(SECRET, "g1", 2)))
    await engine.drain()
    reply = await h.reply(forged)
    assert isinstance(reply, Rejected) and reply.code == "bad_token"
    good = await h.send(h.move("g1", 1, move, seq))
    await engine.drain()
    assert isinstance(await h.reply(good), Accepted)
    assert await h.query.head("g1") == seq + 1


async def test_create_rejections(h: Harness, engine: EngineService) -> None:
    unknown = await h.create("g1", game="chess")
    bad_option = await h.create("g2", options={"markers": "9"})
    ok = await h.create("g3")
    again = await h.create("g3")  # a second create of the same id, another command id
    await engine.drain()
    assert (await h.reply(unknown)).code == "unknown_game"
    bad = await h.reply(bad_option)
    assert bad.code == "malformed" and "markers" in bad.message
    assert isinstance(await h.reply(ok), Accepted)
    assert (await h.reply(again)).code == "stale_seq"
    assert await h.query.game_ids() == ["g3"]


# -- idempotency -----------------------------------------------------------------------------
async def test_the_same_command_twice_appends_once_and_replies_the_same(
    h: Harness, engine: EngineService
) -> None:
    create = CreateGame(
        command_id="create-1", reply_to=h.reply_to, game_id="g1", game="teeko", seats=BOTS
    )
    await h.send(create)
    await h.send(create)
    legal = str(load_game("teeko").new_initial_state().legal_moves()[5])
    move = h.move("g1", 1, legal, 4, command_id="move-1")
    await h.send(move)
    await engine.drain()
    await h.send(move)  # a retry after the first was applied: the state has moved on
    await engine.drain()
    replies = await h.replies()
    assert len(replies["create-1"]) == 2 and len(replies["move-1"]) == 2
    assert encode(replies["move-1"][0]) == encode(replies["move-1"][1])
    assert replies["move-1"][0] == Accepted(command_id="move-1", game_id="g1", seq=5)
    assert len(await h.log("g1")) == 5
    assert engine.counts.duplicates == 2


# -- bad input -------------------------------------------------------------------------------
async def test_bad_entries_are_answered_or_dead_lettered_and_acknowledged(
    h: Harness, engine: EngineService
) -> None:
    stream = h.keys.commands(0)
    addr = {"command_id": "bad", "reply_to": h.reply_to}
    raw: dict[str, bytes] = {
        "garbage": b"\xc1\x00\xff",
        "not_a_map": msgpack.packb([1, 2, 3]),
        "unknown_type": msgpack.packb({**addr, "command_id": "unk", "type": "teleport"}),
        "missing_fields": msgpack.packb({**addr, "command_id": "mis", "type": "play_move"}),
        "too_large": msgpack.packb({**addr, "command_id": "big", "pad": "x" * MAX_ENTRY_BYTES}),
        "bad_reply_to": encode(
            ClaimTimeout(command_id="evil", reply_to=h.keys.log("g1"), game_id="g1", expected_seq=1)
        ),
    }
    for data in raw.values():
        await h.redis.xadd(stream, {"m": data})
    await h.redis.xadd(stream, {"other": b"field"})
    good = await h.create("g1")
    await engine.drain()
    replies = await h.replies()
    assert replies["unk"][0].code == "malformed" and "teleport" in replies["unk"][0].message
    assert replies["mis"][0].code == "malformed" and "game_id" in replies["mis"][0].message
    assert replies["big"][0].code == "too_large"
    assert isinstance(replies[good][0], Accepted)
    dead = await h.redis.xrange(h.keys.dead_letter(0))
    reasons = [f[b"reason"].decode() for _, f in dead]
    assert len(dead) == 4, reasons  # garbage, not a map, outside reply_to, no field m
    assert any("outside" in r for r in reasons) and any("no field" in r for r in reasons)
    assert {f[b"m"] for _, f in dead} >= {raw["garbage"], raw["not_a_map"]}
    # Nothing was written where the crafted reply_to pointed.
    assert len(await h.log("g1")) == 4
    assert chain_problems("g1", await h.query.log("g1")) == []
    assert await h.pending() == 0
    assert engine.counts.dead_lettered == 4


# -- racing engines --------------------------------------------------------------------------
async def test_two_engines_on_one_game_one_wins_the_other_revalidates(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    a, b = make_engine(), make_engine()
    moves, _ = random_moves("teeko", seed=5)
    await h.create("g1")
    await a.drain()
    warm = await h.send(h.move("g1", 1, moves[0][1], 4, token="wrong"))
    await b.drain()  # b caches the game at head 4
    assert (await h.reply(warm)).code == "bad_token"
    first = await h.send(h.move("g1", 1, moves[0][1], 4))
    await a.drain()  # the log is at 5 now; b does not know
    second = await h.send(h.move("g1", 2, moves[1][1], 5))
    await b.drain()
    assert b.counts.conflicts == 1  # b decided on head 4, lost, reloaded and accepted
    assert (await h.reply(first)).seq == 5
    assert (await h.reply(second)).seq == 6

    # Two different moves for the same turn, one to each engine, processed at once.
    one = h.move("g1", 1, moves[2][1], 6)
    other = h.move("g1", 1, moves[4][1], 6)  # teeko: all three placements differ
    await h.send(one)
    taken_a = await a.read_new(None)
    await h.send(other)
    taken_b = await b.read_new(None)
    assert len(taken_a) == len(taken_b) == 1
    await asyncio.gather(a.process(taken_a), b.process(taken_b))
    outcomes = {
        r.command_id: r for r in [await h.reply(one.command_id), await h.reply(other.command_id)]
    }
    kinds = sorted(type(r).__name__ for r in outcomes.values())
    assert kinds == ["Accepted", "Rejected"]
    loser = next(r for r in outcomes.values() if isinstance(r, Rejected))
    assert loser.code == "stale_seq" and loser.seq == 7
    log = await h.log("g1")
    assert [e.seq for e in log] == list(range(1, 8))
    assert chain_problems("g1", await h.query.log("g1")) == []
    assert await h.pending() == 0


async def test_engines_racing_on_many_games_lose_and_double_nothing(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    engines = [make_engine(batch=2), make_engine(batch=2)]
    games = {f"r{i}": random_moves("teeko", seed=100 + i)[0] for i in range(12)}
    for gid in games:
        await h.create(gid)
    await engines[0].drain()
    seqs = dict.fromkeys(games, 4)
    for ply in range(max(len(m) for m in games.values())):
        sent: dict[str, list[str]] = {}
        for gid, moves in games.items():
            if ply < len(moves):
                # Each move goes in twice under two ids, as from a client that retried
                # blindly: exactly one may be applied.
                seat, move = moves[ply]
                cmds = [h.move(gid, seat, move, seqs[gid]) for _ in range(2)]
                sent[gid] = [await h.send(c) for c in cmds]
        await asyncio.gather(*(e.drain() for e in engines))
        for gid, ids in sent.items():
            replies = [await h.reply(i) for i in ids]
            accepted = [r for r in replies if isinstance(r, Accepted)]
            assert len(accepted) == 1, replies
            # The copy that lost sees a newer log, or a finished game after the last move.
            losers = {r.code for r in replies if isinstance(r, Rejected)}
            assert losers <= {"stale_seq", "game_over"}, replies
            seqs[gid] = accepted[0].seq
    assert sum(e.counts.conflicts for e in engines) > 0  # they did race
    for gid, moves in games.items():
        log = await h.log(gid)
        assert [(e.seat, e.move) for e in log if isinstance(e, MovePlayed)] == moves
        assert [e.seq for e in log] == list(range(1, len(log) + 1))
        assert isinstance(log[-1], GameEnded)
        assert chain_problems(gid, await h.query.log(gid)) == []
    assert await h.pending() == 0


async def test_commands_without_a_reply_address_are_acknowledged_by_their_commit(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    # Bots send no reply_to: the commit script acknowledges their entries. Racing
    # engines and blind retries must still apply each move once and leave nothing pending.
    engines = [make_engine(batch=3), make_engine(batch=3)]
    games = {f"q{i}": random_moves("teeko", seed=300 + i)[0] for i in range(8)}
    for gid in games:
        await h.create(gid)
    await engines[0].drain()
    seqs = dict.fromkeys(games, 4)
    for ply in range(max(len(m) for m in games.values())):
        for gid, moves in games.items():
            if ply < len(moves):
                seat, move = moves[ply]
                for _ in range(2):
                    await h.send(
                        h.move(gid, seat, move, seqs[gid]).model_copy(update={"reply_to": ""})
                    )
                seqs[gid] += 1 + (ply == len(moves) - 1)
        await asyncio.gather(*(e.drain() for e in engines))
    # One sent to the wrong partition's stream is acknowledged too (by the flush).
    stray = h.move("q0", 1, "A1", seqs["q0"]).model_copy(update={"reply_to": ""})
    wrong = next(p for p in h.keys.all_partitions() if p != h.keys.partition("q0"))
    await h.redis.xadd(h.keys.commands(wrong), {"m": encode(stray)})
    await engines[1].drain()
    for gid, moves in games.items():
        log = await h.log(gid)
        assert [(e.seat, e.move) for e in log if isinstance(e, MovePlayed)] == moves
        assert isinstance(log[-1], GameEnded) and log[-1].seq == seqs[gid]
    assert sum(e.counts.rejected for e in engines) > 0  # the copies were refused
    assert await h.pending() == 0


# -- dying consumers -------------------------------------------------------------------------
async def test_entries_left_pending_by_a_dead_consumer_are_finished_once(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    dead = make_engine()
    for i in range(5):
        await h.create(f"d{i}")
    taken = await dead.read_new(None)  # ... and then it dies without a word
    assert len(taken) == 5 and await h.pending() == 5
    patient = make_engine()  # the default idle time protects a live consumer's work
    assert await patient.drain() == 0
    heir = make_engine(claim_idle_ms=0)
    assert await heir.drain() == 5
    assert heir.counts.accepted == 5
    for i in range(5):
        assert len(await h.log(f"d{i}")) == 4
    assert await h.pending() == 0


async def test_an_entry_whose_ack_failed_is_read_again_by_its_own_consumer(
    h: Harness, redis_factory: Callable[..., aioredis.Redis], namespace: str
) -> None:
    # A real XACK failure and nothing else: the engine's user may not acknowledge (on a
    # cluster, the command stream's master went down between the commit and the flush).
    user = f"{namespace}-engine"
    await h.redis.acl_setuser(
        user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"], categories=["+@all"]
    )
    await h.redis.acl_setuser(user, enabled=True, commands=["-xack"])
    try:
        engine = EngineService(
            redis_factory(username=user, password="pw"), h.keys, secret=SECRET, consumer="e1"
        )
        cid = await h.create("g1")
        await engine.process(await engine.read_new(None))
        assert isinstance(await h.reply(cid), Accepted)
        assert await h.pending() == 1  # done and answered, but not acknowledged
        await h.redis.acl_setuser(user, enabled=True, commands=["+xack"])
        # Nobody else claims a live consumer's entry: it must read the entry again itself.
        again = await engine.read_new(None)
        assert [e.entry_id for e in again] != []
        await engine.process(again)
        assert await h.pending() == 0
        assert len((await h.replies())[cid]) == 2 and engine.counts.duplicates == 1
        assert len(await h.log("g1")) == 4
    finally:
        await h.redis.acl_deluser(user)


async def test_an_entry_that_keeps_killing_engines_is_dead_lettered(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    await h.create("p1")
    await make_engine().read_new(None)
    stream = h.keys.commands(h.keys.partition("p1"))
    # Four more engines took it over and died too: five deliveries in all.
    for n in range(MAX_DELIVERIES - 1):
        await h.redis.xautoclaim(stream, ENGINE_GROUP, f"victim{n}", 0)
    survivor = make_engine(claim_idle_ms=0)
    assert await survivor.drain() == 0
    dead = await h.redis.xrange(h.keys.dead_letter(h.keys.partition("p1")))
    assert len(dead) == 1 and b"delivered 5 times" in dead[0][1][b"reason"]
    assert await h.query.head("p1") == 0
    assert await h.pending() == 0


async def test_an_engine_killed_mid_batch_loses_and_doubles_nothing(
    h: Harness, redis_url: str, make_engine: Callable[..., EngineService]
) -> None:
    moves = {f"k{i}": random_moves("teeko", seed=i)[0] for i in range(120)}
    for gid in moves:
        await h.create(gid)
    heir = make_engine(claim_idle_ms=0)
    await heir.drain()
    # Every game's next move at once, then a separate engine process that is killed
    # with SIGKILL while it works through them.
    cmds = {gid: h.move(gid, 1, m[0][1], 4) for gid, m in moves.items()}
    for cmd in cmds.values():
        await h.send(cmd)
    code = (
        "import asyncio, redis.asyncio as r\n"
        "from services.engine_service import EngineService\n"
        "from services.bus.keys import Keys\n"
        f"c = r.Redis.from_url({redis_url!r})\n"
        f"e = EngineService(c, Keys(prefix={h.keys.prefix!r}, partitions=4), secret={SECRET!r},"
        " consumer='doomed', batch=1)\n"
        "asyncio.run(e.run())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ})
    done = 0
    try:
        for _ in range(3000):
            done = sum([await h.query.head(gid) for gid in cmds]) - 4 * len(cmds)
            if done >= 5:
                break
            await asyncio.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert done >= 5, "the engine process never got going"
    await heir.drain()
    replies = await h.replies()
    for gid, cmd in cmds.items():
        got = replies[cmd.command_id]
        assert all(r == Accepted(command_id=cmd.command_id, game_id=gid, seq=5) for r in got)
        log = await h.log(gid)
        assert len(log) == 5 and log[-1].move == moves[gid][0][1]
        assert chain_problems(gid, await h.query.log(gid)) == []
    assert await h.pending() == 0


# -- clocks, resignation, abort ----------------------------------------------------------------
async def test_claim_timeout_only_after_the_deadline(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    await h.create("g1", move_time_ms=2000)
    await h.create("g2")
    await engine.drain()

    def claim(gid: str, seq: int) -> ClaimTimeout:
        return ClaimTimeout(command_id=h.cid(), reply_to=h.reply_to, game_id=gid, expected_seq=seq)

    early_claim = claim("g1", 4)
    early = await h.send(early_claim)
    no_clock = await h.send(claim("g2", 4))
    now[0] += 1999
    await engine.drain()
    assert "1 ms left" in (await h.reply(early)).message
    assert "no per-move time limit" in (await h.reply(no_clock)).message
    now[0] += 2  # past the deadline: a move arriving exactly at it would still count
    stale = await h.send(claim("g1", 3))
    # A rejection is not remembered: the same claim sent again is decided afresh, and passes.
    await h.send(early_claim)
    late = await h.send(claim("g1", 4))
    await engine.drain()
    first, again = (await h.replies())[early]
    assert isinstance(first, Rejected) and first.code == "illegal_move"
    assert isinstance(again, Accepted) and again.seq == 5
    assert (await h.reply(stale)).code == "stale_seq"
    assert (await h.reply(late)).code == "game_over"
    end = (await h.log("g1"))[-1]
    assert isinstance(end, GameEnded)
    assert (end.result, end.reason, end.time) == (2, "time_forfeit", 1_002_001)


async def test_a_master_outage_pauses_the_clocks_of_its_own_partitions_only(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    """A spell in which one partition's master did not answer (a failover) is the
    platform's time for that partition's games: their deadlines move by it. A game on
    another partition, whose master answered all along, gets none of it."""
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    ids = [f"g{n}" for n in range(64)]
    away = next(g for g in ids if h.keys.partition(g) == 3)
    other = next(g for g in ids if h.keys.partition(g) != 3)
    for gid in (away, other):
        await h.create(gid, move_time_ms=2000)
    await engine.drain()
    await outages.record(h.redis, h.keys, (1_000_500, 1_001_500), [3])

    def claim(gid: str) -> ClaimTimeout:
        return ClaimTimeout(command_id=h.cid(), reply_to=h.reply_to, game_id=gid, expected_seq=4)

    now[0] += 2100  # 100 ms past both deadlines; one of them ran through the spell
    kept, ended = await h.send(claim(away)), await h.send(claim(other))
    await engine.drain()
    assert "900 ms left" in (await h.reply(kept)).message
    assert (await h.reply(ended)).seq == 5
    end = (await h.log(other))[-1]
    assert isinstance(end, GameEnded) and end.reason == "time_forfeit"


async def test_a_move_after_its_deadline_is_judged_with_its_partitions_spells(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    """The engine reads a partition's spells only when it must (not every round): a move
    that came after its deadline is one such time. Its game's master was away 1 s of it,
    so it is in time; the same move in a game without the spell comes too late."""
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    away = "m0"
    p = h.keys.partition(away)
    other = next(g for g in (f"m{n}" for n in range(1, 64)) if h.keys.partition(g) != p)
    for gid in (away, other):
        await h.create(gid, move_time_ms=2000)
    await engine.drain()  # both at seq 4, seat 1 to move; the engine has read its spells
    await outages.record(h.redis, h.keys, (1_000_500, 1_001_500), [p])
    (_, move), *_ = random_moves("teeko", seed=3)[0]
    now[0] += 2100
    kept = await h.send(h.move(away, 1, move, 4))
    lost = await h.send(h.move(other, 1, move, 4))
    await engine.drain()
    assert (await h.reply(kept)).seq == 5
    late = await h.reply(lost)
    assert isinstance(late, Rejected) and late.code == "too_late", late


async def test_a_move_after_its_deadline_reads_the_spells_of_its_own_partition_only(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    """After a failover most batches hold a move past its deadline: each reads the spells
    of its own partition (and every partition's), not those of every partition it holds,
    one key on each of their masters."""
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    await h.create("m0", move_time_ms=2000)
    await engine.drain()  # seq 4, seat 1 to move; the engine has read its spells
    (_, move), *_ = random_moves("teeko", seed=3)[0]
    now[0] += 2100
    await h.send(h.move("m0", 1, move, 4))
    before = await calls(h.redis, "zrevrangebyscore")
    await engine.drain()
    assert await calls(h.redis, "zrevrangebyscore") - before == 2


async def test_a_time_bank_pays_for_overruns_and_every_move_records_its_time(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    await h.create("g1", move_time_ms=1000, time_bank_ms=500)
    await engine.drain()  # seq 4: started at 1_000_000, seat 1 to move
    (s1, m1), (s2, m2), (s3, _) = random_moves("teeko", seed=3)[0][:3]
    assert (s1, s2, s3) == (1, 2, 1)

    now[0] += 1300  # 300 ms over the limit: drawn from seat 1's bank, 200 ms left
    first = await h.send(h.move("g1", 1, m1, 4))
    await engine.drain()
    assert (await h.reply(first)).seq == 5
    now[0] += 100
    await h.send(h.move("g1", 2, m2, 5))
    await engine.drain()
    moves = [e for e in await h.log("g1") if isinstance(e, MovePlayed)]
    assert [(m.seat, m.think_ms) for m in moves] == [(1, 1300), (2, 100)]

    def claim() -> ClaimTimeout:
        return ClaimTimeout(command_id=h.cid(), reply_to=h.reply_to, game_id="g1", expected_seq=6)

    now[0] += 1150  # the limit is past, but 50 ms of the bank are left
    early = await h.send(claim())
    await engine.drain()
    assert "50 ms left" in (await h.reply(early)).message
    now[0] += 53
    late = await h.send(claim())
    await engine.drain()
    assert (await h.reply(late)).seq == 7
    end = (await h.log("g1"))[-1]
    assert isinstance(end, GameEnded)
    assert (end.result, end.reason, end.fault, end.overrun_ms) == (2, "time_forfeit", 1, 3)


async def test_a_signed_clock_gives_at_most_the_maximum_grace_and_only_the_secret_says_late(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    """A stuck platform cannot give a bot unlimited time: a stamp signed far past the head
    event's deadline counts only `MAX_GRACE_MS` past it. The platform's word that a turn never
    reached its bot (`late_stamp`, signed with the secret) ends the game as `interrupted`,
    nobody's loss; the same words signed with the clock key are only a timeout claim."""
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    for gid in ("g1", "g2", "g3"):
        await h.create(gid, move_time_ms=1000)
    await engine.drain()  # seq 4 in each: started at 1_000_000, due at 1_001_000
    (_, m1) = random_moves("teeko", seed=3)[0][0]
    key, due = clock_key(SECRET), 1_001_000
    far = clock_stamp(key, "g1", 4, due + MAX_GRACE_MS + 10_000)
    now[0] = due + MAX_GRACE_MS + 1

    def claim(gid: str, clock: str) -> ClaimTimeout:
        return ClaimTimeout(
            command_id=h.cid(), reply_to=h.reply_to, game_id=gid, expected_seq=4, clock=clock
        )

    sent = [
        await h.send(h.move("g1", 1, m1, 4, clock=far)),
        await h.send(claim("g2", late_stamp(SECRET, "g2", 4, due))),
        await h.send(claim("g3", late_stamp(key, "g3", 4, due))),
    ]
    await engine.drain()
    assert (await h.reply(sent[0])).code == "too_late"
    ends = [(await h.log(gid))[-1] for gid in ("g2", "g3")]
    assert all(isinstance(e, GameEnded) for e in ends), ends
    assert [(e.reason, e.result, e.fault) for e in ends if isinstance(e, GameEnded)] == [
        ("interrupted", 0, 0),
        ("time_forfeit", 2, 1),
    ]


async def test_a_bot_s_clock_runs_from_the_hand_over_its_turn_request_signs(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    """The dispatcher handed the turn over 400 ms after the event that made it the bot's:
    the stamp it signed gives the bot its whole second from then; a stamp nobody signed, or
    signed for another game or seq, gives nothing."""
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    for gid in ("g1", "g2", "g3"):
        await h.create(gid, move_time_ms=1000, time_bank_ms=200)
    await engine.drain()  # seq 4 in each: started at 1_000_000, seat 1 to move
    (_, m1) = random_moves("teeko", seed=3)[0][0]
    handed_over = 1_000_400
    # A stamp signs the deadline the bot was told plus the send grace.
    stamp = clock_stamp(clock_key(SECRET), "g1", 4, handed_over + 1200 + SEND_GRACE_MS)
    forged = {
        "g2": stamp,  # another game's
        "g3": clock_stamp(SECRET, "g3", 4, handed_over + 1200),  # the secret is no clock key
    }
    now[0] = handed_over + 1100  # 1300 ms after the head event, 1100 after the hand-over
    sent = {"g1": await h.send(h.move("g1", 1, m1, 4, clock=stamp))}
    for gid, bad in forged.items():
        sent[gid] = await h.send(h.move(gid, 1, m1, 4, clock=bad))
    await engine.drain()
    assert (await h.reply(sent["g1"])).seq == 5
    for gid in forged:
        assert (await h.reply(sent[gid])).code == "too_late", gid
    [first] = [e for e in await h.log("g1") if isinstance(e, MovePlayed)]
    assert first.think_ms == 1100  # from the hand-over: 100 ms of the bank

    def claim(seq: int, clock: str = "") -> ClaimTimeout:
        return ClaimTimeout(
            command_id=h.cid(), reply_to=h.reply_to, game_id="g1", expected_seq=seq, clock=clock
        )

    # Seat 2's turn (seq 5) began at `now`, and was handed over 300 ms later.
    began = now[0]
    # The limit + seat 2's bank.
    signed = clock_stamp(clock_key(SECRET), "g1", 5, began + 300 + 1200 + SEND_GRACE_MS)
    now[0] = began + 1250  # past the head event's deadline, not the signed one
    early = await h.send(claim(5, signed))
    unsigned = await h.send(claim(5))  # judged by the head event: that deadline is past
    await engine.drain()
    assert f"{250 + SEND_GRACE_MS} ms left" in (await h.reply(early)).message
    assert (await h.reply(unsigned)).seq == 6
    end = (await h.log("g1"))[-1]
    assert isinstance(end, GameEnded)
    assert (end.reason, end.fault, end.overrun_ms) == ("time_forfeit", 2, 50)
    assert (await h.reply(sent["g1"])).seq == 5


async def test_the_random_move_policy_plays_for_a_seat_that_overran(
    h: Harness, make_engine: Callable[..., EngineService]
) -> None:
    now = [1_000_000]
    engine = make_engine(clock=lambda: now[0])
    for gid in ("r1", "r2"):
        await h.create(gid, move_time_ms=1000, on_timeout="random_move", seed=7)
    await engine.drain()
    now[0] += 1500
    for gid in ("r1", "r2"):
        await h.send(ClaimTimeout(command_id=h.cid(), game_id=gid, expected_seq=4))
    await engine.drain()
    played = [(await h.log(gid))[-1] for gid in ("r1", "r2")]
    for move in played:
        assert isinstance(move, MovePlayed), move
        assert (move.seat, move.think_ms, move.timeout, move.to_move) == (1, 1500, True, 2)
    # Drawn from the game's seed and ply: the same in both games, and a legal move.
    assert played[0].move == played[1].move
    state = load_game("teeko").new_initial_state()
    assert played[0].move in {str(m) for m in state.legal_moves()}
    # The game goes on, and seat 2's clock runs from the random move.
    now[0] += 999
    early = await h.send(
        ClaimTimeout(command_id=h.cid(), reply_to=h.reply_to, game_id="r1", expected_seq=5)
    )
    await engine.drain()
    assert "1 ms left" in (await h.reply(early)).message
    now[0] += 2
    await h.send(ClaimTimeout(command_id=h.cid(), game_id="r1", expected_seq=5))
    await engine.drain()
    second = (await h.log("r1"))[-1]
    assert isinstance(second, MovePlayed) and (second.seat, second.timeout) == (2, True)


async def test_an_illegal_bot_move_forfeits_only_where_the_game_says_so(
    h: Harness, engine: EngineService
) -> None:
    await h.create("strict", forfeit_illegal=True)
    await h.create("lenient")
    await engine.drain()
    lenient = await h.send(h.move("lenient", 1, "Z9", 4))
    strict = await h.send(h.move("strict", 1, "Z9", 4))
    await engine.drain()
    assert (await h.reply(lenient)).code in ("invalid_move", "illegal_move")
    assert len(await h.log("lenient")) == 4  # refused: nothing appended
    assert (await h.reply(strict)).seq == 5
    end = (await h.log("strict"))[-1]
    assert isinstance(end, GameEnded)
    assert (end.result, end.reason, end.fault) == (2, "illegal_move", 1)
    assert "'Z9'" in end.detail


async def test_resign_and_abort(h: Harness, engine: EngineService) -> None:
    for gid in ("g1", "g2", "g3"):
        await h.create(gid, game="supply-chains")
    await engine.drain()

    def resign(gid: str, seat: int, token: str) -> Resign:
        return Resign(command_id=h.cid(), reply_to=h.reply_to, game_id=gid, seat=seat, token=token)

    def abort(gid: str, seat: int, token: str) -> Abort:
        return Abort(command_id=h.cid(), reply_to=h.reply_to, game_id=gid, seat=seat, token=token)

    forged = await h.send(resign("g1", 2, bot_token(SECRET, "g1", 1)))
    await h.send(resign("g1", 2, bot_token(SECRET, "g1", 2)))
    not_admin = await h.send(abort("g2", 0, bot_token(SECRET, "g2", 1)))
    await h.send(abort("g2", 0, admin_token(SECRET)))
    await h.send(abort("g3", 1, bot_token(SECRET, "g3", 1)))
    await engine.drain()
    assert (await h.reply(forged)).code == "bad_token"
    assert (await h.reply(not_admin)).code == "bad_token"
    ends = [(await h.log(g))[-1] for g in ("g1", "g2", "g3")]
    assert [(e.result, e.reason, e.fault) for e in ends] == [
        (1, "resignation", 2),
        (0, "aborted", 0),  # the operator's doing: the platform's, not a seat's
        (0, "abort", 1),
    ]
    assert ends[0].scores == [0, 0]  # supply chains scores exist from the start
    assert ends[1].detail == "aborted by the operator"


# -- the cache ---------------------------------------------------------------------------------
async def test_a_record_rebuilt_from_the_log_equals_the_live_one(
    h: Harness, engine: EngineService
) -> None:
    moves, _ = random_moves("supply-chains", seed=2)
    await h.create("g1", game="supply-chains")
    await engine.drain()
    await play_out(h, engine, "g1", moves[:20], first_seq=4)
    live = engine._cache.get("g1")
    assert live is not None
    rebuilt = GameRecord.from_log("g1", await h.query.log("g1"))
    assert rebuilt is not None
    assert (rebuilt.head, rebuilt.last_hash, rebuilt.last_time, rebuilt.started) == (
        live.head,
        live.last_hash,
        live.last_time,
        live.started,
    )
    assert rebuilt.state.to_dict() == live.state.to_dict()
    assert rebuilt.fold.token_hashes == live.fold.token_hashes
    # The engine's live fold is the projector's fold of the same log, to the byte.
    assert rebuilt.fold.view_bytes() == live.fold.view_bytes()
    # A fresh engine (empty cache) continues the game from the log alone.
    other = EngineService(h.redis, h.keys, secret=SECRET, consumer="fresh")
    seat, move = moves[20]
    cid = await h.send(h.move("g1", seat, move, 24))
    await other.drain()
    assert (await h.reply(cid)).seq == 25


async def test_hexade_swap_moves_colours_between_seats(h: Harness, engine: EngineService) -> None:
    await h.create("g1", game="hexade")
    await engine.drain()
    first = str(load_game("hexade").new_initial_state().legal_moves()[0])
    await play_out(h, engine, "g1", [(1, first), (2, "swap")], first_seq=4)
    swap = (await h.log("g1"))[-1]
    assert (swap.move, swap.seat, swap.colour, swap.colours) == ("swap", 2, 2, [2, 1])
    # Colour 2 moves again, and it is now seat 1's.
    assert swap.to_move == 1


async def test_an_engine_is_warm_before_its_first_command(
    redis: aioredis.Redis, make_engine: Callable[..., EngineService]
) -> None:
    # A clock runs from its event's time, so the first creation must not pay for building
    # rules or loading the commit script: setup does both beforehand.
    await redis.script_flush()  # this session's own server; scripts reload on NOSCRIPT
    fold_rules.cache_clear()
    await make_engine().setup()
    assert await redis.script_exists(COMMIT_SCRIPT.sha) == [True]
    assert fold_rules.cache_info().currsize == len(game_names())
