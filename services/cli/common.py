"""What every `agon` command that talks to Redis shares: its arguments, its Redis, its stop.

`add_service_arguments` (`--redis-url`, default `$REDIS_URL`; `--prefix`, `--partitions`,
`-v`) and `add_wait_argument` (`--wait-s`) are what every such command takes. `with_redis`
runs a command's body against that Redis: commands that play run a private redis-server
without one; commands that inspect refuse instead (`embedded=False`), since a fresh empty
server would always look fine. With no `--redis-url` and no `$REDIS_URL`, the default is the
Redis of the arena `agon up` runs (`services.cli.arena`). A serving command waits for Redis
for ever and stops on SIGTERM or Ctrl-C (`stop_on_signals`); any other is cancelled by them
and exits 130. Either way stopping is bounded: a second signal, or `STOP_S` gone by, ends
the process at once, its private redis-server too. A command that only drives a deployment
says what is missing when no engine serves its Redis (`pipeline_missing`). A `repeatable`
body (reads, and writes guarded by the log head or by scripts) rides out a failover: one
line, then the whole body again once Redis answers, for up to `--wait-s`. Printing: a
console that does not hard-wrap a pipe (`make_console`), log records through it while it
draws (`logging_to`), and readiness shown without -v but as INFO (`setup_logging`).

Safe by default on a replicated Redis: every command that runs services takes
`--ack-replicas N|auto` and `--ack-timeout-ms` (`add_ack_arguments`), passed to each service
it runs; auto waits for one replica when the Redis, or any primary of the cluster, has one
connected, else for none (no WAIT at all). Each service says its setting once
(`announce_acks`) and beats with it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Collection, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoPermissionError
from rich.console import Console
from rich.logging import RichHandler

from services.bus import presence
from services.bus.connection import (
    WAIT_S,
    Client,
    RedisUnavailable,
    connect,
    connected_replicas,
    redact,
    ride_out,
)
from services.bus.consumer import StreamConsumer
from services.bus.embedded import redis_url_or_embedded, stop_all
from services.bus.keys import DEFAULT_PARTITIONS, DEFAULT_PREFIX, Keys
from services.bus.text import now_ms
from services.cli.arena import recorded_url
from services.cli.options import UsageError, non_negative_float, non_negative_int, positive_int

log = logging.getLogger("agon.runtime")

T = TypeVar("T")


def add_redis_url_argument(
    parser: argparse.ArgumentParser, *, private: bool = True, arena: bool = True
) -> None:
    """Add `--redis-url` to a subcommand: by default `$REDIS_URL`, else (`arena`) the Redis of
    the arena `agon up` runs (`services.cli.arena`), else (`private`) a private server."""
    found = arena_url() if arena else None
    places = ["$REDIS_URL"]
    places += ["the Redis of the arena `agon up` (make run) runs"] if arena else []
    places += ["a private redis-server started for this run"] if private else []
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL") or found,
        help=f"Redis to use (default: {', else '.join(places)})",
    )


def arena_url() -> str | None:
    """The running arena's Redis URL, unless `$REDIS_URL` names one."""
    return None if os.environ.get("REDIS_URL") else recorded_url()


def say_arena(args: argparse.Namespace) -> None:
    """One line on stderr when the Redis used is the arena's (no --redis-url, no $REDIS_URL)."""
    if args.redis_url and args.redis_url == arena_url():
        print(
            f"agon {args.command}: using the arena `agon up` runs, {redact(args.redis_url)}",
            file=sys.stderr,
            flush=True,
        )


def add_service_arguments(
    parser: argparse.ArgumentParser, *, private: bool = True, arena: bool = True
) -> None:
    """`--redis-url`, `--prefix`, `--partitions` and `-v`: what every service command takes."""
    add_redis_url_argument(parser, private=private, arena=arena)
    parser.add_argument("--prefix", default=DEFAULT_PREFIX, help="key prefix (default: agon)")
    parser.add_argument(
        "--partitions", type=int, default=DEFAULT_PARTITIONS, help="partitions (default: 16)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")


#: The one line for a command that needs a Redis and was given none.
WHICH_REDIS = (
    "which Redis? pass --redis-url or set REDIS_URL, or start the arena (make run, or agon up)"
)


def add_wait_argument(parser: argparse.ArgumentParser) -> None:
    """`--wait-s`: how long a command that reads or writes Redis rides out its absence (a
    failover) before it gives up (`services.bus.connection.ride_out`)."""
    parser.add_argument(
        "--wait-s", type=non_negative_float, default=WAIT_S, metavar="S",
        help="while Redis is away or a cluster fails over, try again for up to S seconds"
        " (default: %(default)s)",
    )  # fmt: skip


#: How a log record is shown.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: What a service logs once it serves (`<name> ready: <what it does>`; bench/fleet.py waits
#: for it).
READY = " ready: "


class _Announcements(logging.Filter):
    """Show what a process says once on starting (its readiness, `announce_acks`) as INFO:
    it is logged at WARNING so that it shows without -v, but it is no warning."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and (
            getattr(record, "announce", False) or READY in str(record.msg)
        ):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format=LOG_FORMAT, stream=sys.stderr
    )
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _Announcements) for f in handler.filters):
            handler.addFilter(_Announcements())


#: The width of what is printed to a pipe or a file (a terminal's is its own).
PIPED_WIDTH = 200


def make_console(*, stderr: bool = False) -> Console:
    """A rich console that does not hard-wrap lines printed to a pipe or a file at 80
    columns (`$COLUMNS` still rules when set)."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH)
    return console


@contextlib.contextmanager
def logging_to(console: Console) -> Iterator[None]:
    """While the block runs, log records go through `console` (so that none lands inside a
    progress bar it draws in a terminal); elsewhere nothing changes."""
    if not console.is_terminal:
        yield
        return
    root = logging.getLogger()
    handler = RichHandler(console=console, show_path=False, log_time_format="%H:%M:%S")
    handler.addFilter(_Announcements())
    saved = root.handlers[:]
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = saved


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
        log.warning("%s %s", service.reader.consumer, acks_text(replicas), extra={"announce": True})


async def again_after_failover(args: argparse.Namespace, work: Callable[[], Awaitable[T]]) -> T:
    """`work()`, run again while Redis is away or a cluster fails over (one line on stderr),
    for up to `--wait-s`; then `RedisUnavailable`."""

    def say(line: str) -> None:
        print(f"agon {args.command}: {line}", file=sys.stderr, flush=True)

    return await ride_out(work, wait_s=getattr(args, "wait_s", WAIT_S), say=say)


#: The services a command that only drives a deployment needs running on its Redis.
PIPELINE_ROLES = ("engine", "projector", "dispatcher")
#: How long such a command looks for them before it says which are missing.
LOOK_S = 2.5


async def pipeline_missing(redis: Client, keys: Keys, look_s: float = LOOK_S) -> list[str]:
    """The kinds of `PIPELINE_ROLES` no live process on this Redis serves, after looking for
    up to `look_s` (a process just started beats within a second)."""
    deadline = asyncio.get_running_loop().time() + look_s
    while True:
        beats = await presence.processes(redis, keys)
        now = now_ms()
        roles = {b.role for b in beats.values() if presence.alive(b, now)}
        missing = [role for role in PIPELINE_ROLES if role not in roles]
        if not missing or asyncio.get_running_loop().time() >= deadline:
            return missing
        await asyncio.sleep(0.25)


def say_missing(args: argparse.Namespace, url: str, missing: Sequence[str]) -> None:
    """One line: what runs nowhere on this Redis, and what to start."""
    print(
        f"agon {args.command}: no {', no '.join(missing)} serves {redact(url)}"
        f" (prefix {args.prefix!r}): start the arena there (agon up) or"
        f" {', '.join(f'agon {m}' for m in missing)}; or drop --redis-url to run them here",
        file=sys.stderr,
        flush=True,
    )


async def finish(
    tasks: Collection[asyncio.Future[Any]], timeout_s: float, cancel_s: float = 1.0
) -> set[asyncio.Future[Any]]:
    """Wait up to `timeout_s` for `tasks` to end, then cancel those still going, again and
    again (a task whose clean-up swallowed one cancellation gets the next) for up to
    `cancel_s`; return the ones that did not end even so."""
    if not tasks:
        return set()
    _, late = await asyncio.wait(tasks, timeout=timeout_s)
    deadline = asyncio.get_running_loop().time() + cancel_s
    while late and asyncio.get_running_loop().time() < deadline:
        for task in late:
            task.cancel()
        _, late = await asyncio.wait(late, timeout=0.1)
    return late


#: After Ctrl-C or SIGTERM, how long a command may take to stop before it stops at once.
STOP_S = 4.0


#: Set by the first Ctrl-C or SIGTERM: the process is ending (its watchdog is running).
SIGNALLED = threading.Event()
#: The signals that stop a command.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals() -> asyncio.Event:
    """An event that Ctrl-C or SIGTERM sets, so that services stop after their batch.

    Stopping is bounded: a second Ctrl-C or SIGTERM, or `STOP_S` seconds gone by, ends the
    process at once (`force_exit`), its private redis-server too. The handlers are the
    interpreter's, not the loop's, so that they act even while the loop is busy or gone."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int, frame: object) -> None:
        if SIGNALLED.is_set():
            force_exit("stopping at once")
        SIGNALLED.set()
        watchdog = threading.Timer(
            STOP_S, force_exit, [f"did not stop within {STOP_S:g} s; stopping at once"]
        )
        watchdog.daemon = True
        watchdog.start()
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell it
            loop.call_soon_threadsafe(stop.set)

    if _main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, on_signal)
    return stop


def _main_thread() -> bool:
    """Whether this is the main thread: only it may set signal handlers (a command run in
    another thread, by a test or a caller, leaves the signals to its process)."""
    return threading.current_thread() is threading.main_thread()


def force_exit(why: str) -> None:
    """End the process now (exit status 130), after the private redis-servers it started
    (SIGKILL, not waited for: this may run inside a signal handler)."""
    os.write(sys.stderr.fileno(), f"agon: {why}\n".encode())
    stop_all()
    os._exit(EXIT_INTERRUPTED)


#: The exit status of a command that Ctrl-C ended before its work was done (128 + SIGINT).
EXIT_INTERRUPTED = 130


async def _cancelled_on(stop: asyncio.Event, work: Awaitable[int]) -> int:
    """`work`'s status, or, if `stop` is set first (Ctrl-C), `EXIT_INTERRUPTED` once the work
    is cancelled (what a command that does not serve does on Ctrl-C)."""
    working = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if working.done():
        return working.result()
    await finish([working], 0.0, STOP_S / 2)
    return EXIT_INTERRUPTED


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
    it waits: `body` gets the event those set; any other is cancelled by them (exit 130).
    Other commands wait 30 s for Redis. Once it answered, a `repeatable` body (safe to run
    again from its start: reads, and writes guarded by the log head or by scripts) is run
    again while Redis is away or a cluster fails over (`--wait-s`).
    """
    setup_logging(args.verbose)
    say_arena(args)
    keys = Keys(args.prefix, args.partitions)
    if not args.redis_url and not embedded:
        raise UsageError(WHICH_REDIS)

    async def main(url: str) -> int:
        stop = stop_on_signals()
        pool = {} if max_connections is None else {"max_connections": max_connections}
        connecting = asyncio.ensure_future(connect(url, wait_s=None if serving else 30.0, **pool))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({connecting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not connecting.done():
            connecting.cancel()
            return 0 if serving else EXIT_INTERRUPTED  # stopped while waiting for Redis
        try:
            redis = connecting.result()
        except RedisUnavailable as exc:
            print(f"agon {args.command}: {exc}", file=sys.stderr)
            return 1
        try:
            work: Awaitable[int]
            if repeatable:
                work = again_after_failover(args, lambda: body(redis, keys, url, stop))
            else:
                work = body(redis, keys, url, stop)
            return await (work if serving else _cancelled_on(stop, work))
        except RedisUnavailable as exc:
            print(f"agon {args.command}: {exc}", file=sys.stderr)
            return 1
        except NoPermissionError as exc:  # a Redis user (agon acl) not meant for this command
            print(f"agon {args.command}: Redis refused this user: {exc}", file=sys.stderr)
            return 1
        finally:
            await redis.aclose()

    handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        with redis_url_or_embedded(args.redis_url) as url:
            if not args.redis_url:
                print(f"using a private redis-server at {url}", file=sys.stderr)
            status = _run(main(url))
    finally:
        if not SIGNALLED.is_set() and _main_thread():  # else Ctrl-C again forces the end
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    if SIGNALLED.is_set() and _threads_working():
        # Stopped by Ctrl-C, all cleaned up; a thread still thinks (a bot's search, which
        # cannot be cancelled): do not wait for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run(main: Coroutine[Any, Any, int]) -> int:
    """`asyncio.run(main)`, except that once Ctrl-C or SIGTERM stopped the command it does
    not wait for the threads of the loop's executor."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            if not SIGNALLED.is_set():
                loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _threads_working() -> bool:
    """Whether a thread the interpreter would wait for at exit is still running."""
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())
