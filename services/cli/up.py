"""`agon up` (every service and a gateway in one process) and `agon gateway` (one gateway).

`agon up` serves until interrupted (Ctrl-C or SIGTERM), optionally after a demo: one game
of each game between bots and a short tournament to watch in the page. `agon gateway` is
one gateway process, for scaling out. Each gateway beats in `Keys.processes` with its URL
and reply stream (what `agon status` shows). The listening arguments (address, rate
limit, connection caps, read deadlines, where /metrics is served) are shared by both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from bots import bot_names, load_bot
from engine import game_names
from schemas.tournaments import TournamentSpec, new_tournament_id
from services.archive import ARCHIVE_ENV
from services.bus import presence
from services.bus.connection import Client, redact
from services.bus.consumer import consumer_name
from services.bus.keys import Keys
from services.bus.text import now_ms
from services.cli import arena
from services.cli.common import (
    add_ack_arguments,
    add_service_arguments,
    finish,
    replicas_to_wait_for,
    with_redis,
)
from services.cli.options import UsageError, non_negative_int, positive_float, positive_int
from services.cli.pipeline import GameSpec, ServiceSet, collect, create_games, wait_until_ended
from services.cli.selfplay import print_selfplay
from services.engine_service import settle_heap
from services.gateway.serve import serve_until, serving
from services.gateway.settings import REDIS_CONNECTIONS, GatewaySettings
from services.tournament.store import TournamentStore

#: How long a stopping gateway may take to remove its heartbeat (Redis may be away).
BEAT_STOP_S = 1.0


class _Up:
    """`agon up`: every service in one process until interrupted (Ctrl-C or SIGTERM)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, arena=False)
        parser.add_argument(
            "--bots", default=",".join(bot_names()), help="bots to serve, comma separated"
        )
        parser.add_argument(
            "--engines", type=positive_int, default=1, help="engine services to run"
        )
        parser.add_argument(
            "--demo", action="store_true", help="first play one game of each game between bots"
        )
        parser.add_argument(
            "--seconds", type=float, default=0.0, help="stop after this long (0: when interrupted)"
        )
        add_ack_arguments(parser)
        add_listen_arguments(parser)

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        bots = [b.strip() for b in args.bots.split(",") if b.strip()]
        for bot in bots:
            try:
                load_bot(bot)
            except ValueError as exc:
                raise UsageError(str(exc)) from None

        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            replicas = await replicas_to_wait_for(redis, args)
            services = ServiceSet(
                redis, keys, bots, engines=args.engines, ack_replicas=replicas,
                ack_timeout_ms=args.ack_timeout_ms,
            )  # fmt: skip
            await services.start()
            # A serving process: keep full collections from rescanning the startup heap.
            settle_heap()
            settings = gateway_settings(args, url, keys)
            try:
                async with serving(settings, args.host, args.port, redis=redis) as site:
                    beating = asyncio.create_task(
                        beat_as_gateway(redis, keys, settings, site, stop)
                    )
                    recorded = arena.record(url, site)
                    where = f"; recorded in {recorded}" if recorded else ""
                    print(
                        f"agon up: ready on {redact(url)}: engine x{args.engines}, projector,"
                        f" dispatcher, bots {bots}; the gateway serves {site}{where}",
                        flush=True,
                    )
                    try:
                        return await _up_until_stopped(args, services, redis, keys, bots, stop)
                    finally:
                        arena.forget()
                        stop.set()
                        await finish([beating], BEAT_STOP_S)
            except OSError as exc:
                await services.stop()
                print(f"agon up: {exc}; pick another with --port", file=sys.stderr)
                return 1

        return with_redis(args, body, serving=True, max_connections=REDIS_CONNECTIONS)


def add_listen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rate-limit", type=positive_float, default=GatewaySettings.rate_per_s,
        help="requests per second per client address and per bot key (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to serve on (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=port_number, default=8080, help="port (default: %(default)s)"
    )
    parser.add_argument(
        "--archive", metavar="DIR", default=os.environ.get(ARCHIVE_ENV, ""),
        help=f"also serve the games archived in DIR (agon archive; default: ${ARCHIVE_ENV})",
    )  # fmt: skip
    add_door_arguments(parser)


#: Where `--metrics-token` is read from by default (an argument shows in `ps`).
METRICS_TOKEN_ENV = "AGON_METRICS_TOKEN"


def add_door_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection caps, read deadlines and where /metrics is served (guard.py, metrics.py)."""
    d = GatewaySettings
    parser.add_argument(
        "--max-connections", type=non_negative_int, default=d.max_connections, metavar="N",
        help="open client connections in all (default 0: what the file limit leaves)",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections-per-address", type=non_negative_int, metavar="N",
        default=d.max_connections_per_address,
        help="open connections per client address (0: no cap; default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-timeout", type=positive_float, default=d.idle_timeout_s, metavar="S",
        help="close a connection silent or idle this long (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--header-timeout", type=positive_float, default=d.header_timeout_s, metavar="S",
        help="close a request whose headers take longer (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--body-timeout", type=positive_float, default=d.body_timeout_s, metavar="S",
        help="close a request whose body takes longer after its headers (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-host", default=d.metrics_host,
        help="with --metrics-port: the address /metrics is served on (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=port_number, default=d.metrics_port,
        help="serve /metrics on this port only, not on the gateway's (default: on the gateway's)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-token", default=os.environ.get(METRICS_TOKEN_ENV, ""), metavar="TOKEN",
        help=f"/metrics asks for this bearer token (default: ${METRICS_TOKEN_ENV}; none)",
    )  # fmt: skip


def gateway_settings(args: argparse.Namespace, url: str, keys: Keys) -> GatewaySettings:
    return GatewaySettings(
        redis_url=url,
        keys=keys,
        allowed_origins=tuple(getattr(args, "allow_origin", ())),
        rate_per_s=args.rate_limit,
        burst=max(1, int(2 * args.rate_limit)),
        name=consumer_name("gateway"),  # its heartbeat and its reply stream say who it is
        archive=archive_dir(args.archive),
        max_connections=args.max_connections,
        max_connections_per_address=args.max_connections_per_address,
        idle_timeout_s=args.idle_timeout,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        metrics_token=args.metrics_token,
    )


def archive_dir(given: str) -> str:
    if given and not os.path.isdir(given):
        raise UsageError(f"--archive {given}: no such directory (agon archive --to DIR makes one)")
    return given


async def beat_as_gateway(
    redis: Client, keys: Keys, settings: GatewaySettings, url: str, stop: asyncio.Event
) -> None:
    """A gateway's heartbeat, so that `agon status` lists it beside its reply stream, until
    `stop`; then it is removed. A gateway holds no group work, so nothing claims after it."""
    name = settings.name
    fields = {"url": url, "replies": keys.reply_stream(name)}
    async with presence.beating(
        redis, keys, name, lambda: presence.beat(redis, keys, name, "gateway", "", **fields)
    ):
        await stop.wait()


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is at most 65535, not {value}")
    return value


async def _demo_tournament(
    args: argparse.Namespace, redis: Client, keys: Keys, bots: Sequence[str]
) -> None:
    """A short round robin of Teeko between the bots served (at most three), to watch in the
    page while it plays."""
    field = [b for b in ("random", "greedy", "mcts") if b in bots] or list(bots)[:3]
    if len(field) < 2:
        return
    tid = new_tournament_id()
    spec = TournamentSpec(
        format="round-robin", game="teeko", bots=field, move_time_ms=200, concurrency=4,
        name="demo",
    )  # fmt: skip
    await TournamentStore(redis, keys).create(tid, spec, now_ms())
    print(
        f"agon up: a demo tournament plays: http://{args.host}:{args.port}/tournaments/{tid}",
        flush=True,
    )


async def _up_until_stopped(
    args: argparse.Namespace,
    services: ServiceSet,
    redis: Client,
    keys: Keys,
    bots: Sequence[str],
    stop: asyncio.Event,
) -> int:
    try:
        if args.demo:
            await until_stopped(_demo(args, services, redis, keys, bots), stop)
        if args.seconds:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.seconds)
        else:
            await stop.wait()
    finally:
        await services.stop()
    return 0


async def _demo(
    args: argparse.Namespace, services: ServiceSet, redis: Client, keys: Keys, bots: Sequence[str]
) -> None:
    """A demo tournament to watch, and one game of each game between the first and last bot."""
    await _demo_tournament(args, redis, keys, bots)
    specs: list[GameSpec] = [(n, {}) for n in game_names()]
    demo_bots = [bots[0], bots[-1]]
    started = time.perf_counter()
    ids = await create_games(redis, keys, specs, 1, demo_bots)
    await wait_until_ended(redis, keys, ids, 600.0, services.failed)
    result = await collect(redis, keys, ids)
    result.seconds = time.perf_counter() - started
    print_selfplay(result, game_names(), demo_bots)


async def until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> None:
    """Run `work` until it is done or `stop` is set (then it is cancelled)."""
    working = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working


class _Gateway:
    """`agon gateway`: one gateway process (run as many as the load needs)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser, private=False)
        add_listen_arguments(parser)
        parser.add_argument(
            "--allow-origin", action="append", default=[],
            help="an origin (scheme://host:port) whose pages may open sockets, repeatable",
        )  # fmt: skip

    @staticmethod
    def run(args: argparse.Namespace) -> int:
        async def body(redis: Client, keys: Keys, url: str, stop: asyncio.Event) -> int:
            settings = gateway_settings(args, url, keys)
            site = f"http://{args.host}:{args.port}"
            beating = asyncio.create_task(beat_as_gateway(redis, keys, settings, site, stop))
            try:
                await serve_until(settings, args.host, args.port, stop, redis)
            except OSError as exc:
                print(f"agon gateway: {exc}", file=sys.stderr)
                return 1
            finally:
                stop.set()
                await finish([beating], BEAT_STOP_S)
            return 0

        return with_redis(
            args, body, serving=True, embedded=False, max_connections=REDIS_CONNECTIONS
        )


UP = _Up()
GATEWAY = _Gateway()
