"""The pipeline benchmark: engine throughput, command-to-event latency and rebuild speed.

Every figure is printed beside the raw XADD rate of the same Redis, measured in the same
run, because absolute numbers on a shared two-core machine say little on their own:

- `xadd`: pipelined XADD of event-sized entries from one client (the ceiling of any writer);
- `engine <game>`: validated moves per second through one engine process (its own OS
  process, consumer group `engine`) over many concurrent games of random moves: all games'
  moves are queued first (move 1 of every game, then move 2, ...; each with the right
  expected seq) and the engine drains them, deciding, appending and replying;
- `latency`: p50/p99 from XADD of a command to its event appearing on the partition feed,
  with commands offered at a fixed rate (default 1,000 moves/s) to an engine in a separate
  process;
- `rebuild`: events per second of `agon rebuild` over the logs the engine runs wrote.

`run_pipeline_bench(seconds)` returns one dict per figure (with its target and whether it
is met); `agon bench pipeline` prints them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from redis.asyncio import Redis

from engine import load_game
from schemas.codec import FIELD, encode, unpack
from schemas.commands import CreateGame, PlayMove, SeatSpec
from schemas.tokens import bot_token
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import connect
from services.bus.embedded import redis_url_or_embedded
from services.bus.keys import Keys
from services.bus.secret import shared_secret
from services.engine_service import EngineService, settle_heap
from services.engine_service.service import EngineStats
from services.projector import rebuild

ROOT = Path(__file__).resolve().parents[1]
TARGET_MOVES_PER_SEC = 10_000
TARGET_P99_MS = 5.0
TARGET_REBUILD_EVENTS_PER_SEC = 100_000
GAMES = ("teeko", "supply-chains")


def random_games(game: str, count: int, seed: int) -> list[list[str]]:
    """The moves of `count` seeded random playouts of `game`."""
    g = load_game(game)
    out = []
    for i in range(count):
        rng = random.Random(seed * 1_000_003 + i)
        state = g.new_initial_state()
        moves = []
        actions = state.legal_actions()
        while actions:
            action = actions[rng.randrange(len(actions))]
            moves.append(str(g.move_of(action)))
            state.apply_action(action)
            actions = state.legal_actions()
        out.append(moves)
    return out


class MoveQueue:
    """Precomputed games as commands: creation, then each move with its expected seq."""

    def __init__(
        self, keys: Keys, game: str, games: list[list[str]], tag: str, secret: bytes
    ) -> None:
        self.keys = keys
        self.game = game
        self.ids = [f"{game}-{tag}-{i}" for i in range(len(games))]
        self.games = games
        self.tokens = {
            (gid, seat): bot_token(secret, gid, seat) for gid in self.ids for seat in (1, 2)
        }

    def creates(self) -> list[tuple[str, bytes]]:
        return [
            (
                self.keys.commands_for(gid),
                encode(
                    CreateGame(
                        command_id=f"c-{gid}",
                        game_id=gid,
                        game=self.game,
                        seats=[SeatSpec(kind="bot", name="bench")] * 2,
                    )
                ),
            )
            for gid in self.ids
        ]

    def move(self, index: int, ply: int, seat: int, head: int) -> tuple[str, bytes, str, int]:
        """The command for move `ply` of game `index`; also (game id, the seq it will get)."""
        gid = self.ids[index]
        command = PlayMove(
            command_id=f"m-{gid}-{ply}",
            game_id=gid,
            seat=seat,
            token=self.tokens[(gid, seat)],
            move=self.games[index][ply],
            expected_seq=head,
        )
        return self.keys.commands_for(gid), encode(command), gid, head + 1

    def interleaved(self, heads: dict[str, int]) -> list[tuple[str, bytes, str, int]]:
        """Every move of every game, round-robin over games (the way live games interleave).

        Seats follow the engine's own record of who is to move, replayed here.
        """
        g = load_game(self.game)
        states = [g.new_initial_state() for _ in self.games]
        out = []
        for ply in range(max(len(m) for m in self.games)):
            for i, moves in enumerate(self.games):
                if ply >= len(moves):
                    continue
                state = states[i]
                seat = state.seat_to_move
                out.append(self.move(i, ply, seat, heads[self.ids[i]] + ply))
                state.apply(moves[ply])
        return out


async def xadd_rate(redis: Redis, seconds: float, batch: int = 500) -> float:
    """Entries/s of pipelined XADD of ~200-byte entries into one stream."""
    payload: dict[Any, Any] = {FIELD: b"x" * 200}
    stream = "bench:xadd"
    count = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pipe = redis.pipeline(transaction=False)
        for _ in range(batch):
            pipe.xadd(stream, payload)
        await pipe.execute()
        count += batch
    rate = count / (time.perf_counter() - start)
    await redis.delete(stream)
    return rate


def redis_benchmark_xadd(url: str, requests: int = 200_000) -> float | None:
    """XADD/s that `redis-benchmark` (pipelined, from C) gets from the same server, if it is
    installed: the server's own ceiling, beside the Python client's."""
    binary = shutil.which("redis-benchmark")
    address = urlparse(url)
    if binary is None or address.hostname is None:
        return None
    target = ["-h", address.hostname, "-p", str(address.port or 6379)]
    command = ["XADD", "bench:raw", "*", "m", "x" * 200]
    run = subprocess.run(
        [binary, *target, "-n", str(requests), "-P", "32", "--csv", *command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rows = [line.split('","') for line in run.stdout.splitlines() if line.startswith('"XADD')]
    return float(rows[0][1]) if run.returncode == 0 and rows else None


async def send(redis: Redis, items: Sequence[tuple[str, bytes]], chunk: int = 2000) -> None:
    client = CommandClient(redis, Keys())
    for i in range(0, len(items), chunk):
        await client.send_encoded(items[i : i + chunk])


async def heads(redis: Redis, keys: Keys, ids: Sequence[str]) -> dict[str, int]:
    return dict(zip(ids, await QueryClient(redis, keys).heads(ids), strict=True))


def engine_process(url: str, prefix: str, mode: str) -> subprocess.Popen[str]:
    """An engine service in its own process: `drain2` drains, says so, waits for a line on
    stdin, then drains again timed (printing its stats); `run` serves until SIGTERM."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.pipeline", f"_{mode}", url, prefix],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def engine_throughput(
    redis: Redis, url: str, keys: Keys, game: str, seconds: float, tag: str
) -> dict[str, Any]:
    """Validated moves/s of one engine process draining queued moves of many games."""
    # Size the run to about `seconds` at the target rate, in whole random games.
    per_game = len(random_games(game, 1, 0)[0]) or 1
    count = max(50, int(TARGET_MOVES_PER_SEC * seconds / per_game))
    secret = await shared_secret(redis, keys)
    queue = MoveQueue(keys, game, random_games(game, count, 7), tag, secret)
    await send(redis, [(s, d) for s, d in queue.creates()])
    # One engine process creates the games, then (its cache warm, as in steady play)
    # drains the queued moves on cue; only that second drain is timed.
    proc = engine_process(url, keys.prefix, "drain2")
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdout.readline()
    moves = queue.interleaved(await heads(redis, keys, queue.ids))
    await send(redis, [(s, d) for s, d, _, _ in moves])
    out, _ = proc.communicate("go\n", timeout=600)
    stats = json.loads(out.strip().splitlines()[-1])
    appended = sum((await heads(redis, keys, queue.ids)).values())
    return {
        "name": f"engine {game}",
        "games": count,
        "moves": stats["moves"],
        "rejected": stats["rejected"],
        "seconds": round(stats["seconds"], 3),
        "moves_per_sec": round(stats["moves"] / stats["seconds"], 1),
        # the engine process's own CPU per move: steadier than the rate on a shared machine
        "cpu_us_per_move": round(stats["cpu"] * 1e6 / max(1, stats["moves"]), 1),
        "events_in_logs": appended,
    }


async def latency(
    redis: Redis, url: str, keys: Keys, rate: float, seconds: float, tag: str
) -> dict[str, Any]:
    """p50/p99 ms from a command's XADD to its event on the feed, at `rate` moves/s."""
    total = int(rate * seconds)
    secret = await shared_secret(redis, keys)
    # Enough games that each sees a move only every few hundred ms, none ending early.
    queues = [
        MoveQueue(keys, game, random_games(game, max(50, total // 12), 11), tag, secret)
        for game in GAMES
    ]
    # The engine runs before the games exist, so it holds them all in its cache.
    proc = engine_process(url, keys.prefix, "run")
    assert proc.stdout is not None
    proc.stdout.readline()
    await send(redis, [c for q in queues for c in q.creates()])
    while min((await heads(redis, keys, [g for q in queues for g in q.ids])).values()) < 4:
        await asyncio.sleep(0.05)
    plan: list[tuple[str, bytes, str, int]] = []
    for q in queues:
        plan.extend(q.interleaved(await heads(redis, keys, q.ids)))
    # Round-robin over games of both kinds; a game's next move is far behind its last.
    plan.sort(key=lambda m: (int(m[3]), m[2]))
    plan = plan[:total]
    sent: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], float] = {}
    # Start reading each feed after its current last entry: nothing sent later is missed.
    feeds: dict[Any, Any] = {}
    pipe = redis.pipeline(transaction=False)
    for p in keys.all_partitions():
        pipe.xrevrange(keys.feed(p), count=1)
    for p, last in zip(keys.all_partitions(), await pipe.execute(), strict=True):
        feeds[keys.feed(p)] = last[0][0] if last else "0-0"
    listener_redis = Redis.from_url(url)
    client = CommandClient(redis, keys)
    try:

        async def listen() -> None:
            while len(seen) < len(plan):
                reply: Any = await listener_redis.xread(feeds, block=1000, count=1000)
                now = time.perf_counter()
                if not reply:
                    if time.perf_counter() - start > seconds + 10:
                        return
                    continue
                for stream, entries in reply:
                    for entry_id, fields in entries:
                        feeds[stream.decode()] = entry_id
                        ev = unpack(fields[FIELD.encode()])
                        seen.setdefault((ev["game_id"], ev["seq"]), now)

        start = time.perf_counter()
        listener = asyncio.create_task(listen())
        for i, (stream, data, gid, seq) in enumerate(plan):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[(gid, seq)] = time.perf_counter()
            await client.send_encoded([(stream, data)])
        await listener
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        await listener_redis.aclose()
    lat = sorted((seen[k] - t) * 1000 for k, t in sent.items() if k in seen)
    if not lat:
        return {"name": "latency", "offered_moves_per_sec": rate, "answered": 0}
    p50 = statistics.median(lat)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    return {
        "name": "latency",
        "offered_moves_per_sec": rate,
        "moves": len(plan),
        "answered": len(lat),
        "p50_ms": round(p50, 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(lat[-1], 3),
        "target_p99_ms": TARGET_P99_MS,
        "met": p99 <= TARGET_P99_MS,
    }


async def rebuild_rate(redis: Redis, url: str, keys: Keys) -> dict[str, Any]:
    """Events/s of `agon rebuild` (one process per core), with where the CPU went: the
    rebuild processes' own time per event and the Redis server's share."""
    workers = os.cpu_count() or 1
    redis_cpu = await _redis_cpu(redis)
    before = os.times()
    started = time.perf_counter()
    stats = await rebuild(redis, keys, workers=workers, url=url)
    seconds = time.perf_counter() - started
    after = os.times()
    redis_cpu = await _redis_cpu(redis) - redis_cpu
    # The worker processes have been reaped by now, so their time is in `children_*`.
    python_cpu = sum(after[:4]) - sum(before[:4])
    rate = stats.events / seconds
    events = stats.events or 1
    return {
        "name": "rebuild",
        "workers": workers,
        "games": stats.games,
        "events": stats.events,
        "seconds": round(seconds, 3),
        "events_per_sec": round(rate, 1),
        "python_cpu_us_per_event": round(python_cpu / events * 1e6, 2),
        "redis_cpu_us_per_event": round(redis_cpu / events * 1e6, 2),
        "target_events_per_sec": TARGET_REBUILD_EVENTS_PER_SEC,
        "met": rate >= TARGET_REBUILD_EVENTS_PER_SEC,
    }


async def _redis_cpu(redis: Redis) -> float:
    """CPU seconds the Redis server has used (user + system, all threads)."""
    info: Any = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def _bench(url: str, seconds: float, rate: float) -> list[dict[str, Any]]:
    redis = Redis.from_url(url)
    tag = f"b{int(time.time())}"
    keys = Keys(prefix=f"bench-{tag}")
    try:
        xadd = await xadd_rate(redis, min(2.0, seconds))
        server = redis_benchmark_xadd(url)
        await redis.delete("bench:raw")
        results: list[dict[str, Any]] = [
            {
                "name": "xadd",
                "entries_per_sec": round(xadd, 1),
                "redis_benchmark_entries_per_sec": server,
            }
        ]
        for game in GAMES:
            row = await engine_throughput(redis, url, keys, game, seconds, tag)
            row["target_moves_per_sec"] = TARGET_MOVES_PER_SEC
            row["met"] = row["moves_per_sec"] >= TARGET_MOVES_PER_SEC
            row["ratio_to_xadd"] = round(row["moves_per_sec"] / xadd, 3)
            results.append(row)
        row = await latency(redis, url, keys, rate, seconds, tag + "l")
        results.append(row)
        row = await rebuild_rate(redis, url, keys)
        row["ratio_to_xadd"] = round(row["events_per_sec"] / xadd, 3)
        results.append(row)
        return results
    finally:
        await redis.aclose()


def run_pipeline_bench(
    seconds: float = 5.0, redis_url: str | None = None, rate: float = 1000.0
) -> list[dict[str, Any]]:
    """Run every pipeline figure against `redis_url`, else a private redis-server."""
    with redis_url_or_embedded(redis_url) as url:
        return asyncio.run(_bench(url, seconds, rate))


def print_pipeline_table(results: Sequence[dict[str, Any]]) -> None:
    first = next(r for r in results if r["name"] == "xadd")
    xadd, server = first["entries_per_sec"], first["redis_benchmark_entries_per_sec"]
    print(f"{'figure':<22} {'value':>16} {'target':>12} {'met':>5}  / Python XADD")
    print(f"{'xadd, Python client':<22} {xadd:>14.0f}/s {'':>12} {'':>5}  1.000")
    if server:
        ratio = server / xadd
        print(f"{'xadd, redis-benchmark':<22} {server:>14.0f}/s {'':>12} {'':>5}  {ratio:.3f}")
    for r in results:
        if r["name"].startswith("engine"):
            met = "yes" if r["met"] else "no"
            value, target = f"{r['moves_per_sec']:.0f} moves/s", r["target_moves_per_sec"]
            print(f"{r['name']:<22} {value:>16} {target:>10}/s {met:>5}  {r['ratio_to_xadd']:.3f}")
            print(f"{'  engine cpu per move':<22} {r['cpu_us_per_move']:>8.1f} us")
        elif r["name"] == "latency" and "p99_ms" in r:
            met = "yes" if r["met"] else "no"
            print(
                f"{'latency @' + str(int(r['offered_moves_per_sec'])) + '/s':<22}"
                f" p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms {r['target_p99_ms']:>5} ms"
                f" {met:>5}"
            )
        elif r["name"] == "rebuild":
            met = "yes" if r["met"] else "no"
            print(
                f"{'rebuild':<22} {r['events_per_sec']:>7.0f} events/s"
                f" {r['target_events_per_sec']:>10}/s {met:>5}  {r['ratio_to_xadd']:.3f}"
            )
            if "python_cpu_us_per_event" in r:
                print(
                    f"{'  cpu per event':<22} {r['python_cpu_us_per_event']:>6.1f} us Python"
                    f" ({r['workers']} processes), {r['redis_cpu_us_per_event']:.1f} us Redis"
                )


# -- the engine process the benchmark starts -------------------------------------------------
async def _engine(url: str, prefix: str, mode: str) -> None:
    logging.getLogger("agon").setLevel(logging.ERROR)  # its ready line would cut the table
    redis = await connect(url)
    engine = EngineService(redis, Keys(prefix=prefix), batch=512, block_ms=100)
    await engine.setup()
    settle_heap()  # as `agon engine` does
    if mode == "drain2":
        await engine.drain()
        print("created", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        engine.counts = EngineStats()
        started, cpu = time.perf_counter(), time.process_time()
        await engine.drain()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        s = engine.counts
        stats = {"moves": s.moves, "rejected": s.rejected, "seconds": seconds, "cpu": cpu}
        print(json.dumps(stats))
    else:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print("ready", flush=True)
        await engine.run(stop)
    await redis.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """The engine process the benchmark spawns: `python -m bench.pipeline _run URL PREFIX`.

    People run the benchmark as `agon bench pipeline` (bench/benchmarks.py).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or args[0] not in ("_drain2", "_run"):
        print("run the benchmark with `agon bench pipeline`", file=sys.stderr)
        return 2
    asyncio.run(_engine(args[1], args[2], args[0][1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
