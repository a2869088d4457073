"""Running the pipeline in one process: `ServiceSet`, and selfplay as a library.

`ServiceSet` runs engine services, the projector, the dispatcher, one worker per bot and
the tournament director on one event loop against one Redis (what `agon up`, `agon
selfplay`, `agon tournament run`, the tests and the benchmarks run). The selfplay library
creates games between bots (`game_commands`, `create_games`), waits until they end
(`wait_until_ended`, or `play_admitted` with admission control by the platform's lag) and
reads what they came to (`collect`, `SelfplayResult`); `selfplay` does all of it, through
services run here or (`services=False`) through a deployment that runs them elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from bots.worker import BotWorker
from schemas.commands import CreateGame, SeatSpec
from schemas.events import NO_RESULT_REASONS
from services.bus.admission import Admission, platform_lag
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import TRANSIENT_ERRORS, Client
from services.bus.consumer import ConsumerOptions, StreamConsumer
from services.bus.keys import Keys
from services.cli.common import announce_acks, finish
from services.cli.options import UsageError
from services.dispatcher import Dispatcher
from services.engine_service import EngineService
from services.projector import Projector
from services.tournament.director import Director

log = logging.getLogger("agon.runtime")

#: How often selfplay looks at the game index while waiting for its games to end.
POLL_S = 0.05

#: A game name and its options, as `--game` and `--option` give them.
GameSpec = tuple[str, dict[str, str]]


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

    async def stop(self, timeout_s: float = 2.0) -> None:
        """Stop every service: after its batch, else (after `timeout_s`) cancelled until it
        ends (for up to a second more; one still going then is logged)."""
        self._stop.set()
        stuck = await finish(self._tasks, timeout_s)
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
        end = view["result"]
        if end is None:  # not ended yet
            result.unfinished.append(gid)
            outcomes["unfinished"] += 1
            continue
        result.finished += 1
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
