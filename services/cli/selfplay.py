"""`agon selfplay`: games between bots through the whole pipeline, then a summary.

Creates N games per game name between two bots, waits until they end and prints what they
came to; with `--services none` it only drives a deployment started separately; with
`--verify` it runs `agon verify` afterwards; with `--json` the last line is
machine-readable. The work is `services.cli.pipeline.selfplay`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from bots import bot_names, load_bot
from engine import game_names
from services.bus.connection import Client
from services.bus.keys import Keys
from services.cli.admin import print_verify
from services.cli.common import (
    add_ack_arguments,
    add_service_arguments,
    add_wait_argument,
    again_after_failover,
    pipeline_missing,
    replicas_to_wait_for,
    say_missing,
    with_redis,
)
from services.cli.options import (
    UsageError,
    game_options_or_usage,
    parse_options,
    positive_float,
    positive_int,
)
from services.cli.pipeline import SelfplayResult, selfplay
from services.projector import verify


class _Selfplay:
    """`agon selfplay`: games between bots through the whole pipeline, then a summary."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
        parser.add_argument(
            "--game",
            action="append",
            required=True,
            help=f"game to play, repeatable, or 'all' ({', '.join(game_names())})",
        )
        parser.add_argument(
            "--option", action="append", default=[], help="game option key=value, repeatable"
        )
        parser.add_argument("--games", type=positive_int, default=10, help="games per game name")
        parser.add_argument(
            "--bots", default="random,random", help=f"two bots, comma separated ({bot_names()})"
        )
        parser.add_argument(
            "--move-time-ms", type=int, default=0, help="per-move limit in ms (0: none)"
        )
        parser.add_argument(
            "--engines", type=positive_int, default=1, help="engine services to run"
        )
        parser.add_argument(
            "--services",
            choices=("all", "none"),
            default="all",
            help="run every service in this process (all), or only drive a deployment (none)",
        )
        parser.add_argument("--timeout", type=positive_float, default=600.0, help="seconds to wait")
        parser.add_argument("--verify", action="store_true", help="run `agon verify` afterwards")
        parser.add_argument("--json", action="store_true", help="end with a JSON summary line")
        add_ack_arguments(parser)
        add_wait_argument(parser)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        names = game_names() if "all" in args.game else args.game
        options = parse_options(args.option)
        bots = [b.strip() for b in args.bots.split(",")]
        if len(bots) != 2:
            raise UsageError("--bots wants two bot names, e.g. random,random")
        if args.move_time_ms < 0:
            raise UsageError(
                f"--move-time-ms must be 0 (no clock) or more, got {args.move_time_ms}"
            )
        for name in names:
            game_options_or_usage(name, options)
        try:
            for b in set(bots):
                load_bot(b)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.services == "none" and not args.redis_url:
            raise UsageError("--services none drives a running deployment: pass its --redis-url")
        specs = [(name, options) for name in names]

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            services = args.services == "all"
            missing = [] if services else await pipeline_missing(redis, keys)
            if missing:
                say_missing(args, url, missing)
                return 1
            replicas = await replicas_to_wait_for(redis, args) if services else 0
            try:
                result = await selfplay(
                    redis,
                    keys,
                    specs,
                    args.games,
                    bots,
                    move_time_ms=args.move_time_ms,
                    timeout_s=args.timeout,
                    engines=args.engines,
                    services=services,
                    ack_replicas=replicas,
                    ack_timeout_ms=args.ack_timeout_ms,
                )
            except TimeoutError as exc:
                print(
                    f"agon selfplay: {exc}: is an engine running on this Redis with this --prefix?",
                    file=sys.stderr,
                )
                return 1
            print_selfplay(result, names, bots)
            status = 0 if result.finished == result.games else 1
            if args.verify:
                report = await again_after_failover(args, lambda: verify(redis, keys))
                print_verify(report.games, report.events, report.problems)
                status = status or (0 if report.ok else 1)
            if args.json:
                print(json.dumps(result.summary()))
            return status

        return with_redis(args, body)


def print_selfplay(result: SelfplayResult, names: Sequence[str], bots: Sequence[str]) -> None:
    print(f"selfplay {', '.join(names)}: {bots[0]} (seat 1) vs {bots[1]} (seat 2)")
    for game, outcomes in sorted(result.outcomes.items()):
        parts = ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        print(f"  {game}: {parts}")
    s = result.summary()
    print(
        f"  {s['finished']}/{s['games']} games ended, {s['moves']} moves in {s['seconds']} s"
        f" ({s['moves_per_sec']} moves/s)"
    )
    if result.most_going:
        print(f"  at most {result.most_going} games at once (admission control by the lag)")
    if result.unfinished:
        print(f"  unfinished: {', '.join(result.unfinished[:20])}")


SELFPLAY = _Selfplay()
