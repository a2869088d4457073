"""The bots benchmark: how often MCTS beats the random and greedy bots, game by game.

For each game at its default options, `mcts` plays `random` and `greedy` in pairs of games
with the seats swapped, each pair sharing a game id (the bots' seed), so neither the first
move nor the luck of a seed favours one side. Games are played straight on the engine, no
Redis: a loop asks the bot to move with a `TurnContext` whose deadline is now plus the move
time, checks the move on the engine's checked path and goes on; games run in worker
processes, one per core by default. A game scores 1 for a win of the bot under test, 1/2 for
a draw, 0 for a loss. The interval is Wilson's 95% score interval over the games (points as
successes); a target is "met" when the whole interval clears it, "likely" when only the
score does. Beside them: the mean game length in plies and how many of the tested bot's
moves came after their deadline (on a busy machine the clock runs while others compute).

`agon bench bots [--games N] [--move-time S] [--game G [--option K=V]] [--opponent O] [--json]`
(bench/benchmarks.py); the issue's measurement is the default, 100 games per pairing at 0.25 s a
move, hours of CPU. `--option` plays one game's variant (Teeko's `markers=4`: at Ludii's default
of 8 markers the first player has a forced win, see bench/README.md), `--opponent` one pairing.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from bots import TurnContext, load_bot
from bots.evaluation import value_function
from engine import load_game

GAMES = ("supply-chains", "supplier-sabotage", "overflow", "teeko", "hexade")
#: (bot under test, opponent, target score)
PAIRINGS = (("mcts", "random", 0.95), ("mcts", "greedy", 0.70))
Z95 = 1.959964


@dataclass(frozen=True, slots=True)
class Job:
    """One game: `bot` in `seat` against `opponent`, the `pair`-th pair of the pairing."""

    game: str
    bot: str
    opponent: str
    pair: int
    seat: int
    move_time: float
    #: the game's options, as (key, value) pairs; none for its defaults
    options: tuple[tuple[str, str], ...] = ()

    @property
    def game_id(self) -> str:
        return f"bench-{self.game}-{self.bot}-{self.opponent}-{self.pair}"


@dataclass(frozen=True, slots=True)
class GameResult:
    job: Job
    #: 1 win, 0.5 draw, 0 loss, for `job.bot`
    score: float
    plies: int
    #: the longest think of `job.bot` and how many of its moves missed their deadline
    longest_s: float
    late: int


def play(job: Job) -> GameResult:
    """Play one game to its end."""
    state = load_game(job.game, **dict(job.options)).new_initial_state()
    players = {job.seat: load_bot(job.bot), 3 - job.seat: load_bot(job.opponent)}
    seq = 1
    longest, late = 0.0, 0
    while not state.is_terminal:
        seat = state.seat_to_move
        deadline = time.time() + job.move_time
        start = time.monotonic()
        context = TurnContext(job.game_id, seat, seq, int(deadline * 1000))
        move = players[seat].choose(state.clone(), context)
        if seat == job.seat:
            longest = max(longest, time.monotonic() - start)
            late += time.time() > deadline
        state.apply(move)
        seq += 1
    outcome = state.outcome()
    assert outcome is not None
    score = 0.5 if outcome.winner == 0 else float(state.seat_of(outcome.winner) == job.seat)
    return GameResult(job, score, state.ply, longest, late)


def warm_up(games: Sequence[str], options: dict[str, str]) -> None:
    """Build each game's tables and evaluation in a worker before its first timed move."""
    for name in games:
        game = load_game(name, **options)
        value_function(game)
        game.new_initial_state().legal_actions()


def wilson(points: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion of `points` out of `n`."""
    if n == 0:
        return 0.0, 1.0
    p = points / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n), (centre + spread) / (1 + z * z / n)


def jobs(
    games: Sequence[str],
    n_games: int,
    move_time: float,
    options: dict[str, str] | None = None,
    opponents: Sequence[str] | None = None,
) -> list[Job]:
    """Every game to play, pairs of seat-swapped games, the pairings interleaved."""
    pairs = (n_games + 1) // 2
    variant = tuple(sorted((options or {}).items()))
    return [
        Job(game, bot, opponent, pair, seat, move_time, variant)
        for pair in range(pairs)
        for game in games
        for bot, opponent, _ in PAIRINGS
        if opponents is None or opponent in opponents
        for seat in (1, 2)
    ]


def summarise(
    games: Sequence[str], results: Sequence[GameResult], move_time: float
) -> list[dict[str, Any]]:
    """One row per game and pairing, in the order of `games` and `PAIRINGS`."""
    rows = []
    for game in games:
        for bot, opponent, target in PAIRINGS:
            mine = [
                r
                for r in results
                if (r.job.game, r.job.bot, r.job.opponent) == (game, bot, opponent)
            ]
            if not mine:
                continue
            points = sum(r.score for r in mine)
            low, high = wilson(points, len(mine))
            score = points / len(mine)
            rows.append(
                {
                    "game": game,
                    "options": dict(mine[0].job.options),
                    "pairing": f"{bot} v {opponent}",
                    "move_time_s": move_time,
                    "games": len(mine),
                    "wins": sum(r.score == 1 for r in mine),
                    "draws": sum(r.score == 0.5 for r in mine),
                    "losses": sum(r.score == 0 for r in mine),
                    "score": round(score, 4),
                    "low": round(low, 4),
                    "high": round(high, 4),
                    "target": target,
                    "met": "yes" if low >= target else "likely" if score >= target else "no",
                    "mean_plies": round(sum(r.plies for r in mine) / len(mine), 1),
                    "longest_think_s": round(max(r.longest_s for r in mine), 3),
                    "late_moves": sum(r.late for r in mine),
                }
            )
    return rows


def run_bots_bench(
    games: Sequence[str],
    n_games: int,
    move_time: float,
    workers: int | None = None,
    options: dict[str, str] | None = None,
    opponents: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Play every pairing (or those against `opponents`) of every game, in parallel, with a
    progress bar on stderr."""
    for game in games:
        load_game(game, **(options or {}))  # an unknown name or option fails here
    todo = jobs(games, n_games, move_time, options, opponents)
    results: list[GameResult] = []
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    # Piped (no terminal to redraw a bar on), a line every 5% of the games says how far it is
    # and the score so far, which a run stopped early leaves behind.
    every = 0 if progress.console.is_terminal else max(1, len(todo) // 20)
    started = time.monotonic()
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(
        workers or os.cpu_count() or 1, initializer=warm_up, initargs=(games, options or {})
    )
    with progress, pool:
        task = progress.add_task("games", total=len(todo))
        for result in pool.imap_unordered(play, todo):
            results.append(result)
            progress.update(task, advance=1, description=f"{result.job.game} games")
            if every and len(results) % every == 0:
                elapsed = time.monotonic() - started
                scores = ", ".join(
                    f"{r['game']} {r['pairing']} {r['wins']}-{r['draws']}-{r['losses']}"
                    for r in summarise(games, results, move_time)
                )
                progress.console.print(
                    f"{len(results)}/{len(todo)} games in {elapsed:.0f} s; {scores}"
                )
    return summarise(games, results, move_time)


def print_bots_table(rows: Sequence[dict[str, Any]]) -> None:
    table = Table(title="MCTS against the other built-in bots (seat-swapped pairs)")
    for column in (
        "game",
        "pairing",
        "s/move",
        "games",
        "W-D-L",
        "score",
        "95% interval",
        "target",
        "met",
        "plies",
        "late moves",
    ):
        table.add_column(column, justify="left" if column in ("game", "pairing") else "right")
    for r in rows:
        variant = ", ".join(f"{k}={v}" for k, v in r["options"].items())
        table.add_row(
            f"{r['game']} ({variant})" if variant else r["game"],
            r["pairing"],
            f"{r['move_time_s']:g}",
            str(r["games"]),
            f"{r['wins']}-{r['draws']}-{r['losses']}",
            f"{100 * r['score']:.1f}%",
            f"{100 * r['low']:.1f}-{100 * r['high']:.1f}%",
            f"≥ {100 * r['target']:.0f}%",
            r["met"],
            f"{r['mean_plies']:.0f}",
            str(r["late_moves"]),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # piped: rich's 80 columns would wrap every cell
    console.print(table)
