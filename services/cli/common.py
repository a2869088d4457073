"""What every `agon` command that talks to Redis shares: its arguments, its Redis, its stop.

`add_service_arguments` (`--redis-url`, default `$REDIS_URL`; `--prefix`, `--partitions`,
`-v`) and `add_wait_argument` (`--wait-s`) are what every such command takes. `with_redis`
runs a command's body against that Redis: commands that play run a private redis-server
without one; commands that inspect refuse instead (`embedded=False`), since a fresh empty
server would always look fine. A serving command waits for Redis for ever and stops on
SIGTERM or Ctrl-C (`stop_on_signals`); a `repeatable` body (reads, and writes guarded by
the log head or by scripts) rides out a failover: one line, then the whole body again once
Redis answers, for up to `--wait-s`.

Safe by default on a replicated Redis: every command that runs services takes
`--ack-replicas N|auto` and `--ack-timeout-ms` (`add_ack_arguments`), passed to each service
it runs; auto waits for one replica when the Redis, or any primary of the cluster, has one
connected, else for none (no WAIT at all). Each service says its setting once
(`announce_acks`) and beats with it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.exceptions import NoPermissionError

from services.bus.connection import (
    WAIT_S,
    Client,
    RedisUnavailable,
    connect,
    connected_replicas,
    ride_out,
)
from services.bus.consumer import StreamConsumer
from services.bus.embedded import redis_url_or_embedded
from services.bus.keys import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Keys
from services.cli.options import UsageError, non_negative_float, non_negative_int, positive_int

log = logging.getLogger("agon.runtime")

T = TypeVar("T")


def add_redis_url_argument(parser: argparse.ArgumentParser) -> None:
    """Add `--redis-url` to a subcommand (default: REDIS_URL, else an embedded server)."""
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or None,
        help="Redis to use (default: $REDIS_URL, else a private redis-server started for this run)",
    )


def add_service_arguments(parser: argparse.ArgumentParser) -> None:
    """`--redis-url`, `--prefix`, `--partitions` and `-v`: what every service command takes."""
    add_redis_url_argument(parser)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix (default: agon)")
    parser.add_argument(
        "--partitions", type=int, default=DEFAULT_PARTITIONS, help="partitions (default: 16)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


def add_wait_argument(parser: argparse.ArgumentParser) -> None:
    """`--wait-s`: how long a command that reads or writes Redis rides out its absence (a
    failover) before it gives up (`services.bus.connection.ride_out`)."""
    parser.add_argument(
        "--wait-s", type=non_negative_float, default=WAIT_S, metavar="S",
        help="while Redis is away or a cluster fails over, try again for up to S seconds"
        " (default: %(default)s)",
    )  # fmt: skip


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )


# -- waiting for replicas, riding out failovers ------------------------------------------------
def ack_replicas_arg(text: str) -> int | None:
    """`--ack-replicas`: a count, or `auto` (None)."""
    return None if text == "auto" else non_negative_int(text)


def add_ack_arguments(parser: argparse.ArgumentParser, done: str = "its work done") -> None:
    """`--ack-replicas` and `--ack-timeout-ms`, for every command that runs services: what
    each service waits for before it counts `done`."""
    parser.add_argument(
        "--ack-replicas",
        type=ack_replicas_arg,
        default=None,
        metavar="N|auto",
        help=f"count {done} only once N replicas hold what it wrote (Redis WAIT; see "
        "deploy/README.md); auto: 1 when the Redis (a primary of the cluster) has a replica, "
        "else 0 (default: auto)",
    )
    parser.add_argument(
        "--ack-timeout-ms",
        type=positive_int,
        default=1000,
        help="how long to wait for those replicas; what they did not confirm "
        "is done again (default: 1000)",
    )


async def replicas_to_wait_for(redis: Client, args: argparse.Namespace) -> int:
    """`--ack-replicas` as given, or for `auto` 1 when a primary has a replica connected
    (a failover would lose what only the primary holds), else 0 (no WAIT: as fast as can be)."""
    if args.ack_replicas is not None:
        return int(args.ack_replicas)
    replicas = await again_after_failover(args, lambda: connected_replicas(redis))
    return 1 if replicas else 0


def acks_text(replicas: int) -> str:
    if not replicas:
        return "does not wait for replicas"
    return f"waits for {replicas} replica{'s' * (replicas != 1)} per write"


def announce_acks(services: Sequence[StreamConsumer], replicas: int) -> None:
    """Each service says once what it waits for, and beats with it (`agon status`)."""
    for service in services:
        service.ack_replicas = replicas
        log.warning("%s %s", service.reader.consumer, acks_text(replicas))


async def again_after_failover(args: argparse.Namespace, work: Callable[[], Awaitable[T]]) -> T:
    """`work()`, run again while Redis is away or a cluster fails over (one line on stderr),
    for up to `--wait-s`; then `RedisUnavailable`."""

    def say(line: str) -> None:
        print(f"agon {args.command}: {line}", file=sys.stderr, flush=True)

    return await ride_out(work, wait_s=getattr(args, "wait_s", WAIT_S), say=say)


def stop_on_signals() -> asyncio.Event:
    """An event that Ctrl-C or SIGTERM sets, so that services stop after their batch."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def with_redis(
    args: argparse.Namespace,
    body: Callable[[Client, Keys, str, asyncio.Event], Awaitable[int]],
    *,
    embedded: bool = True,
    serving: bool = False,
    repeatable: bool = False,
    max_connections: int | None = None,
) -> int:
    """Run `body` against `--redis-url` (or, if `embedded`, a private server) and close it.

    A `serving` command waits for Redis for ever and stops on SIGTERM or Ctrl-C, also while
    it waits: `body` gets the event those set. Other commands wait 30 s for Redis. Once it
    answered, a `repeatable` body (safe to run again from its start: reads, and writes
    guarded by the log head or by scripts) is run again while Redis is away or a cluster
    fails over (`--wait-s`).
    """
    setup_logging(args.verbose)
    keys = Keys(args.prefix, args.partitions)
    if not args.redis_url and not embedded:
        raise UsageError(
            "which Redis? pass --redis-url or set REDIS_URL (a new private server would be empty)"
        )

    async def main(url: str) -> int:
        stop = stop_on_signals() if serving else asyncio.Event()
        pool = {} if max_connections is None else {"max_connections": max_connections}
        connecting = asyncio.ensure_future(connect(url, wait_s=None if serving else 30.0, **pool))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not connecting.done():
            connecting.cancel()
            return 0  # stopped while waiting for Redis
        try:
            redis = connecting.result()
        except RedisUnavailable as exc:
            print(f"agon {args.command}: {exc}", file=sys.stderr)
            return 1
        try:
            if repeatable:
                return await again_after_failover(args, lambda: body(redis, keys, url, stop))
            return await body(redis, keys, url, stop)
        except RedisUnavailable as exc:
            print(f"agon {args.command}: {exc}", file=sys.stderr)
            return 1
        except NoPermissionError as exc:  # a Redis user (agon acl) not meant for this command
            print(f"agon {args.command}: Redis refused this user: {exc}", file=sys.stderr)
            return 1
        finally:
            await redis.aclose()

    with redis_url_or_embedded(args.redis_url) as url:
        if not args.redis_url:
            print(f"using a private redis-server at {url}", file=sys.stderr)
        return asyncio.run(main(url))
