"""Connecting to Redis: one `connect(url)` for a single server and for a Redis Cluster.

`connect` waits for Redis at start-up (one clear line per failed attempt, retried with
backoff, never a traceback), then asks the server whether it is a cluster node (`INFO
cluster`) and returns a `RedisCluster` client for a cluster, a plain `Redis` client
otherwise: the same `--redis-url` serves both. Both retry a command whose connection
dropped, which is safe for everything Agon writes (commands are deduplicated by id,
appends check the log head, projections the seq).

A plain client packs commands with hiredis (C) instead of redis-py's Python packer, the
largest cost of a busy engine after the rules. `scan_keys` lists keys on every primary of a
cluster, which is what listing logs and read models must do.

`ride_out` is how a command (verify, rebuild, archive, status...) rides out a failover the way
the services do: it runs the command's work again while Redis is away or a cluster fails
over, saying so once, for a bounded time. `connected_replicas` is what `--ack-replicas auto`
asks: whether any primary has a replica to wait for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("agon.bus")

#: A client of either kind: their command APIs are the same for everything Agon sends.
Client = Redis | RedisCluster


class ReplicasBehind(RuntimeError):
    """Fewer replicas than asked for confirmed a write in time, or its master changed under
    it: a moment of a failover, like a dropped connection; the work is done again."""


#: Redis refusing writes for a while: out of memory (`maxmemory` with noeviction), or a
#: master turned replica in a failover. Backpressure, never a verdict on the entry at hand.
WRITES_REFUSED: tuple[type[Exception], ...] = (OutOfMemoryError, ReadOnlyError)

#: Errors that say Redis is away for a moment (restart, failover, a spell out of memory), not
#: that a request is bad.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    *WRITES_REFUSED,
    ReplicasBehind,
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    TryAgainError,
    OSError,
)

#: Waiting for Redis at start-up: first pause, longest pause.
BACKOFF_FIRST_S = 0.2
BACKOFF_CAP_S = 5.0


_UNREACHABLE: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, RedisClusterException)

#: What a command rides out: Redis away, or a cluster failing over (for a moment a slot has
#: no node the client knows of).
FAILING_OVER: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, SlotNotCoveredError)

#: How long a command waits for Redis to answer again once it went away (`--wait-s`).
WAIT_S = 60.0


class RedisUnavailable(RuntimeError):
    """Redis did not answer within the time a command was willing to wait."""


def redact(url: str) -> str:
    """The URL without its password, for log lines and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))


class _HiredisPacking:
    """Mixin for a redis-py asyncio connection: pack commands with `hiredis.pack_command`.

    What the synchronous redis-py client does when hiredis is installed; arguments
    hiredis refuses (e.g. a bool) go to redis-py's own packer, which raises its usual
    DataError.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        if isinstance(args[0], str):
            # Multi-word command names ("XINFO GROUPS") are separate protocol words.
            args = (*args[0].encode().split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            packed: list[bytes] = super().pack_command(*args)  # type: ignore[misc]
            return packed


_PACKING_CLASSES: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), 8)


def plain_client(url: str, **kwargs: Any) -> Redis:
    """A single-server client for `url` whose commands hiredis packs (utf-8 encoding only)."""
    kwargs.setdefault("retry", _retry())
    redis = Redis.from_url(url, **kwargs)
    pool = redis.connection_pool
    if pool.connection_kwargs.get("encoding", "utf-8") != "utf-8":
        return redis
    base = pool.connection_class
    fast = _PACKING_CLASSES.get(base)
    if fast is None:
        fast = type(f"Hiredis{base.__name__}", (_HiredisPacking, base), {})
        _PACKING_CLASSES[base] = fast
    pool.connection_class = fast
    return redis


class _ClosedMidSend(Connection):
    """redis-py's connection, but one that another task closed while this one was sending
    (what happens to a dead node's connections in a failover) fails as a ConnectionError,
    which every retry knows, rather than an AttributeError of its half-closed writer."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except AttributeError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"connection closed while sending ({exc})") from None


class _StreamsCluster(RedisCluster):
    """redis-py's cluster client, routing XREAD/XREADGROUP without asking the server.

    Stream reads have "movable keys", and the stock client asks a node (COMMAND GETKEYS)
    where they go on every call: two extra round trips per read, on the hottest path of
    every consumer. Their keys are what follows STREAMS, first half.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes_manager.connection_kwargs["connection_class"] = _ClosedMidSend
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = _ClosedMidSend

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("XREAD", "XREADGROUP"):
            words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
            upper = [w.upper() for w in words]
            if "STREAMS" in upper:
                at = upper.index("STREAMS") + 1
                keys = words[at : at + (len(words) - at) // 2]
                slots = {self.keyslot(key) for key in keys}
                if len(slots) == 1:
                    return slots.pop()
                raise RedisClusterException(f"{command} - all keys must map to the same key slot")
        return await super()._determine_slot(command, *args)


#: How long a cluster client waits to connect to a node: a host that went away (its link
#: down: no refusal comes back) must not hold every command that touches it for the
#: system's connect timeout, while its replica takes over.
NODE_CONNECT_TIMEOUT_S = 1.0


def cluster_client(url: str, **kwargs: Any) -> RedisCluster:
    """A Redis Cluster client that follows MOVED/ASK and refreshes its slots after failover."""
    kwargs.setdefault("retry", _retry())
    kwargs.setdefault("socket_connect_timeout", NODE_CONNECT_TIMEOUT_S)
    return _StreamsCluster.from_url(url, **kwargs)


async def _is_cluster(probe: Redis) -> bool:
    info: Any = await probe.info("cluster")
    return bool(int(info.get("cluster_enabled", 0)))


async def connect(url: str, *, wait_s: float | None = 30.0, **kwargs: Any) -> Client:
    """A client for the Redis (or Redis Cluster) at `url`, once it answers.

    Waits up to `wait_s` seconds (None: for ever, what services do) with backoff, logging
    one line per failed attempt; then raises `RedisUnavailable` with one line that says
    what to do. A wrong password is not retried.
    """
    deadline = None if wait_s is None else time.monotonic() + wait_s
    pause = BACKOFF_FIRST_S
    while True:
        probe = plain_client(url, retry=None, socket_connect_timeout=2.0)
        try:
            cluster = await _is_cluster(probe)
        except AuthenticationError as exc:
            raise RedisUnavailable(f"Redis at {redact(url)} refused the login: {exc}") from None
        except _UNREACHABLE as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if deadline is not None and time.monotonic() + pause > deadline:
                raise RedisUnavailable(
                    f"cannot reach Redis at {redact(url)} ({reason}): start it, or pass "
                    "another --redis-url / REDIS_URL"
                ) from None
            log.warning(
                "cannot reach Redis at %s (%s); retrying in %.1f s", redact(url), reason, pause
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, BACKOFF_CAP_S)
            continue
        finally:
            await probe.aclose()
        if cluster:
            client: Client = cluster_client(url, **kwargs)
            await client.initialize()
            return client
        return plain_client(url, **kwargs)


def is_cluster(client: Client) -> bool:
    return isinstance(client, RedisCluster)


async def scan_keys(client: Client, pattern: str, count: int = 1000) -> AsyncIterator[str]:
    """Every key matching `pattern`, on every primary of a cluster (each key once)."""
    seen: set[str] = set()
    async for key in client.scan_iter(match=pattern, count=count):
        name = key.decode() if isinstance(key, bytes) else str(key)
        if name not in seen:
            seen.add(name)
            yield name


async def connected_replicas(client: Client) -> int:
    """The most replicas any primary has connected (INFO replication `connected_slaves`);
    on a cluster every primary is asked."""
    if isinstance(client, RedisCluster):
        asks = [client.info("replication", target_nodes=n) for n in client.get_primaries()]
        infos: list[Any] = await asyncio.gather(*asks)
    else:
        infos = [await client.info("replication")]
    return max((int(info.get("connected_slaves", 0)) for info in infos), default=0)


T = TypeVar("T")


async def ride_out(
    work: Callable[[], Awaitable[T]], *, wait_s: float, say: Callable[[str], None]
) -> T:
    """`work()`, run again while Redis is away or a cluster fails over, until it succeeds.

    Each outage is said once (`say`, one line) and waited out with backoff for up to
    `wait_s` seconds; then `RedisUnavailable`. An attempt that ran `wait_s` without failing
    starts a new outage's count. Only for work that is safe to repeat from its start.
    """
    deadline: float | None = None
    said = False
    pause = BACKOFF_FIRST_S
    while True:
        started = time.monotonic()
        try:
            return await work()
        except FAILING_OVER as exc:
            now = time.monotonic()
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if deadline is None or now - started >= wait_s:
                deadline, said, pause = now + wait_s, False, BACKOFF_FIRST_S
            if now + pause > deadline:
                raise RedisUnavailable(
                    f"Redis did not answer again within {wait_s:g} s ({reason}); "
                    "give it longer with --wait-s"
                ) from None
            if not said:
                say(
                    f"Redis unavailable ({reason}); trying again until it answers, "
                    f"for up to {wait_s:g} s"
                )
                said = True
            await asyncio.sleep(pause)
            pause = min(pause * 2, BACKOFF_CAP_S)
