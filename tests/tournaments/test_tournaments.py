"""Tournaments through the whole pipeline, on a real Redis: a six-bot round robin whose
crosstable agrees with the games' own logs, a director killed with -9 mid-round and
started again, the results read models rebuilt and verified, and the CLI's errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from schemas.events import GameEnded
from schemas.tokens import admin_token
from schemas.tournaments import GameScheduled, TournamentCreated, TournamentSpec, new_tournament_id
from services.bus.clients import QueryClient
from services.bus.keys import Keys
from services.bus.secret import shared_secret
from services.bus.text import now_ms
from services.cli.pipeline import ServiceSet
from services.projector import rebuild, verify
from services.tournament.aggregate import Tournament, decide
from services.tournament.report import report, tournament_report, tournament_results
from services.tournament.store import TournamentStore
from tests.support.gateway import running_arena

ROOT = Path(__file__).resolve().parents[2]
SIX = ["random", "random.2", "random.3", "greedy", "greedy.2", "greedy.3"]

pytestmark = pytest.mark.timeout(240)


async def ended(store: TournamentStore, tid: str, timeout_s: float = 150) -> Tournament:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        t = await store.load(tid)
        if t is not None and t.ended is not None:
            return t
        await asyncio.sleep(0.1)
    raise AssertionError(f"tournament {tid} did not end in {timeout_s} s")


async def test_a_six_bot_round_robin_matches_its_games_logs(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    services = ServiceSet(redis, keys, SIX, block_ms=50)
    await services.start()
    store = TournamentStore(redis, keys)
    tid = new_tournament_id()
    spec = TournamentSpec(
        format="round-robin", game="teeko", bots=SIX, move_time_ms=50, concurrency=8
    )
    try:
        await store.create(tid, spec, now_ms())
        t = await ended(store, tid)
    finally:
        await services.stop()
    assert t.ended is not None and t.ended.reason == "completed"
    # Every encounter (15 of six bots) as two games, seats swapped; replays on top.
    firsts = [s.scheduled for s in t.games.values() if s.scheduled.replay_of is None]
    assert len(firsts) == 30
    assert Counter(frozenset(g.seats) for g in firsts) == {
        frozenset((a, b)): 2 for i, a in enumerate(SIX) for b in SIX[i + 1 :]
    }
    # The record of each game is its log's end; the crosstable is the sum of those ends.
    query = QueryClient(redis, keys)
    expected: Counter[tuple[str, str, str]] = Counter()
    for gid, slot in t.games.items():
        end = (await query.events(gid))[-1]
        assert isinstance(end, GameEnded), gid
        assert slot.recorded is not None
        assert (slot.recorded.winner, slot.recorded.reason) == (end.result, end.reason)
        if end.reason in ("aborted", "interrupted"):
            continue
        a, b = slot.scheduled.seats
        outcome = {0: ("draws", "draws"), 1: ("wins", "losses"), 2: ("losses", "wins")}
        first, second = outcome[end.result]
        expected[a, b, first] += 1
        expected[b, a, second] += 1
    rep = report(t, await tournament_results(redis, keys, t))
    got: Counter[tuple[str, str, str]] = Counter()
    for a, row in rep["crosstable"].items():
        for b, cell in row.items():
            for what in ("wins", "losses", "draws"):
                got[a, b, what] += cell[what]
    assert +got == +expected
    assert sum(s["games"] for s in rep["standings"]) == 2 * 30
    assert sorted(s["name"] for s in rep["standings"]) == sorted(SIX)
    # The results read models are rebuilt and verified like every other.
    before = await verify(redis, keys)
    assert before.ok, before.problems[:5]
    await rebuild(redis, keys)
    assert rep == report(t, await tournament_results(redis, keys, t))


def _director(
    redis_url: str, keys: Keys, tid: str, *, capture: bool = False
) -> subprocess.Popen[str]:
    env = {**os.environ, "AGON_SECRET": "tournament-test", "PYTHONUNBUFFERED": "1"}
    env.pop("REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "services.cli", "tournament", "run", "--id", tid,
         "--services", "none", "--json", "--redis-url", redis_url, "--prefix", keys.prefix],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip


async def test_a_director_killed_mid_round_resumes_without_losing_or_doubling(
    redis: aioredis.Redis, redis_url: str, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    bots = ["random", "random.2", "greedy", "greedy.2", "random.3"]
    # The pipeline runs here without a director: only the killed one and its heir direct.
    services = ServiceSet(redis, keys, bots, block_ms=50, director=False)
    await services.start()
    store = TournamentStore(redis, keys)
    tid = new_tournament_id()
    spec = TournamentSpec(
        format="swiss", game="teeko", bots=bots, rounds=4, move_time_ms=100, concurrency=2
    )
    try:
        await store.create(tid, spec, now_ms())
        first = _director(redis_url, keys, tid)
        try:
            # Kill it once some games are recorded and others are still going.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                t = await store.load(tid)
                assert t is not None
                recorded = sum(s.recorded is not None for s in t.games.values())
                if recorded >= 3 and t.pending():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the director never got going")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        heir = _director(redis_url, keys, tid, capture=True)
        out, _ = await asyncio.to_thread(heir.communicate, timeout=150)
        assert heir.returncode == 0, out[-2000:]
        t = await ended(store, tid, 5)
    finally:
        await services.stop()
    assert t.ended is not None and t.ended.reason in ("completed", "no-pairing")
    events = await store.events(tid)
    scheduled = [e.game_id for e in events if isinstance(e, GameScheduled)]
    assert len(scheduled) == len(set(scheduled))  # nothing scheduled twice
    rounds = [e for e in events if e.type == "round_paired"]
    assert [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    # Never a rematch (a platform-ended game's replay is the same pairing, not a new one).
    firsts = [s.scheduled for s in t.games.values() if s.scheduled.replay_of is None]
    assert max(Counter(frozenset(g.seats) for g in firsts).values()) == 1
    # Every scheduled game exists exactly once, ended, and no other game names the tournament.
    query = QueryClient(redis, keys)
    for gid in scheduled:
        log = await query.events(gid)
        assert isinstance(log[-1], GameEnded), gid
    ids = set(await query.game_ids())
    ours = {gid for gid in ids if gid.startswith(f"{tid}.")}
    assert ours == set(scheduled)
    # The heir's final report agrees with the log.
    final: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert final["games"]["scheduled"] == len(scheduled) and final["status"] == "ended"


async def test_the_report_tells_games_not_created_yet_from_games_being_played(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    spec = TournamentSpec.model_validate(
        {"format": "round-robin", "game": "teeko", "bots": ["a", "b"], "concurrency": 1}
    )
    created = TournamentCreated(tournament_id="t1", seq=1, time=0, spec=spec, command_id="c")
    t = Tournament.fold([created])
    decide(t, {}, now=0)  # schedules both games of the encounter; the director creates none
    first, second = list(t.games)
    rep = await tournament_report(redis, keys, t)
    assert [g["status"] for g in rep["schedule"]] == ["waiting", "waiting"]
    await redis.xadd(keys.log(first), {"m": "x"})  # the director created the first game
    rep = await tournament_report(redis, keys, t)
    assert [(g["game_id"], g["status"]) for g in rep["schedule"]] == [
        (first, "playing"),
        (second, "waiting"),
    ]


def test_the_tournament_cli_says_what_is_wrong_in_one_line() -> None:
    env = {**os.environ}
    env.pop("REDIS_URL", None)

    def agon(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "services.cli", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    bad_bot = agon("tournament", "run", "--format", "swiss", "--game", "teeko", "--bots", "x,y")
    assert bad_bot.returncode == 2 and "unknown bot 'x'" in bad_bot.stderr.splitlines()[0]
    one_bot = agon("tournament", "run", "--format", "swiss", "--game", "teeko", "--bots", "random")
    assert one_bot.returncode == 2 and "at least two" in one_bot.stderr
    sprt = agon("match", "random", "greedy", "--game", "teeko", "--sprt", "5,1")
    assert sprt.returncode == 2 and "elo0" in sprt.stderr, sprt.stderr
    no_url = agon("tournament", "list")
    assert no_url.returncode == 2 and "--redis-url" in no_url.stderr
    for done in (bad_bot, one_bot, sprt, no_url):
        assert "Traceback" not in done.stderr


async def test_the_gateway_creates_shows_and_cancels_tournaments_for_the_operator_only(
    redis: aioredis.Redis, namespace: str
) -> None:

    keys = Keys(prefix=namespace)
    async with running_arena(redis, keys, ["random", "greedy"]) as arena:
        client = await arena.gateway()
        admin = {"Authorization": f"Bearer {admin_token(await shared_secret(redis, keys))}"}
        body = {"format": "round-robin", "game": "teeko", "bots": ["random", "greedy"],
                "move_time_ms": 200}  # fmt: skip
        for headers in ({}, {"Authorization": "Bearer forged"}):
            refused = await client.post("/api/tournaments", json=body, headers=headers)
            assert refused.status == 401, await refused.text()
        assert await store_ids(redis, keys) == []
        bad = await client.post(
            "/api/tournaments", json={**body, "bots": ["random"]}, headers=admin
        )
        assert bad.status == 422
        made = await client.post("/api/tournaments", json=body, headers=admin)
        assert made.status == 201
        tid = (await made.json())["id"]
        t = await ended(TournamentStore(redis, keys), tid, 120)
        rep = await (await client.get(f"/api/tournaments/{tid}")).json()
        assert rep["status"] == "ended" and rep["games"]["scheduled"] == len(t.games) == 2
        assert [r["game_id"] for r in rep["schedule"]] == list(t.games)
        csv_text = await (await client.get(f"/api/tournaments/{tid}/standings.csv")).text()
        assert csv_text.splitlines()[0].startswith("rank,name,points")
        assert len(csv_text.splitlines()) == 3
        listed = await (await client.get("/api/tournaments")).json()
        assert [x["id"] for x in listed["tournaments"]] == [tid]
        board = await (await client.get("/api/leaderboards/teeko")).json()
        assert {r["name"] for b in board["boards"] for r in b["rows"]} == {"random", "greedy"}
        assert (await client.get("/api/tournaments/nope")).status == 404
        # A cancel needs the operator too; a running one's games are aborted.
        long = await client.post("/api/tournaments", json={**body, "rounds": 50}, headers=admin)
        tid2 = (await long.json())["id"]
        assert (await client.post(f"/api/tournaments/{tid2}/cancel")).status == 401
        done = await client.post(f"/api/tournaments/{tid2}/cancel", headers=admin)
        assert (await done.json())["ended"] == "cancelled"


async def store_ids(redis: aioredis.Redis, keys: Keys) -> list[str]:
    return await TournamentStore(redis, keys).ids()


async def test_a_director_says_redis_is_away_in_one_line(
    redis_server_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis going away under a director (a restart, a failover) is a warning line per
    pass, never a traceback in the output of `agon up` or `agon selfplay`."""
    from services.tournament.director import Director

    server = redis_server_factory()
    client = aioredis.from_url(server.url)
    director = Director(client, Keys(prefix="away"), every_s=0.05)
    stop = asyncio.Event()
    running = asyncio.create_task(director.run(stop))
    try:
        while not director.secret:
            await asyncio.sleep(0.02)
        server.stop()
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await client.aclose()
    away = [r for r in caplog.records if r.name == "agon.director" and "unavailable" in r.message]
    assert away, [r.message for r in caplog.records]
    assert not [r for r in caplog.records if r.name == "agon.director" and r.exc_info]


async def test_an_end_lost_with_redis_is_written_again_not_retired(
    redis: aioredis.Redis, namespace: str
) -> None:
    """Redis going away while the director appends a tournament's end (nothing written):
    the next pass decides again on the log, so the end lands and the tournament is not
    retired from the active list with its log unfinished."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    from schemas.tournaments import TournamentEnded
    from services.tournament.director import Director

    class LosesTheEnd(TournamentStore):
        lost = 0

        async def append(self, tournament_id: str, head: int, events: Any) -> bool:
            if not self.lost and any(isinstance(e, TournamentEnded) for e in events):
                self.lost += 1
                raise RedisConnectionError("Connection closed by server.")
            return await super().append(tournament_id, head, events)

    keys = Keys(prefix=namespace)
    services = ServiceSet(redis, keys, ["random", "greedy"], block_ms=50, director=False)
    await services.start()
    director = Director(redis, keys, every_s=0.05)
    director.store = LosesTheEnd(redis, keys)
    stop = asyncio.Event()
    running = asyncio.create_task(director.run(stop))
    store = TournamentStore(redis, keys)
    tid = new_tournament_id()
    spec = TournamentSpec(
        format="round-robin", game="teeko", bots=["random", "greedy"], move_time_ms=50
    )
    try:
        await store.create(tid, spec, now_ms())
        t = await ended(store, tid, 60)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
        await services.stop()
    assert director.store.lost == 1
    assert t.ended is not None and t.ended.reason == "completed"
