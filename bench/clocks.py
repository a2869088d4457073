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

Then `SEARCH_GAMES` games of a searching bot (`SEARCHER`, served by a plain `BotWorker` in
the bots' process, thinking to its clock) against the same random movers, at the same move
time. For every setting a second table shows, per bot, the moves that arrived after the
deadline (each ends its game by time forfeit; the worst overrun is the engine's
`overrun_ms`) and the margin the others left: the deadline less the arrival, p50 and min
over the rounds' moves (the move time less the server's think time: the games have no bank).
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

from bench.measure import quantile
from bots.random_bot import RandomBot
from bots.worker import BotWorker
from schemas.codec import decode_turn
from schemas.commands import CreateGame, SeatSpec
from schemas.events import GameEnded
from schemas.turns import TurnRequest
from services.bus.clients import CommandClient, QueryClient
from services.bus.embedded import EmbeddedRedis
from services.bus.keys import Keys
from services.bus.reader import Entry
from services.cli.pipeline import ServiceSet
from services.tournament.report import game_results

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
        self._positions.forget(turn.game_id)

    async def process(self, entries: Sequence[Entry]) -> None:
        turns = [decode_turn(e.data) for e in entries if e.data is not None]
        away: set[str] = set()
        current = await self._delivered(await self._current(turns, away), away)
        if away:  # a master is away: the batch is read again whole
            raise TimeoutError(f"games on a master that did not answer: {sorted(away)}")
        for req in current:
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
#: The searching bot whose margin is measured, and how many games of it each round plays.
SEARCHER = "mcts"
SEARCH_GAMES = 20


def _serve_bots(url: str, prefix: str, ready: Any, stop: Any) -> None:
    """The bots' process: one `PromptWorker` and one `SEARCHER` worker until `stop` is set."""

    async def serve() -> None:
        redis = aioredis.Redis.from_url(url)
        worker = PromptWorker(redis, Keys(prefix=prefix))
        searcher = BotWorker(redis, SEARCHER, Keys(prefix=prefix), block_ms=50)
        await worker.setup()
        await searcher.setup()
        worker.warm_up()
        ready.set()
        done = asyncio.Event()
        running = [asyncio.create_task(w.run(done)) for w in (worker, searcher)]
        await asyncio.to_thread(stop.wait)
        done.set()
        await asyncio.gather(*running)
        await redis.aclose()

    asyncio.run(serve())


async def _play(
    url: str, games: int, move_time_ms: int, round_no: int, searcher: str = ""
) -> dict[str, Any]:
    """One round: `games` games of random movers, or with `searcher` in one seat of each
    (first in every other game)."""
    redis = aioredis.Redis.from_url(url)
    keys = Keys(prefix=f"bench-clocks-{searcher}{move_time_ms}-{round_no}")
    services = ServiceSet(redis, keys, [], block_ms=50, director=False)
    spawn = multiprocessing.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    bots = spawn.Process(target=_serve_bots, args=(url, keys.prefix, ready, stop), daemon=True)
    bots.start()
    if not await asyncio.to_thread(ready.wait, 60):
        raise RuntimeError("the bots' process did not get ready within 60 s")
    await services.start()
    ids = [f"c{searcher}{move_time_ms}-{i}" for i in range(games)]
    random_seat = SeatSpec(kind="bot", name="random")
    ids_n = range(games)
    pairs = [[random_seat] * 2 for _ in ids_n]
    if searcher:
        mover = SeatSpec(kind="bot", name=searcher)  # first in every other game
        pairs = [[mover, random_seat] if i % 2 == 0 else [random_seat, mover] for i in ids_n]
    started = time.perf_counter()
    async with CommandClient(redis, keys) as client:
        await client.send(
            [
                CreateGame(
                    command_id=f"create:{gid}",
                    game_id=gid,
                    game="teeko",
                    seats=pairs[i],
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
    overruns = {}
    for r in results:
        if r.reason == "time_forfeit":
            ends = [e for e in await query.events(r.game_id) if isinstance(e, GameEnded)]
            overruns[r.game_id] = ends[-1].overrun_ms if ends else 0
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
        "per_bot": _per_bot(results, move_time_ms, overruns),
    }


def _per_bot(results: Sequence[Any], move_time_ms: int, overruns: dict[str, int]) -> dict[str, Any]:
    """Per bot: its moves' margins (deadline less arrival), its late moves and their
    overruns. A late move is never played: it (or the dispatcher's claim) ends the game."""
    out: dict[str, Any] = {}
    for r in results:
        for seat, name in enumerate(r.players, start=1):
            bot = out.setdefault(name, {"margins": [], "late": 0, "overruns": []})
            if move_time_ms:
                bot["margins"].extend(move_time_ms - ms for ms in r.think_ms[seat - 1])
            if r.reason == "time_forfeit" and r.fault == seat:
                bot["late"] += 1
                bot["overruns"].append(overruns.get(r.game_id, 0))
    return out


def _median_round(
    url: str, games: int, move_time_ms: int, progress: Progress, searcher: str = ""
) -> dict[str, Any]:
    """Every figure the median of `ROUNDS` rounds; the per-bot figures over all rounds."""
    label = f"{move_time_ms / 1000:g} s/move" if move_time_ms else "no clock"
    task = progress.add_task(f"{label} {searcher}".strip(), total=ROUNDS)
    rounds = []
    for n in range(ROUNDS):
        rounds.append(asyncio.run(_play(url, games, move_time_ms, n, searcher)))
        progress.advance(task)
    out = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "per_bot"}
    out["forfeits_each_round"] = [r["forfeits"] for r in rounds]
    out["searcher"] = searcher
    pooled: dict[str, dict[str, Any]] = {}
    for r in rounds:
        for name, bot in r["per_bot"].items():
            into = pooled.setdefault(name, {"margins": [], "late": 0, "overruns": []})
            for k in ("margins", "late", "overruns"):
                into[k] += bot[k]
    out["per_bot"] = {name: _margin_figures(bot) for name, bot in sorted(pooled.items())}
    return out


def _margin_figures(bot: dict[str, Any]) -> dict[str, Any]:
    margins = bot["margins"]
    return {
        "moves": len(margins) + bot["late"],
        "late": bot["late"],
        "overrun_max_ms": max(bot["overruns"], default=0),
        "margin_p50_ms": int(quantile(margins, 0.5)) if margins else None,
        "margin_min_ms": min(margins, default=None),
    }


def run_clocks_bench(games: int, move_time_s: float) -> list[dict[str, Any]]:
    """The clocked setting, the baseline, then `SEARCHER`'s games at the clocked time."""
    move_time_ms = round(move_time_s * 1000)
    with EmbeddedRedis() as server, Progress(transient=True) as progress:
        clocked = _median_round(server.url, games, move_time_ms, progress)
        baseline = _median_round(server.url, games, 0, progress)
        search = _median_round(server.url, SEARCH_GAMES, move_time_ms, progress, SEARCHER)
    clocked["moves_per_s_vs_no_clock"] = clocked["moves_per_s"] / max(1e-9, baseline["moves_per_s"])
    return [clocked, baseline, search]


def print_clocks_table(rows: list[dict[str, Any]]) -> None:
    table = Table(
        "move time", "games", "moves", "time forfeits", "per 1,000 moves", "think p50",
        "think p95", "moves/s",
        title=f"clocks: concurrent bot games, 5-50 ms bots (median of {ROUNDS} rounds)",
    )  # fmt: skip
    timed = [r for r in rows if not r.get("searcher")]
    for r in timed:
        table.add_row(
            f"{r['move_time_ms'] / 1000:g} s" if r["move_time_ms"] else "none (baseline)",
            str(r["games"]), str(r["moves"]), str(r["forfeits"]),
            f"{r['forfeits_per_1000_moves']:.2f}", f"{r['think_p50_ms']} ms",
            f"{r['think_p95_ms']} ms", f"{r['moves_per_s']:.0f}",
        )  # fmt: skip
    Console().print(table)
    for r in timed:
        if r["move_time_ms"]:
            each = ", ".join(map(str, r["forfeits_each_round"]))
            Console().print(f"time forfeits in each round at {r['move_time_ms']} ms: {each}")
    ratio = rows[0].get("moves_per_s_vs_no_clock")
    if ratio is not None:
        Console().print(f"moves/s with the clock vs without: {ratio:.2f}x")
    print_margin_table(rows)


def print_margin_table(rows: list[dict[str, Any]]) -> None:
    """Per setting and bot: late moves and the margin left (deadline less arrival)."""
    table = Table(
        "games", "move time", "bot", "moves", "late", "worst overrun", "margin p50",
        "margin min", title=f"late moves per bot (all {ROUNDS} rounds)",
    )  # fmt: skip
    for r in rows:
        if not r["move_time_ms"]:
            continue
        games = f"{r['searcher']} vs random" if r["searcher"] else "random vs random"
        for name, b in r.get("per_bot", {}).items():
            table.add_row(
                games, f"{r['move_time_ms'] / 1000:g} s", name, str(b["moves"]), str(b["late"]),
                f"{b['overrun_max_ms']} ms" if b["late"] else "-",
                f"{b['margin_p50_ms']} ms", f"{b['margin_min_ms']} ms",
            )  # fmt: skip
    Console().print(table)
