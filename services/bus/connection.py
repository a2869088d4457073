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
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from collections.abc import Set as AbstractSet
from itertools import chain
from typing import Any, NamedTuple, TypeGuard, TypeVar
from urllib.parse import urlsplit, urlunsplit

import hiredis
from redis.asyncio import Redis
from redis.asyncio.cluster import (
    ClusterNode,
    ClusterPipeline,
    PipelineCommand,
    PipelineStrategy,
    RedisCluster,
)
from redis.asyncio.connection import AbstractConnection, Connection
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.cluster import REPLICA
from redis.exceptions import (
    AskError,
    AuthenticationError,
    ClusterDownError,
    ClusterError,
    MovedError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger("agon.bus")

#: A client of either kind: their command APIs are the same for everything Agon sends.
Client = Redis | RedisCluster


class NodeTooSlow(RedisTimeoutError):
    """A part of a batch (a node's commands, a send) that did not answer in the time a
    `Patience` allows (`patiently`): most likely its host died and nobody knows yet.
    Transient: the caller keeps what it needed for later, as for a node counted down."""


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

#: A cluster client's map of the slots behind the cluster's (a failover or a resharding
#: moved them, or a node it learnt from did not serve them all yet): never about what a
#: request holds, so never a reason to set an entry aside; the map is learnt again.
ROUTING_ERRORS: tuple[type[Exception], ...] = (
    MovedError,
    AskError,
    RedisClusterException,
    ClusterError,
)
#: What leaves a batch for later, never for the dead letters: Redis away, or the map behind.
RETRIED_ERRORS: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, *ROUTING_ERRORS)

#: Waiting for Redis at start-up: first pause, longest pause.
BACKOFF_FIRST_S = 0.2
BACKOFF_CAP_S = 5.0


_UNREACHABLE: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, RedisClusterException)

#: A node that did not answer in time, or at all.
_NO_ANSWER: tuple[type[Exception], ...] = (*_UNREACHABLE, TimeoutError)
#: ... or refused the question (a user not let to ask it): no answer either.
_NOT_ASKED: tuple[type[Exception], ...] = (*_NO_ANSWER, ResponseError)

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


class _QuickSend:
    """Mixin for a redis-py asyncio connection: a send the kernel takes whole needs no task.

    redis-py bounds every send by `socket_timeout` with `asyncio.wait_for`, which on
    Python 3.11 runs the write in a task of its own: a fifth of the client's CPU for a
    PING's round trip. A write that left nothing in the transport's buffer cannot block,
    so only one that did waits for the socket under the timeout (and fails as redis-py's
    would: `TimeoutError`, the connection closed).
    """

    _writer: asyncio.StreamWriter | None
    socket_timeout: float | None
    health_check_interval: float

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        writer = self._writer
        if writer is None or not self.socket_timeout or self.health_check_interval:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            writer.writelines(command)
            if writer.transport.get_write_buffer_size():
                async with asyncio.timeout(self.socket_timeout):
                    await writer.drain()
            else:
                await writer.drain()  # (raises at once if the connection was lost)
        except TimeoutError:
            await self._drop(writer)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self._drop(writer)
            raise RedisConnectionError(f"Error while writing to socket: {exc}") from exc
        except BaseException:
            await self._drop(writer)
            raise

    async def _drop(self, writer: asyncio.StreamWriter) -> None:
        """Close the connection of a send cut short, and drop what it still buffers: a
        closed transport would otherwise go on sending the rest of the command."""
        writer.transport.abort()
        await self.disconnect(nowait=True)  # type: ignore[attr-defined]


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
    """A single-server client for `url` whose commands hiredis packs and sends without a
    task each (`_QuickSend`; utf-8 encoding only)."""
    kwargs.setdefault("retry", _retry())
    redis = Redis.from_url(url, **kwargs)
    pool = redis.connection_pool
    if pool.connection_kwargs.get("encoding", "utf-8") != "utf-8":
        return redis
    base = pool.connection_class
    fast = _PACKING_CLASSES.get(base)
    if fast is None:
        fast = type(f"Hiredis{base.__name__}", (_QuickSend, _HiredisPacking, base), {})
        _PACKING_CLASSES[base] = fast
    pool.connection_class = fast
    return redis


class _ClosedMidSend(_QuickSend, Connection):
    """redis-py's connection, but one that another task closed while this one was sending
    (what happens to a dead node's connections in a failover) fails as a ConnectionError,
    which every retry knows, rather than an AttributeError of its half-closed writer."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)
        except AttributeError as exc:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"connection closed while sending ({exc})") from None


#: How often a node that counts as down is asked again (and the slots learnt again).
NODE_PROBE_S = 0.1
#: How long one command waits for a node that counts as down before its caller hears so.
NODE_WAIT_S = 1.0
#: How often a cluster client asks which nodes the cluster sees failing.
WATCH_S = 0.25
#: How long a node that one master suspects (or whose connection failed) has to answer a
#: PING before it counts as down.
PING_WAIT_S = 0.5
#: How long a node is asked at most (a task per node while it is down).
NODE_PROBE_MAX_S = 60.0
#: How long closing waits for the watch, the probes and the connections they close (s).
CLOSE_WAIT_S = 2.0
#: How long before a node counted down an outage may have begun, at most (ms): the cluster
#: hears from each node every few node timeouts.
HEARD_MAX_MS = 10_000
#: The pause before a cluster pipeline sends again what met a failover.
RESEND_PAUSE_S = 0.05
#: How long after a node counted down was found back (or replaced) a failure is taken for
#: one more of that failover's, and tried again after `RESEND_PAUSE_S` (s).
JUST_SETTLED_S = 1.0
#: Once one node answered its share of a batch (a patient pipeline's, `patiently`), how
#: long the others may take: a host that dies answers nothing, and until the masters agree
#: it failed (0.5 s or more) every command there waits; the batch's other games must not.
NODE_PATIENCE_S = 0.25
#: What a cluster pipeline sends again, after learning where the slots are now.
_RESEND = (RedisConnectionError, RedisTimeoutError, ClusterDownError, TryAgainError)

F = TypeVar("F", bound=asyncio.Future[Any])


class Patience(NamedTuple):
    """How long a batch waits for the first of its parts to answer (None: until one did,
    or every one is done), and then for the others (`patiently`)."""

    first_s: float | None = NODE_WAIT_S
    then_s: float = NODE_PATIENCE_S


async def patiently(
    futures: Collection[F], patience: Patience, answered: Callable[[F], bool] = lambda f: True
) -> set[F]:
    """Wait for `futures` until one is `answered` (at most `patience.first_s`), then
    `patience.then_s` more for the others (none more when none answered); cancel those
    still running and return them once they stopped (a connection they leave is closed
    by then, not at some later collection)."""
    pending: set[F] = set(futures)
    heard = False
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(patience.first_s):
                while pending and not heard:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    heard = any(answered(f) for f in done)
        if pending and heard:
            _, pending = await asyncio.wait(pending, timeout=patience.then_s)
    finally:
        for f in pending:  # (also when the caller is cancelled: none is left running)
            f.cancel()
    if pending:
        await asyncio.wait(pending)
    return pending


def patient_pipeline(redis: Client, patience: Patience | None = None) -> Any:
    """A pipeline (no transaction) whose nodes are each given the time `patience` allows
    (None: all waited for): those that take longer fail their commands with `NodeTooSlow`,
    not sent again. A single server is one node: it is waited for."""
    pipe = redis.pipeline(transaction=False)
    strategy = getattr(pipe, "_execution_strategy", None)
    if isinstance(strategy, _NodeIsolated):
        strategy.patience = patience
    return pipe


class AgonCluster(RedisCluster):
    """redis-py's cluster client, routing XREAD/XREADGROUP without asking the server, and
    keeping a node's failure to the commands of that node.

    Stream reads have "movable keys", and the stock client asks a node (COMMAND GETKEYS)
    where they go on every call: two extra round trips per read, on the hottest path of
    every consumer. Their keys are what follows STREAMS, first half.

    A host that dies answers nothing: the stock client waited for its read timeout (5 s) on
    every connection it had there, and a pipeline that met it closed every connection of the
    client (every other task's too) and sent the whole pipeline again, up to its retries: one
    host's death stalled the partitions of every live master until its replica took over
    (7-8 s, measured). Here:

    - **Down, at once.** A watch asks a live master every `WATCH_S` which nodes the cluster
      flags `fail` (the masters agreed: no answer for the node timeout): down at once; one
      it flags `fail?` (its own suspicion: on a starved host a peer that is only slow), or
      whose connection failed, is PINGed first (`PING_WAIT_S`). A node that is down has
      its connections closed (what is in flight fails now) and its commands fail at once,
      until it answers again or serves no slot (its replica took over: the slots are
      learnt again every `NODE_PROBE_S` meanwhile). A reader that failed on it waits for
      that, not a fixed pause (`pause_after_failure`).
    - **A pipeline fails only that node's commands** (`_NodeIsolated`); they are sent again
      once their slots moved, else the caller's own retry takes them from there.
    - **A single command waits for the failover** (at most `NODE_WAIT_S` a try, within the
      client's retries), not for connect timeouts.
    - **The failover starts once the masters agree.** Redis's replica waits 0.5-1 s more
      before it stands for election; once a live master flags the dead one `fail` (the
      masters' verdict, never this client's guess) and the replica does too, a probe has
      a master's best replica take over at once (`_hasten`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes_manager.connection_kwargs["connection_class"] = _ClosedMidSend
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = _ClosedMidSend
        #: nodes whose connection failed, each with the task that asks it whether it is back
        self.probes: dict[str, asyncio.Future[None]] = {}
        #: those of them that did not answer: their commands fail at once
        self.down: set[str] = set()
        self._refreshing: asyncio.Task[None] | None = None
        self._watching: asyncio.Future[None] | None = None
        self._closing: set[asyncio.Future[None]] = set()
        #: per node, when the cluster last heard from it (ms; the watch's CLUSTER NODES)
        self.heard: dict[str, int] = {}
        #: the nodes (replicas too) the cluster flagged failing when the watch last asked
        self.failing: set[str] = set()
        #: when the last node counted down was found back or replaced (monotonic s)
        self.settled_at = float("-inf")
        #: whether a probe has a dead master's replica take over once the masters agree
        #: (`_hasten`); an observer that must not act on the cluster (a benchmark's) sets
        #: it False
        self.takes_over = True
        #: called with each spell (start, end: ms) in which a master did not answer and
        #: the slots it served then (`services.bus.outages`: no move clock runs in them)
        self.outage_hooks: list[Callable[[tuple[int, int], frozenset[int]], None]] = []

    async def initialize(self, *args: Any, **kwargs: Any) -> AgonCluster:
        """Learn the nodes and slots (and, the first time, the commands). After a failure
        redis-py asks its default node for the commands again, and when that node is the
        dead one the whole client fails and closes every connection: the commands a
        server knows do not change, so only the slots are learnt again."""
        if not (self._initialize and self.commands_parser.commands):
            await super().initialize(*args, **kwargs)
        else:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if self._initialize:
                    await self._learn_slots(*args, **kwargs)
                    self.commands_parser.node = self.nodes_manager.default_node
                    self._initialize = False
        if self._watching is None or self._watching.done():
            self._watching = asyncio.ensure_future(self._watch())
        return self

    def _close_if_dropped(self, node: ClusterNode) -> None:
        """Closes `node`'s connections if the client no longer knows it (it dropped out of
        the slots: a dead master its replica replaced). A probe's PING to a node that came
        back (as a replica, known under a new object) would stay open, owned by nobody."""
        manager = self.nodes_manager
        if all(
            n is not node
            for n in chain(manager.nodes_cache.values(), manager.startup_nodes.values())
        ):
            self._close_later(node.disconnect())

    def _close_later(self, closing: Awaitable[Any]) -> None:
        """Close connections beside the caller (`aclose` waits for what is left)."""
        task = asyncio.ensure_future(closing)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(seen)

    async def _watch(self) -> None:
        """Every `WATCH_S`, ask a live master which nodes the cluster sees failing: a master
        flagged `fail` counts as down at once (one flagged `fail?`, once it did not answer
        a PING), its commands in flight fail now rather than at their read timeout, and the
        slots are learnt again until its replica took over."""
        while True:
            await asyncio.sleep(WATCH_S)
            asking = [n for n in self.get_primaries() if n.name not in self.down]
            if not asking:
                continue
            node = asking[int(time.monotonic() / WATCH_S) % len(asking)]
            if (nodes := await self._cluster_nodes(node)) is None:
                continue
            primaries = {n.name: n for n in self.get_primaries()}
            for name, node_seen in nodes.items():
                if node_seen.pong:
                    self.heard[name] = node_seen.pong
            failing = _flagged(nodes)
            self.failing = set(failing)
            for name, confirmed in failing.items():
                if name in primaries and name not in self.probes:
                    self.nodes_manager.move_node_to_end_of_cached_nodes(name)
                    probe = self._probe(primaries[name], ask_first=not confirmed)
                    self.probes[name] = asyncio.ensure_future(probe)

    async def aclose(self) -> None:
        """Close every connection; the watch stops (the next `initialize` starts it again)."""
        me = asyncio.current_task()
        tasks = [
            t for t in (self._watching, *self.probes.values()) if t is not None and t is not me
        ]
        for task in tasks:
            task.cancel()
        for waiting in (tasks, list(self._closing)):
            if waiting:
                await asyncio.wait(waiting, timeout=CLOSE_WAIT_S)
        await super().aclose()

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> ClusterPipeline:
        pipe = super().pipeline(transaction, shard_hint)
        if not transaction:
            pipe._execution_strategy = _NodeIsolated(pipe)
        return pipe

    async def _execute_command(self, target_node: ClusterNode, *args: Any, **kwargs: Any) -> Any:
        """One command on `target_node`; while that node is down, wait (bounded) for it to
        answer or its slots to move, then fail so that the caller's loop routes it again:
        a command waits for a failover, not for connect timeouts."""
        if self.is_down(target_node):
            await asyncio.wait([self.probes[target_node.name]], timeout=NODE_WAIT_S)
            raise RedisConnectionError(f"node {target_node.name} was down")
        try:
            return await super()._execute_command(target_node, *args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError):
            self.node_failed(target_node)
            raise

    def is_down(self, node: ClusterNode) -> bool:
        return node.name in self.down

    def node_failed(self, node: ClusterNode) -> None:
        """A command on `node` failed for its connection: a task beside asks it whether it
        is there. One that does not answer is down (its commands fail at once) until it
        answers again or serves no slot any more (its replica took over); meanwhile the
        task learns the slots again, from the other nodes first."""
        if node.name not in self.probes:
            self.nodes_manager.move_node_to_end_of_cached_nodes(node.name)
            self.probes[node.name] = asyncio.ensure_future(self._probe(node))

    async def _ping(self, node: ClusterNode, timeout_s: float | None = None) -> bool:
        try:
            async with asyncio.timeout(timeout_s):  # no inner task to leave unawaited
                await node.execute_command("PING")
            return True
        except _NO_ANSWER:
            return False

    async def _probe(self, node: ClusterNode, ask_first: bool = True) -> None:
        """Until `node` answers again or serves no slot: it is down. `ask_first`: only once
        it did not answer a PING within `PING_WAIT_S` (a connection can fail for other
        reasons, and one master may suspect another that is only slow), or the masters
        flagged it `fail` meanwhile. While it is down and serves slots, its replica may be
        asked to take over now (`_hasten`)."""
        me, name = asyncio.current_task(), node.name
        ping = asyncio.ensure_future(self._ping(node, PING_WAIT_S if ask_first else None))
        asked, slots = _wall_ms(), self._slots_of(node)
        down, replicas = False, _Replicas(self.nodes_manager.connection_kwargs)
        try:
            if ask_first and not await self._unanswered(ping, name):
                return  # a connection that failed for another reason (closed by a reset)
            self.down.add(name)
            down = True
            for connection in list(getattr(node, "_connections", ())):
                with contextlib.suppress(Exception):
                    await connection.disconnect(nowait=True)  # what is in flight fails now
            ends = time.monotonic() + NODE_PROBE_MAX_S
            hastened = False
            while time.monotonic() < ends:
                if ping.done():
                    if ping.result():
                        return
                    ping = asyncio.ensure_future(self._ping(node))  # one at a time
                view = await self._view(name)
                if view is None or _seen(view, name).serves:
                    # its replica has not taken over yet
                    if view is not None and self.takes_over and not hastened:
                        hastened = await self._hasten(name, view, replicas)
                    await asyncio.sleep(NODE_PROBE_S)
                    continue
                await self.refresh_slots()
                if name not in {n.name for n in self.get_primaries()}:
                    return
                await asyncio.sleep(NODE_PROBE_S)
        except asyncio.CancelledError:
            down = False  # the client closes: nothing was learnt of the node
            raise
        finally:
            ping.cancel()
            if replicas.nodes:
                self._close_later(replicas.close())
            if self.probes.get(name) is me:
                del self.probes[name]
                self.down.discard(name)
                if down:
                    self.settled_at = time.monotonic()
            self._close_if_dropped(node)
            if down and slots:
                # From when the cluster last heard from it (at worst a PING's wait before
                # this asked, at most `HEARD_MAX_MS`) to now: as wide as the outage could
                # have been.
                began = min(self.heard.get(name) or asked, asked - int(PING_WAIT_S * 1000))
                began = max(began, asked - HEARD_MAX_MS)
                for hook in self.outage_hooks:
                    hook((began, _wall_ms()), slots)

    async def _unanswered(self, ping: asyncio.Future[bool], name: str) -> bool:
        """Whether node `name` counts down: its `ping` went unanswered, or meanwhile the
        masters agreed that it failed (a live master flags it `fail`)."""
        while not ping.done():
            await asyncio.wait([ping], timeout=NODE_PROBE_S)
            if not ping.done() and "fail" in _seen(await self._view(name), name).flags:
                return True
        return not ping.result()

    async def _view(self, name: str) -> dict[str, _Seen] | None:
        """CLUSTER NODES as the first live master other than `name` to answer in time sees
        it (None: none did). Learning the slots anew costs a client far more (16,384
        slots, and every connection marked to reconnect): each process of a starved host
        doing it every `NODE_PROBE_S` until the failover stalled them all for seconds."""
        for node in self.get_primaries():
            if node.name == name or node.name in self.down:
                continue
            if (view := await self._cluster_nodes(node)) is not None:
                return view
        return None

    async def _cluster_nodes(self, node: ClusterNode) -> dict[str, _Seen] | None:
        try:
            async with asyncio.timeout(WATCH_S):
                return _nodes(await node.execute_command("CLUSTER NODES"))
        except _NOT_ASKED:
            return None

    async def _hasten(self, name: str, view: dict[str, _Seen], replicas: _Replicas) -> bool:
        """Once the masters agreed that master `name` failed, have its best replica take
        over now (CLUSTER FAILOVER TAKEOVER). False: look again at the next probe; True:
        done, or nothing to do. `replicas`: the probe's connections to them.

        Redis's own failover waits 0.5-1 s more after the masters agree: a fixed delay for
        the word to spread, a random one so that replicas do not stand at once, 1 s per
        rank behind the best replica. Only that wait is skipped, and only where nothing
        depends on it (`takeover`, `_standing`): the master is `fail` (the masters' own
        verdict, never this client's); no replica of it is only suspected (`fail?`), and
        every other one answers, follows it and flags it `fail` too; and their offsets
        stand still for `STILL_S` (the master writes no more). Of those Redis's own
        election would let stand (data not too old, no `cluster-replica-no-failover`),
        the one chosen holds the most of its master's writes (so every write `WAIT`
        confirmed), the first address in string order on a tie (so every client that
        asks chooses the same)."""
        choice = takeover(name, view)
        if not choice:
            return choice is None
        try:
            offsets = await self._offsets(replicas, choice, name)
            if offsets is None:
                return False
            await asyncio.sleep(STILL_S)
            if offsets != await self._offsets(replicas, choice, name):
                return False  # the master still writes to them: not dead yet
            best = best_replica(offsets)
            if best is None:
                log.info("master %s failed: no replica of it may stand, none takes over", name)
                return True
            async with asyncio.timeout(WATCH_S):
                await replicas.node(best).execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        except _NO_ANSWER:
            return False
        except ResponseError as exc:
            # it took over already, or this Redis does not let us (ACL, renamed commands)
            log.info("asking a replica to take over from %s was refused: %s", name, exc)
            return True
        except Exception as exc:  # a shortcut only: Redis's own election goes on
            log.warning("could not have a replica take over from %s: %r", name, exc)
            return True
        log.warning(
            "master %s failed (the masters agreed): its replica %s took over at once"
            " (CLUSTER FAILOVER TAKEOVER)", name, best,
        )  # fmt: skip
        return True

    async def _offsets(
        self, replicas: _Replicas, addresses: list[str], name: str
    ) -> dict[str, int] | None:
        """`_standing` of each of the replicas at `addresses`, asked at once (None unless
        every one answered)."""
        asking = (self._standing(replicas.node(a), name) for a in addresses)
        answers = await asyncio.gather(*asking, return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, _NO_ANSWER):
                raise answer  # (a refusal: the caller gives up)
        offsets = {a: o for a, o in zip(addresses, answers, strict=True) if isinstance(o, int)}
        return offsets if len(offsets) == len(addresses) else None

    async def _standing(self, replica: ClusterNode, name: str) -> int | None:
        """How much of master `name`'s writes `replica` holds (its replication offset), if
        it still follows `name` and flags it `fail`; `NEVER` if Redis's own election would
        not let it stand (`cluster-replica-no-failover`, or its data older than
        `cluster-replica-validity-factor` allows); None if it does not answer or does not
        see the failure yet."""
        own = await self._cluster_nodes(replica) or {}
        mine = next((n for n in own.values() if "myself" in n.flags), None)
        suspect = _seen(own, name)
        if not (mine and mine.master == suspect.id and "fail" in suspect.flags):
            return None
        async with asyncio.timeout(WATCH_S):
            config = await replica.execute_command("CONFIG GET", *ELECTION_SETTINGS)
            info = await replica.execute_command("INFO", "replication")
        return replica_offset(config, info)

    def _slots_of(self, node: ClusterNode) -> frozenset[int]:
        """The slots `node` serves as far as this client knows."""
        cache = self.nodes_manager.slots_cache
        return frozenset(slot for slot, nodes in cache.items() if nodes and nodes[0] is node)

    async def refresh_slots(self) -> None:
        """Ask a live node where the slots are now (a failover may have moved them): one
        `_learn_slots` at a time, every caller waiting for it."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._learn_slots())
            self._refreshing.add_done_callback(lambda t: t.cancelled() or t.exception())
        with contextlib.suppress(*_UNREACHABLE):
            await asyncio.shield(self._refreshing)
            self._initialize = False

    async def _learn_slots(self, *args: Any, **kwargs: Any) -> None:
        """Learn the slots, not asking the nodes counted down or flagged failing (those
        still in the cluster are learnt again). redis-py asks the nodes it knows in a
        random order until one answers, and a dead one before a live one costs a connect
        timeout (a host whose link is down sends no refusal) with every command of the
        process waiting, its beats and lease renewals too: after its own failures only
        the node that failed goes last."""
        known = self.nodes_manager.startup_nodes
        if self.nodes_manager._dynamic_startup_nodes:  # else they are not learnt again
            for name in {*self.down, *self.failing} & set(known):
                if len(known) > 1:
                    self._close_if_dropped(known.pop(name))
        await self.nodes_manager.initialize(*args, **kwargs)

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


def seen(task: asyncio.Future[Any]) -> None:
    """A done callback that marks a background task's failure as seen (awaiting the task
    still raises it). A claim pass's failure is logged by the reader when it ends; a reader
    stopped or dropped first has nothing to report, and asyncio would log the failure,
    traceback and all, whenever the task is collected (in whatever code runs then)."""
    if not task.cancelled():
        task.exception()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class _Seen(NamedTuple):
    """One node in a CLUSTER NODES answer."""

    #: its flags (master, fail, fail?...)
    flags: AbstractSet[str]
    #: when the node asked last heard from it (pong-recv, ms on that node's clock; 0: not
    #: known)
    pong: int
    #: whether it serves slots
    serves: bool
    #: its node id
    id: str = ""
    #: the node id of the master it replicates ("" for a master)
    master: str = ""


def _nodes(raw: Any) -> dict[str, _Seen]:
    """A CLUSTER NODES answer, per node (host:port)."""
    if isinstance(raw, dict):
        fields = ("flags", "last_pong_rcvd", "slots", "node_id", "master_id")
        rows = [(str(a), *(n.get(f, "") for f in fields)) for a, n in raw.items()]
        rows = [(a, str(f), p or 0, bool(s), str(i), str(m or "-")) for a, f, p, s, i, m in rows]
    else:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        words = [w for w in map(str.split, text.splitlines()) if len(w) > 5]
        rows = [(w[1], w[2], w[5], len(w) > 8, w[0], w[3]) for w in words]
    out = {}
    for address, flags, pong, serves, node_id, master in rows:
        with contextlib.suppress(ValueError):
            out[address.split("@")[0]] = _Seen(
                set(flags.split(",")), int(pong), serves, node_id, "" if master == "-" else master
            )
    return out


def _failing(raw: Any) -> dict[str, bool]:
    """The nodes (host:port) a CLUSTER NODES answer flags failing: True where the masters
    agreed (`fail`), False where only the one asked suspects it (`fail?`)."""
    return _flagged(_nodes(raw))


def _flagged(nodes: dict[str, _Seen]) -> dict[str, bool]:
    """`_failing` of an answer already read: `fail?` is a node the one asked has not heard
    from for the node timeout, `fail` one the masters agreed has failed."""
    return {name: "fail" in n.flags for name, n in nodes.items() if {"fail", "fail?"} & n.flags}


#: What decides whether Redis's own election lets a replica stand: an operator's veto, and
#: how old its data may be (`cluster-replica-validity-factor` node timeouts, plus the
#: replication ping period; a factor of 0: any age).
ELECTION_SETTINGS = (
    "cluster-replica-no-failover",
    "cluster-replica-validity-factor",
    "cluster-node-timeout",
    "repl-ping-replica-period",
)
#: `replica_offset` of a replica that may not stand.
NEVER = -1
#: How long the replicas' offsets must stand still before one takes over (s): a master
#: the others flag `fail` but that still writes to its replicas is not dead.
STILL_S = 0.05


def replica_offset(config: Mapping[str, Any], info: Mapping[str, Any]) -> int:
    """A replica's replication offset from its CONFIG GET of `ELECTION_SETTINGS` and its
    INFO replication, or `NEVER` where Redis's own election would not let it stand: an
    operator's `cluster-replica-no-failover`, or data older than the validity factor
    allows (the age as Redis reckons it: since the link went down, or since the master
    last spoke, less the node timeout)."""
    if str(config.get("cluster-replica-no-failover")) != "no":
        return NEVER
    timeout_ms = int(config.get("cluster-node-timeout", 0))
    factor = int(config.get("cluster-replica-validity-factor", 0))
    ping_ms = int(config.get("repl-ping-replica-period", 10)) * 1000
    if info.get("master_link_status") == "up":
        age_ms = int(info.get("master_last_io_seconds_ago", 0)) * 1000
    else:
        age_ms = int(info.get("master_link_down_since_seconds", 0)) * 1000
    if factor and age_ms - timeout_ms > ping_ms + timeout_ms * factor:
        return NEVER
    return int(info.get("slave_repl_offset", 0))


def best_replica(offsets: Mapping[str, int]) -> str | None:
    """The replica (host:port) with the highest offset, then the first address in string
    order (every client chooses the same); None if none may stand."""
    ranked = sorted(offsets, key=lambda a: (-offsets[a], a))
    return ranked[0] if ranked and offsets[ranked[0]] != NEVER else None


#: A node an answer does not name: neither failing nor serving slots.
_GONE = _Seen(frozenset(), 0, False)


def _seen(view: Mapping[str, _Seen] | None, name: str) -> _Seen:
    """Node `name` in a CLUSTER NODES answer (`_GONE` if not there, or no answer)."""
    return (view or {}).get(name, _GONE)


class _Replicas:
    """A probe's connections to a dead master's replicas (`AgonCluster._hasten`): made once
    a spell, closed when it ends."""

    def __init__(self, connection: Mapping[str, Any]) -> None:
        self.connection = connection
        self.nodes: dict[str, ClusterNode] = {}

    def node(self, address: str) -> ClusterNode:
        if address not in self.nodes:
            host, _, port = address.rpartition(":")
            self.nodes[address] = ClusterNode(host, int(port), REPLICA, **self.connection)
        return self.nodes[address]

    async def close(self) -> None:
        nodes, self.nodes = list(self.nodes.values()), {}
        await asyncio.gather(*(n.disconnect() for n in nodes), return_exceptions=True)


def takeover(name: str, view: dict[str, _Seen]) -> list[str] | None:
    """The replicas (host:port) to ask before one takes over from master `name` at once,
    from CLUSTER NODES as a live master sees it: every one but those the masters agreed
    failed, once the master is flagged `fail` (the masters agreed) and no replica is only
    suspected (`fail?`: it may hold what `WAIT` confirmed; Redis's election would still
    let it stand); [] not yet. None: never (`name` serves no slot, or has no replica)."""
    suspect = _seen(view, name)
    replicas = sorted(a for a, n in view.items() if suspect.id and n.master == suspect.id)
    if not (suspect.serves and replicas):
        return None
    if "fail" not in suspect.flags or any("fail?" in view[a].flags for a in replicas):
        return []
    return [a for a in replicas if "fail" not in view[a].flags]


class _NodeIsolated(PipelineStrategy):
    """A cluster pipeline whose commands go to their nodes at once, each node's on its own:
    a node that fails fails only its commands (see `AgonCluster`), and with `patience`
    one that is slow to answer too (`patient_pipeline`)."""

    def __init__(self, pipe: ClusterPipeline) -> None:
        super().__init__(pipe)
        self.patience: Patience | None = None

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        client = self._pipe.cluster_client
        assert isinstance(client, AgonCluster)
        stack, todo = list(self._command_queue), list(self._command_queue)
        try:
            failed: set[str] = set()  # nodes that failed in this call: not asked again
            for _ in range(1 + client.retry.get_retries()):
                if client._initialize:
                    await client.refresh_slots()
                live: dict[asyncio.Task[None], tuple[ClusterNode | None, list[Any]]] = {}
                for node, cmds in await self._by_node(client, todo):
                    if node is not None and (node.name in failed or client.is_down(node)):
                        for cmd in cmds:
                            cmd.result = RedisConnectionError(f"node {node.name} is down")
                    else:
                        send = self._send(client, node, cmds, allow_redirections, failed)
                        live[asyncio.ensure_future(send)] = (node, cmds)
                await self._answered(live)
                todo = [
                    cmd
                    for cmd in todo
                    if isinstance(cmd.result, _RESEND) and not isinstance(cmd.result, NodeTooSlow)
                ]
                if not (todo and live):
                    break
                await asyncio.sleep(RESEND_PAUSE_S)
            if raise_on_error:
                for cmd in stack:
                    if isinstance(cmd.result, Exception):
                        self._annotate_exception(cmd.result, cmd.position + 1, cmd.args)  # type: ignore[no-untyped-call]
                        raise cmd.result
            return [cmd.result for cmd in stack]
        finally:
            await self.reset()  # type: ignore[no-untyped-call]

    async def _answered(
        self, sends: dict[asyncio.Task[None], tuple[ClusterNode | None, list[Any]]]
    ) -> None:
        """Wait for each node's send; with `patience`, a node still silent after the time
        it allows has its commands fail with `NodeTooSlow`, and is asked whether it is
        there (`node_failed`: one that does not answer a PING is counted down, so that
        the next batches need not wait for it)."""
        if self.patience is None:
            await asyncio.gather(*sends)
            return
        for task in sends:
            task.add_done_callback(seen)  # each one's failure is read below, or not needed
        late = await patiently(sends, self.patience)
        for task in late:
            node, cmds = sends[task]
            for cmd in cmds:
                cmd.result = NodeTooSlow(f"node {node.name if node else '?'} answered too late")
            client = self._pipe.cluster_client
            if node is not None and isinstance(client, AgonCluster):
                client.node_failed(node)
        for task in sends.keys() - late:
            task.result()  # what the stock gather would raise

    @staticmethod
    async def _by_node(
        client: AgonCluster, cmds: list[PipelineCommand]
    ) -> list[tuple[ClusterNode | None, list[PipelineCommand]]]:
        """The commands by the node serving their slot (None: keyless, the stock way)."""
        by_name: dict[str | None, tuple[ClusterNode | None, list[PipelineCommand]]] = {}
        for cmd in cmds:
            node: ClusterNode | None
            try:
                node = client.nodes_manager.get_node_from_slot(
                    await client._determine_slot(*cmd.args)
                )
            except (RedisClusterException, SlotNotCoveredError, ValueError):
                node = None
            by_name.setdefault(node.name if node else None, (node, []))[1].append(cmd)
        return list(by_name.values())

    async def _send(
        self,
        client: AgonCluster,
        node: ClusterNode | None,
        cmds: list[PipelineCommand],
        allow_redirections: bool,
        failed: set[str],
    ) -> None:
        """Send one node's commands; their results (or errors) land on them; a node whose
        connection fails joins `failed` (and the slots are learnt again)."""
        for cmd in cmds:
            cmd.result = None
        try:
            if node is None:
                await self._execute(
                    client, cmds, raise_on_error=False, allow_redirections=allow_redirections
                )
            elif await node.execute_pipeline(cmds) and allow_redirections:
                # Routed once, here; what met a redirection goes alone, as the stock does.
                for cmd in cmds:
                    if isinstance(cmd.result, MovedError | AskError):
                        try:
                            cmd.result = await client.execute_command(*cmd.args, **cmd.kwargs)
                        except Exception as exc:
                            cmd.result = exc
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            error = exc if isinstance(exc, _RESEND) else RedisConnectionError(str(exc))
            for cmd in cmds:
                if cmd.result is None or isinstance(cmd.result, BaseException):
                    cmd.result = error
            if node is not None:
                failed.add(node.name)
                client.node_failed(node)
            client._initialize = True
        except (ClusterDownError, SlotNotCoveredError, TryAgainError) as exc:
            for cmd in cmds:
                if cmd.result is None:
                    cmd.result = exc
            client._initialize = True


#: How long a cluster client waits to connect to a node: a host that went away (its link
#: down: no refusal comes back) must not hold every command that touches it for the
#: system's connect timeout, while its replica takes over.
NODE_CONNECT_TIMEOUT_S = 1.0
#: How long a cluster client waits for a node's answer: longer than any command Agon sends
#: may take (a blocking read or a WAIT: 1 s), shorter than redis-py's 5 s, which a dead
#: host's established connections waited out before their commands failed.
NODE_READ_TIMEOUT_S = 1.5


def cluster_client(url: str, **kwargs: Any) -> RedisCluster:
    """A Redis Cluster client that follows MOVED/ASK and refreshes its slots after failover."""
    kwargs.setdefault("retry", _retry())
    kwargs.setdefault("socket_connect_timeout", NODE_CONNECT_TIMEOUT_S)
    kwargs.setdefault("socket_timeout", NODE_READ_TIMEOUT_S)
    return AgonCluster.from_url(url, **kwargs)


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


def is_cluster(client: Client) -> TypeGuard[RedisCluster]:
    return isinstance(client, RedisCluster)


async def pause_after_failure(client: Client, seconds: float) -> None:
    """The pause before a command that failed for Redis is tried again: `seconds`, or on a
    cluster only until every node found failing answers again or its replica took over
    (at least `RESEND_PAUSE_S`): a failover costs each reader the failover, not the
    failover and a pause. A failure just after the last such node was found back or
    replaced (`JUST_SETTLED_S`) is one of that failover's (a command that waited for the
    probe and failed as it ended): `RESEND_PAUSE_S` too, not `seconds`."""
    probes = list(client.probes.values()) if isinstance(client, AgonCluster) else []
    if not probes:
        settled = isinstance(client, AgonCluster) and (
            time.monotonic() - client.settled_at < JUST_SETTLED_S
        )
        await asyncio.sleep(RESEND_PAUSE_S if settled else seconds)
        return
    began = time.monotonic()
    await asyncio.wait(probes, timeout=seconds)
    await asyncio.sleep(max(0.0, RESEND_PAUSE_S - (time.monotonic() - began)))


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
