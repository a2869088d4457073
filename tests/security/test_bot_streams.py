"""Issue 22, attack 5: thousands of bot turn streams on one gateway.

Registered outside bots (`BOTS` of them) open `STREAMS` NDJSON turn streams, four per bot,
on one real `agon gateway` process, from several loopback addresses (a gateway caps the
connections of one address). Then, held open past a keep-alive and a check of their keys,
the gateway must hold only a few Redis connections (counted from its own sockets,
`/proc`), a game created through it must answer within 1 s,
the streams of clients that went away must be released (streams, heartbeats), and SIGTERM
must stop the gateway within 5 s with the other streams still open. On main each stream
held a Redis connection in a blocking read: thousands of connections, game creation
through that gateway took seconds, and the gateway ignored SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import time
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest

from schemas.tokens import token_hash
from services.bus.embedded import free_port
from services.gateway.live import KEY_CACHE_S
from tests.security.attacks import report, scale
from tests.support.gateway import Arena, until
from tests.support.procs import Processes

pytestmark = pytest.mark.timeout(600)

STREAMS = scale(200, 4000)
BOTS = scale(50, 1000)
#: Streams opened from one loopback address (below a gateway's cap per address).
PER_ADDRESS = 100
#: Streams opened at once.
OPENING = 50
#: Redis connections the gateway may hold with every stream open: its feed follower, reply
#: reader, inbox reader, heartbeats and a few requests in flight, not one per stream.
CONNECTION_BOUND = 32
#: How long every stream stays open before the gateway is measured: past a keep-alive
#: (5 s) and a check of the streams' keys (`KEY_CACHE_S`).
HOLD_S = KEY_CACHE_S + 1.0
CREATE_BOUND_S = 1.0
SIGTERM_BOUND_S = 5.0
#: How long the test waits for a gateway that ignores SIGTERM before it kills it.
SIGTERM_WAIT_S = 20.0
#: How long after its client went a stream may still hold anything (keep-alive 5 s).
RELEASE_BOUND_S = 15.0


def redis_connections(pid: int, port: int) -> int:
    """The established TCP connections of process `pid` to local port `port` (Redis)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                cols = row.split()
                remote_port = int(cols[2].rsplit(":", 1)[1], 16)
                if cols[3] == "01" and remote_port == port and cols[9] in inodes:
                    count += 1
    return count


async def register(arena: Arena, count: int) -> list[tuple[str, str]]:
    """`count` outside bots as `POST /api/bots` leaves them (written straight to Redis, as a
    registration quota would otherwise take an hour), each accepting challenges."""
    keys, redis = arena.keys, arena.redis
    bots = [(f"swarm-{i}", f"agon_{secrets.token_urlsafe(32)}") for i in range(count)]
    record = json.dumps({"registered": 0, "accept_challenges": True})
    await redis.hset(keys.registered_bots(), mapping={name: record for name, _ in bots})
    await redis.hset(keys.bot_key_hashes(), mapping={token_hash(k): n for n, k in bots})
    return bots


async def open_streams(
    base: str, bots: list[tuple[str, str]], streams: int, first_address: int
) -> tuple[list[aiohttp.ClientSession], list[aiohttp.ClientResponse], list[int]]:
    """`streams` streams, `streams // len(bots)` per bot, from 127.0.0.<first_address>... ."""
    sessions: list[aiohttp.ClientSession] = []
    opened: list[aiohttp.ClientResponse] = []
    statuses: list[int] = []
    per_bot = max(1, streams // len(bots))
    plan = [key for _, key in bots for _ in range(per_bot)][:streams]
    for at in range(0, len(plan), PER_ADDRESS):
        address = f"127.0.0.{first_address + at // PER_ADDRESS}"
        connector = aiohttp.TCPConnector(limit=0, local_addr=(address, 0))
        session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        sessions.append(session)
        chunk = plan[at : at + PER_ADDRESS]
        for start in range(0, len(chunk), OPENING):
            answers = await asyncio.gather(
                *(
                    session.get(f"{base}/api/bot/stream", headers={"Authorization": f"Bearer {k}"})
                    for k in chunk[start : start + OPENING]
                ),
                return_exceptions=True,
            )
            for answer in answers:
                if isinstance(answer, aiohttp.ClientResponse):
                    statuses.append(answer.status)
                    opened.append(answer)
                else:
                    statuses.append(0)
    return sessions, opened, statuses


async def create_seconds(base: str) -> float:
    """The slowest of three game creations through the gateway, from a bystander address."""
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.250", 0))
    body = {"game": "teeko", "seats": [{"human": {}}, {"bot": "random"}]}
    slowest = 0.0
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(3):
            started = time.perf_counter()
            async with http.post(f"{base}/api/games", json=body) as resp:
                assert resp.status == 201, await resp.text()
            slowest = max(slowest, time.perf_counter() - started)
    return slowest


async def open_bot_streams(base: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith('agon_open_streams{kind="bot"}'):
            return int(float(line.split()[-1]))
    return 0


async def served_bots(arena: Arena, gateway: str) -> int:
    beats: Any = await arena.redis.hgetall(arena.keys.processes())
    return sum(1 for name in beats if (name.decode() if isinstance(name, bytes) else name)
               .startswith(f"{gateway}-bot-"))  # fmt: skip


async def test_thousands_of_bot_streams_hold_few_redis_connections_and_sigterm_stops(
    arena: Arena, redis_url: str, namespace: str
) -> None:
    bots = await register(arena, BOTS)
    redis_port = urlsplit(redis_url).port
    assert redis_port is not None
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with Processes(redis_url) as procs:
        gateway = procs.start("gateway", "--prefix", namespace, "--port", str(port))
        pid = gateway.process.pid
        half = bots[: len(bots) // 2]
        # Two halves from different addresses: the first goes away, the second stays.
        leaving, leaving_streams, statuses = await open_streams(base, half, STREAMS // 2, 2)
        staying, _, more = await open_streams(base, bots[len(half) :], STREAMS - STREAMS // 2, 60)
        statuses += more
        opened = sum(1 for s in statuses if s == 200)
        # Held past a keep-alive and a check of every stream's key: the most at any time.
        held = 0
        for _ in range(int(HOLD_S / 0.5)):
            held = max(held, redis_connections(pid, redis_port))
            await asyncio.sleep(0.5)
        clients: Any = (await arena.redis.info("clients"))["connected_clients"]
        create_s = await create_seconds(base)

        # The first half's clients go away; what they held must be released.
        for session in leaving:
            await session.close()
        remaining = opened - sum(1 for r in leaving_streams if r.status == 200)
        name = await _gateway_name(arena, base)
        staying_bots = len(bots) - len(half)

        async def released_all() -> bool:
            return await open_bot_streams(base) <= remaining and (
                await served_bots(arena, name) == staying_bots
            )

        released = await until(released_all, timeout_s=RELEASE_BOUND_S)
        beating = await served_bots(arena, name)

        # SIGTERM with the second half still open.
        started = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        status: int | None = None
        try:
            status = await asyncio.to_thread(gateway.process.wait, SIGTERM_WAIT_S)
        except subprocess.TimeoutExpired:
            gateway.process.kill()  # ignored SIGTERM: the figure says so
        finally:
            stop_s = time.monotonic() - started
            for session in staying:
                await session.close()
    figure = (
        f"{opened:,} of {STREAMS:,} streams ({BOTS:,} bots) open: the gateway holds {held} Redis"
        f" connections (connected_clients {clients}), game creation {create_s * 1000:.0f} ms;"
        f" released after clients left: {bool(released)} ({beating} bots still beating);"
        f" SIGTERM exit in {stop_s:.1f} s (status {status})"
    )
    ok = (
        opened == STREAMS
        and held <= CONNECTION_BOUND
        and create_s < CREATE_BOUND_S
        and bool(released)
        and beating == staying_bots
        and stop_s < SIGTERM_BOUND_S
        and status == 0
    )
    report("bot streams exhaust Redis connections", ok, figure)
    assert opened == STREAMS, (figure, sorted(set(statuses)))
    assert held <= CONNECTION_BOUND, figure
    assert create_s < CREATE_BOUND_S, figure
    assert released and beating == staying_bots, figure
    assert stop_s < SIGTERM_BOUND_S and status == 0, figure


async def _gateway_name(arena: Arena, base: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/health") as resp:
        return str((await resp.json())["gateway"])
