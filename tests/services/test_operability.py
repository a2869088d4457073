"""Operability: what an operator sees of the `agon` processes, and bots nobody serves.

Every service process says when it is ready and stops with status 0 on SIGTERM; with -v it
logs a stats line; against a Redis that is not there it says so, one line per attempt, and
never with a traceback. `verify` and `rebuild` refuse to run without a Redis to look at;
`selfplay --services none` only drives a deployment, and ends with a clear error when there
is none. In-process: `bot_health` tells a served bot from an unserved one, and the
dispatcher aborts a game whose bot to move nobody serves, but not one whose bot is served.

The commands run as real processes (`python -m services.cli ...`, what `agon` runs) against
the test session's redis-server, each test in a key prefix of its own (`--prefix`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import redis.asyncio as aioredis

from bots.worker import BotWorker
from services.bus.clients import QueryClient
from services.bus.embedded import free_port
from services.bus.keys import Keys
from services.bus.text import as_text, now_ms
from services.cli.pipeline import ServiceSet, create_games
from services.dispatcher import TIMEOUT_GRACE_MS, Dispatcher
from services.engine_service import EngineService
from services.projector import Projector

ROOT = Path(__file__).resolve().parents[2]
#: The commands' environment: no REDIS_URL, so only `--redis-url` names a Redis.
ENV = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}

READY_S = 10.0
STOP_S = 5.0


class Agon:
    """One `agon` command as a process; threads collect its stdout and stderr line by line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.cli", *args],
            cwd=ROOT,
            env=ENV if env is None else env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._eof = {"stdout": False, "stderr": False}
        self._cond = threading.Condition()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._read, args=("stdout", self.proc.stdout), daemon=True),
            threading.Thread(target=self._read, args=("stderr", self.proc.stderr), daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self, name: str, stream: IO[str]) -> None:
        try:
            for line in stream:
                with self._cond:
                    self.lines[name].append(line.rstrip("\n"))
                    self._cond.notify_all()
        except (OSError, ValueError):
            pass  # the pipe was closed under us at teardown
        finally:
            with self._cond:
                self._eof[name] = True
                self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[str], bool], timeout: float, stream: str = "stderr"
    ) -> str | None:
        """The first line of `stream` that satisfies `predicate`, waiting up to `timeout` s;
        None when none came in time (or the stream ended without one)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = next((x for x in self.lines[stream] if predicate(x)), None)
                remaining = deadline - time.monotonic()
                if found is not None or remaining <= 0 or self._eof[stream]:
                    return found
                self._cond.wait(remaining)

    def wait(self, timeout: float) -> int | None:
        """The exit status, waiting up to `timeout` s (None: still running); output read."""
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for thread in self._threads:
            thread.join(5.0)
        return status

    def terminate(self, timeout: float = STOP_S) -> int | None:
        """SIGTERM, then the exit status within `timeout` s (None: it did not exit)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def text(self, stream: str = "stderr") -> str:
        with self._cond:
            return "\n".join(self.lines[stream])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for thread in self._threads:
            thread.join(5.0)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def agon() -> Iterator[Callable[..., Agon]]:
    """Start `agon` processes; any still running when the test ends is killed."""
    started: list[Agon] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Agon:
        process = Agon(*args, env=env)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.close()


#: `agon verify` waits up to 30 s for Redis (`connect(wait_s=30)`) before it gives up.
VERIFY_GIVES_UP_S = 40.0


@pytest.fixture(scope="module", autouse=True)
def unreachable_verify() -> Iterator[Agon]:
    """`agon verify` against a port nobody listens on, started with the module so that its
    ~27 s of waiting overlaps the other tests; `test_verify_gives_up_...` (last) checks it."""
    process = Agon("verify", "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    try:
        yield process
    finally:
        process.close()


def is_ready(line: str) -> bool:
    return "ready" in line


def is_stats(line: str) -> bool:
    return "lag=" in line and "pending=" in line


# -- 1. ready line and SIGTERM ------------------------------------------------------------------
@pytest.mark.parametrize("command", ["engine", "projector", "dispatcher", "bots"])
def test_a_service_says_ready_and_stops_on_sigterm(
    agon: Callable[..., Agon], redis_url: str, namespace: str, command: str
) -> None:
    service = agon(command, "--redis-url", redis_url, "--prefix", namespace)
    line = service.wait_for(is_ready, READY_S)
    assert line is not None, f"no ready line in {READY_S} s:\n{service.text()}"
    asked = time.monotonic()
    status = service.terminate(STOP_S)
    assert status is not None, f"agon {command} ignored SIGTERM for {STOP_S} s"
    assert status == 0, f"exit {status} after SIGTERM:\n{service.text()}"
    assert time.monotonic() - asked < STOP_S
    assert "Traceback" not in service.text()


# -- 2. the stats line ------------------------------------------------------------------------
def test_the_engine_logs_a_stats_line_with_v(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    engine = agon("engine", "-v", "--redis-url", redis_url, "--prefix", namespace)
    assert engine.wait_for(is_ready, READY_S) is not None, engine.text()
    line = engine.wait_for(is_stats, 8.0)
    assert line is not None, f"no stats line in 8 s:\n{engine.text()}"
    assert "entries=" in line and "moves=" in line
    assert engine.terminate() == 0, engine.text()
    assert "Traceback" not in engine.text()


def test_the_engine_logs_no_stats_line_without_v(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    engine = agon("engine", "--redis-url", redis_url, "--prefix", namespace)
    assert engine.wait_for(is_ready, READY_S) is not None, engine.text()
    # Stats are logged at once and then every TRIM_EVERY_S (5 s): 6 s sees two rounds.
    assert engine.wait_for(is_stats, 6.0) is None, engine.text()
    assert engine.terminate() == 0, engine.text()
    assert "Traceback" not in engine.text()


# -- 3. a Redis that is not there -------------------------------------------------------------
def test_a_service_waits_for_an_unreachable_redis_one_line_per_attempt(
    agon: Callable[..., Agon],
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    engine = agon("engine", "--redis-url", dead, "--prefix", "agon-unreachable")

    def attempts() -> list[str]:
        return [x for x in engine.text().splitlines() if "cannot reach Redis at" in x]

    # Backoff 0.2, 0.4, 0.8 s...: the fourth attempt comes ~1.4 s after the first.
    assert engine.wait_for(lambda _: len(attempts()) >= 4, 15.0) is not None, engine.text()
    asked = time.monotonic()
    status = engine.terminate(STOP_S)
    assert status is not None, f"SIGTERM did not end a service waiting for Redis:\n{engine.text()}"
    assert time.monotonic() - asked < STOP_S
    # It may stop cleanly (0) or by the signal's default action; either way, at once.
    assert status in (0, -signal.SIGTERM), engine.text()
    err = engine.text()
    assert "Traceback" not in err
    assert engine.wait_for(is_ready, 0) is None
    lines = attempts()
    assert all(dead in x and "retrying" in x for x in lines), err
    # One line per attempt: every line of stderr is an attempt, each with the next backoff.
    assert len(lines) == len(err.splitlines()), err
    pauses = [float(m.group(1)) for x in lines if (m := re.search(r"retrying in ([\d.]+) s", x))]
    assert len(pauses) == len(lines)
    assert pauses[:4] == [0.2, 0.4, 0.8, 1.6], pauses


# -- 4. inspecting commands refuse to run without a Redis -------------------------------------
@pytest.mark.parametrize("command", ["verify", "rebuild"])
def test_an_inspecting_command_without_a_redis_refuses(
    agon: Callable[..., Agon], tmp_path: Path, command: str
) -> None:
    # Any redis-server start would run this stand-in, which leaves a mark and fails.
    marker = tmp_path / "started"
    fake = tmp_path / "redis-server"
    fake.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    fake.chmod(0o755)
    run = agon(command, env={**ENV, "AGON_REDIS_SERVER": str(fake)})
    status = run.wait(30.0)
    assert status == 2, f"exit {status}:\n{run.text()}"
    err = run.text()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"agon {command}:")
    assert "--redis-url" in err and "REDIS_URL" in err
    assert "private redis-server" not in err + run.text("stdout")
    assert not marker.exists(), "a redis-server was started"


# -- 5. selfplay that only drives -------------------------------------------------------------
def test_selfplay_services_none_drives_a_running_deployment(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    up = agon(
        "up", "--redis-url", redis_url, "--prefix", namespace, "--bots", "random",
        "--port", str(free_port()),
    )  # fmt: skip
    assert up.wait_for(is_ready, READY_S, stream="stdout") is not None, up.text()
    play = agon(
        "selfplay", "--services", "none", "--redis-url", redis_url, "--prefix", namespace,
        "--game", "teeko", "--games", "2", "--json", "--timeout", "30",
    )  # fmt: skip
    status = play.wait(45.0)
    assert status == 0, f"exit {status}:\n{play.text()}\n{play.text('stdout')}"
    out = play.text("stdout").splitlines()
    summary = json.loads(out[-1])
    assert (summary["games"], summary["finished"]) == (2, 2)
    assert "Traceback" not in play.text()
    assert "private redis-server" not in play.text()
    assert up.terminate() == 0, up.text()
    assert "Traceback" not in up.text()


def test_selfplay_services_none_without_a_deployment_ends_with_a_clear_error(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    started = time.monotonic()
    play = agon(
        "selfplay", "--services", "none", "--redis-url", redis_url, "--prefix", namespace,
        "--game", "teeko", "--games", "2", "--json", "--timeout", "5",
    )  # fmt: skip
    status = play.wait(50.0)
    took = time.monotonic() - started
    assert status is not None, (
        f"selfplay --services none --timeout 5 with no services still runs after {took:.0f} s:"
        f"\n{play.text()}"
    )
    assert status not in (0, None)
    err = play.text()
    assert "Traceback" not in err, err
    assert err.splitlines()[-1].startswith("agon selfplay:"), err


# -- 6. bot health and unserved bots (in process) ---------------------------------------------
async def test_bot_health_tells_an_unserved_bot_from_a_served_one(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    query = QueryClient(redis, keys)
    services = ServiceSet(redis, keys, ["random"])
    await create_games(redis, keys, [("teeko", {})], 1, ["nobody", "nobody"])
    assert await services.drain() > 0
    nobody = await query.bot_health("nobody")
    assert nobody.workers == 0
    assert nobody.last_seen_ms is None
    assert nobody.undelivered_turns + nobody.pending_turns >= 1, nobody

    await services.start()
    try:
        deadline = time.monotonic() + 5.0
        random = await query.bot_health("random")
        while random.workers < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            random = await query.bot_health("random")
        assert random.workers >= 1, random
        assert random.last_seen_ms is not None
        assert services.failed() is None
    finally:
        await services.stop()


async def _a_watched_game(
    redis: aioredis.Redis, keys: Keys, bot: str
) -> tuple[str, EngineService, Dispatcher, Projector, str]:
    """A game without a clock, both seats `bot`, created and dispatched; its watch member."""
    engine = EngineService(redis, keys)
    dispatcher = Dispatcher(redis, keys, unserved_ms=200)
    projector = Projector(redis, keys)
    [gid] = await create_games(redis, keys, [("teeko", {})], 1, [bot, bot])
    assert await engine.drain() == 1
    assert await dispatcher.drain() >= 1
    assert dispatcher.turns_sent == 1
    clocks = keys.clocks(keys.partition(gid))
    raw: Any = await redis.zrange(clocks, 0, -1)
    members = [as_text(m) for m in raw]
    assert len(members) == 1, members
    assert members[0].startswith(f"{gid}|") and members[0].endswith("|watch"), members
    return gid, engine, dispatcher, projector, members[0]


async def _until_due(redis: aioredis.Redis, clocks: str, member: str) -> None:
    """Poll until the watch is due (past its deadline by the grace), within 5 s."""
    score = await redis.zscore(clocks, member)
    assert score is not None
    deadline = time.monotonic() + 5.0
    while now_ms() <= score + TIMEOUT_GRACE_MS:
        assert time.monotonic() < deadline, "the watch never came due"
        await asyncio.sleep(0.02)


async def test_the_dispatcher_aborts_a_game_whose_bot_nobody_serves(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    gid, engine, dispatcher, projector, member = await _a_watched_game(redis, keys, "nobody")
    clocks = keys.clocks(keys.partition(gid))
    await projector.drain()
    view = await QueryClient(redis, keys).view(gid)
    assert view is not None and view["status"] == "playing"

    await _until_due(redis, clocks, member)
    assert await dispatcher.claim_timeouts() == 1
    assert dispatcher.unserved_aborted == 1
    # Set again as a re-check (should the abort not take), until the game has moved on.
    assert await redis.zscore(clocks, member) is not None
    assert await engine.drain() == 1
    await dispatcher.drain()
    await projector.drain()
    assert await redis.zscore(clocks, member) is None
    view = await QueryClient(redis, keys).view(gid)
    assert view is not None
    assert view["status"] == "ended", view
    assert view["result"]["reason"] == "no_reply", view
    # Seat 1 was to move (Teeko's first mover), and nobody serves it: its fault, it loses.
    assert view["result"]["winner"] == 2 and view["result"]["fault"] == 1, view


async def test_an_outside_bot_nobody_is_connected_as_loses_by_disconnect(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    await redis.hset(keys.registered_bots(), "outsider", "{}")  # as POST /api/bots leaves it
    gid, engine, dispatcher, projector, member = await _a_watched_game(redis, keys, "outsider")
    await _until_due(redis, keys.clocks(keys.partition(gid)), member)
    assert await dispatcher.claim_timeouts() == 1
    assert await engine.drain() == 1
    await projector.drain()
    view = await QueryClient(redis, keys).view(gid)
    assert view is not None and view["status"] == "ended", view
    assert view["result"]["reason"] == "disconnect", view
    assert view["result"]["winner"] == 2 and view["result"]["fault"] == 1, view


async def test_the_dispatcher_does_not_abort_a_game_whose_bot_is_served(
    redis: aioredis.Redis, namespace: str
) -> None:
    keys = Keys(prefix=namespace)
    gid, engine, dispatcher, projector, member = await _a_watched_game(redis, keys, "random")
    clocks = keys.clocks(keys.partition(gid))
    # A live worker of "random": its heartbeat, as its run loop writes it (it never reads).
    worker = BotWorker(redis, "random", keys)
    await _until_due(redis, clocks, member)
    await worker.heartbeat()
    assert (await QueryClient(redis, keys).bot_health("random")).workers == 1

    before = now_ms()
    assert await dispatcher.claim_timeouts() == 0
    assert dispatcher.unserved_aborted == 0
    score = await redis.zscore(clocks, member)
    assert score is not None, "the watch of a served bot was dropped"
    assert score >= before + 200, "the watch was not set again"
    assert await engine.drain() == 0, "a command was sent about a served bot's game"
    await projector.drain()
    view = await QueryClient(redis, keys).view(gid)
    assert view is not None
    assert view["status"] == "playing", view
    await redis.hdel(keys.processes(), worker.reader.consumer)


# -- 3 (end). verify against a Redis that is not there, started with the module -------------
def test_verify_gives_up_on_an_unreachable_redis(unreachable_verify: Agon) -> None:
    run = unreachable_verify
    left = run.started + VERIFY_GIVES_UP_S - time.monotonic()
    status = run.wait(max(left, 0.0))
    took = time.monotonic() - run.started
    assert status is not None, f"agon verify still waits after {took:.0f} s:\n{run.text()}"
    assert status != 0
    err = run.text()
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("agon verify: cannot reach Redis at"), err
    assert "--redis-url" in last and "REDIS_URL" in last
    assert all("cannot reach Redis at" in x for x in err.splitlines()), err


# -- 7. the gateway as a process --------------------------------------------------------------
def test_the_gateway_prints_its_url_serves_and_stops_on_sigterm(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    port = free_port()
    gateway = agon("gateway", "--redis-url", redis_url, "--prefix", namespace, "--port", str(port))
    line = gateway.wait_for(lambda x: "serving http://" in x, READY_S, stream="stdout")
    assert line is not None and f"http://127.0.0.1:{port}" in line, gateway.text()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
        assert json.loads(resp.read())["status"] == "ok"
    assert gateway.terminate() == 0, gateway.text()
    assert "Traceback" not in gateway.text()


def test_the_gateway_on_a_taken_port_is_one_clear_line(
    agon: Callable[..., Agon], redis_url: str, namespace: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = agon("gateway", "--redis-url", redis_url, "--port", str(port))
        assert gateway.wait(READY_S + 5) == 1
    err = gateway.text().strip().splitlines()
    assert "Traceback" not in gateway.text() and f"cannot listen on 127.0.0.1:{port}" in err[-1]
