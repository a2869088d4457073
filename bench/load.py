"""The load test (`agon bench load`, `make load`): many bot games at once through the pipeline
run as separate OS processes, with 1, 2 and 4 engine processes, then with 1 and 2 gateways
followed by WebSocket spectators.

Every service is its own process, started as an operator would (`agon projector`, `agon
dispatcher`, `agon bots --bot random`, `agon engine` x E, `agon gateway` x G on free ports),
against a private redis-server (or `--redis-url`, a single server). This process keeps
`--games` games going between two `random` bots (bot against bot, so the load is the
pipeline's, not a person's) and replaces each game that ends with a new one. Per
configuration: a warm-up, then `--seconds` measured, then a memory phase. Figures:

- throughput: MovePlayed and GameEnded events appended in the measured window, per second:
  the median of one-second buckets (and the mean over the window);
- command->event latency, p50/p99: from the move command's XADD to the command stream to
  its MovePlayed's XADD to the partition feed, both on Redis's clock (entry ids, 1 ms
  resolution). The feed alone gives both ends: the engine sets a move's `think_ms` to the
  command's arrival (its entry id's time) minus the time of the game's previous event, so
  arrival = previous event's `time` + `think_ms`; latency = feed entry time - arrival. It
  is the time a move waits in the command stream plus the engine's read, decision and
  append, with any conflict between racing engines and its retry;
- consumer lag (entries not yet delivered to the group) and pending (delivered, not yet
  acknowledged) of each group, summed over its streams (XINFO GROUPS): `engine` on the
  command streams, `projector` and `dispatcher` on the feeds, `workers` on the bot's inbox;
  sampled every half second: the peak while measuring and the value at the end;
- Redis memory per live and per finished game: `used_memory` less what its client
  connections hold (CLIENT LIST `tot-mem`: some 40 KiB each, and gateways open and close
  connections as sockets come and go), the median of three reads. Once the window's games
  have ended and every stream is trimmed (m0), `--games` new games start; when they are about
  half-way (by the mean length of the window's games) the bot worker is paused (SIGSTOP),
  the pipeline settles, streams are trimmed: m1, with L live and F already finished; then
  the bots go on, every game ends, trimmed: m2. Per finished game (m2 - m0) / games; per
  live game (m1 - m0 - F x per finished) / L: a live game's log so far, view, index
  entries, replies memory, its turn in the inbox;
- spectators (gateway part): `--spectators` sockets spread round robin over the gateways,
  each on the least watched live game (`/ws/games/{id}?since=<head>`), moving to another
  when theirs ends, all in one process of their own (`python -m bench.load spectators`);
  delivery latency = arrival - the event's `time` (the engine's stamp), for events stamped
  after the socket opened (not the catch-up from the log), and events a socket never got;
- CPU (cores) each process used while measuring, Redis and this process included, and the
  scaling ratio: moves/s against the 1-engine configuration of the same run.

The gateway part runs the first `--engines` count (the baseline's pipeline) plus the
gateways and spectators, so its ratio shows what following every feed and fanning out
costs. Every process started (`bench.fleet`) is stopped (SIGTERM, then SIGKILL) however
the run ends; their logs go to a temporary directory that is kept (and named) only when one
logged an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.fleet import Fleet, Service, delete_keys
from bench.measure import CpuMeter, quantile, raise_open_files, spectate
from schemas.codec import FIELD_BYTES, unpack
from schemas.commands import CreateGame, SeatSpec
from services.bus.clients import CommandClient, QueryClient
from services.bus.connection import TRANSIENT_ERRORS, Client, RedisUnavailable, connect, is_cluster
from services.bus.embedded import RedisServerError, redis_url_or_embedded
from services.bus.keys import ENGINE_GROUP, FEED_GROUPS, WORKERS_GROUP, Keys
from services.bus.presence import group_rows, group_totals
from services.bus.reader import trim_acknowledged
from services.bus.text import as_text, id_ms, now_ms
from services.cli.options import UsageError, game_options_or_usage

BOT = "random"
DEFAULT_GAMES = 64
DEFAULT_SPECTATORS = 128
DEFAULT_ENGINES = "1,2,4"
DEFAULT_GATEWAYS = "1,2"
#: The groups whose lag is reported, in the order of the pipeline.
GROUPS = (ENGINE_GROUP, *FEED_GROUPS, WORKERS_GROUP)
#: At most this long of warm-up before each measured window (half the window if shorter).
WARMUP_S = 3.0
SAMPLE_EVERY_S = 0.5
#: How long the games of a window may take to end, and the pipeline to settle.
DRAIN_TIMEOUT_S = 120.0
#: A gateway that never refuses the benchmark (all its sockets come from one address).
GATEWAY_RATE = "1000000"


@dataclass(frozen=True)
class Config:
    """One configuration: engine processes, gateways and spectators."""

    engines: int
    gateways: int = 0
    spectators: int = 0

    @property
    def label(self) -> str:
        if not self.gateways:
            return _engines(self.engines)
        gateways = f"{self.gateways} gateway{'s' * (self.gateways != 1)}"
        return f"{_engines(self.engines)}, {gateways}, {self.spectators} spectators"


def _engines(n: int) -> str:
    return f"{n} engine{'s' * (n != 1)}"


def parse_counts(text: str, option: str, *, none_ok: bool = False) -> list[int]:
    """`"1,2,4"` as [1, 2, 4]; "0" or "none" is [] where `none_ok`; else a UsageError."""
    if none_ok and text.strip().lower() in ("0", "none", ""):
        return []
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        skip = ' (or "none" to skip that part)' if none_ok else ""
        raise UsageError(
            f"{option} wants whole numbers ≥ 1 separated by commas, e.g. 1,2,4{skip}; got {text!r}"
        )
    return counts


# -- what the feeds say ------------------------------------------------------------------------
class Tracker:
    """Follows every event of the benchmark's games (all of its key space's) on the feeds."""

    def __init__(self) -> None:
        #: live game -> (seq, time) of its last event
        self.heads: dict[str, tuple[int, int]] = {}
        self.plies: dict[str, int] = {}
        #: per move: (its feed entry's ms, command->event latency in ms)
        self.moves: list[tuple[int, int]] = []
        #: per ended game: (its GameEnded's feed entry ms, plies)
        self.ended: list[tuple[int, int]] = []
        #: events the feeds lost before this process read them (the services trim what
        #: their groups acknowledged), read from the games' logs instead (`take`)
        self.filled = 0
        #: those it could not read there either
        self.missed = 0

    def missing(self, ev: dict[str, Any]) -> range:
        """The seqs of `ev`'s game this tracker has not seen and that come before `ev`."""
        head = self.heads.get(str(ev["game_id"]), (0, 0))[0]
        return range(head + 1, int(ev["seq"]))

    def event(self, entry_ms: int, ev: dict[str, Any]) -> str | None:
        """Take in one event; the game's id if it ended the game."""
        gid = str(ev["game_id"])
        kind = ev["type"]
        seq = int(ev["seq"])
        head = self.heads.get(gid, (0, 0))[0]
        if seq > head + 1:
            self.missed += seq - head - 1
        if kind == "game_ended":
            self.heads.pop(gid, None)
            self.ended.append((entry_ms, self.plies.pop(gid, 0)))
            return gid
        if kind == "move_played":
            previous = self.heads.get(gid)
            if previous is not None:
                arrival = previous[1] + int(ev.get("think_ms", 0))
                self.moves.append((entry_ms, entry_ms - arrival))
            self.plies[gid] = int(ev["ply"]) + 1
        self.heads[gid] = (seq, int(ev["time"]))
        return None


class Load:
    """Keeps `target` games going between two `random` bots while `replacing`."""

    def __init__(self, redis: Client, keys: Keys, names: Sequence[str], target: int) -> None:
        self.client = CommandClient(redis, keys)
        self.names = list(names)
        self.target = target
        self.tag = f"{os.getpid()}-{int(time.time())}"
        self.made = 0
        self.live: set[str] = set()
        self.replacing = False

    async def create(self, count: int) -> list[str]:
        commands = []
        for _ in range(count):
            n = self.made
            self.made += 1
            gid = f"load-{self.tag}-{n}"
            commands.append(
                CreateGame(
                    command_id=f"create:{gid}",
                    game_id=gid,
                    game=self.names[n % len(self.names)],
                    seats=[SeatSpec(kind="bot", name=BOT)] * 2,
                    seed=n,
                )
            )
        self.live.update(c.game_id for c in commands)
        await self.client.send(commands)
        return [c.game_id for c in commands]

    async def ended(self, game_ids: Sequence[str]) -> None:
        self.live.difference_update(game_ids)
        if self.replacing and len(self.live) < self.target:
            await self.create(self.target - len(self.live))


async def take(
    redis: Client, keys: Keys, tracker: Tracker, entry_ms: int, ev: dict[str, Any]
) -> str | None:
    """`tracker.event`, after the events of `ev`'s game that the feed lost before this
    process read them (trimmed: it lagged behind the services' groups) are read from the
    game's log, each at its own time. The game's id if `ev` ended it."""
    gap = tracker.missing(ev)
    if gap:
        with contextlib.suppress(*TRANSIENT_ERRORS):  # a failover: counted as missed
            query = QueryClient(redis, keys)
            for entry in await query.log(str(ev["game_id"]), gap.start, gap.stop - 1):
                earlier = unpack(entry.data)
                tracker.event(int(earlier["time"]), earlier)
                tracker.filled += 1
    return tracker.event(entry_ms, ev)


async def follow_feeds(
    redis: Client, keys: Keys, tracker: Tracker, load: Load, stop: asyncio.Event
) -> None:
    """Every event on every feed, from the start of the (new) key space, into `tracker`;
    games that end are replaced (`load`)."""
    last: dict[Any, Any] = {keys.feed(p): "0-0" for p in keys.all_partitions()}
    while not stop.is_set():
        reply: Any = await redis.xread(last, count=1000, block=200)
        ended = []
        for stream, entries in reply or ():
            for entry_id, fields in entries:
                last[as_text(stream)] = entry_id
                data = fields.get(FIELD_BYTES)
                if data is not None:
                    gid = await take(redis, keys, tracker, id_ms(entry_id), unpack(data))
                    if gid is not None:
                        ended.append(gid)
        if ended:
            await load.ended(ended)


# -- lag, settling, memory ---------------------------------------------------------------------
def group_streams(keys: Keys) -> list[tuple[str, tuple[str, ...]]]:
    """Each stream the pipeline's groups read, with those groups."""
    out: list[tuple[str, tuple[str, ...]]] = []
    for p in keys.all_partitions():
        out.append((keys.commands(p), (ENGINE_GROUP,)))
        out.append((keys.feed(p), FEED_GROUPS))
    out.append((keys.bot_turns(BOT), (WORKERS_GROUP,)))
    return out


async def group_lag(redis: Client, keys: Keys) -> dict[str, tuple[int, int]]:
    """(lag, pending) of each of `GROUPS`, summed over its streams."""
    totals = group_totals(await group_rows(redis, [s for s, _ in group_streams(keys)]))
    return {g: totals.get(g, (0, 0)) for g in GROUPS}


async def settle(redis: Client, keys: Keys, *, bots_paused: bool = False) -> bool:
    """Wait until no group has work left (twice in a row), then trim every stream as the
    services' housekeeping does; False if it did not settle in time. The inbox is left out
    while the bots are paused: its turns are the live games' own."""
    quiet = 0
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while quiet < 2 and time.monotonic() < deadline:
        lag = await group_lag(redis, keys)
        busy = any(sum(v) for g, v in lag.items() if not (bots_paused and g == WORKERS_GROUP))
        quiet = 0 if busy else quiet + 1
        await asyncio.sleep(0.05 if busy else 0.1)
    for stream, groups in group_streams(keys):
        await trim_acknowledged(redis, stream, groups)
    return quiet >= 2


async def engine_counts(redis: Client, keys: Keys) -> Counter[str]:
    """The engines' own counters (moves, conflicts, rejected), summed over their heartbeats."""
    beats: Any = await redis.hgetall(keys.processes())
    total: Counter[str] = Counter()
    for raw in beats.values():
        beat = json.loads(raw)
        if beat.get("role") == "engine":
            total.update({k: int(beat.get(k, 0)) for k in ("moves", "conflicts", "rejected")})
    return total


async def memory_now(redis: Client, reads: int = 3) -> int:
    """Redis's memory less its clients' (`used_memory` - the sum of CLIENT LIST `tot-mem`):
    what the data costs, whoever is connected; the median of a few reads."""
    values = []
    for _ in range(reads):
        pipe = redis.pipeline(transaction=False)
        pipe.info("memory")
        pipe.client_list()
        info, clients = await pipe.execute()
        values.append(int(info["used_memory"]) - sum(int(c["tot-mem"]) for c in clients))
        await asyncio.sleep(0.05)
    return int(statistics.median(values))


async def until(
    check: Callable[[], bool],
    what: str,
    why: Callable[[], Awaitable[str]] | None = None,
    timeout_s: float = DRAIN_TIMEOUT_S,
) -> None:
    """Wait until `check()`; else an error naming `what` and (`why()`) the state."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            state = f": {await why()}" if why is not None else ""
            raise RuntimeError(f"{what} did not happen in {timeout_s:.0f} s{state}")
        await asyncio.sleep(0.05)


# -- one configuration -------------------------------------------------------------------------
@dataclass
class Bench:
    """What every configuration shares: Redis, the processes, the load and its readings."""

    redis: Client
    keys: Keys
    fleet: Fleet
    tracker: Tracker
    load: Load
    seconds: float
    progress: Progress

    async def run(self, config: Config) -> dict[str, Any]:
        fleet, redis, keys = self.fleet, self.redis, self.keys
        task = self.progress.add_task(f"{config.label}: starting", total=None)

        def say(text: str) -> None:
            self.progress.update(task, description=f"{config.label}: {text}", refresh=True)

        begun = time.monotonic()
        await fleet.scale("engine", config.engines)
        gateways = await fleet.scale(
            "gateway",
            config.gateways,
            "--rate-limit",
            GATEWAY_RATE,
            "--max-connections-per-address",
            "0",
        )
        helper = None
        if gateways and config.spectators:
            out = fleet.dir / f"spectators-{len(fleet.started)}.json"
            urls = [g.url for g in gateways]
            helper = fleet.start(
                "spectators", "--count", str(config.spectators), "--out", str(out), *urls,
                module="bench.load",
            )  # fmt: skip
            await fleet.ready([helper])
        pids = {s.name: s.process.pid for s in fleet.running}
        loadavg = round(os.getloadavg()[0], 2)
        started = time.monotonic()
        say("settling")
        await settle(redis, keys)
        memory_start, finished_before = await memory_now(redis), len(self.tracker.ended)
        missed_before, filled_before = self.tracker.missed, self.tracker.filled
        self.load.replacing = True
        await self.load.create(self.load.target)
        warmup = min(WARMUP_S, self.seconds / 2)
        say(f"warming up ({warmup:g} s)")
        await asyncio.sleep(warmup)
        if not self.tracker.moves:
            raise RuntimeError(f"no move in {warmup:g} s of warm-up (logs in {fleet.dir})")
        window = await self._measure(task, say, helper, pids)
        spectator = None
        if helper is not None:
            await fleet.stop_soon([helper])
            try:
                spectator = json.loads(out.read_text())
            except (OSError, ValueError):
                raise RuntimeError(f"the spectators wrote no summary (log: {helper.log})") from None
        measured = time.monotonic()
        memory = await self._memory(say, memory_start, finished_before)
        row = self._row(config, window, memory, spectator, loadavg)
        row["feed_events_missed"] = self.tracker.missed - missed_before
        row["feed_events_filled"] = self.tracker.filled - filled_before
        # where the wall time went: starting processes, warm-up and window, the memory phase
        row["wall_s"] = {
            "start": round(started - begun, 1),
            "run": round(measured - started, 1),
            "memory": round(time.monotonic() - measured, 1),
        }
        done = f"{row['moves_per_sec']:.0f} moves/s, command->event p99 {row['latency_p99_ms']} ms"
        say(done)
        return row

    async def _measure(
        self,
        task: TaskID,
        say: Callable[[str], None],
        spectators: Service | None,
        pids: dict[str, int],
    ) -> dict[str, Any]:
        meter = CpuMeter(self.redis, pids)
        peaks = dict.fromkeys(GROUPS, (0, 0))
        self.progress.update(task, total=self.seconds, completed=0, refresh=True)
        if spectators is not None:
            spectators.process.send_signal(signal.SIGUSR1)  # measure from now
        await meter.start()
        counts = await engine_counts(self.redis, self.keys)
        t0 = now_ms()
        started = time.monotonic()
        lag = await group_lag(self.redis, self.keys)
        while True:
            for g, (lagged, pending) in lag.items():
                peaks[g] = (max(peaks[g][0], lagged), max(peaks[g][1], pending))
            elapsed = time.monotonic() - started
            moves = sum(1 for ms, _ in self.tracker.moves[-5000:] if ms >= now_ms() - 1000)
            self.progress.update(task, completed=min(elapsed, self.seconds), refresh=True)
            say(f"measuring, {moves} moves in the last second")
            if elapsed >= self.seconds:
                break
            await asyncio.sleep(min(SAMPLE_EVERY_S, self.seconds - elapsed))
            lag = await group_lag(self.redis, self.keys)
        t1 = now_ms()
        if spectators is not None:
            spectators.process.send_signal(signal.SIGUSR2)  # up to now
        await meter.stop()
        counts = await engine_counts(self.redis, self.keys) - counts
        return {
            "t0": t0, "t1": t1, "peaks": peaks, "end": lag, "cpu": meter.cores(),
            "engines": counts,
        }  # fmt: skip

    async def _memory(
        self, say: Callable[[str], None], memory_start: int, finished_before: int
    ) -> dict[str, Any]:
        redis, keys, load, tracker = self.redis, self.keys, self.load, self.tracker
        load.replacing = False
        say("memory: the window's games end")
        await self._all_ended("the end of every game")
        settled = await settle(redis, keys)
        m0 = await memory_now(redis)
        window_games = tracker.ended[finished_before:]
        finished = len(window_games)
        mean_plies = statistics.mean(p for _, p in window_games) if window_games else 20.0
        ids = await load.create(load.target)

        def halfway() -> bool:
            done = len(tracker.ended) - finished_before - finished
            played = sum(tracker.plies.get(g, 0) for g in ids)
            return done > len(ids) // 2 or played + done * mean_plies >= len(ids) * mean_plies / 2

        say("memory: new games, to half-way")
        await until(halfway, "half of the new games' moves")
        bots = self.fleet.of("bots")
        for service in bots:
            self.fleet.pause(service)
        try:
            say("memory: bots paused")
            settled = await settle(redis, keys, bots_paused=True) and settled
            m1 = await memory_now(redis)
            live = [g for g in ids if g in load.live]
            live_plies = [tracker.plies.get(g, 0) for g in live]
        finally:
            for service in bots:
                self.fleet.resume(service)
        say("memory: the new games end")
        await self._all_ended("the end of the new games")
        settled = await settle(redis, keys) and settled
        m2 = await memory_now(redis)
        per_finished = (m2 - m0) / len(ids)
        ended_early = len(ids) - len(live)
        per_live = (m1 - m0 - ended_early * per_finished) / len(live) if live else None
        whole_run = len(tracker.ended) - finished_before - len(ids)
        return {
            # Redis memory less its clients': idle, games live (bots paused), games finished
            "memory_idle": m0,
            "memory_live": m1,
            "memory_finished": m2,
            "live_games": len(live),
            "ended_before_pause": ended_early,
            "live_mean_ply": round(statistics.mean(live_plies), 1) if live_plies else None,
            "finished_mean_ply": round(mean_plies, 1),
            "per_live_game_bytes": None if per_live is None else round(per_live),
            "per_finished_game_bytes": round(per_finished),
            # the same, over every game of the window (the first estimate's check)
            "per_finished_game_run_bytes": round((m0 - memory_start) / whole_run)
            if whole_run > 0
            else None,
            "settled": settled,
        }

    async def _all_ended(self, what: str) -> None:
        """Wait until every game created has ended. The feeds tell; the views too, every
        second, in case this process fell so far behind that a feed was trimmed first."""
        query = QueryClient(self.redis, self.keys)

        async def ended_by_view() -> None:
            while self.load.live:
                await asyncio.sleep(1.0)
                live = sorted(self.load.live)
                views = await query.views(live)
                gone = [g for g, v in zip(live, views, strict=True) if v and v["status"] == "ended"]
                self.load.live.difference_update(gone)

        async def stuck() -> str:
            live = sorted(self.load.live)[:3]
            views = await query.views(live)
            shown = ", ".join(
                f"{g}: view {v and {k: v.get(k) for k in ('status', 'seq', 'to_move')}}"
                for g, v in zip(live, views, strict=True)
            )
            return f"{len(self.load.live)} games still live ({shown}); logs in {self.fleet.dir}"

        watching = asyncio.create_task(ended_by_view())
        try:
            await until(lambda: not self.load.live, what, stuck)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)

    def _row(
        self,
        config: Config,
        window: dict[str, Any],
        memory: dict[str, Any],
        spectator: dict[str, Any] | None,
        loadavg: float,
    ) -> dict[str, Any]:
        t0, t1 = window["t0"], window["t1"]
        span_s = (t1 - t0) / 1000
        moves = [(ms, lat) for ms, lat in self.tracker.moves if t0 <= ms < t1]
        ended = [ms for ms, _ in self.tracker.ended if t0 <= ms < t1]
        buckets = max(3, round(span_s))
        width = (t1 - t0) / buckets

        def rates(times: Sequence[int]) -> list[float]:
            counts = [0] * buckets
            for ms in times:
                counts[min(buckets - 1, int((ms - t0) / width))] += 1
            return [c * 1000 / width for c in counts]

        move_rates = rates([ms for ms, _ in moves])
        latencies = [float(lat) for _, lat in moves]
        row: dict[str, Any] = {
            "name": config.label,
            "engines": config.engines,
            "gateways": config.gateways,
            "spectators": config.spectators,
            "games": self.load.target,
            "seconds": round(span_s, 2),
            "moves": len(moves),
            "games_ended": len(ended),
            "moves_per_sec": round(statistics.median(move_rates), 1),
            "moves_per_sec_mean": round(len(moves) / span_s, 1),
            "moves_per_sec_buckets": [round(r) for r in move_rates],
            "games_per_sec": round(statistics.median(rates(ended)), 2),
            "games_per_sec_mean": round(len(ended) / span_s, 2),
            "latency_p50_ms": quantile(latencies, 0.5) if latencies else None,
            "latency_p99_ms": quantile(latencies, 0.99) if latencies else None,
            "latency_max_ms": max(latencies) if latencies else None,
            "lag": {
                g: {
                    "peak_lag": window["peaks"][g][0],
                    "peak_pending": window["peaks"][g][1],
                    "end_lag": window["end"][g][0],
                    "end_pending": window["end"][g][1],
                }
                for g in GROUPS
            },
            # the engines' own counters over the window (heartbeats: to 0.25 s)
            "engine_moves": window["engines"]["moves"],
            "engine_conflicts": window["engines"]["conflicts"],
            "engine_rejected": window["engines"]["rejected"],
            "memory": memory,
            "cpu_cores": window["cpu"],
            "load_average_before": loadavg,
        }
        if spectator is not None:
            row["spectator"] = spectator
        return row


async def _bench(
    url: str, fleet: Fleet, configs: Sequence[Config], games: int, seconds: float,
    names: Sequence[str], lent: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    redis = await connect(url, wait_s=10.0)
    keys = Keys(prefix=fleet.prefix)
    stop = asyncio.Event()
    following: asyncio.Task[None] | None = None
    progress = Progress(
        TimeElapsedColumn(),
        BarColumn(bar_width=20),
        TextColumn("[progress.description]{task.description}"),
        # Refreshed by hand: a refresh thread would be running while processes are forked.
        auto_refresh=False,
        console=Console(stderr=True),
    )
    try:
        if is_cluster(redis):
            raise UsageError(
                "the load test reads one server's memory and feeds: pass a single Redis"
                " server's URL (or none, for a private one)"
            )
        tracker = Tracker()
        load = Load(redis, keys, names, games)
        following = asyncio.create_task(follow_feeds(redis, keys, tracker, load, stop))
        bench = Bench(redis, keys, fleet, tracker, load, seconds, progress)
        rows = []
        with progress:
            task = progress.add_task("starting the projector, dispatcher and random bots")
            base = [fleet.start(role, *extra) for role, extra in
                    (("projector", ()), ("dispatcher", ()), ("bots", ("--bot", BOT)))]  # fmt: skip
            await fleet.ready(base)
            progress.update(task, description="projector, dispatcher, random bots: ready")
            progress.refresh()
            for config in configs:
                rows.append(await bench.run(config))
                if following.done():
                    following.result()  # its failure, if it failed
        baseline = next((r for r in rows if r["engines"] == 1 and not r["gateways"]), rows[0])
        for r in rows:
            base_rate = baseline["moves_per_sec"]
            r["ratio"] = round(r["moves_per_sec"] / base_rate, 3) if base_rate else None
            r["ratio_to"] = baseline["name"]
        rows.append(
            {
                "name": "run",
                "cores": os.cpu_count(),
                "redis": "lent (--redis-url)" if lent else "private redis-server",
                "game": list(names),
                "prefix": fleet.prefix,
                "pids": [s.process.pid for s in fleet.started],
                "process_errors": fleet.errors(),
                "logs": str(fleet.dir) if fleet.errors() else None,
            }
        )
        return rows
    finally:
        stop.set()
        if following is not None:
            await asyncio.gather(following, return_exceptions=True)
        if lent:
            await fleet.stop_soon(list(fleet.running))  # before their keys go
            with contextlib.suppress(Exception):
                await delete_keys(redis, keys)
        await redis.aclose()


def run_load_bench(
    games: int = DEFAULT_GAMES,
    seconds: float = 20.0,
    engines: str = DEFAULT_ENGINES,
    gateways: str = DEFAULT_GATEWAYS,
    spectators: int = DEFAULT_SPECTATORS,
    redis_url: str | None = None,
    names: Sequence[str] = ("teeko",),
) -> list[dict[str, Any]]:
    """Every configuration, one row each, and a last row about the run ("name": "run")."""
    if games < 1:
        raise UsageError(f"--games wants a whole number ≥ 1, got {games}")
    if not seconds > 0:
        raise UsageError(f"--seconds wants a number > 0, got {seconds:g}")
    if spectators < 0:
        raise UsageError(f"--spectators wants a whole number ≥ 0, got {spectators}")
    for name in names:
        game_options_or_usage(name, {})
    engine_counts = parse_counts(engines, "--engines")
    configs = [Config(e) for e in engine_counts]
    configs += [
        Config(engine_counts[0], g, spectators)
        for g in parse_counts(gateways, "--gateways", none_ok=True)
    ]
    raise_open_files()  # before a private server starts, so that it inherits the limit
    prefix = f"bench-load-{os.getpid()}-{int(time.time())}"
    try:
        with (
            redis_url_or_embedded(redis_url) as url,
            Fleet(url, prefix, name="bench-load") as fleet,
        ):
            return asyncio.run(
                _bench(url, fleet, configs, games, seconds, names, lent=redis_url is not None)
            )
    except (RedisServerError, RedisUnavailable) as exc:
        raise UsageError(str(exc)) from None


# -- the report --------------------------------------------------------------------------------
def _kib(value: float | None) -> str:
    return "-" if value is None else f"{value / 1024:.1f}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _cpu(cores: dict[str, float]) -> str:
    """Cores per kind of process, the busiest first."""
    kinds: dict[str, float] = {}
    for name, value in cores.items():
        kind = {"client": "bench"}.get(name, name.split(" ")[0])
        kinds[kind] = kinds.get(kind, 0.0) + value
    busiest = sorted(kinds.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.2f}" for k, v in busiest if v >= 0.005)


def interpretation(rows: Sequence[dict[str, Any]]) -> list[str]:
    """A few plain lines: what the figures show on this machine, and what they cannot."""
    configs = [r for r in rows if r["name"] != "run"]
    run = next((r for r in rows if r["name"] == "run"), {})
    cores = run.get("cores") or os.cpu_count() or 1
    engine_rows = [r for r in configs if not r["gateways"]]
    lines = []
    if engine_rows:
        ratios = ", ".join(
            f"{_engines(r['engines'])} {r['ratio']:.2f}x" for r in engine_rows
            if r.get("ratio") is not None
        )  # fmt: skip
        top = max(engine_rows, key=lambda r: r["engines"])
        busiest = max(GROUPS, key=lambda g: top["lag"][g]["peak_lag"])
        peak = top["lag"][busiest]["peak_lag"]
        lines.append(
            f"{cores} cores: moves/s against {configs[0]['ratio_to']}: {ratios}; at"
            f" {_engines(top['engines'])} the CPU went to {_cpu(top['cpu_cores'])} (cores), and"
            f" the `{busiest}` group fell furthest behind (peak lag {peak})."
        )
        racing = [r for r in engine_rows if r["engines"] > 1 and r["engine_moves"]]
        if racing:
            parts = ", ".join(
                f"{1000 * r['engine_conflicts'] / r['engine_moves']:.0f} at {r['engines']}"
                for r in racing
            )
            lines.append(
                f"Conflicts per 1,000 moves: {parts}: each engine reads only the partitions"
                " it owns (services.bus.ownership), so a game's moves all reach the engine"
                " holding its current copy; a conflict is a partition changing hands (an"
                " engine joining or leaving) or a command sent twice."
            )
    lines.append(
        f"{cores} cores: engines beyond {cores} compete with Redis and the bots for CPU (and"
        " with the projector, the dispatcher and this client), so the ratio shows contention,"
        " not the design's limit; one projector, dispatcher and bot worker serve every"
        " configuration, so they cap it too."
    )
    gateway_rows = [r for r in configs if r["gateways"]]
    if gateway_rows:
        shown = [
            f"{r['gateways']} gateway{'s' * (r['gateways'] != 1)}: spectators p99"
            f" {_ms((r.get('spectator') or {}).get('p99_ms'))} ms, moves/s"
            f" {'-' if r.get('ratio') is None else format(r['ratio'], '.2f')}x"
            for r in gateway_rows
        ]
        lines.append(
            f"Gateways ({_engines(gateway_rows[0]['engines'])} plus gateways following every"
            f" feed and the spectators' process): {'; '.join(shown)}; on {cores} cores every"
            " gateway's CPU comes out of the pipeline's, so more gateways cannot add capacity"
            " here."
        )
    live = [r["memory"]["per_live_game_bytes"] for r in configs]
    live = [x for x in live if x is not None]
    finished = [r["memory"]["per_finished_game_bytes"] for r in configs]
    whole = [r["memory"]["per_finished_game_run_bytes"] for r in configs]
    whole = [x for x in whole if x is not None]
    if live and finished:
        plies = statistics.median(r["memory"]["live_mean_ply"] or 0 for r in configs)
        lines.append(
            f"Memory per game is the same in every configuration; medians over the {len(configs)}:"
            f" {_kib(statistics.median(live))} KiB per live game (at ply {plies:g} on average),"
            f" {_kib(statistics.median(finished))} KiB per finished game"
            + (f" ({_kib(statistics.median(whole))} over all the windows' games)" if whole else "")
            + f"; their spread ({_kib(min(finished))}-{_kib(max(finished))} KiB) is why the"
            " median counts: one step in Redis's own structures (the keyspace's table doubling,"
            " say) adds several KiB a game to the phase it falls in."
        )
    loads = [r["load_average_before"] for r in configs]
    lines.append(
        "They cannot show: scaling past this machine's cores, network latency (all on the"
        " loopback), or figures free of other work: load average before each configuration"
        f" {', '.join(f'{x:g}' for x in loads)}; rerun on a quiet machine for absolute figures."
    )
    if run.get("logs"):
        lines.append(f"a process logged errors: {run['process_errors']} (logs in {run['logs']})")
    return lines


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title)
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def print_load_table(rows: Sequence[dict[str, Any]]) -> None:
    configs = [r for r in rows if r["name"] != "run"]
    if not configs:
        return
    main = []
    for r in configs:
        m, spectator = r["memory"], r.get("spectator")
        conflicts = 1000 * r["engine_conflicts"] / max(1, r["engine_moves"])
        main.append(
            (
                r["name"],
                f"{r['moves_per_sec']:.0f}",
                f"{r['games_per_sec']:.1f}",
                "-" if r.get("ratio") is None else f"{r['ratio']:.2f}x",
                f"{_ms(r['latency_p50_ms'])} / {_ms(r['latency_p99_ms'])}",
                f"{_ms(spectator['p50_ms'])} / {_ms(spectator['p99_ms'])}" if spectator else "-",
                f"{conflicts:.1f}",
                f"{_kib(m['per_live_game_bytes'])} / {_kib(m['per_finished_game_bytes'])}",
            )
        )
    groups = [
        (
            r["name"],
            *(
                f"{v['peak_lag']}/{v['end_lag']} ({v['peak_pending']}/{v['end_pending']})"
                for v in r["lag"].values()
            ),
        )
        for r in configs
    ]
    kinds = ["redis", "engine", "projector", "dispatcher", "bots", "gateway", "spectators"]
    kinds.append("client")
    cpu = []
    for r in configs:
        by_kind = dict.fromkeys(kinds, 0.0)
        for name, value in r["cpu_cores"].items():
            by_kind[name.split(" ")[0]] += value
        cells = [f"{by_kind[k]:.2f}" if by_kind[k] else "-" for k in kinds]
        cpu.append((r["name"], *cells, f"{sum(by_kind.values()):.2f}"))
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped: rich's 80 columns would wrap every cell
    console.print(
        _table(
            f"load: {configs[0]['games']} concurrent games, random against random",
            (
                "configuration", "moves/s", "games/s", f"vs {configs[0]['ratio_to']}",
                "cmd→event p50 / p99 ms", "spectators p50 / p99 ms", "engine conflicts / 1k moves",
                "KiB per live / finished game",
            ),
            main,
        )
    )  # fmt: skip
    console.print(
        _table(
            "consumer groups: lag peak/end (pending peak/end), entries",
            ("configuration", *GROUPS),
            groups,
        )
    )
    console.print(
        _table(
            "CPU while measuring, cores",
            ("configuration", *(("engines" if k == "engine" else k) for k in kinds[:-1]),
             "this client", "total"),
            cpu,
        )
    )  # fmt: skip
    notes = [
        "moves/s, games/s: median of 1 s buckets of MovePlayed / GameEnded feed entries in the"
        " window. cmd→event: the command's XADD to its MovePlayed's XADD to the feed (Redis"
        " clock, 1 ms steps).",
        "spectators: socket arrival - the event's time. lag: entries not yet delivered to the"
        " group; pending: delivered, not acknowledged. memory: Redis used_memory less its"
        " clients' buffers, live games"
        " paused (bots stopped) half-way. conflicts: the engines' appends that lost a race.",
    ]
    behind = [r["name"] for r in configs if r.get("feed_events_filled")]
    if behind:
        notes.append(
            f"this client fell behind the feeds ({', '.join(behind)}): some events were trimmed"
            " before it read them, and it read them from the games' logs"
        )
    lost = [r["name"] for r in configs if r.get("feed_events_missed")]
    if lost:
        notes.append(
            f"some events were neither on a feed nor in a log when read ({', '.join(lost)}):"
            " those rows undercount moves and games"
        )
    for line in (*notes, *interpretation(rows)):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


# -- the spectators' process ------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """The spectators' process: `python -m bench.load spectators --redis-url URL --prefix P
    --count K --out FILE GATEWAY_URL...`. People run the benchmark as `agon bench load`."""
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=main.__doc__)
    parser.add_argument("role", choices=["spectators"])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("gateways", nargs="+")
    args = parser.parse_args(argv)
    raise_open_files()
    asyncio.run(spectate(args.redis_url, args.prefix, args.count, args.gateways, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
