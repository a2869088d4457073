"""`agon verify` and `agon rebuild`: checking and repairing the read models.

`agon verify` replays every log, checks every hash chain and compares the read models;
exit 1 on any difference. `agon rebuild` recomputes the read models from the logs (safe
while play goes on; `--check` compares them with the ones before). Both need
`--redis-url`: a fresh private server would always look fine. Both ride out a failover.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Sequence

from services.bus.connection import Client
from services.bus.keys import Keys
from services.cli.common import add_service_arguments, add_wait_argument, with_redis
from services.cli.options import positive_int
from services.projector import compare_read_models, rebuild, snapshot, verify


def print_verify(games: int, events: int, problems: Sequence[str]) -> None:
    for line in problems:
        print(f"  {line}")
    verdict = "OK" if not problems else f"{len(problems)} problem(s)"
    print(f"verify: {games} games, {events} events: {verdict}")


class _Verify:
    """`agon verify`: hash chains, a replay of every log and the read models; exit 1 if off."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, private=False)
        add_wait_argument(parser)
        parser.add_argument("--json", action="store_true", help="print the report as JSON")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            report = await verify(redis, keys)
            if args.json:
                out = {"games": report.games, "events": report.events, "ok": report.ok}
                print(json.dumps({**out, "problems": report.problems}))
            else:
                print_verify(report.games, report.events, report.problems)
            return 0 if report.ok else 1

        return with_redis(args, body, embedded=False, repeatable=True)


class _Rebuild:
    """`agon rebuild`: recompute every read model from the logs."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, private=False)
        add_wait_argument(parser)
        parser.add_argument(
            "--check",
            action="store_true",
            help="compare the rebuilt read models with the ones before; exit 1 if they differ",
        )
        parser.add_argument(
            "--workers",
            type=positive_int,
            default=os.cpu_count() or 1,
            help="processes replaying logs (default: one per core)",
        )
        parser.add_argument(
            "--chunk",
            type=positive_int,
            default=1000,
            help="games folded per step; -v logs each step (default: 1000)",
        )
        parser.add_argument("--json", action="store_true", help="end with a JSON summary line")

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            before = await snapshot(redis, keys) if args.check else {}
            started = time.perf_counter()
            stats = await rebuild(redis, keys, args.chunk, workers=args.workers, url=url)
            seconds = time.perf_counter() - started
            for line in stats.skipped:
                print(f"  skipped {line}")
            rate = stats.events / seconds if seconds > 0 else 0.0
            print(
                f"rebuild: {stats.games} games, {stats.events} events in {seconds:.3f} s"
                f" ({rate:.0f} events/s); {stats.ahead} already newer, {stats.swept} stale removed"
            )
            status = 1 if stats.skipped else 0
            if args.check:
                diff = compare_read_models(before, await snapshot(redis, keys))
                for line in diff:
                    print(f"  {line}")
                print(f"rebuild --check: {'identical' if not diff else f'{len(diff)} differ'}")
                status = status or (1 if diff else 0)
            if args.json:
                summary = {"games": stats.games, "events": stats.events, "seconds": seconds}
                print(json.dumps({**summary, "events_per_sec": round(rate, 1)}))
            return status

        return with_redis(args, body, embedded=False, repeatable=True)


VERIFY = _Verify()
REBUILD = _Rebuild()
