"""What the benchmarks measure with: CPU per process, quantiles, and spectators.

`CpuMeter` sums the CPU seconds of the benchmark's processes, of itself and of the Redis server
over the spans it measures; `quantile` is the nearest-rank quantile every figure uses;
`raise_open_files` makes room for thousands of sockets. Spectators measure delivery: a
`SpectatorSocket` notes when each WebSocket message arrived without decoding it (the gateway
benchmark's thousand sockets on one game); `Spectators`, run by `spectate` in a process of its
own (`python -m bench.load spectators`), follow the live games across gateways (the load test).
`bench.gateway` and `bench.load` (and `bench.clocks`) import them from here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import resource
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp

from schemas.codec import FIELD_BYTES, unpack
from services.bus.connection import Client, connect
from services.bus.keys import Keys
from services.bus.text import as_text


# -- CPU, quantiles, open files ----------------------------------------------------------------
def raise_open_files(wanted: int = 16_384) -> int:
    """Raise this process's soft open-file limit towards `wanted` (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return int(soft)


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile of `values` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by the helper processes, this client and the Redis server, summed
    over the spans measured (`start` ... `stop`); `cores()` is their share of the wall time."""

    def __init__(self, redis: Client, pids: dict[str, int]) -> None:
        self.redis = redis
        self.pids = pids
        self.used: dict[str, float] = dict.fromkeys([*pids, "client", "redis"], 0.0)
        self.wall = 0.0
        self._then: dict[str, float] = {}
        self._started = 0.0

    async def _read(self) -> dict[str, float]:
        out = {name: cpu_seconds(pid) or 0.0 for name, pid in self.pids.items()}
        out["client"] = time.process_time()
        info: Any = await self.redis.info("cpu")
        out["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        return out

    async def start(self) -> None:
        self._then = await self._read()
        self._started = time.perf_counter()

    async def stop(self) -> None:
        self.wall += time.perf_counter() - self._started
        for name, value in (await self._read()).items():
            self.used[name] += value - self._then[name]

    def cores(self) -> dict[str, float]:
        return {k: round(v / self.wall, 2) for k, v in self.used.items()} if self.wall else {}


# -- spectators on one game (the gateway benchmark) --------------------------------------------
class SpectatorSocket(asyncio.Protocol):
    """A WebSocket client that notes when each message arrived, in `data_received`, and
    decodes nothing until the measurement is over.

    A thousand of them share this process. aiohttp's client parses every frame, hands it
    to a task of its own and the benchmark then decoded its JSON, all before the arrival
    time was read: tens of milliseconds of this process's own queue, per event, counted
    as the gateway's delivery time. Frames from a server are unmasked; pings are answered
    (the gateway's heartbeat), a close ends the connection."""

    def __init__(self) -> None:
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        #: (arrival in ms since the epoch, the text message's bytes)
        self.messages: list[tuple[float, bytes]] = []
        self.closed = False

    @classmethod
    async def connect(cls, host: str, port: int, path: str) -> SpectatorSocket:
        loop = asyncio.get_running_loop()
        _, sock = await loop.create_connection(cls, host, port)
        key = base64.b64encode(os.urandom(16)).decode()
        assert sock.transport is not None
        sock.transport.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        try:
            await asyncio.wait_for(sock.opened, 10.0)
        except BaseException:
            sock.transport.abort()
            raise
        return sock

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        now = time.time() * 1000
        self.buffer += data
        if not self.opened.done():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(self.buffer[:end]).split(b"\r\n", 1)[0]
            del self.buffer[: end + 4]
            if status[9:12] != b"101":
                self.opened.set_exception(HandshakeRefused(int(status[9:12] or 0)))
                self.close()
                return
            self.opened.set_result(None)
        self._frames(now)

    def _frames(self, now: float) -> None:
        buffer = self.buffer
        while len(buffer) >= 2:
            opcode, length, start = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length >= 126:
                start = 4 if length == 126 else 10
                if len(buffer) < start:
                    return
                length = int.from_bytes(buffer[2:start], "big")
            if len(buffer) < start + length:
                return
            payload = bytes(buffer[start : start + length])
            del buffer[: start + length]
            if opcode == 0x1:
                self.messages.append((now, payload))
            elif opcode == 0x9:
                self._send(0xA, payload)  # pong
            elif opcode == 0x8:
                self.close()

    def _send(self, opcode: int, payload: bytes) -> None:
        """A masked frame (as a client's must be) with a payload under 126 bytes."""
        if self.transport is None or self.transport.is_closing():
            return
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._send(0x8, (1000).to_bytes(2, "big"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.opened.done():
            self.opened.set_exception(exc or ConnectionResetError("closed in the handshake"))


class HandshakeRefused(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"the WebSocket handshake was answered {status}")
        self.status = status


# -- spectators across gateways, a process of their own (the load test) ------------------------
@dataclass
class Spectators:
    """Sockets spread round robin over the gateways, each on the least watched live game,
    moving to another when theirs ends. Run in a process of their own (`spectate`), so that
    their work neither delays this process's feed reading nor hides in its CPU figure."""

    bases: list[str]
    count: int
    #: live game -> the last seq seen on the feeds
    heads: dict[str, int] = field(default_factory=dict)
    measuring: bool = False
    stopping: bool = False
    latencies: list[float] = field(default_factory=list)
    delivered: int = 0
    #: events a socket never got (a gap in the seqs it received)
    missed: int = 0
    sockets: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    watchers: Counter[str] = field(default_factory=Counter)
    connecting: int = 0
    open: set[aiohttp.ClientWebSocketResponse] = field(default_factory=set)

    async def follow(self, redis: Client, keys: Keys, stop: asyncio.Event) -> None:
        """Which games are live, from the feeds' current ends on."""
        last: dict[Any, Any] = {}
        for p in keys.all_partitions():
            rows: Any = await redis.xrevrange(keys.feed(p), count=1)
            last[keys.feed(p)] = rows[0][0] if rows else "0-0"
        while not stop.is_set():
            reply: Any = await redis.xread(last, count=1000, block=200)
            for stream, entries in reply or ():
                for entry_id, fields in entries:
                    last[as_text(stream)] = entry_id
                    data = fields.get(FIELD_BYTES)
                    ev = unpack(data) if data is not None else {}
                    if ev.get("type") == "game_ended":
                        self.heads.pop(str(ev["game_id"]), None)
                    elif ev:
                        self.heads[str(ev["game_id"])] = int(ev["seq"])

    def pick(self) -> tuple[str, int] | None:
        if not self.heads:
            return None
        gid = min(self.heads, key=lambda g: self.watchers[g])
        return gid, self.heads[gid]

    async def run(self) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(
                *(self._one(http, self.bases[i % len(self.bases)]) for i in range(self.count))
            )

    async def stop(self) -> None:
        """No new sockets; let handshakes under way finish (a socket dropped mid-handshake
        is an error in the gateway's log), then close every socket."""
        self.stopping = True
        deadline = time.monotonic() + 5.0
        while self.connecting and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.gather(*(ws.close() for ws in list(self.open)), return_exceptions=True)

    async def _one(self, http: aiohttp.ClientSession, base: str) -> None:
        while not self.stopping:
            picked = self.pick()
            if picked is None:
                await asyncio.sleep(0.05)
                continue
            gid, since = picked
            self.watchers[gid] += 1
            try:
                await self._watch(http, f"{base}/ws/games/{gid}?since={since}", since)
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                self.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.1)
            finally:
                self.watchers[gid] -= 1
                if self.watchers[gid] <= 0:
                    del self.watchers[gid]

    async def _watch(self, http: aiohttp.ClientSession, url: str, since: int) -> None:
        self.connecting += 1
        try:
            ws = await http.ws_connect(url)
        finally:
            self.connecting -= 1
        opened = time.time() * 1000
        self.sockets += 1
        self.open.add(ws)
        try:
            expect = since + 1
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                arrived = time.time() * 1000
                message = json.loads(msg.data)
                if message.get("type") != "event":
                    continue
                seq, event = int(message["seq"]), message["event"]
                self.missed += max(0, seq - expect)
                expect = max(expect, seq + 1)
                self.delivered += 1
                if self.measuring and event["time"] >= opened:
                    self.latencies.append(arrived - event["time"])
                if event.get("type") == "game_ended":
                    return
        finally:
            self.open.discard(ws)
            await ws.close()

    def summary(self) -> dict[str, Any]:
        lat = self.latencies
        return {
            "deliveries": len(lat),
            "p50_ms": round(quantile(lat, 0.5), 1) if lat else None,
            "p99_ms": round(quantile(lat, 0.99), 1) if lat else None,
            "max_ms": round(max(lat), 1) if lat else None,
            "events_delivered": self.delivered,
            "events_missed": self.missed,
            "sockets_opened": self.sockets,
            "errors": dict(self.errors),
        }


async def spectate(url: str, prefix: str, count: int, bases: list[str], out: Path) -> None:
    """The spectators' process: measure from SIGUSR1 to SIGUSR2; on SIGTERM close every
    socket and write the summary to `out`."""
    redis = await connect(url)
    spectators = Spectators(bases, count)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(spectators, "measuring", True))
    loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(spectators, "measuring", False))
    following = asyncio.create_task(spectators.follow(redis, Keys(prefix=prefix), stop))
    watching = asyncio.create_task(spectators.run())
    print(f"spectators ready: {count} over {len(bases)} gateway(s)", file=sys.stderr, flush=True)
    await stop.wait()
    await spectators.stop()
    for task in (watching, following):
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10.0)
    out.write_text(json.dumps(spectators.summary()))
    await redis.aclose()
