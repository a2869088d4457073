"""Shared fixtures: a real redis-server that the test session starts, and clients that close.

The session starts one redis-server of its own on a free port (never 6379, never a server it
did not start) and gives every test a fresh database index on it, flushed before use, so tests
cannot see each other's keys. `redis_url` is that database's URL (for subprocesses and services),
`redis` an async client on it, `redis_factory` more clients (racing engines, killed consumers),
`namespace` a unique key prefix for tests that share one database on purpose,
`redis_server_factory` private servers (AOF, restarts) that stop when the test ends, and
`primary_and_replica` two of them, the second made a replica of the first on request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis as redis_sync
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient

from services.bus.embedded import EmbeddedRedis
from services.bus.keys import Keys
from services.cli.arena import ARENA_ENV
from tests.support.gateway import Arena, running_arena
from tests.support.procs import SESSION_DIR

#: Databases on the session server: one per test; indexes wrap around after this many tests.
TEST_DATABASES = 4096

SHARED = Path(__file__).resolve().parents[2] / "shared"

#: The commands under test never find an arena `make run` runs on this machine (set before
#: any test module copies the environment).
os.environ[ARENA_ENV] = str(SESSION_DIR / "arena.json")

_db_counter = itertools.count(1)
_namespace_counter = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(databases=TEST_DATABASES)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_db(redis_server: EmbeddedRedis) -> int:
    """A database index of the session server that no other test uses, emptied for this test."""
    db = next(_db_counter) % TEST_DATABASES
    # FLUSHDB only ever goes to the server this session started.
    with redis_sync.Redis.from_url(redis_server.url_for_db(db)) as client:
        client.flushdb()
    return db


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis, redis_db: int) -> str:
    return redis_server.url_for_db(redis_db)


@pytest.fixture
async def redis_factory(redis_url: str) -> AsyncIterator[Callable[..., aioredis.Redis]]:
    """Make async clients on this test's database; every one is closed when the test ends."""
    opened: list[aioredis.Redis] = []

    def make(**kwargs: Any) -> aioredis.Redis:
        client = aioredis.Redis.from_url(redis_url, **kwargs)
        opened.append(client)
        return client

    try:
        yield make
    finally:
        for client in opened:
            await client.aclose()


@pytest.fixture
async def redis(redis_factory: Callable[..., aioredis.Redis]) -> aioredis.Redis:
    return redis_factory()


@pytest.fixture
def namespace() -> str:
    """A key prefix no other test in this session uses (in place of the default `agon`)."""
    return f"agon-t{next(_namespace_counter)}"


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., EmbeddedRedis]]:
    """Start private redis-servers (e.g. `appendonly=True` to restart); all stop at the end."""
    started: list[EmbeddedRedis] = []

    def make(**kwargs: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(**kwargs)
        started.append(server)
        server.start()
        return server

    try:
        yield make
    finally:
        for server in started:
            server.stop()


@dataclass
class PrimaryAndReplica:
    """A private primary (`redis`) and a server (`replica`) that follows it once told to."""

    redis: aioredis.Redis
    replica: aioredis.Redis
    port: int

    async def follow(self) -> None:
        """Make `replica` a replica of `redis`, and return once its link is up."""
        await self.replica.replicaof("127.0.0.1", self.port)
        while (await self.replica.info("replication"))["master_link_status"] != "up":
            await asyncio.sleep(0.05)


@pytest.fixture
async def primary_and_replica(
    redis_server_factory: Callable[..., EmbeddedRedis],
) -> AsyncIterator[PrimaryAndReplica]:
    primary, secondary = redis_server_factory(), redis_server_factory()
    pair = PrimaryAndReplica(
        aioredis.from_url(primary.url), aioredis.from_url(secondary.url), primary.port
    )
    try:
        yield pair
    finally:
        await pair.redis.aclose()
        await pair.replica.aclose()


@pytest.fixture
def shared_dir() -> Path:
    """`../shared` beside the checkout, or skip: it is reference data, not part of the project."""
    if not SHARED.is_dir():
        pytest.skip("../shared/conformance not present (outside the project)")
    return SHARED


# --- A real Redis Cluster (tests/support/cluster.py), started only when a test asks for it ------

from tests.support.cluster import ClusterTarget, RedisClusterError, RedisClusterProcesses  # noqa: E402


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcesses]:
    """A 3-master Redis Cluster that this session starts (once, on first use) and stops."""
    try:
        cluster = RedisClusterProcesses(masters=3)
    except RedisClusterError as error:  # e.g. no redis-cli beside redis-server
        pytest.skip(f"no Redis Cluster for the tests: {error}")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterProcesses) -> ClusterTarget:
    """The session cluster's URL and a key prefix no other test uses (a cluster has only db 0).

    Nothing is flushed: the cluster is this session's own and every test's prefix differs.
    """
    return ClusterTarget(url=redis_cluster.url, prefix=f"agon-c{next(_namespace_counter)}")


@pytest.fixture
async def arena(redis: aioredis.Redis, namespace: str) -> AsyncIterator[Arena]:
    """Every service running as tasks on this test's database, with gateways on demand."""
    async with running_arena(redis, Keys(prefix=namespace), ["random"]) as running:
        yield running


@pytest.fixture
async def client(arena: Arena) -> TestClient:
    """A gateway of `arena` over real HTTP on the loopback, and a client of it."""
    return await arena.gateway()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove what the session left on disk, unless a test failed: then its processes' logs
    stay, and the summary names where."""
    if exitstatus == 0:
        shutil.rmtree(SESSION_DIR, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int) -> None:
    """The fault suite's and the security suite's tables: one line per scenario or attack
    that ran (tests/support/faults.py, tests/security/attacks.py); after a failure, where
    the session's processes left their logs."""
    from tests.security.attacks import LINES as ATTACKS
    from tests.support.faults import LINES

    if exitstatus != 0 and SESSION_DIR.exists():
        terminalreporter.write_line(f"this session's process logs: {SESSION_DIR}")

    for title, lines in (("faults: one line per scenario", LINES),
                         ("attacks: one line per attack", ATTACKS)):  # fmt: skip
        if lines:
            terminalreporter.write_sep("-", title)
            for line in lines:
                terminalreporter.write_line(str(line))
