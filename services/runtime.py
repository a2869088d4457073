"""Running the pipeline: every service in one process or one per process, selfplay, verify, rebuild.

`ServiceSet` runs engine services, the projector, the dispatcher and one worker per bot on
one event loop against one Redis. The subcommands built on it are `agon up` (serve until
interrupted, optionally after a demo match), `agon selfplay` (create N games between bots,
wait until they end, print a summary; with `--services none` it only drives a deployment
started separately; with `--json` the last line is machine-readable), `agon verify` (replay
every log, check every hash chain, compare the read models; exit 1 on any difference) and
`agon rebuild` (recompute the read models from the logs, safe while play goes on).
`agon engine`, `agon projector`, `agon dispatcher`, `agon bots` and `agon director` run one
kind of service per process, for scaling out: each says when it is ready, logs a stats line
every few seconds with -v, waits for Redis when it is away, and stops cleanly on SIGTERM or
Ctrl-C. Each beats in `Keys.processes` (what `agon status` shows); so does a gateway.

Every command takes `--redis-url` (default `$REDIS_URL`). Commands that play run a private
redis-server without one; commands that inspect (verify, rebuild) refuse instead, since a
fresh empty server would always look fine. Each subcommand is an object with
`add_arguments(parser)` and `run(args) -> int`, the shape `services.cli` expects.

Safe by default on a replicated Redis: every command that runs services (these, and
`agon tournament run`, `agon match`) takes `--ack-replicas N|auto` and `--ack-timeout-ms`
(`add_ack_arguments`), passed to each service it runs; auto waits for one replica when the
Redis, or any primary of the cluster, has one connected, else for none (no WAIT at all).
Each service says its setting once and beats with it. Commands that only read or repair
(`_with_redis(..., repeatable=True)`) ride out a failover: one line, then the whole body
again once Redis answers, for up to `--wait-s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from redis.exceptions import NoPermissionError

from bots import bot_names, load_bot
from bots.worker import BotWorker
from engine import game_names
from schemas.commands import CreateGame, SeatSpec
from schemas.events import NO_RESULT_REASONS
from schemas.tournaments import TournamentSpec, new_tournament_id
from services.archive import ARCHIVE_ENV
from services.bus import presence
from services.bus.admission import Admission, platform_lag
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import (
    TRANSIENT_ERRORS,
    WAIT_S,
    Client,
    RedisUnavailable,
    connect,
    connected_replicas,
    redact,
    ride_out,
)
from services.bus.consumer import ConsumerOptions, StreamConsumer, consumer_name
from services.bus.keys import Keys
from services.bus.text import now_ms
from services.dispatcher import Dispatcher
from services.engine_service import EngineService, settle_heap
from services.gateway.serve import serve_until, serving
from services.gateway.settings import REDIS_CONNECTIONS, GatewaySettings
from services.options import (
    UsageError,
    game_options_or_usage,
    non_negative_int,
    parse_options,
    positive_float,
    positive_int,
)
from services.projector import Projector, compare_read_models, rebuild, snapshot, verify
from services.redis_embedded import (
    add_service_arguments,
    add_wait_argument,
    redis_url_or_embedded,
    setup_logging,
)
from services.tournament.director import Director
from services.tournament.store import TournamentStore

log = logging.getLogger("agon.runtime")

#: How often selfplay looks at the game index while waiting for its games to end.
POLL_S = 0.05

#: A game name and its options, as `--game` and `--option` give them.
GameSpec = tuple[str, dict[str, str]]

T = TypeVar("T")


class ServiceSet:
    """Engine services, the projector, the dispatcher, bot workers and the tournament
    director, run as tasks.

    A short `block_ms` keeps shutdown quick: every loop checks the stop flag that often.
    """

    def __init__(
        self,
        redis: Client,
        keys: Keys,
        bots: Sequence[str],
        *,
        engines: int = 1,
        block_ms: int = 100,
        claim_idle_ms: int = 30_000,
        director: bool = True,
        ack_replicas: int = 0,
        ack_timeout_ms: int = 1000,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.ack_replicas = ack_replicas
        # Every service waits for the same replicas (`--ack-replicas`, `--ack-timeout-ms`).
        common = ConsumerOptions(
            block_ms=block_ms,
            claim_idle_ms=claim_idle_ms,
            replicas=ack_replicas,
            replica_timeout_ms=ack_timeout_ms,
        )
        self.engines = [EngineService(redis, keys, **common) for _ in range(engines)]
        self.projector = Projector(redis, keys, **common)
        self.dispatcher = Dispatcher(redis, keys, **common)
        self.workers = [BotWorker(redis, b, keys, **common) for b in sorted(set(bots))]
        self.director = Director(redis, keys) if director else None
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def services(self) -> list[StreamConsumer]:
        return [*self.engines, self.projector, self.dispatcher, *self.workers]

    async def start(self) -> None:
        # Groups first, so that nothing written from now on is missed by a late reader.
        for service in self.services():
            await service.setup()
        announce_acks(self.services(), self.ack_replicas)
        runners: list[Callable[[asyncio.Event], Coroutine[Any, Any, None]]] = [
            s.run for s in self.services()
        ]
        if self.director is not None:
            await self.director.setup()
            runners.append(self.director.run)
        self._tasks = [asyncio.create_task(run(self._stop)) for run in runners]

    async def drain(self, max_rounds: int = 100_000) -> int:
        """Run every service in drain mode, round after round, until none has work left.

        The tests' and benchmarks' way to let the pipeline settle without sleeping.
        """
        handled = 0
        for _ in range(max_rounds):
            done = 0
            for engine in self.engines:
                done += await engine.drain()
            done += await self.dispatcher.drain()
            for worker in self.workers:
                done += await worker.drain()
            done += await self.projector.drain()
            if self.director is not None:
                done += await self.director.drain()
            if not done:
                return handled
            handled += done
        raise RuntimeError(f"the pipeline did not settle in {max_rounds} rounds")

    async def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=timeout_s)
            for task in late:
                task.cancel()
            if late:
                _, stuck = await asyncio.wait(late, timeout=timeout_s)
                if stuck:
                    log.error("%d service tasks ignored cancellation", len(stuck))

    def failed(self) -> BaseException | None:
        """The exception that ended a service task, if one ended (they should not)."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None


# -- selfplay ---------------------------------------------------------------------------------
@dataclass
class SelfplayResult:
    """What a selfplay run came to, read from the games' views."""

    games: int = 0
    finished: int = 0
    moves: int = 0
    seconds: float = 0.0
    #: per game name: how many games "seat N won", were a "draw", "aborted" or "unfinished",
    #: and how many ended for each "end: <reason>/<detail>"
    outcomes: dict[str, Counter[str]] = field(default_factory=dict)
    unfinished: list[str] = field(default_factory=list)
    #: clocked games: the most going at once that admission control allowed (0: unclocked)
    most_going: int = 0

    def summary(self) -> dict[str, Any]:
        rate = self.moves / self.seconds if self.seconds > 0 else 0.0
        return {
            "games": self.games,
            "finished": self.finished,
            "moves": self.moves,
            "seconds": round(self.seconds, 3),
            "moves_per_sec": round(rate, 1),
        }


def game_commands(
    specs: Sequence[GameSpec],
    count: int,
    bots: Sequence[str],
    *,
    move_time_ms: int = 0,
    run_id: str = "",
) -> list[CreateGame]:
    """`count` CreateGame commands per (game, options) spec between `bots`."""
    run_id = run_id or uuid.uuid4().hex[:8]
    seats = [SeatSpec(kind="bot", name=b) for b in bots]
    return [
        CreateGame(
            command_id=f"selfplay:{game}-{run_id}-{i}",
            game_id=f"{game}-{run_id}-{i}",
            game=game,
            options=options,
            seats=seats,
            move_time_ms=move_time_ms,
            seed=i,
        )
        for game, options in specs
        for i in range(count)
    ]


async def create_games(
    redis: Client,
    keys: Keys,
    specs: Sequence[GameSpec],
    count: int,
    bots: Sequence[str],
    *,
    move_time_ms: int = 0,
    run_id: str = "",
) -> list[str]:
    """Send the games' CreateGame commands without waiting; return the game ids."""
    commands = game_commands(specs, count, bots, move_time_ms=move_time_ms, run_id=run_id)
    await CommandClient(redis, keys).send(commands)
    return [c.game_id for c in commands]


async def wait_until_ended(
    redis: Client,
    keys: Keys,
    game_ids: Sequence[str],
    timeout_s: float,
    check: Callable[[], BaseException | None] = lambda: None,
) -> list[str]:
    """Wait until the projector lists every game as ended; return the ones that did not."""
    query = QueryClient(redis, keys)
    waiting = list(game_ids)
    deadline = time.monotonic() + timeout_s
    while waiting and time.monotonic() < deadline:
        failure = check()
        if failure is not None:
            raise RuntimeError(f"a service stopped: {failure!r}") from failure
        try:
            ended = await query.ended(waiting)
        except TRANSIENT_ERRORS:
            # Redis restarting: the services ride it out, and so does the waiting.
            await asyncio.sleep(POLL_S)
            continue
        waiting = [gid for gid, done in zip(waiting, ended, strict=True) if not done]
        if waiting:
            await asyncio.sleep(POLL_S)
    return waiting


async def play_admitted(
    client: CommandClient,
    commands: Sequence[CreateGame],
    admission: Admission,
    timeout_s: float,
    check: Callable[[], BaseException | None] = lambda: None,
) -> list[str]:
    """Create the games, no more going at once than `admission` allows as it measures the
    platform's lag, and wait until they end; return the ones that did not in time."""
    query = QueryClient(client.redis, client.keys)
    todo, going = list(commands), list[str]()
    deadline = time.monotonic() + timeout_s
    while (todo or going) and time.monotonic() < deadline:
        failure = check()
        if failure is not None:
            raise RuntimeError(f"a service stopped: {failure!r}") from failure
        with contextlib.suppress(*TRANSIENT_ERRORS):  # Redis restarting: try again
            admission.observe(platform_lag(await query.processes()))
            ended = await query.ended(going) if going else []
            going = [gid for gid, done in zip(going, ended, strict=True) if not done]
        start = todo[: admission.room(len(going))]
        if start:
            replies = await client.submit_many(start)
            refused = [r for r in replies if r.type == "rejected"]
            if refused:
                raise UsageError(f"the engine refused a game: {refused[0].message}")
            todo = todo[len(start) :]
            going += [c.game_id for c in start]
            admission.most_going = max(admission.most_going, len(going))
        if todo or going:
            await asyncio.sleep(POLL_S)
    return [c.game_id for c in todo] + going


async def collect(redis: Client, keys: Keys, game_ids: Sequence[str]) -> SelfplayResult:
    """Moves and outcomes of the games, read from their views."""
    result = SelfplayResult(games=len(game_ids))
    views = await QueryClient(redis, keys).views(game_ids)
    for gid, view in zip(game_ids, views, strict=True):
        if view is None:
            result.unfinished.append(gid)
            continue
        result.moves += view["ply"]
        outcomes = result.outcomes.setdefault(view["game"], Counter())
        if view["status"] != "ended":
            result.unfinished.append(gid)
            outcomes["unfinished"] += 1
            continue
        result.finished += 1
        end = view["result"]
        if end["reason"] in NO_RESULT_REASONS:
            outcomes["aborted"] += 1
        else:
            outcomes["draw" if end["winner"] == 0 else f"seat {end['winner']} won"] += 1
        outcomes[f"end: {end['reason']}/{end['detail']}"] += 1
    return result


async def selfplay(
    redis: Client,
    keys: Keys,
    specs: Sequence[GameSpec],
    count: int,
    bots: Sequence[str],
    *,
    move_time_ms: int = 0,
    timeout_s: float = 600.0,
    engines: int = 1,
    services: bool = True,
    ack_replicas: int = 0,
    ack_timeout_ms: int = 1000,
) -> SelfplayResult:
    """Play `count` games per spec between `bots`: through services run in this process, or
    (`services` False) through a deployment that runs them elsewhere."""
    acks: dict[str, Any] = {"ack_replicas": ack_replicas, "ack_timeout_ms": ack_timeout_ms}
    running = ServiceSet(redis, keys, bots, engines=engines, **acks) if services else None
    if running is not None:
        await running.start()
    try:
        started = time.perf_counter()
        commands = game_commands(specs, count, bots, move_time_ms=move_time_ms)
        ids = [c.game_id for c in commands]
        check = running.failed if running is not None else (lambda: None)
        admission = Admission(move_time_ms, len(commands))
        async with CommandClient(redis, keys, timeout_s=min(30.0, timeout_s)) as client:
            await play_admitted(client, commands, admission, timeout_s, check)
        seconds = time.perf_counter() - started
    finally:
        if running is not None:
            await running.stop()
    result = await collect(redis, keys, ids)
    result.seconds = seconds
    result.most_going = admission.most_going if move_time_ms else 0
    return result


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


# -- the subcommands -----------------------------------------------------------------------
def _with_redis(
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
        stop = _stop_on_signals() if serving else asyncio.Event()
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
            _print_selfplay(result, names, bots)
            status = 0 if result.finished == result.games else 1
            if args.verify:
                report = await again_after_failover(args, lambda: verify(redis, keys))
                _print_verify(report.games, report.events, report.problems)
                status = status or (0 if report.ok else 1)
            if args.json:
                print(json.dumps(result.summary()))
            return status

        return _with_redis(args, body)


def _print_selfplay(result: SelfplayResult, names: Sequence[str], bots: Sequence[str]) -> None:
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


def _print_verify(games: int, events: int, problems: Sequence[str]) -> None:
    for line in problems:
        print(f"  {line}")
    verdict = "OK" if not problems else f"{len(problems)} problem(s)"
    print(f"verify: {games} games, {events} events: {verdict}")


class _Verify:
    """`agon verify`: hash chains, a replay of every log and the read models; exit 1 if off."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
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
                _print_verify(report.games, report.events, report.problems)
            return 0 if report.ok else 1

        return _with_redis(args, body, embedded=False, repeatable=True)


class _Rebuild:
    """`agon rebuild`: recompute every read model from the logs."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
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

        return _with_redis(args, body, embedded=False, repeatable=True)


class _Up:
    """`agon up`: every service in one process until interrupted (Ctrl-C or SIGTERM)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
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
                    print(
                        f"agon up: ready on {redact(url)}: engine x{args.engines}, projector,"
                        f" dispatcher, bots {bots}; the gateway serves {site}",
                        flush=True,
                    )
                    try:
                        return await _up_until_stopped(args, services, redis, keys, bots, stop)
                    finally:
                        stop.set()
                        await beating
            except OSError as exc:
                await services.stop()
                print(f"agon up: {exc}; pick another with --port", file=sys.stderr)
                return 1

        return _with_redis(args, body, serving=True, max_connections=REDIS_CONNECTIONS)


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
            await _demo_tournament(args, redis, keys, bots)
            specs: list[GameSpec] = [(n, {}) for n in game_names()]
            demo_bots = [bots[0], bots[-1]]
            started = time.perf_counter()
            ids = await create_games(redis, keys, specs, 1, demo_bots)
            await wait_until_ended(redis, keys, ids, 600.0, services.failed)
            result = await collect(redis, keys, ids)
            result.seconds = time.perf_counter() - started
            _print_selfplay(result, game_names(), demo_bots)
        if args.seconds:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), args.seconds)
        else:
            await stop.wait()
    finally:
        await services.stop()
    return 0


class _Gateway:
    """`agon gateway`: one gateway process (run as many as the load needs)."""

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        add_service_arguments(parser)
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
                await beating
            return 0

        return _with_redis(
            args, body, serving=True, embedded=False, max_connections=REDIS_CONNECTIONS
        )


def _stop_on_signals() -> asyncio.Event:
    """An event that Ctrl-C or SIGTERM sets, so that services stop after their batch."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


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
            return [BotWorker(redis, bot, keys, **acks) for bot in args.bot or bot_names()]
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

        return _with_redis(args, body, serving=True)


ENGINE = _Service("engine")
UP = _Up()
GATEWAY = _Gateway()
PROJECTOR = _Service("projector")
DISPATCHER = _Service("dispatcher")
BOTS = _Service("bots")
DIRECTOR = _Service("director")
SELFPLAY = _Selfplay()
VERIFY = _Verify()
REBUILD = _Rebuild()

__all__ = [
    "BOTS",
    "DIRECTOR",
    "DISPATCHER",
    "ENGINE",
    "PROJECTOR",
    "REBUILD",
    "SELFPLAY",
    "UP",
    "VERIFY",
    "SelfplayResult",
    "ServiceSet",
    "collect",
    "create_games",
    "selfplay",
    "wait_until_ended",
]
