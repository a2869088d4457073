"""`agon bench`: the engine's playout speed, printed beside Ludii's on this kind of machine.

`agon bench playouts` plays seeded uniformly random games through the unchecked
path (`legal_actions` / `apply_action`) for each row of Ludii's own benchmark
(shared/conformance/ludii-bench.tsv) and prints playouts/s, plies/s and the ratio to
Ludii. Teeko and Hexade rows also report the batched numpy engines (engine/batch),
which are tested to agree with the single-game rules move for move. Each row runs in
several rounds and reports the median round, since these machines are noisy.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from engine import Game, load_game
from engine.batch import BATCHED_GAMES, batched_playouts_per_sec
from services.cli.options import (
    UsageError,
    game_options_or_usage,
    parse_options,
    positive_float,
    positive_int,
)

#: The rows of ludii-bench.tsv: every game at its defaults plus the larger or variant boards.
PLAYOUT_ROWS: list[tuple[str, dict[str, Any]]] = [
    ("supply-chains", {}),
    ("supplier-sabotage", {}),
    ("overflow", {}),
    ("teeko", {}),
    ("hexade", {}),
    ("supply-chains", {"board": "square-8"}),
    ("supply-chains", {"variant": "capture-122"}),
    ("supplier-sabotage", {"board": "square-5"}),
    ("overflow", {"size": 8}),
    ("overflow", {"size": 4}),
]

DEFAULT_LUDII_TSV = Path(__file__).resolve().parents[2] / "shared/conformance/ludii-bench.tsv"


def _key(game: str, options: dict[str, Any]) -> str:
    return f"{game} {json.dumps({k: str(v) for k, v in options.items()}, sort_keys=True)}"


def load_ludii_figures(path: Path) -> dict[str, float]:
    """Ludii's playouts/s per (game, options) row, or nothing when the file is absent."""
    if not path.is_file():
        return {}
    with path.open() as f:
        rows = csv.DictReader(f, delimiter="\t")
        return {
            _key(r["game"], json.loads(r["options"])): float(r["ludii_playouts_per_sec"])
            for r in rows
        }


def time_playouts(game: Game, seconds: float, seed: int) -> tuple[int, int, float]:
    """Random playouts for about `seconds`: (playouts, plies, elapsed seconds)."""
    rng = random.Random(seed)
    randrange = rng.randrange
    playouts = plies = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        state = game.new_initial_state()
        actions = state.legal_actions()
        while actions:
            state.apply_action(actions[randrange(len(actions))])
            plies += 1
            actions = state.legal_actions()
        playouts += 1
        now = time.perf_counter()
        if now >= deadline:
            return playouts, plies, now - start


def bench_playouts(seconds: float, rounds: int = 3, seed: int = 1) -> list[dict[str, Any]]:
    results = []
    for name, options in PLAYOUT_ROWS:
        game = load_game(name, **options)
        time_playouts(game, min(0.2, seconds / 10), seed)  # warm caches and tables
        rates = []
        for r in range(rounds):
            playouts, plies, elapsed = time_playouts(game, seconds / rounds, seed + r)
            rates.append((playouts / elapsed, plies / elapsed))
        row: dict[str, Any] = {
            "game": name,
            "options": {k: str(v) for k, v in options.items()},
            "playouts_per_sec": round(statistics.median(p for p, _ in rates), 2),
            "plies_per_sec": round(statistics.median(q for _, q in rates), 1),
        }
        if name in BATCHED_GAMES:
            batched = [
                batched_playouts_per_sec(name, options, seconds / rounds, seed + r)
                for r in range(rounds)
            ]
            row["batched_playouts_per_sec"] = round(statistics.median(p for p, _ in batched), 2)
            row["batched_plies_per_sec"] = round(statistics.median(q for _, q in batched), 1)
        results.append(row)
    return results


def print_playout_table(results: list[dict[str, Any]], ludii: dict[str, float]) -> None:
    header = ("game", "options", "playouts/s", "plies/s", "Ludii", "ratio", "batched", "ratio")
    print("{:<18} {:<26} {:>11} {:>11} {:>8} {:>8} {:>10} {:>8}".format(*header))
    for r in results:
        base = ludii.get(_key(r["game"], r["options"]))
        batched = r.get("batched_playouts_per_sec")

        def ratio(rate: float | None, base: float | None = base) -> str:
            return f"{rate / base:.1f}x" if rate and base else "-"

        opts = json.dumps(r["options"]) if r["options"] else "defaults"
        print(
            f"{r['game']:<18} {opts:<26} {r['playouts_per_sec']:>11.1f}"
            f" {r['plies_per_sec']:>11.0f} {base or '-':>8} {ratio(r['playouts_per_sec']):>8}"
            f" {f'{batched:.1f}' if batched else '-':>10} {ratio(batched):>8}"
        )
    if not ludii:
        print("(Ludii's figures come from ../shared/conformance/ludii-bench.tsv, absent here)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "which",
        choices=["playouts", "pipeline", "memory", "gateway", "bots", "clocks", "load", "scale"],
        help="the engine's random playouts, the Redis pipeline (bench.pipeline), what"
        " finished games leave in Redis (bench.memory), the HTTP/WebSocket gateway"
        " (bench.gateway), MCTS against the other built-in bots (bench.bots), time"
        " forfeits of many concurrent bot games at a short move time (bench.clocks), or"
        " many bot games through 1, 2, 4 engine processes and 1, 2 gateways (bench.load), or"
        " the pipeline on 1, 2, 4, 8 simulated hosts with a CPU quota each (bench.scale)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="time per row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per row; the median counts")
    parser.add_argument("--ludii", type=Path, default=DEFAULT_LUDII_TSV)
    parser.add_argument("--json", action="store_true", help="also print a JSON array, last line")
    parser.add_argument("--rate", type=float, default=1000.0, help="pipeline: offered moves/s")
    parser.add_argument(
        "--redis-url", default=None, help="pipeline, gateway, load: default a private server"
    )
    parser.add_argument(
        "--games",
        type=int,
        default=None,
        help="memory: finished games per game name (default 50); bots: games per pairing"
        " and game, in seat-swapped pairs (default 100); load: concurrent games (default 64);"
        " scale: bot games per host (default 32)",
    )
    parser.add_argument(
        "--hosts", default="1,2,4,8", help="scale: simulated hosts, a window each (default 1,2,4,8)"
    )
    parser.add_argument(
        "--cpu", type=float, default=0.2, help="scale: CPU cores per host, its quota (default 0.2)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="scale: windows per host count, taken in turn (1,2,4,8,1,2,...); the efficiency"
        " is of the medians (default 1)",
    )
    parser.add_argument(
        "--kill-host",
        action="store_true",
        help="scale: one more run at the largest host count that kills a host mid-run",
    )
    parser.add_argument(
        "--keep-logs",
        action="store_true",
        help="scale: run the services with -v and keep every log (Redis's too)",
    )
    parser.add_argument(
        "--pace-ms",
        type=int,
        default=0,
        help="scale: the bots answer a turn no sooner than this after taking it (default 0:"
        " at once, every host saturated); a paced load leaves the hosts room",
    )
    parser.add_argument("--engines", default="1,2,4", help="load: engine processes, one run each")
    parser.add_argument("--gateways", default="1,2", help="load: gateways, one run each, or none")
    parser.add_argument(
        "--spectators", type=int, default=128, help="load: WebSocket spectators (default 128)"
    )
    parser.add_argument(
        "--move-time",
        type=positive_float,
        default=None,
        help="bots, clocks, scale: seconds per move (default 0.25 for bots, 0.1 for clocks;"
        " scale: the bot games have no clock)",
    )
    parser.add_argument(
        "--game",
        action="append",
        default=None,
        help="bots, load: only this game (repeatable; default all five for bots, teeko for load)",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="bots: worker processes (default one per core)",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="bots: play the one --game with this option (repeatable), e.g. markers=4 for Teeko",
    )
    parser.add_argument(
        "--opponent",
        action="append",
        default=None,
        help="bots: only MCTS against this bot, random or greedy (repeatable; default both)",
    )


def run(args: argparse.Namespace) -> int:
    if args.which == "pipeline":
        from bench.pipeline import print_pipeline_table, run_pipeline_bench

        results = run_pipeline_bench(args.seconds, args.redis_url, args.rate)
        print_pipeline_table(results)
    elif args.which == "gateway":
        from bench.gateway import print_gateway_table, run_gateway_bench

        results = run_gateway_bench(args.seconds, args.redis_url)
        print_gateway_table(results)
    elif args.which == "memory":
        from bench.memory import print_memory_table, run_memory_bench

        results = run_memory_bench(args.games if args.games is not None else 50)
        print_memory_table(results)
    elif args.which == "bots":
        from bench.bots import GAMES, PAIRINGS, print_bots_table, run_bots_bench

        games = args.game or GAMES
        known = [opponent for _, opponent, _ in PAIRINGS]
        for opponent in args.opponent or ():
            if opponent not in known:
                raise UsageError(f"--opponent {opponent!r}: MCTS plays {' or '.join(known)}")
        options = parse_options(args.option)
        if options and len(games) != 1:
            raise UsageError("--option sets one game's options: give exactly one --game")
        for game in games:
            game_options_or_usage(game, options)
        results = run_bots_bench(
            games,
            args.games if args.games is not None else 100,
            args.move_time if args.move_time is not None else 0.25,
            args.workers,
            options,
            args.opponent,
        )
        print_bots_table(results)
    elif args.which == "load":
        from bench.load import print_load_table, run_load_bench

        results = run_load_bench(
            args.games if args.games is not None else 64, args.seconds, args.engines,
            args.gateways, args.spectators, args.redis_url, args.game or ["teeko"],
        )  # fmt: skip
        print_load_table(results)
    elif args.which == "scale":
        from bench.fleet import FleetError
        from bench.scale import ScaleError, print_scale_table, run_scale_bench

        try:
            results = run_scale_bench(
                args.hosts, args.cpu, args.seconds, args.kill_host,
                args.games if args.games is not None else 32, keep_logs=args.keep_logs,
                move_time=args.move_time, repeat=args.repeat, pace_ms=args.pace_ms,
            )  # fmt: skip
        except (ScaleError, FleetError) as exc:
            # The testbed failed (it was cleaned up): one line, with the log that says why.
            print(f"agon bench scale: {exc}", file=sys.stderr)
            return 1
        print_scale_table(results)
    elif args.which == "clocks":
        from bench.clocks import print_clocks_table, run_clocks_bench

        move_time = args.move_time if args.move_time is not None else 0.1
        results = run_clocks_bench(args.games if args.games is not None else 200, move_time)
        print_clocks_table(results)
    else:
        results = bench_playouts(args.seconds, args.rounds)
        print_playout_table(results, load_ludii_figures(args.ludii))
    if args.json:
        print(json.dumps(results))
    return 0
