"""The clocks benchmark: time forfeits when many bot games run at a short move time.

`--games` (default 200) Teeko games run at once through the whole pipeline (one engine,
projector and dispatcher in this process), between random movers in a process of their own
that answer every turn on its own after a uniform 5-50 ms, as that many separate engine
processes would (well inside the clock), at `--move-time` (default 0.1 s) per move with the
forfeit policy. Printed, the median of `ROUNDS` rounds: games, moves, time forfeits per game
and per 1,000 moves (fastchess reports 10 in 20,000 games at its shortest control), think
time p50/p95 as the server measured it (from the turn's hand-over to the move's arrival),
and moves per second; the baseline is the same games without a clock in the same run, so
the ratio shows what the clock costs.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from bench.gateway import quantile
from bots.random_bot import RandomBot
from bots.worker import BotWorker
from schemas.codec import decode_turn
from schemas.commands import CreateGame, SeatSpec
from schemas.turns import TurnRequest
from services.bus.clients import CommandClient, QueryClient
from services.bus.consumer import Entry
from services.bus.keys import Keys
from services.redis_embedded import EmbeddedRedis
from services.runtime import ServiceSet
from services.tournament.results import game_results

PROMPT_MS = (5, 50)


class PromptWorker(BotWorker):
    """Bots that answer every turn after 5-50 ms, each turn on its own, as separate engine
    processes would (fastchess runs one engine process per game and seat)."""

    def __init__(self, redis: Any, keys: Keys) -> None:
        super().__init__(redis, RandomBot(), keys, block_ms=50)
        self._going: set[asyncio.Task[None]] = set()

    def warm_up(self) -> None:
        """Answer one made-up turn, as a bot that is already running has: the first answer
        of a fresh process builds the rules' tables (about 70 ms here), which would hold up
        the first turn of every game."""
        turn = TurnRequest(
            game_id="warm-up", game="teeko", options={}, moves=[], seq=4, seat=1, colour=1,
            bot="random", token="-",
        )  # fmt: skip
        self._answer(turn)
        self._states.pop(turn.game_id)

    async def process(self, entries: Sequence[Entry]) -> None:
        turns = [decode_turn(e.data) for e in entries if e.data is not None]
        for req in await self._current(turns):
            task = asyncio.create_task(self._reply(req))
            self._going.add(task)
            task.add_done_callback(self._going.discard)
        await self.reader.ack(entries)

    async def _reply(self, req: TurnRequest) -> None:
        await asyncio.sleep(random.uniform(*PROMPT_MS) / 1000)
        command = self._answer(req)
        if command is not None:
            await self.commands.send([command])
            self.moves_sent += 1


#: Rounds per setting; the table shows their medians.
ROUNDS = 3


def _serve_bots(url: str, prefix: str, ready: Any, stop: Any) -> None:
    """The bots' process: one `PromptWorker` until `stop` is set."""

    async def serve() -> None:
        redis = aioredis.Redis.from_url(url)
        worker = PromptWorker(redis, Keys(prefix=prefix))
        await worker.setup()
        worker.warm_up()
        ready.set()
        done = asyncio.Event()
        running = asyncio.create_task(worker.run(done))
        await asyncio.to_thread(stop.wait)
        done.set()
        await running
        await redis.aclose()

    asyncio.run(serve())


async def _play(url: str, games: int, move_time_ms: int, round_no: int) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(url)
    keys = Keys(prefix=f"bench-clocks-{move_time_ms}-{round_no}")
    services = ServiceSet(redis, keys, [], block_ms=50, director=False)
    spawn = multiprocessing.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    bots = spawn.Process(target=_serve_bots, args=(url, keys.prefix, ready, stop), daemon=True)
    bots.start()
    if not await asyncio.to_thread(ready.wait, 60):
        raise RuntimeError("the bots' process did not get ready within 60 s")
    await services.start()
    ids = [f"c{move_time_ms}-{i}" for i in range(games)]
    started = time.perf_counter()
    async with CommandClient(redis, keys) as client:
        await client.send(
            [
                CreateGame(
                    command_id=f"create:{gid}",
                    game_id=gid,
                    game="teeko",
                    seats=[SeatSpec(kind="bot", name="random")] * 2,
                    move_time_ms=move_time_ms,
                    seed=i,
                )
                for i, gid in enumerate(ids)
            ]
        )
    query = QueryClient(redis, keys)
    while not all(await query.ended(ids)) and time.perf_counter() - started < 600:
        await asyncio.sleep(0.1)
    seconds = time.perf_counter() - started
    stop.set()
    await asyncio.to_thread(bots.join, 30)
    await services.stop()
    # The results read model has every game's end and each move's think time.
    results = await game_results(redis, keys, "teeko")
    await redis.aclose()
    think = [ms for r in results for seat in r.think_ms for ms in seat]
    moves = len(think)
    forfeits = sum(r.reason == "time_forfeit" for r in results)

    def q(p: float) -> int:
        return int(quantile(think, p)) if think else 0

    return {
        "move_time_ms": move_time_ms,
        "games": games,
        "moves": moves,
        "forfeits": forfeits,
        "forfeits_per_1000_moves": 1000 * forfeits / max(1, moves),
        "think_p50_ms": q(0.5),
        "think_p95_ms": q(0.95),
        "moves_per_s": moves / seconds,
        "seconds": seconds,
    }


def _median_round(url: str, games: int, move_time_ms: int, progress: Progress) -> dict[str, Any]:
    """Every figure the median of `ROUNDS` rounds."""
    label = f"{move_time_ms / 1000:g} s/move" if move_time_ms else "no clock"
    task = progress.add_task(label, total=ROUNDS)
    rounds = []
    for n in range(ROUNDS):
        rounds.append(asyncio.run(_play(url, games, move_time_ms, n)))
        progress.advance(task)
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    out["forfeits_each_round"] = [r["forfeits"] for r in rounds]
    return out


def run_clocks_bench(games: int, move_time_s: float) -> list[dict[str, Any]]:
    with EmbeddedRedis() as server, Progress(transient=True) as progress:
        clocked = _median_round(server.url, games, round(move_time_s * 1000), progress)
        baseline = _median_round(server.url, games, 0, progress)
    clocked["moves_per_s_vs_no_clock"] = clocked["moves_per_s"] / max(1e-9, baseline["moves_per_s"])
    return [clocked, baseline]


def print_clocks_table(rows: list[dict[str, Any]]) -> None:
    table = Table(
        "move time", "games", "moves", "time forfeits", "per 1,000 moves", "think p50",
        "think p95", "moves/s",
        title=f"clocks: concurrent bot games, 5-50 ms bots (median of {ROUNDS} rounds)",
    )  # fmt: skip
    for r in rows:
        table.add_row(
            f"{r['move_time_ms'] / 1000:g} s" if r["move_time_ms"] else "none (baseline)",
            str(r["games"]), str(r["moves"]), str(r["forfeits"]),
            f"{r['forfeits_per_1000_moves']:.2f}", f"{r['think_p50_ms']} ms",
            f"{r['think_p95_ms']} ms", f"{r['moves_per_s']:.0f}",
        )  # fmt: skip
    Console().print(table)
    for r in rows:
        if r["move_time_ms"]:
            each = ", ".join(map(str, r["forfeits_each_round"]))
            Console().print(f"time forfeits in each round at {r['move_time_ms']} ms: {each}")
    ratio = rows[0].get("moves_per_s_vs_no_clock")
    if ratio is not None:
        Console().print(f"moves/s with the clock vs without: {ratio:.2f}x")
