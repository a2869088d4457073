"""Issue 22, item 6: public lists that cost the server what their data holds.

`GET /api/leaderboards/<game>` used to read every result record and replay Glicko-2 over
all of them on every request: 190 requests (inside the rate limit's burst) stalled a
gateway for seconds and a move sent meanwhile waited with them. Here the results read
model holds thousands of records, written as the projector writes them (its guarded
write of folded games), and:

- a burst of 190 concurrent leaderboard requests over `scale(3000, 6000)` records must
  leave the gateway answering `/health` and a game view, asked again and again meanwhile,
  each within 1 s (the bound the issue names), or within twice what the same burst of game
  views took on a machine slower than that;
- a leaderboard request's work must not grow with the results: the record reads (HVALS,
  counted with INFO commandstats, no MONITOR) per request once the leaderboards are
  computed, at N and at 4N records; the time per request at both is reported;
- the public lists (leaderboards, games, tournaments) answer with `Cache-Control: public`
  and an `ETag`, and a request naming that ETag in `If-None-Match` gets 304.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from schemas.codec import encode, unpack
from schemas.commands import SeatSpec
from schemas.events import GameCreated, GameEnded
from services.bus.keys import Keys
from services.gamelog.fold import GameFold
from services.gateway import GatewaySettings, init_app
from services.projector.write import Write, write
from tests.security.attacks import report, scale
from tests.support.commandstats import calls
from tests.support.gateway import Arena, new_game

pytestmark = pytest.mark.timeout(300)

#: The players of the seeded results: enough for a leaderboard worth paging.
PLAYERS = [f"bot{i}" for i in range(24)]
#: The bound the issue sets on /health and a game view during the burst.
BOUND_S = 1.0


def _folded(game_id: str, players: tuple[str, str], winner: int, ended_ms: int) -> GameFold:
    """A finished game as the projector folds it from its log: created, then ended."""
    seats = [SeatSpec(kind="bot", name=players[0]), SeatSpec(kind="bot", name=players[1])]
    created = GameCreated(
        game_id=game_id, seq=1, time=ended_ms - 1000, command_id="c", prev_hash="",
        game="teeko", options={}, seats=seats, move_time_ms=0, seed=1, engine_version="test",
    )  # fmt: skip
    ended = GameEnded(
        game_id=game_id, seq=2, time=ended_ms, command_id="e", prev_hash="0" * 64,
        result=winner, scores=None, reason="natural",
    )  # fmt: skip
    game = GameFold.start(unpack(encode(created)))  # type: ignore[arg-type]
    game.apply(unpack(encode(ended)))  # type: ignore[arg-type]
    return game


async def seed_results(redis: Any, keys: Keys, n: int, *, first: int = 0) -> None:
    """`n` finished teeko games between `PLAYERS`, through the projector's own write (each
    game's view, index entries, bot results and result record)."""
    rng = random.Random(first)
    folds = []
    for i in range(first, first + n):
        a, b = rng.sample(PLAYERS, 2)
        folds.append(_folded(f"teeko-seed-{i}", (a, b), rng.choice((0, 1, 2)), 1_000_000 + i))
    for at in range(0, len(folds), 256):
        await write(redis, keys, [Write(g, 0, 0) for g in folds[at : at + 256]])


async def gateway(arena: Arena, redis_url: str) -> TestClient:
    """A gateway of `arena` with its own Redis connections, as a deployed one has (the
    arena's lent client holds 100, which a burst of requests outgrows)."""
    app = init_app(GatewaySettings(keys=arena.keys, redis_url=redis_url))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    arena.clients.append(client)
    return client


async def _timed(client: TestClient, path: str) -> float:
    started = time.perf_counter()
    resp = await client.get(path)
    await resp.read()
    assert resp.status == 200, (path, resp.status, await resp.text())
    return time.perf_counter() - started


async def _probe(session: aiohttp.ClientSession, url: str, done: asyncio.Event) -> float:
    """The slowest answer to `url`, asked again and again until `done`."""
    slowest = 0.0
    while not done.is_set():
        started = time.perf_counter()
        async with session.get(url) as resp:
            await resp.read()
            assert resp.status == 200, (url, resp.status)
        slowest = max(slowest, time.perf_counter() - started)
        await asyncio.sleep(0.02)
    return slowest


async def _stalled(
    client: TestClient, game_id: str, path: str, burst: int
) -> tuple[float, float, float]:
    """The slowest answer to `/health` and to a game view, each asked again and again on
    connections of their own, while `burst` concurrent requests for `path` are answered;
    and the slowest of those (seconds)."""
    done = asyncio.Event()
    # The probes on connections of their own: the burst's session holds 100 at most.
    async with aiohttp.ClientSession() as other:
        probes = [
            asyncio.create_task(_probe(other, str(client.make_url(probe)), done))
            for probe in ("/health", f"/api/games/{game_id}")
        ]
        answers = await asyncio.gather(*(_timed(client, path) for _ in range(burst)))
        done.set()
        health, seen = await asyncio.gather(*probes)
    return health, seen, max(answers)


async def test_a_leaderboard_burst_does_not_stall_the_gateway(arena: Arena, redis_url: str) -> None:
    # The burst (inside the rate limit's 200) over at least its ~1,900 results: fewer
    # would not stall today's main in the short form either.
    results, burst = scale(3000, 6000), 190
    await seed_results(arena.redis, arena.keys, results)
    client = await gateway(arena, redis_url)
    game = await new_game(client, seats=[{"human": {}}, {"human": {}}])
    # The same burst of game views first: what this machine takes to answer 190 requests
    # at once in this process, probes and all. A loaded machine (a full CI run) came within
    # 4% of the 1 s, then past it, with no stall of the gateway's own: the bound is
    # the issue's, or twice that burst's where the machine itself is slower than that.
    base = await _stalled(client, game["id"], f"/api/games/{game['id']}", burst)
    limits = GatewaySettings()
    await asyncio.sleep(limits.burst / limits.rate_per_s)  # the rate limit's bucket full again
    bound = max(BOUND_S, 2 * max(base))
    health, seen, slowest = await _stalled(client, game["id"], "/api/leaderboards/teeko", burst)
    held = max(health, seen) < bound
    report(
        "leaderboard burst stalls a gateway",
        held,
        f"/health at worst {health * 1000:.0f} ms, a game view {seen * 1000:.0f} ms during "
        f"{burst} leaderboard requests over {results} results (the slowest {slowest * 1000:.0f}"
        f" ms); bound {bound * 1000:.0f} ms (a burst of game views: at worst "
        f"{max(base) * 1000:.0f} ms)",
    )
    assert held, (health, seen, base)


async def _per_request(client: TestClient, redis: Any, requests: int) -> tuple[float, float]:
    """Record reads (HVALS) and seconds per leaderboard request, once it is computed."""
    await _timed(client, "/api/leaderboards/teeko")  # computes it, if the results changed
    before, started = await calls(redis, "hvals"), time.perf_counter()
    for _ in range(requests):
        await _timed(client, "/api/leaderboards/teeko")
    seconds = (time.perf_counter() - started) / requests
    return (await calls(redis, "hvals") - before) / requests, seconds


async def test_a_leaderboard_request_costs_the_same_at_4x_the_results(
    arena: Arena, redis_url: str
) -> None:
    n, requests = scale(300, 2000), 20
    await seed_results(arena.redis, arena.keys, n)
    client = await gateway(arena, redis_url)
    reads_n, time_n = await _per_request(client, arena.redis, requests)
    await seed_results(arena.redis, arena.keys, 3 * n, first=n)
    reads_4n, time_4n = await _per_request(client, arena.redis, requests)
    board = await (await client.get("/api/leaderboards/teeko")).json()
    counted = sum(r["games"] for b in board["boards"] for r in b["rows"]) // 2
    held = reads_n == reads_4n == 0 and counted == 4 * n
    report(
        "leaderboard work grows with results",
        held,
        f"record reads per request {reads_n:g} at {n} results, {reads_4n:g} at {4 * n}; "
        f"time per request {time_n * 1000:.1f} ms -> {time_4n * 1000:.1f} ms "
        f"(x{time_4n / time_n:.2f})",
    )
    assert held, (reads_n, reads_4n, counted)


async def test_public_lists_are_paged_and_cacheable(arena: Arena, redis_url: str) -> None:
    await seed_results(arena.redis, arena.keys, 60)
    client = await gateway(arena, redis_url)
    answers = {}
    for path in ("/api/leaderboards/teeko", "/api/games?status=ended", "/api/tournaments"):
        resp = await client.get(path)
        await resp.read()
        tag, control = resp.headers.get("ETag"), resp.headers.get("Cache-Control", "")
        again = await client.get(path, headers={"If-None-Match": tag or '"none"'})
        await again.read()
        answers[path] = (resp.status, control.startswith("public, max-age="), again.status)
    # A page is what it says: `limit` rows of each board from `offset`, and where the rest is.
    page = await (await client.get("/api/leaderboards/teeko?limit=5&offset=5")).json()
    rows = [len(b["rows"]) for b in page["boards"]]
    paged = rows == [5] and page["boards"][0]["total"] == len(PLAYERS) and page["next"] == 10
    too_big = (await client.get("/api/leaderboards/teeko?limit=100000")).status
    held = all(a == (200, True, 304) for a in answers.values()) and paged and too_big == 400
    report(
        "public lists without cache validation",
        held,
        ", ".join(f"{p.split('?')[0]} {a[0]}->{a[2]}" for p, a in answers.items())
        + f"; a page of 5 rows {rows}; limit=100000 -> {too_big}",
    )
    assert held, (answers, rows, too_big)


async def _list_bytes(client: TestClient, redis: Any, path: str, requests: int) -> float:
    """Bytes Redis sent (to every client: the services' idle reads are noise far below a
    whole index) per request of `path`."""
    before = (await redis.info("stats"))["total_net_output_bytes"]
    for _ in range(requests):
        await _timed(client, path)
    return ((await redis.info("stats"))["total_net_output_bytes"] - before) / requests


async def test_a_filtered_game_list_reads_a_page_not_the_index(
    arena: Arena, redis_url: str
) -> None:
    n, requests = scale(1500, 3000), 10
    # Every game is an ended teeko game: the filters' intersection is the whole index.
    path = "/api/games?status=ended&game=teeko&limit=10"
    await seed_results(arena.redis, arena.keys, n)
    client = await gateway(arena, redis_url)
    at_n = await _list_bytes(client, arena.redis, path, requests)
    await seed_results(arena.redis, arena.keys, 3 * n, first=n)
    at_4n = await _list_bytes(client, arena.redis, path, requests)
    # Paging through a filter lists every game of it once.
    listed: list[str] = []
    cursor: str | None = ""
    while cursor is not None:
        query = f"status=ended&player={PLAYERS[0]}&limit=7&cursor={cursor}"
        page = await (await client.get(f"/api/games?{query}")).json()
        listed += [g["id"] for g in page["games"]]
        cursor = page["cursor"]
    index = [arena.keys.index_player(p, PLAYERS[0]) for p in arena.keys.all_partitions()]
    total = sum([await arena.redis.zcard(name) for name in index])
    held = at_4n < 2 * at_n and len(listed) == len(set(listed)) == total
    report(
        "filtered game list reads the whole index",
        held,
        f"Redis bytes out per request {at_n / 1024:.1f} KiB at {n} games, "
        f"{at_4n / 1024:.1f} KiB at {4 * n} (x{at_4n / at_n:.2f}); paged {len(listed)} of "
        f"{total} games",
    )
    assert held, (at_n, at_4n, len(listed), total)
