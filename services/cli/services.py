"""`agon engine|projector|dispatcher|bots|director`: one kind of service per process.

For scaling out: each says when it is ready, logs a stats line every few seconds with -v,
waits for Redis when it is away, and stops cleanly on SIGTERM or Ctrl-C. Each beats in
`Keys.processes` (what `agon status` shows). `--drain` processes what is there, then exits.
"""

from __future__ import annotations

import argparse
import asyncio

from bots import bot_names, load_bot
from bots.worker import BotWorker
from services.bus.connection import Client
from services.bus.consumer import ConsumerOptions, StreamConsumer
from services.bus.keys import Keys
from services.cli.common import (
    add_ack_arguments,
    add_service_arguments,
    announce_acks,
    replicas_to_wait_for,
    with_redis,
)
from services.cli.options import UsageError, non_negative_int, positive_float, positive_int
from services.dispatcher import Dispatcher
from services.engine_service import EngineService, settle_heap
from services.projector import Projector
from services.tournament.director import Director


class _Service:
    """One pipeline service kind in its own process, for scaling out (DESIGN.md, Running it)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
        if self.kind == "bots":
            parser.add_argument(
                "--bot", action="append", help=f"bot to serve, repeatable (default: {bot_names()})"
            )
            parser.add_argument(
                "--pace-ms",
                type=non_negative_int,
                default=0,
                help="answer a turn no sooner than this after taking it, on the bot's clock"
                " (bot games a person can follow; keep it well inside the move time;"
                " default: at once)",
            )
        if self.kind == "engine":
            parser.add_argument(
                "--batch", type=positive_int, default=256, help="entries per partition per read"
            )
            parser.add_argument(
                "--idempotency-hours",
                type=positive_float,
                default=24.0,
                help="how long a command id is remembered (its reply repeated) (default: 24)",
            )
        if self.kind == "dispatcher":
            parser.add_argument(
                "--abandon-after-hours",
                type=positive_float,
                default=24.0,
                help="end a game nobody touched for this long as aborted (default: 24)",
            )
        done = {
            "engine": "a command done",
            "projector": "a feed entry projected",
            "dispatcher": "a turn sent",
            "bots": "a turn answered",
        }.get(self.kind)
        if done:
            add_ack_arguments(parser, done)
        parser.add_argument(
            "--drain", action="store_true", help="process what is there, then exit (burst mode)"
        )

    def _make(
        self, redis: Client, keys: Keys, args: argparse.Namespace, replicas: int
    ) -> list[StreamConsumer | Director]:
        if self.kind == "director":
            return [Director(redis, keys)]
        # What each service waits for before it counts its work done (--ack-replicas).
        acks = ConsumerOptions(replicas=replicas, replica_timeout_ms=args.ack_timeout_ms)
        if self.kind == "engine":
            acks["batch"] = args.batch
            ttl = int(args.idempotency_hours * 3_600_000)
            return [EngineService(redis, keys, reply_ttl_ms=ttl, **acks)]
        if self.kind == "projector":
            return [Projector(redis, keys, **acks)]
        if self.kind == "dispatcher":
            abandon_ms = int(args.abandon_after_hours * 3_600_000)
            return [Dispatcher(redis, keys, abandon_ms=abandon_ms, **acks)]
        try:
            bots = args.bot or bot_names()
            return [BotWorker(redis, bot, keys, pace_ms=args.pace_ms, **acks) for bot in bots]
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def run(self, args: argparse.Namespace) -> int:
        if self.kind == "bots":
            for bot in args.bot or ():
                try:
                    load_bot(bot)
                except ValueError as exc:
                    raise UsageError(str(exc)) from None

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            replicas = 0 if self.kind == "director" else await replicas_to_wait_for(redis, args)
            services = self._make(redis, keys, args, replicas)
            announce_acks([s for s in services if isinstance(s, StreamConsumer)], replicas)
            if args.drain:
                handled = sum([await service.drain() for service in services])
                print(f"{self.kind}: {handled} entries handled")
                return 0
            settle_heap()  # a serving process: keep collections off the startup heap
            await asyncio.gather(*(service.run(stop) for service in services))
            return 0

        return with_redis(args, body, serving=True)


ENGINE = _Service("engine")
PROJECTOR = _Service("projector")
DISPATCHER = _Service("dispatcher")
BOTS = _Service("bots")
DIRECTOR = _Service("director")
