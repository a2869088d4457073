"""The gateway benchmark: REST moves/s, outside bots' turn round trip, spectator fan-out.

Three processes besides Redis, so that the gateway's figures are its own on a two-core
machine: the gateway (`python -m bench.gateway gateway`: `serving()` as `agon gateway`
uses it, with its own Redis client, on the loopback), the pipeline services (engine,
projector, dispatcher and the built-in `random` bot worker as one `ServiceSet`, `python
-m bench.gateway services`), both started by `bench.fleet`, and this process, which plays
every client and measures.
Every figure is printed beside a baseline measured in the same run:

- `rest`: moves/s through one gateway over REST with keep-alive: `REST_GAMES` concurrent
  human-vs-human Teeko games, each played move after move (`POST /api/games/{id}/moves`
  with the seq the previous move returned) from precomputed random legal moves. Baseline:
  as many moves submitted straight to the pipeline (`CommandClient.submit`, same
  concurrency, no HTTP). The median of `ROUNDS` rounds of each. Target: at least
  `TARGET_REST_MOVES_PER_SEC` and `TARGET_REST_RATIO` of the baseline.
- `bot ndjson` / `bot websocket`: an outside bot in `BOT_GAMES` concurrent games against
  the built-in `random` bot, thinking `THINK_S` per turn. Per turn, the round trip without
  the bot's think time: (the bot receives the turn, minus the turn's XADD to the bot's
  inbox, i.e. its entry id's ms) plus (the bot sees the move accepted, minus the bot
  sending it). Baseline: the built-in `random` worker's turns in the same games, from
  the XADD to its inbox to its move's event `time` (appended to the log).
- `spectators`: `SPECTATORS` WebSocket spectators on one game whose moves are submitted
  straight to the pipeline every `MOVE_INTERVAL_S`: per event and spectator, its arrival
  minus the event's `time` (the engine's clock when it appended it), an event never
  delivered counting as infinitely late. Baseline: one spectator alone on another game.

The REST players (`KeepAlive`) and the spectators (`SpectatorSocket`) are plain HTTP/1.1
and WebSocket clients on asyncio, not aiohttp's: they share two cores with what they
measure, and aiohttp's client cost half as much CPU per move as the gateway itself and
read a thousand spectators' arrival times only after decoding each message. The bots keep
aiohttp's client (a few turns a second each).

The gateway runs with its rate limits raised, since all load comes from one address and
one key per bot. `run_gateway_bench(seconds)` returns one dict per figure (and one with
what the helper processes logged); `agon bench gateway` prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import random
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.fleet import READY, Fleet, delete_keys
from bench.measure import CpuMeter, SpectatorSocket, quantile, raise_open_files
from engine import State, load_game
from schemas.codec import FIELD_BYTES, DecodeError, decode_turn, unpack
from schemas.commands import CreateGame, PlayMove, SeatPlayer, SeatSpec
from schemas.replies import Accepted
from services.bus.clients import CommandClient
from services.bus.connection import Client, connect
from services.bus.embedded import redis_url_or_embedded
from services.bus.keys import Keys
from services.bus.text import as_text
from services.cli.common import stop_on_signals

GAME = "teeko"

TARGET_REST_MOVES_PER_SEC = 1_500.0
#: ... and at least this share of the moves/s submitted straight to the pipeline.
TARGET_REST_RATIO = 0.85
TARGET_BOT_P99_MS = 20.0
TARGET_SPECTATOR_P99_MS = 100.0

#: Concurrent REST games, each on its own keep-alive connection; rounds per figure.
REST_GAMES = 100
ROUNDS = 3
#: Outside bots: concurrent games, and the think time drawn per turn (seconds).
BOT_GAMES = 100
THINK_S = (0.25, 0.75)
#: Turns in the first second of a bot phase (the 100 games starting at once) are left out.
WARMUP_S = 1.0
SPECTATORS = 1_000
MOVE_INTERVAL_S = 0.5
CONNECT_BATCH = 100
#: Rounds of connecting spectators (the refused ones again), a pause between.
CONNECT_ATTEMPTS = 5
#: Redis connections this process may open (its load, not the gateway's, must not wait).
BENCH_POOL = 4_096
#: How long a helper process may take to stop on SIGTERM before it is killed.
HELPER_STOP_S = 20.0

_STARTED = time.perf_counter()


def progress(message: str) -> None:
    """One line on stderr: where the benchmark is (the table goes to stdout)."""
    print(
        f"[bench gateway {time.perf_counter() - _STARTED:6.1f} s] {message}",
        file=sys.stderr,
        flush=True,
    )


# -- games -------------------------------------------------------------------------------------
@dataclass
class BenchGame:
    """A human-vs-human game created for the benchmark, and the random moves it will get."""

    game_id: str
    plan: list[tuple[str, int]]  # (move, seat of the mover)
    tokens: dict[int, str] = field(default_factory=dict)
    head: int = 0

    def command(self, ply: int, seq: int, tag: str) -> PlayMove:
        """Move `ply` of the plan, sent straight to the pipeline, expecting `seq`."""
        move, seat = self.plan[ply]
        return PlayMove(
            command_id=f"{tag}-{self.game_id}-{ply}",
            game_id=self.game_id,
            seat=seat,
            token=self.tokens[seat],
            move=move,
            expected_seq=seq,
        )


def random_plan(seed: int) -> list[tuple[str, int]]:
    """A seeded random legal game of `GAME`: each move with the seat that plays it."""
    rng = random.Random(seed)
    state = load_game(GAME).new_initial_state()
    plan = []
    moves = state.legal_moves()
    while moves:
        move = moves[rng.randrange(len(moves))]
        plan.append((str(move), int(state.seat_to_move)))
        state.apply(move)
        moves = state.legal_moves()
    return plan


def long_seed(moves: int, start: int = 0) -> int:
    """The first seed from `start` whose random game has at least `moves` moves (or the
    longest of the first thousand)."""
    best, best_len = start, -1
    for seed in range(start, start + 1000):
        length = len(random_plan(seed))
        if length >= moves:
            return seed
        if length > best_len:
            best, best_len = seed, length
    return best


async def new_games(
    client: CommandClient, redis: Client, keys: Keys, seeds: Sequence[int], tag: str
) -> list[BenchGame]:
    """Human-vs-human games created and seated straight through the pipeline (untimed)."""
    games = [BenchGame(f"{tag}-{seed}", random_plan(seed)) for seed in seeds]
    for lo in range(0, len(games), 500):
        chunk = games[lo : lo + 500]
        creates = [
            CreateGame(
                command_id=f"c-{g.game_id}",
                game_id=g.game_id,
                game=GAME,
                seats=[SeatSpec(kind="human"), SeatSpec(kind="human")],
            )
            for g in chunk
        ]
        _accepted(await client.submit_many(creates, timeout_s=30))
        seats = [
            SeatPlayer(command_id=f"s{s}-{g.game_id}", game_id=g.game_id, seat=s, name=f"p{s}")
            for g in chunk
            for s in (1, 2)
        ]
        replies = _accepted(await client.submit_many(seats, timeout_s=30))
        for i, (command, reply) in enumerate(zip(seats, replies, strict=True)):
            assert reply.token is not None
            chunk[i // 2].tokens[command.seat] = reply.token
        pipe = redis.pipeline(transaction=False)
        for g in chunk:
            pipe.xlen(keys.log(g.game_id))
        for g, head in zip(chunk, await pipe.execute(), strict=True):
            g.head = int(head)
    return games


def _accepted(replies: Sequence[Any]) -> list[Accepted]:
    for reply in replies:
        if not isinstance(reply, Accepted):
            raise RuntimeError(f"the engine refused a benchmark command: {reply!r}")
    return list(replies)


# -- 1. moves/s over REST ----------------------------------------------------------------------
@dataclass
class PlayStats:
    moves: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.moves / self.seconds if self.seconds > 0 else 0.0


async def post_json(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], **kwargs: Any
) -> tuple[int, dict[str, Any]]:
    """POST `body`; the status and the JSON answer (status 0 and the error's name when
    the connection failed, `{}` for an answer that is no JSON object)."""
    try:
        async with http.post(url, json=body, **kwargs) as resp:
            try:
                answer = await resp.json(content_type=None)
            except ValueError:
                answer = None
            return resp.status, answer if isinstance(answer, dict) else {}
    except aiohttp.ClientError as exc:
        return 0, {"code": type(exc).__name__}


def address_of(base: str) -> tuple[str, int]:
    """(host, port) of a base URL such as `http://127.0.0.1:8080`."""
    parts = urlsplit(base)
    return parts.hostname or "127.0.0.1", parts.port or 80


class KeepAlive:
    """One HTTP/1.1 keep-alive connection that POSTs JSON and reads each answer by its
    Content-Length: the REST load's client.

    The load shares two cores with the gateway it measures, so it must cost little:
    aiohttp's client took about half as much CPU per move as the gateway itself (150 of
    some 300 us), and every microsecond of it was a microsecond the gateway and the
    engine did not get."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST `body`; as `post_json` answers. A connection the gateway closed while idle is
        opened again once (the request never reached it)."""
        data = json.dumps(body, separators=(",", ":")).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        for attempt in range(2):
            try:
                if self._streams is None:
                    self._streams = await asyncio.open_connection(self.host, self.port)
                reader, writer = self._streams
                writer.write(request)
                return await self._answer(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self.close()
                if attempt:
                    return 0, {"code": type(exc).__name__}
        raise AssertionError("unreachable")

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
        head = await reader.readuntil(b"\r\n\r\n")
        status, length, closing = int(head[9:12]), 0, False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                closing = value.strip().lower() == b"close"
        raw = await reader.readexactly(length)
        if closing:
            self.close()
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        return status, answer if isinstance(answer, dict) else {}

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def play_rest(host: str, port: int, games: Sequence[BenchGame], seconds: float) -> PlayStats:
    """Play the games over REST, `REST_GAMES` at a time (a keep-alive connection each), for
    `seconds`."""
    queue = deque(games)
    stats = PlayStats()
    deadline = time.perf_counter() + seconds

    async def player() -> None:
        connection = KeepAlive(host, port)
        try:
            while queue and time.perf_counter() < deadline:
                game = queue.popleft()
                seq = game.head
                path = f"/api/games/{game.game_id}/moves"
                for move, seat in game.plan:
                    if time.perf_counter() >= deadline:
                        return
                    body = {"move": move, "seq": seq, "token": game.tokens[seat]}
                    sent = time.perf_counter()
                    status, answer = await connection.post(path, body)
                    stats.latencies_ms.append((time.perf_counter() - sent) * 1000)
                    if status != 200:
                        stats.errors[str(answer.get("code"))] += 1
                        break
                    seq = int(answer["seq"])
                    stats.moves += 1
        finally:
            connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(player() for _ in range(REST_GAMES)))
    stats.seconds = time.perf_counter() - started
    return stats


async def play_direct(client: CommandClient, games: Sequence[BenchGame], moves: int) -> PlayStats:
    """Submit `moves` moves of the games straight to the pipeline, as `play_rest` does."""
    queue = deque(games)
    stats = PlayStats()
    issued = 0

    async def player() -> None:
        nonlocal issued
        while queue and issued < moves:
            game = queue.popleft()
            seq = game.head
            for ply in range(len(game.plan)):
                if issued >= moves:
                    return
                issued += 1
                command = game.command(ply, seq, "d")
                sent = time.perf_counter()
                reply = await client.submit(command)
                stats.latencies_ms.append((time.perf_counter() - sent) * 1000)
                if not isinstance(reply, Accepted):
                    stats.errors[str(getattr(reply, "code", "?"))] += 1
                    break
                seq = reply.seq
                stats.moves += 1

    started = time.perf_counter()
    await asyncio.gather(*(player() for _ in range(REST_GAMES)))
    stats.seconds = time.perf_counter() - started
    return stats


async def rest_figure(
    redis: Client, keys: Keys, base: str, pids: dict[str, int], seconds: float, tag: str
) -> dict[str, Any]:
    rest_rounds: list[PlayStats] = []
    direct_rounds: list[PlayStats] = []
    meter = CpuMeter(redis, pids)
    mean_len = statistics.mean(len(random_plan(s)) for s in range(200))
    expected_rate = 3 * TARGET_REST_MOVES_PER_SEC
    seed = 0
    host, port = address_of(base)
    async with CommandClient(redis, keys) as client:

        async def games_for(rate: float, span: float, label: str) -> list[BenchGame]:
            nonlocal seed
            count = max(2 * REST_GAMES, math.ceil(rate * span * 1.5 / mean_len))
            made = await new_games(client, redis, keys, range(seed, seed + count), f"{tag}{label}")
            seed += count
            return made

        progress("rest: warming up (1 s of REST moves, untimed)")
        await play_rest(host, port, await games_for(expected_rate, 1.0, "w"), 1.0)
        for r in range(1, ROUNDS + 1):
            progress(f"rest: round {r}/{ROUNDS}: creating games")
            games = await games_for(expected_rate, seconds, f"r{r}")
            progress(f"rest: round {r}/{ROUNDS}: {REST_GAMES} games over REST for {seconds:g} s")
            await meter.start()
            rest = await play_rest(host, port, games, seconds)
            await meter.stop()
            rest_rounds.append(rest)
            expected_rate = max(expected_rate, 1.5 * rest.rate)
            progress(
                f"rest: round {r}/{ROUNDS}: {rest.rate:.0f} moves/s;"
                f" baseline: {rest.moves} moves submitted directly"
            )
            direct_games = await games_for(2 * expected_rate, rest.moves / expected_rate, f"d{r}")
            direct_rounds.append(await play_direct(client, direct_games, rest.moves))
    rate = statistics.median(s.rate for s in rest_rounds)
    direct = statistics.median(s.rate for s in direct_rounds)
    latencies = [x for s in rest_rounds for x in s.latencies_ms]
    direct_latencies = [x for s in direct_rounds for x in s.latencies_ms]
    errors = sum((s.errors for s in rest_rounds), Counter[str]())
    moves = sum(s.moves for s in rest_rounds)
    return {
        "name": "rest",
        "games": REST_GAMES,
        "rounds": [round(s.rate, 1) for s in rest_rounds],
        "moves": moves,
        "moves_per_sec": round(rate, 1),
        "request_p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "request_p99_ms": round(quantile(latencies, 0.99), 2) if latencies else None,
        "errors": dict(errors),
        "gateway_cpu_us_per_move": round(meter.used["gateway"] / max(1, moves) * 1e6, 1),
        "cpu_cores": meter.cores(),
        "baseline_moves_per_sec": round(direct, 1),
        "baseline_rounds": [round(s.rate, 1) for s in direct_rounds],
        "baseline_p50_ms": round(statistics.median(direct_latencies), 2),
        "baseline_p99_ms": round(quantile(direct_latencies, 0.99), 2),
        "ratio": round(rate / direct, 3) if direct else None,
        "target_moves_per_sec": TARGET_REST_MOVES_PER_SEC,
        "target_ratio": TARGET_REST_RATIO,
        "met": rate >= TARGET_REST_MOVES_PER_SEC
        and bool(direct)
        and rate / direct >= TARGET_REST_RATIO,
    }


# -- 2. an outside bot's turn round trip -------------------------------------------------------
@dataclass
class TurnTimes:
    """One turn of the outside bot, by this process's wall clock (seconds)."""

    received: float
    sent: float = 0.0
    accepted: float = 0.0


class InboxWatch:
    """Records when each turn was XADDed to the watched inboxes: (game, seq) -> entry ms."""

    def __init__(self, redis: Client, inboxes: Sequence[str]) -> None:
        self.redis = redis
        self.added: dict[str, dict[tuple[str, int], int]] = {i: {} for i in inboxes}
        self.last: dict[Any, Any] = {}

    async def start(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for inbox in self.added:
            pipe.xrevrange(inbox, count=1)
        for inbox, rows in zip(self.added, await pipe.execute(), strict=True):
            self.last[inbox] = as_text(rows[0][0]) if rows else "0-0"

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            reply: Any = await self.redis.xread(dict(self.last), count=1000, block=100)
            for stream, entries in reply or ():
                inbox = as_text(stream)
                for entry_id, fields in entries:
                    self.last[inbox] = as_text(entry_id)
                    with contextlib.suppress(DecodeError, KeyError):
                        turn = decode_turn(fields[FIELD_BYTES])
                        ms = int(as_text(entry_id).partition("-")[0])
                        self.added[inbox].setdefault((turn.game_id, turn.seq), ms)


class OutsideBot:
    """A random-move bot answering its turns after a think time; records every turn."""

    def __init__(self, http: aiohttp.ClientSession, base: str, name: str, key: str) -> None:
        self.http = http
        self.base = base
        self.name = name
        self.headers = {"Authorization": f"Bearer {key}"}
        self.turns: dict[tuple[str, int], TurnTimes] = {}
        self.games: set[str] = set()
        self.ended = 0
        self.errors: Counter[str] = Counter()
        self.rng = random.Random(5)
        self._states: dict[str, tuple[State, int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: new games replace ended ones while true; moves are sent while `answering`
        self.creating = True
        self.answering = True

    def stop_answering(self) -> float:
        """Send no more moves (so none is in flight when the connection closes); when."""
        self.creating = self.answering = False
        return time.time()

    def choose(self, turn: dict[str, Any]) -> str:
        """A random legal move after the turn's moves (replaying only the new ones)."""
        game_id, moves = str(turn["game_id"]), list(turn["moves"])
        state, done = self._states.get(game_id) or (load_game(turn["game"]).new_initial_state(), 0)
        if done > len(moves):
            state, done = load_game(turn["game"]).new_initial_state(), 0
        for text in moves[done:]:
            state.apply(text)
        self._states[game_id] = (state, len(moves))
        legal = state.legal_moves()
        return str(legal[self.rng.randrange(len(legal))])

    async def new_game(self) -> None:
        body = {"game": GAME, "seats": [{"bot": self.name}, {"bot": "random"}]}
        status, answer = await post_json(self.http, f"{self.base}/api/games", body)
        if status != 201:
            self.errors[f"create: {answer.get('code')}"] += 1
            return
        self.games.add(str(answer["id"]))

    def on_message(self, text: str | bytes, received: float) -> None:
        """A line or socket message from the gateway, received at `received`."""
        if not text.strip():
            return  # an NDJSON keep-alive
        message = json.loads(text)
        kind = message.get("type")
        if kind == "turn":
            key = (str(message["game_id"]), int(message["seq"]))
            self.turns.setdefault(key, TurnTimes(received))
            self._spawn(self._answer(message, key))
        elif kind == "ended":
            self.ended += 1
            if self.creating:
                self._spawn(self.new_game())
        elif kind == "reply":
            _, game_id, seq = str(message["command_id"]).split(":")
            times = self.turns.get((game_id, int(seq)))
            if not message.get("ok"):
                self.errors[str(message.get("code"))] += 1
            elif times is not None and not times.accepted:
                times.accepted = received
        elif kind == "error":
            self.errors[str(message.get("code"))] += 1

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
                self.errors[f"client: {type(exc).__name__}"] += 1

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, turn: dict[str, Any], key: tuple[str, int]) -> None:
        move = self.choose(turn)
        await asyncio.sleep(self.rng.uniform(*THINK_S))
        if not self.answering:
            return
        self.turns[key].sent = time.time()
        await self.send_move(key[0], move, key[1])

    async def send_move(self, game_id: str, move: str, seq: int) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        self.creating = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class NdjsonBot(OutsideBot):
    """Turns from `GET /api/bot/stream`; answers with `POST /api/bot/games/{id}/moves`."""

    async def serve(self, ready: asyncio.Event) -> None:
        url = f"{self.base}/api/bot/stream?ready=*"  # no warm-up: it needs none
        timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
        async with self.http.get(url, headers=self.headers, timeout=timeout) as stream:
            if stream.status != 200:
                raise RuntimeError(f"the bot stream answered {stream.status}")
            ready.set()
            async for line in stream.content:
                self.on_message(line, time.time())

    async def send_move(self, game_id: str, move: str, seq: int) -> None:
        url = f"{self.base}/api/bot/games/{game_id}/moves"
        body = {"move": move, "seq": seq}
        status, answer = await post_json(self.http, url, body, headers=self.headers)
        accepted = time.time()
        if status == 200:
            self.turns[(game_id, seq)].accepted = accepted
        else:
            self.errors[str(answer.get("code"))] += 1


class SocketBot(OutsideBot):
    """Turns from `/ws/bot`; answers with `move` messages on it, accepted by `reply`."""

    ws: aiohttp.ClientWebSocketResponse | None = None

    async def serve(self, ready: asyncio.Event) -> None:
        async with self.http.ws_connect(f"{self.base}/ws/bot?ready=*", headers=self.headers) as ws:
            self.ws = ws
            ready.set()
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    self.on_message(msg.data, time.time())

    async def send_move(self, game_id: str, move: str, seq: int) -> None:
        assert self.ws is not None
        message = {"type": "move", "game_id": game_id, "move": move, "seq": seq}
        await self.ws.send_str(json.dumps(message))


async def event_times(
    redis: Client, keys: Keys, game_ids: Sequence[str]
) -> dict[tuple[str, int], int]:
    """(game, seq) -> the event's `time` for every move_played event of the games."""
    pipe = redis.pipeline(transaction=False)
    for gid in game_ids:
        pipe.xrange(keys.log(gid))
    out: dict[tuple[str, int], int] = {}
    for gid, rows in zip(game_ids, await pipe.execute(), strict=True):
        for _, fields in rows:
            ev = unpack(fields[FIELD_BYTES])
            if ev.get("type") == "move_played":
                out[(gid, int(ev["seq"]))] = int(ev["time"])
    return out


async def bot_figure(
    redis: Client,
    keys: Keys,
    base: str,
    transport: str,
    seconds: float,
    tag: str,
    pids: dict[str, int],
) -> dict[str, Any]:
    name = f"bench-{transport}-{tag}"
    meter = CpuMeter(redis, pids)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        body = {"name": name, "accept_challenges": True}  # games against it are made keyless
        status, registered = await post_json(http, f"{base}/api/bots", body)
        if status != 201:
            raise RuntimeError(f"registering the bot failed: {status} {registered}")
        cls = NdjsonBot if transport == "ndjson" else SocketBot
        bot = cls(http, base, name, str(registered["key"]))
        watch = InboxWatch(redis, [keys.bot_turns(name), keys.bot_turns("random")])
        await watch.start()
        stop = asyncio.Event()
        watching = asyncio.create_task(watch.run(stop))
        ready = asyncio.Event()
        serving = asyncio.create_task(bot.serve(ready))
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({serving, waiting}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not ready.is_set():
            serving.cancel()
            stop.set()
            await asyncio.gather(serving, watching, return_exceptions=True)
            failure = serving.exception() if serving.done() and not serving.cancelled() else None
            raise RuntimeError(f"the bot's {transport} connection did not open: {failure!r}")
        await asyncio.sleep(0.3)  # let the gateway look for pending turns first
        progress(f"bot {transport}: {BOT_GAMES} games vs random for {seconds:g} s")
        started = time.time()
        await asyncio.gather(*(bot.new_game() for _ in range(BOT_GAMES)))
        await asyncio.sleep(WARMUP_S)
        await meter.start()
        await asyncio.sleep(max(0.0, seconds - WARMUP_S))
        await meter.stop()
        stopped = bot.stop_answering()
        await asyncio.sleep(1.0)  # replies to the moves in flight
        await bot.close()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        stop.set()
        await watching
    appended = await event_times(redis, keys, sorted(bot.games))
    mine, theirs = watch.added[keys.bot_turns(name)], watch.added[keys.bot_turns("random")]
    cutoff_ms = (started + WARMUP_S) * 1000
    # Turns received this long before the bot stopped answering were all answered in time.
    answerable = stopped - THINK_S[1] - 0.05
    unanswered = sum(1 for t in bot.turns.values() if t.received < answerable and not t.accepted)
    trips, to_append = [], []
    for key, t in bot.turns.items():
        added = mine.get(key)
        if added is None or added < cutoff_ms or not t.accepted:
            continue
        trips.append((t.received - added / 1000 + t.accepted - t.sent) * 1000)
        if (key[0], key[1] + 1) in appended:
            think = t.sent - t.received
            to_append.append(appended[(key[0], key[1] + 1)] - added - think * 1000)
    worker = [
        appended[(gid, seq + 1)] - ms
        for (gid, seq), ms in theirs.items()
        if gid in bot.games and ms >= cutoff_ms and (gid, seq + 1) in appended
    ]
    row: dict[str, Any] = {
        "name": f"bot {transport}",
        "games": BOT_GAMES,
        "turns": len(trips),
        "turns_unanswered": unanswered,
        "games_ended": bot.ended,
        "errors": dict(bot.errors),
        "cpu_cores": meter.cores(),
        "target_p99_ms": TARGET_BOT_P99_MS,
    }
    if trips:
        p99 = quantile(trips, 0.99)
        row.update(
            p50_ms=round(statistics.median(trips), 2),
            p99_ms=round(p99, 2),
            max_ms=round(max(trips), 2),
            met=p99 <= TARGET_BOT_P99_MS and not unanswered,
        )
    if to_append:
        row.update(
            append_p50_ms=round(statistics.median(to_append), 2),
            append_p99_ms=round(quantile(to_append, 0.99), 2),
        )
    if worker:
        row.update(
            baseline_turns=len(worker),
            baseline_p50_ms=round(statistics.median(worker), 2),
            baseline_p99_ms=round(quantile(worker, 0.99), 2),
        )
        if trips:
            row["ratio"] = round(row["p99_ms"] / max(row["baseline_p99_ms"], 1.0), 2)
    row.setdefault("met", False)
    return row


# -- 3. spectators -----------------------------------------------------------------------------
async def spectate(
    base: str,
    game: BenchGame,
    count: int,
    client: CommandClient,
    moves: int,
    meter: CpuMeter | None = None,
) -> dict[str, Any]:
    """`count` sockets on the game; a first move (warming the gateway up: its figures are
    kept apart), then `moves` moves submitted every `MOVE_INTERVAL_S`; each event's delivery
    latency per socket (arrival - the event's `time`), in ms."""
    host, port = address_of(base)
    path = f"/ws/games/{game.game_id}?since={game.head}"
    sockets: list[SpectatorSocket] = []
    refused: Counter[str] = Counter()
    for attempt in range(CONNECT_ATTEMPTS):
        while len(sockets) < count:
            batch = min(CONNECT_BATCH, count - len(sockets))
            opened = await asyncio.gather(
                *(SpectatorSocket.connect(host, port, path) for _ in range(batch)),
                return_exceptions=True,
            )
            sockets += [ws for ws in opened if isinstance(ws, SpectatorSocket)]
            failed = [e for e in opened if not isinstance(e, SpectatorSocket)]
            for exc in failed:
                status = getattr(exc, "status", None)
                refused[str(status) if status else type(exc).__name__] += 1
            if failed:
                break  # pause, then try again
        if len(sockets) == count:
            break
        await asyncio.sleep(0.5 * (attempt + 1))
    if count > 1:
        progress(f"spectators: {len(sockets)}/{count} connected; refused {dict(refused) or 0}")
    seq = game.head
    try:
        await asyncio.sleep(0.5)
        if meter is not None:
            await meter.start()
        for ply in range(min(len(game.plan), moves + 1)):
            command = game.command(ply, seq, "v")
            reply = await client.submit(command)
            assert isinstance(reply, Accepted), reply
            seq = reply.seq
            await asyncio.sleep(MOVE_INTERVAL_S)
        if meter is not None:
            await meter.stop()
        deadline = time.perf_counter() + 3.0
        expected = (seq - game.head) * len(sockets)  # the gateway sends only events here
        while sum(len(ws.messages) for ws in sockets) < expected:
            if time.perf_counter() >= deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        closed = sum(1 for ws in sockets if ws.closed)
        for ws in sockets:
            ws.close()
    by_seq: dict[int, list[float]] = {}
    per_socket = [0] * len(sockets)  # events received, per socket connected
    for index, ws in enumerate(sockets):
        for arrived, text in ws.messages:
            message = json.loads(text)
            if message.get("type") == "event":
                by_seq.setdefault(int(message["seq"]), []).append(
                    arrived - message["event"]["time"]
                )
                per_socket[index] += 1
    events = seq - game.head - 1  # the first is the warm-up
    measured = [x for n in range(game.head + 2, seq + 1) for x in by_seq.get(n, [])]
    first = by_seq.get(game.head + 1, [])
    return {
        "events": events,
        "expected": events * len(sockets),
        "delivered": len(measured),
        "first_p99_ms": round(quantile(first, 0.99), 2) if first else None,
        "first_delivered": len(first),
        "sockets_short": sum(1 for n in per_socket if n < events + 1),
        "sockets_closed_by_gateway": closed,
        "connected": len(sockets),
        "handshakes_refused": dict(refused),
        "latencies": measured,
    }


def delivery_quantiles(result: dict[str, Any]) -> tuple[float | None, float | None]:
    """p50 and p99 of delivery over every expected delivery, a missing one counting as
    never delivered (None when that is where the quantile falls)."""
    missing = max(0, result["expected"] - result["delivered"])
    values = [*result["latencies"], *[math.inf] * missing]
    if not values:
        return None, None
    p50, p99 = quantile(values, 0.5), quantile(values, 0.99)
    return (
        None if math.isinf(p50) else round(p50, 2),
        None if math.isinf(p99) else round(p99, 2),
    )


async def spectator_figure(
    redis: Client, keys: Keys, base: str, seconds: float, tag: str, pids: dict[str, int]
) -> dict[str, Any]:
    moves = max(4, int(seconds / MOVE_INTERVAL_S))
    seed = long_seed(moves + 2)
    meter = CpuMeter(redis, pids)
    async with CommandClient(redis, keys) as client:
        (one,) = await new_games(client, redis, keys, [seed], f"{tag}s1")
        (crowd,) = await new_games(client, redis, keys, [seed], f"{tag}s2")
        progress(f"spectators: baseline, 1 spectator, {moves} moves {MOVE_INTERVAL_S:g} s apart")
        alone = await spectate(base, one, 1, client, moves)
        progress(f"spectators: {SPECTATORS} sockets on one game, {moves} moves")
        many = await spectate(base, crowd, SPECTATORS, client, moves, meter)
        info: Any = await redis.info("clients")
    p50, p99 = delivery_quantiles(many)
    base_p50, base_p99 = delivery_quantiles(alone)
    complete = many["delivered"] == many["expected"] and many["connected"] == SPECTATORS
    row: dict[str, Any] = {
        "name": "spectators",
        "spectators": SPECTATORS,
        "connected": many["connected"],
        "handshakes_refused": many["handshakes_refused"],
        "events": many["events"],
        "expected": many["expected"],
        "delivered": many["delivered"],
        "sockets_short": many["sockets_short"],
        "sockets_closed_by_gateway": many["sockets_closed_by_gateway"],
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": round(max(many["latencies"]), 2) if many["latencies"] else None,
        "first_event_p99_ms": many["first_p99_ms"],
        "first_event_delivered": many["first_delivered"],
        "cpu_cores": meter.cores(),
        "redis_clients_after": int(info["connected_clients"]),
        "baseline_p50_ms": base_p50,
        "baseline_p99_ms": base_p99,
        "ratio": round(p99 / max(base_p99, 1.0), 2) if p99 and base_p99 else None,
        "target_p99_ms": TARGET_SPECTATOR_P99_MS,
        "met": p99 is not None and p99 <= TARGET_SPECTATOR_P99_MS and complete,
    }
    return row


# -- the run -----------------------------------------------------------------------------------
async def _bench(url: str, seconds: float, cleanup: bool) -> list[dict[str, Any]]:
    tag = f"g{int(time.time())}"
    keys = Keys(prefix=f"bench-{tag}")
    progress("starting the pipeline services and the gateway, each in its own process")
    fleet = Fleet(url, keys.prefix, name="bench-gateway", stop_timeout_s=HELPER_STOP_S)
    logs: dict[str, Any] | None = None
    # Room for every concurrent request of this client (redis-py's default pool is 100).
    redis = await connect(url, max_connections=BENCH_POOL)
    try:
        services = fleet.start("services", module="bench.gateway")
        await fleet.ready([services])
        gateway = fleet.start("gateway", module="bench.gateway")
        await fleet.ready([gateway])
        base = gateway.url
        pids = {"gateway": gateway.process.pid, "services": services.process.pid}
        results = [await rest_figure(redis, keys, base, pids, seconds, tag)]
        for transport in ("ndjson", "websocket"):
            results.append(await bot_figure(redis, keys, base, transport, seconds, tag, pids))
        results.append(await spectator_figure(redis, keys, base, seconds, tag, pids))
        fleet.stop(fleet.running[::-1])
        logs = helper_logs(fleet)
        results.append(logs)
        progress("done")
        return results
    finally:
        fleet.close(keep=logs is None or logs["directory"] is not None)
        if cleanup:
            await delete_keys(redis, keys)
        await redis.aclose()


def helper_logs(fleet: Fleet) -> dict[str, Any]:
    """What the helper processes wrote besides their ready line (errors; they log nothing
    else): counts and the last line of each error. No directory when they wrote nothing."""
    row: dict[str, Any] = {"name": "logs", "directory": str(fleet.dir)}
    for service in fleet.started:
        lines = [line for line in service.text().splitlines() if READY not in line]
        errors = [i for i, line in enumerate(lines) if line.startswith(("ERROR", "Traceback"))]
        last = [
            line
            for line in lines
            if line and not line.startswith((" ", "ERROR", "Traceback", "During", "The above"))
        ]
        row[service.kind] = {
            "log": service.log.name,
            "lines": len(lines),
            "errors": len(errors),
            "last": sorted(set(last))[:5],
        }
    if not any(row[s.kind]["lines"] for s in fleet.started):
        row["directory"] = None
    return row


def run_gateway_bench(seconds: float = 5.0, redis_url: str | None = None) -> list[dict[str, Any]]:
    """Every gateway figure against `redis_url` (its keys removed afterwards), else a
    private redis-server."""
    raise_open_files()  # before a private server starts, so that it inherits the limit
    with redis_url_or_embedded(redis_url) as url:
        return asyncio.run(_bench(url, seconds, cleanup=redis_url is not None))


def _met(row: dict[str, Any]) -> str:
    return "met" if row.get("met") else "not met"


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def _quantiles(row: dict[str, Any], prefix: str = "") -> str:
    return f"p50 {_ms(row.get(prefix + 'p50_ms'))} p99 {_ms(row.get(prefix + 'p99_ms'))} ms"


def _cpu(row: dict[str, Any]) -> None:
    cores = row.get("cpu_cores") or {}
    if cores:
        parts = ", ".join(f"{name} {value:.2f}" for name, value in cores.items())
        print(f"{'  CPU cores used':<32} {parts}")


def print_gateway_table(results: Sequence[dict[str, Any]]) -> None:
    print(f"{'figure':<32} {'value':>22} {'baseline':>22} {'/ baseline':>10} {'target':>14}  met")
    for r in results:
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        if r["name"] == "rest":
            value = f"{r['moves_per_sec']:.0f} moves/s"
            base = f"{r['baseline_moves_per_sec']:.0f} moves/s"
            target = f">={r['target_moves_per_sec']:.0f}/s,{r['target_ratio']:g}x"
            print(
                f"{'REST moves/s, 1 gateway':<32} {value:>22} {base:>22} {ratio:>10} {target:>14}"
                f"  {_met(r)}"
            )
            rounds = " ".join(f"{x:.0f}" for x in r["rounds"])
            base_rounds = " ".join(f"{x:.0f}" for x in r["baseline_rounds"])
            print(f"{'  rounds (moves/s)':<32} {rounds:>22} {base_rounds:>22}")
            per_move, base_move = _quantiles(r, "request_"), _quantiles(r, "baseline_")
            print(f"{'  per move':<32} {per_move:>22} {base_move:>22}")
            print(f"{'  gateway CPU per move':<32} {r['gateway_cpu_us_per_move']:>19.0f} us")
            _cpu(r)
            if r["errors"]:
                print(f"{'  refused':<32} {r['errors']}")
        elif r["name"].startswith("bot"):
            label = f"bot turn, {r['name'][4:]}, {r['games']} games"
            target = f"p99 <= {r['target_p99_ms']:g} ms"
            print(
                f"{label:<32} {_quantiles(r):>22} {_quantiles(r, 'baseline_'):>22} {ratio:>10}"
                f" {target:>14}  {_met(r)}"
            )
            print(f"{'  same turns, XADD to append':<32} {_quantiles(r, 'append_'):>22}")
            print(f"{'  turns measured':<32} {r['turns']:>22} {r.get('baseline_turns', 0):>22}")
            _cpu(r)
            if r["errors"] or r["turns_unanswered"]:
                print(f"{'  problems':<32} unanswered {r['turns_unanswered']}, {r['errors']}")
        elif r["name"] == "spectators":
            label = f"{r['spectators']} spectators, delivery"
            target = f"p99 <= {r['target_p99_ms']:g} ms"
            print(
                f"{label:<32} {_quantiles(r):>22} {_quantiles(r, 'baseline_'):>22} {ratio:>10}"
                f" {target:>14}  {_met(r)}"
            )
            print(
                f"{'  delivered':<32} {r['delivered']} of {r['expected']} ({r['events']} events);"
                f" {r['connected']} connected (refused {r['handshakes_refused'] or 0}),"
                f" {r['sockets_short']} missed some,"
                f" {r['sockets_closed_by_gateway']} closed by the gateway"
            )
            first = f"p99 {_ms(r['first_event_p99_ms'])} ms"
            print(
                f"{'  first event (warm-up, apart)':<32} {first:>22}"
                f"  delivered {r['first_event_delivered']} of {r['connected']}"
            )
            _cpu(r)
        elif r["name"] == "logs" and r["directory"]:
            for proc in ("gateway", "services"):
                found = r.get(proc) or {}
                if found.get("lines"):
                    print(
                        f"{'  ' + proc + ' stderr':<32} {found['errors']} error(s) in"
                        f" {r['directory']}/{found['log']}: {'; '.join(found['last'])}"
                    )
    notes = (
        "notes: the gateway (its Redis client as `agon gateway` makes it), the pipeline services",
        "  (engine, projector, dispatcher, random worker) and this client each run in their own",
        "  process; the gateway's rate limits are raised (one address, one key).",
        "  REST: median of rounds; baseline = as many moves through CommandClient.submit.",
        "  bot turn = (turn received - its inbox XADD) + (move accepted - move sent), i.e. without",
        "  think time; baseline = the random worker's turns in the same games, inbox XADD to the",
        "  move's event time. spectators: arrival - event time, an undelivered event counting as",
        "  never; baseline = one spectator alone. '/ baseline' is the rate ratio for REST, the p99",
        "  ratio for latencies. Times are in ms; inbox XADD times have 1 ms resolution.",
    )
    print("\n".join(notes))


# -- the helper processes ----------------------------------------------------------------------
async def _services(url: str, prefix: str) -> None:
    from services.cli.pipeline import ServiceSet
    from services.engine_service import settle_heap

    redis = await connect(url)
    services = ServiceSet(redis, Keys(prefix=prefix), ["random"], block_ms=100)
    await services.start()
    settle_heap()
    stop = stop_on_signals()
    print("bench-services ready: engine, projector, dispatcher, random bots", flush=True)
    await stop.wait()
    await services.stop()
    await redis.aclose()


async def _gateway(url: str, prefix: str, host: str, port: int) -> None:
    from services.bus.consumer import consumer_name
    from services.bus.quotas import Quota
    from services.engine_service import settle_heap
    from services.gateway import GatewaySettings
    from services.gateway.serve import serving

    raise_open_files()
    # One address plays every client: no per-address caps, limits or quotas.
    unbounded = Quota(per_hour=1e12, burst=10**12)
    settings = GatewaySettings(
        redis_url=url,
        keys=Keys(prefix=prefix),
        # Each its own name, as `agon up` gives one: the name is its reply stream's and its
        # beat's, and gateways sharing one each read and drop all of the others' replies.
        name=consumer_name("bench-gateway"),
        rate_per_s=1e9,
        burst=1_000_000_000,
        max_connections_per_address=0,
        create_quota=unbounded,
        register_quota=unbounded,
    )
    stop = stop_on_signals()
    async with serving(settings, host, port) as site:
        settle_heap()
        print(f"bench-gateway ready: serving {site}", flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """The helper processes, as `bench.fleet` starts them: `python -m bench.gateway
    services|gateway --redis-url URL --prefix P [--host H --port N]`.

    People run the benchmark as `agon bench gateway` (bench/benchmarks.py).
    """
    parser = argparse.ArgumentParser(prog="python -m bench.gateway", description=main.__doc__)
    parser.add_argument("kind", choices=["services", "gateway"])
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    if args.kind == "services":
        asyncio.run(_services(args.redis_url, args.prefix))
    else:
        asyncio.run(_gateway(args.redis_url, args.prefix, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
