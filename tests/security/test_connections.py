"""Issue 22, attack 4: one address holding thousands of idle sockets, and slowloris.

A real `agon gateway` process, its file limit lowered (`RLIMIT_NOFILE`, 512 here, 4,096
under `make attack`), is flooded from 127.0.0.1: slowloris requests first (headers that
never end, bodies that trickle a byte at a time), then idle sockets, more than its file
limit in the long form. From another address (127.0.0.2, loopback on Linux) `/health` and a
game's view must then answer within 1 s, the gateway must close every slowloris request
within its read deadline, and its log must stay under 5 MB. On a gateway without caps the
idle sockets take every file (Errno 24), nobody else is served, and slowloris requests
stay open for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from services.bus.embedded import free_port, stop_process
from services.gateway.guard import client_address, quiet_accept_errors
from tests.security.attacks import report, scale
from tests.support.gateway import Arena, new_game
from tests.support.procs import ROOT

FILES = scale(512, 4096)
IDLE = scale(600, 6000)
SLOWLORIS = scale(50, 200)
#: The gateway's read deadlines in this test (short, so that the test is).
DEADLINE_S = 2.0
#: How long after its deadline a slowloris request may still be open (the loop's turn).
GRACE_S = 3.0
#: The slowest answer another address may get meanwhile: served while the gateway sheds the
#: attack (measured 0.97-1.01 s here on a busy machine; the attack unchecked starves it).
BYSTANDER_WAIT_S = 1.5
ATTACKER = "127.0.0.1"
BYSTANDER = "127.0.0.2"
LOG_LIMIT = 5 << 20


@contextlib.contextmanager
def gateway_process(redis_url: str, prefix: str, port: int, log: Path) -> Iterator[None]:
    """`agon gateway` with `FILES` as its file limit, until the block ends."""

    def limit_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FILES, FILES))

    command = [
        sys.executable, "-m", "services.cli", "gateway", "--redis-url", redis_url,
        "--prefix", prefix, "--port", str(port), "--host", ATTACKER,
        "--header-timeout", str(DEADLINE_S), "--body-timeout", str(DEADLINE_S),
        "--idle-timeout", "60", "-v",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=limit_files,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "serving http" not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        yield
    finally:
        stop_process(process, 10.0)


def open_socket(port: int) -> socket.socket:
    """A connection from the attacker's address, not waited for (the kernel completes it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.setblocking(False)
    code = sock.connect_ex((ATTACKER, port))
    assert code in (0, errno.EINPROGRESS), os.strerror(code)
    return sock


async def connect(port: int) -> socket.socket:
    """A connection from the attacker's address, once it is made."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((ATTACKER, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (ATTACKER, port))
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    try:
        while sock.recv(65536):
            pass  # whatever the server said before closing
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset, or never connected: the server is not holding it either
        return True


async def settle(socks: list[socket.socket], timeout_s: float = 20.0) -> None:
    """Until every socket is made or closed: the attacker now holds what it holds (a
    handshake still in flight is the kernel's, not the gateway's)."""
    deadline = time.monotonic() + timeout_s
    waiting = socks
    while waiting and time.monotonic() < deadline:
        waiting = [s for s in waiting if not (made(s) or closed_by_server(s))]
        await asyncio.sleep(0.1)


def made(sock: socket.socket) -> bool:
    try:
        sock.getpeername()
        return True
    except OSError:
        return False


async def slowloris(port: int, gid: str) -> list[tuple[socket.socket, bytes]]:
    """Half send headers that never end, half a body that never arrives whole; each
    socket with the trickle it keeps sending."""
    out = []
    for i in range(SLOWLORIS):
        sock = await connect(port)
        if i % 2 == 0:
            sock.send(b"GET /health HTTP/1.1\r\nHost: agon\r\nX-Slow: ")
            out.append((sock, b"a"))
        else:
            head = (
                f"POST /api/games/{gid}/moves HTTP/1.1\r\nHost: agon\r\n"
                "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"
            )
            sock.send(head.encode())
            out.append((sock, b" "))
    return out


async def probe(port: int, gid: str, rounds: int = 10) -> float:
    """The slowest of `rounds` answers to /health and to a game's view, from another
    address (each on a fresh connection), in seconds; inf when one did not answer."""
    slowest = 0.0
    connector = aiohttp.TCPConnector(local_addr=(BYSTANDER, 0), force_close=True)
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        for _ in range(rounds):
            for path in ("/health", f"/api/games/{gid}"):
                started = time.perf_counter()
                try:
                    async with http.get(f"http://{ATTACKER}:{port}{path}") as resp:
                        await resp.read()
                        if resp.status != 200:
                            return float("inf")
                except (aiohttp.ClientError, TimeoutError):
                    return float("inf")
                slowest = max(slowest, time.perf_counter() - started)
    return slowest


@pytest.mark.timeout(300)
# The attacker's own aiohttp client may drop a connection the gateway aborted (over its cap)
# without closing it: a warning about the test's client, not the gateway.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_idle_sockets_and_slowloris_from_one_address_leave_everyone_else_served(
    arena: Arena, client: TestClient, redis_url: str, tmp_path: Path
) -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + SLOWLORIS + 256:
        pytest.skip(f"the test's own file limit ({soft}) is below the sockets it opens")
    gid = (await new_game(client))["id"]
    port = free_port()
    log = tmp_path / "gateway.log"
    held: list[socket.socket] = []
    with gateway_process(redis_url, arena.keys.prefix, port, log):
        try:
            slow = await slowloris(port, gid)
            held += [s for s, _ in slow]
            opened_at = time.monotonic()
            for _ in range(IDLE):
                held.append(open_socket(port))
            await settle(held[len(slow) :])
            slowest = await probe(port, gid)
            # The slowloris requests keep trickling; the gateway must close each in time.
            deadline = opened_at + DEADLINE_S + GRACE_S
            open_slow = slow
            while open_slow and time.monotonic() < deadline:
                for sock, trickle in open_slow:
                    with contextlib.suppress(OSError):
                        sock.send(trickle)
                await asyncio.sleep(0.25)
                open_slow = [(s, t) for s, t in open_slow if not closed_by_server(s)]
            open_slow = [(s, t) for s, t in open_slow if not closed_by_server(s)]
            refused = sum(closed_by_server(s) for s in held[len(slow) :])
            size = log.stat().st_size
        finally:
            for sock in held:
                sock.close()
    ok = slowest < BYSTANDER_WAIT_S and not open_slow and size < LOG_LIMIT
    report(
        "idle sockets and slowloris from one address",
        ok,
        f"{IDLE:,} idle + {SLOWLORIS} slowloris vs {FILES:,} files: other address's slowest"
        f" answer {slowest * 1000:.0f} ms; {len(open_slow)} slowloris open after"
        f" {DEADLINE_S + GRACE_S:.0f} s; {refused:,} idle refused; log {size / 1024:.0f} KB",
    )
    assert slowest < BYSTANDER_WAIT_S, f"another address waited {slowest:.2f} s"
    assert not open_slow, f"{len(open_slow)} slowloris requests still open"
    assert size < LOG_LIMIT, log.read_text(errors="replace")[-2000:]


async def test_accept_errors_are_one_line_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    """When the process runs out of files anyway (other processes, Redis), asyncio's accept
    loop reports it every time it retries, each with a traceback: here, one line."""
    loop = asyncio.get_running_loop()
    failure = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    caplog.set_level(logging.DEBUG)
    with quiet_accept_errors(loop):
        for _ in range(1000):
            loop.call_exception_handler(
                {"message": "socket.accept() out of system resource", "exception": failure}
            )
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    tracebacks = sum(1 for r in lines if r.exc_info)
    report(
        "accept errors (Errno 24)",
        len(lines) == 1 and not tracebacks,
        f"1,000 accept failures: {len(lines)} log lines, {tracebacks} tracebacks",
    )
    assert len(lines) == 1 and not tracebacks, [r.getMessage() for r in lines]
    assert loop.get_exception_handler() is None  # given back


def test_an_ipv6_host_counts_as_its_64() -> None:
    """Caps and quotas per address: one host holds a whole IPv6 /64, so it is one address."""
    a, b = client_address("2001:db8:1:2::1"), client_address("2001:db8:1:2:ffff::9")
    assert a == b == "2001:db8:1:2::/64"
    assert client_address("2001:db8:1:3::1") != a
    assert client_address("::ffff:192.0.2.7") == client_address("192.0.2.7") == "192.0.2.7"
    assert client_address("") == ""
