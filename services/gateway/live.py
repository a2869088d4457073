"""Live events for this gateway's sockets and streams: one feed follower, many listeners.

`Hub.run` follows every partition's feed (`services.bus.feeds.FeedTail`) while anybody
listens here (a gateway nobody listens to reads none), and hands each event to the
listeners of its game, once per event however many listen: a `LiveEvent` encodes itself
for a socket or an NDJSON line once, on first use, and every listener shares that text.
A listener keeps what it has not sent yet, up to `QUEUE_SIZE`; beyond that, or when an
event arrives out of order (a feed entry missed while Redis was away), the listener's
owner reads the gap from the game's log (`catch_up`), so a client gets every event once,
in order. A bot stream's `EndedListener` is told of the games that seat its bot (from their
`game_created` events, or as the stream learns of them) and of their ends, so that every
outside bot hears how each of its games ended.

Outside bots' turns come the same way: one `TurnReader` per gateway reads the inboxes of
the bots that have a stream here and hands each entry to that bot's `InboxListener`s
(`services.gateway.turns` serves the streams), so no stream holds a Redis connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from schemas.api import EventMessage
from schemas.codec import DecodeError, unpack
from services.bus.clients import QueryClient
from services.bus.connection import TRANSIENT_ERRORS, Client, pause_after_failure
from services.bus.delivery import Lag
from services.bus.feeds import FeedTail
from services.bus.keys import WORKERS_GROUP, Keys
from services.bus.presence import EVERY_S, beat_many, beat_value, forget
from services.bus.registry import BotRegistry
from services.bus.text import as_text
from services.gamelog.export import export_line

log = logging.getLogger("agon.gateway")

#: Events a listener holds for its socket before it is told to catch up from the log.
QUEUE_SIZE = 256
#: Ends of a bot's games a stream holds before it asks the views instead.
ENDED_QUEUE_SIZE = 1_024
#: How often the hub wakes the listeners whose quiet wait is over: one clock for all of
#: them, rather than a timer per wait (with a thousand sockets on a game, setting and
#: cancelling a timer per event and socket cost a fifth of the fan-out).
QUIET_TICK_S = 0.25
#: How long a bot stream that wakes an idle hub waits for it to follow the feeds before it
#: searches for its games (the hub tells it of those created from then on).
WAKE_WAIT_S = 5.0

#: How long a gateway trusts a bot key it has looked up: a key rotated or revoked elsewhere
#: (another gateway, the CLI) is refused here, and its streams end, within this.
KEY_CACHE_S = 5.0
#: Key hashes looked up per HMGET when the reader checks its streams' keys.
KEYS_PER_CHECK = 1_000
#: A single server's inbox read blocks this long at most: a bot whose first stream opens
#: meanwhile is read from the next call on (its waiting turns were sent on connect).
BLOCK_MS = 500
#: On a cluster the inboxes are polled this often when nothing came.
POLL_S = 0.1
#: Inbox entries read per inbox per call.
READ_COUNT = 100
RETRY_PAUSE_S = 0.5
#: Inbox entries a listener holds for its stream; beyond that it looks for its turns anew.
INBOX_QUEUE_SIZE = 256
#: Streams whose connect-time search (a few reads each) runs at once: a burst of connecting
#: streams queues here instead of opening a Redis connection each.
OPENING_AT_ONCE = 8


async def woken_within(woken: asyncio.Event, timeout_s: float) -> None:
    """Wait until `woken` is set or `timeout_s` has passed. A timer on the waiting task
    rather than `wait_for`, which makes a task per wait: a game with a thousand sockets
    wakes a thousand waiters per event, and the tasks were most of the fan-out's cost."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await woken.wait()


class LiveEvent:
    """One logged event as the gateway sends it, encoded once for all its listeners."""

    __slots__ = ("__dict__", "data", "seq")

    def __init__(self, seq: int, data: bytes) -> None:
        self.seq = seq
        self.data = data

    @cached_property
    def event(self) -> dict[str, Any]:
        return unpack(self.data)

    @cached_property
    def socket_text(self) -> str:
        return EventMessage(seq=self.seq, event=self.event).model_dump_json()

    @cached_property
    def ndjson_line(self) -> bytes:
        return (export_line(self.data) + "\n").encode()

    @property
    def ends_game(self) -> bool:
        return self.event.get("type") == "game_ended"


@dataclass(eq=False)
class Listener:
    """One socket's or stream's interest in a game."""

    game_id: str
    pending: list[LiveEvent] = field(default_factory=list)
    overflowed: bool = False
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    #: whether a running hub's clock ends this listener's quiet waits (else a timer each)
    clocked: bool = False
    #: the loop time at which a waiting `take` gives up (inf while it is not waiting)
    quiet_until: float = math.inf

    def deliver(self, event: LiveEvent) -> None:
        if len(self.pending) >= QUEUE_SIZE:
            self.pending.clear()
            self.overflowed = True  # the owner reads the log instead
        else:
            self.pending.append(event)
        self.woken.set()

    async def take(self, timeout_s: float) -> tuple[list[LiveEvent], bool]:
        """The events delivered since the last take, and whether some were dropped;
        waits up to `timeout_s` for at least one."""
        if not self.pending and not self.overflowed:
            if self.clocked:  # the hub's clock sets `woken` once `quiet_until` has passed
                self.quiet_until = asyncio.get_running_loop().time() + timeout_s
                try:
                    await self.woken.wait()
                finally:
                    self.quiet_until = math.inf
            else:
                await woken_within(self.woken, timeout_s)
        self.woken.clear()
        events, self.pending = self.pending, []
        overflowed, self.overflowed = self.overflowed, False
        return events, overflowed


async def follow(
    listener: Listener,
    query: QueryClient,
    last: int,
    send: Callable[[LiveEvent], Awaitable[None]],
    *,
    keepalive_s: float,
    on_quiet: Callable[[], Awaitable[None]] | None = None,
    until_ended: bool = False,
    alive: Callable[[], bool] = lambda: True,
) -> None:
    """Send every event after `last` in seq order, each once: first what the log holds,
    then the hub's events as they come, reading the log again for any gap. Returns after
    the game's end when `until_ended`, else until cancelled or no longer `alive()` (its
    client gone: checked at least every `keepalive_s`). The listener must be registered
    before the call, so nothing falls between the log and the hub."""
    from_log = True
    while alive():
        if from_log:
            events = [LiveEvent(e.seq, e.data) for e in await query.log(listener.game_id, last + 1)]
            from_log = False
        else:
            events, overflowed = await listener.take(keepalive_s)
            if overflowed or (events and events[0].seq > last + 1):
                from_log = True
                continue
        sent = False
        for event in events:
            if event.seq <= last:
                continue  # already sent from the log
            if event.seq > last + 1:  # a hole in what the hub delivered: the log has it
                from_log = True
                break
            await send(event)
            last, sent = event.seq, True
            if until_ended and event.ends_game:
                return
        if not sent and not from_log:
            # Quiet: a feed entry the hub missed would leave the client waiting, so ask
            # the log whether it has moved on.
            from_log = await query.head(listener.game_id) > last
            if on_quiet is not None:
                await on_quiet()


@dataclass(eq=False)
class EndedListener:
    """A bot stream's games and their ends: `games` (game id -> the bot's seat) grows as
    games that seat `bot` are created (the hub adds them) or as the stream learns of them;
    `queue` gets (game id, its game_ended event's map) for each of them that ends. Past
    `ENDED_QUEUE_SIZE` ends not yet told, `overflowed`: the stream asks the views."""

    bot: str
    games: dict[str, int] = field(default_factory=dict)
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = field(
        default_factory=lambda: asyncio.Queue(ENDED_QUEUE_SIZE)
    )
    overflowed: bool = False

    def created(self, game_id: str, ev: dict[str, Any]) -> None:
        for seat, spec in enumerate(ev.get("seats", ()), start=1):
            if spec.get("kind") == "bot" and spec.get("name") == self.bot:
                self.games.setdefault(game_id, seat)
                return

    def ended(self, game_id: str, ev: dict[str, Any]) -> None:
        if game_id in self.games:
            try:
                self.queue.put_nowait((game_id, ev))
            except asyncio.QueueFull:
                self.overflowed = True


class Hub:
    def __init__(self, tail: FeedTail) -> None:
        self.tail = tail
        self.games: dict[str, set[Listener]] = defaultdict(set)
        self.ended: set[EndedListener] = set()
        self.events_seen = 0
        #: whether `run`'s clock is going (ending the listeners' quiet waits)
        self.ticking = False
        self._listened = asyncio.Event()
        #: set while the hub follows the feeds (somebody listens)
        self.following = asyncio.Event()

    def listen(self, game_id: str) -> Listener:
        listener = Listener(game_id, clocked=self.ticking)
        self.games[game_id].add(listener)
        self._listened.set()
        return listener

    async def listen_ended(self, ended: EndedListener) -> None:
        """Tell `ended` of its bot's games created from now on: returns once the hub follows
        the feeds (a bot stream searches for its games after this, so none falls between)."""
        self.ended.add(ended)
        self._listened.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WAKE_WAIT_S):
                await self.following.wait()

    def heard(self) -> bool:
        """Whether anybody listens here (a socket, an event stream or a bot stream)."""
        return bool(self.games or self.ended)

    def unlisten(self, listener: Listener) -> None:
        listeners = self.games.get(listener.game_id)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self.games[listener.game_id]

    @property
    def listeners(self) -> int:
        return sum(len(s) for s in self.games.values())

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the feeds while anybody listens, until `stop`; a failure is logged and the
        following resumes where it was."""
        clock = asyncio.create_task(self._clock())
        try:
            while not stop.is_set():
                try:
                    await self._follow(stop)
                except Exception as exc:
                    log.warning("gateway feed follower failed (%s); resuming in 1 s", exc)
                    await asyncio.sleep(1.0)
        finally:
            clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await clock

    async def _clock(self) -> None:
        """Every `QUIET_TICK_S`, wake the listeners whose quiet wait is over. When it stops,
        its listeners go back to a timer per wait, woken now to set theirs."""
        self.ticking = True
        loop = asyncio.get_running_loop()
        try:
            while True:
                await asyncio.sleep(QUIET_TICK_S)
                now = loop.time()
                for listeners in self.games.values():
                    for listener in listeners:
                        if listener.quiet_until <= now:
                            listener.woken.set()
        finally:
            self.ticking = False
            for listeners in self.games.values():
                for listener in listeners:
                    listener.clocked = False
                    listener.woken.set()

    async def _follow(self, stop: asyncio.Event) -> None:
        """Follow the feeds while anybody listens. While nobody does, read nothing (each
        gateway reading every event would cost every gateway the whole arena's moves); the
        first listener wakes the hub, which follows on from the feeds' ends and sends each
        listener to its game's log once, for what came in between. A wake that failed is
        tried again: the hub never follows on from where it stopped long ago."""
        if not self.following.is_set():
            while True:
                self._listened.clear()
                if self.heard():
                    break
                if stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._listened.wait()
            await self.tail.start_here()
            for listeners in self.games.values():
                for listener in listeners:
                    listener.overflowed = True  # the owner reads the log
                    listener.woken.set()
            self.following.set()
        async with contextlib.aclosing(self.tail.follow(stop)) as batches:
            async for batch in batches:
                self._hand_out(batch)
                if not self.heard():
                    self.following.clear()
                    return

    def _hand_out(self, batch: list[bytes]) -> None:
        """Each event of `batch` to the listeners of its game."""
        for data in batch:
            self.events_seen += 1
            try:
                ev = unpack(data)
                game_id, seq = str(ev["game_id"]), int(ev["seq"])
            except (DecodeError, KeyError, TypeError, ValueError):
                log.warning("feed entry without game_id/seq dropped")
                continue
            listeners = self.games.get(game_id)
            if listeners:
                event = LiveEvent(seq, data)
                event.event = ev  # already unpacked: spare each listener the work
                for listener in listeners:
                    listener.deliver(event)
            kind = ev.get("type")
            if kind == "game_created":
                for ended in self.ended:
                    ended.created(game_id, ev)
            elif kind == "game_ended":
                for ended in self.ended:
                    ended.ended(game_id, ev)


# -- outside bots' inboxes -------------------------------------------------------------------
@dataclass(eq=False)
class InboxListener:
    """One stream's share of its bot's inbox: entries not sent yet, up to `INBOX_QUEUE_SIZE`."""

    bot: str
    #: the hash of the key the stream was opened with
    key_hash: str = ""
    entries: list[Any] = field(default_factory=list)
    overflowed: bool = False
    closed: bool = False
    #: closed because its key was rotated or revoked
    revoked: bool = False
    woken: asyncio.Event = field(default_factory=asyncio.Event)

    def deliver(self, entries: list[Any]) -> None:
        if len(self.entries) + len(entries) > INBOX_QUEUE_SIZE:
            self.entries.clear()
            self.overflowed = True  # the stream searches for its turns again
        else:
            self.entries.extend(entries)
        self.woken.set()

    def close(self) -> None:
        self.closed = True
        self.woken.set()

    async def take(self, timeout_s: float) -> tuple[list[Any], bool]:
        """The entries delivered since the last take, and whether some were dropped; waits
        up to `timeout_s` for at least one."""
        if not self.entries and not self.overflowed and not self.closed:
            await woken_within(self.woken, timeout_s)
        self.woken.clear()
        entries, self.entries = self.entries, []
        overflowed, self.overflowed = self.overflowed, False
        return entries, overflowed


class TurnReader:
    """The gateway's one reader of its bots' inboxes (see the module's doc)."""

    def __init__(self, redis: Client, keys: Keys, name: str, lag: Lag | None = None) -> None:
        self.redis = redis
        self.keys = keys
        self.query = QueryClient(redis, keys)
        self.registry = BotRegistry(redis, keys)
        self.name = name
        #: this gateway's delivery lag, beaten for every bot served here (admission reads it)
        self.lag = lag or Lag()
        self.bots: dict[str, set[InboxListener]] = {}
        #: bot -> the last inbox entry id read; a bot is read once its first stream set it
        self.last: dict[str, str] = {}
        self.opening = asyncio.Semaphore(OPENING_AT_ONCE)
        self.closed = False
        self.reads = 0
        self._changed = asyncio.Event()

    def listen(self, bot: str, key_hash: str) -> InboxListener:
        """A new listener of `bot`'s inbox for a stream opened with the key hashing to
        `key_hash` (closed already when the gateway is stopping)."""
        listener = InboxListener(bot, key_hash, closed=self.closed)
        self.bots.setdefault(bot, set()).add(listener)
        return listener

    def start(self, bot: str, after: str) -> None:
        """Read `bot`'s inbox after entry `after`, unless it is read already: a stream
        registers its listener before it searches for pending turns, so what arrives
        after that search reaches it either way (twice at worst; streams send a turn once)."""
        if bot in self.bots and bot not in self.last:
            self.last[bot] = after
            self._changed.set()

    def unlisten(self, listener: InboxListener) -> None:
        listeners = self.bots.get(listener.bot)
        if listeners is None:
            return
        listeners.discard(listener)
        if not listeners:
            del self.bots[listener.bot]
            self.last.pop(listener.bot, None)

    def streams(self, bot: str) -> int:
        return len(self.bots.get(bot, ()))

    def close(self) -> None:
        """End every stream now (the gateway is stopping) and refuse new ones."""
        self.closed = True
        for listeners in self.bots.values():
            for listener in listeners:
                listener.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Read and beat until `stop`; then remove the heartbeats it wrote."""
        beating = asyncio.create_task(self._beat(stop))
        try:
            while not stop.is_set():
                try:
                    await self._read_once()
                except TRANSIENT_ERRORS as exc:
                    log.warning("bot inbox reader: Redis unavailable (%s); retrying", exc)
                    await pause_after_failure(self.redis, RETRY_PAUSE_S)
                except Exception as exc:  # a reader that dies would silence every bot here
                    log.warning("bot inbox reader failed (%s); resuming", exc)
                    await asyncio.sleep(RETRY_PAUSE_S)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await beating

    async def _read_once(self) -> None:
        followed = dict(self.last)
        if not followed:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), BLOCK_MS / 1000)
            return
        self.reads += 1
        for bot, entries in await self.query.inboxes(followed, READ_COUNT, BLOCK_MS, POLL_S):
            if not entries or bot not in self.last:
                continue  # its last stream went while the read was on its way
            self.last[bot] = as_text(entries[-1][0])
            for listener in self.bots.get(bot, ()):
                listener.deliver(entries)

    async def _beat(self, stop: asyncio.Event) -> None:
        """One HSET for every bot served here, every `EVERY_S` (`services.bus.presence`: a
        beat is one field per process); a bot no longer served loses its beat."""
        beaten: set[str] = set()
        checked = time.monotonic()
        try:
            while not stop.is_set():
                if time.monotonic() - checked >= KEY_CACHE_S:
                    checked = time.monotonic()
                    with contextlib.suppress(*TRANSIENT_ERRORS):
                        await self._check_keys()
                served = set(self.bots)
                with contextlib.suppress(*TRANSIENT_ERRORS):
                    if served:
                        lag = self.lag.summary()
                        beats: dict[Any, Any] = {
                            self._consumer(bot): self._beat_of(bot, lag) for bot in served
                        }
                        await beat_many(self.redis, self.keys, beats)
                    await forget(self.redis, self.keys, map(self._consumer, beaten - served))
                    beaten = served
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), EVERY_S)
        finally:
            with contextlib.suppress(Exception):
                gone = beaten | set(self.bots)
                await forget(self.redis, self.keys, map(self._consumer, gone))

    async def _check_keys(self) -> None:
        """End the streams whose key is no longer their bot's: the keys of every stream
        here in one HMGET per `KEYS_PER_CHECK`, not a lookup per stream."""
        owners = {(l.key_hash, l.bot) for ls in self.bots.values() for l in ls}  # noqa: E741
        hashes = sorted({key_hash for key_hash, _ in owners})
        valid: dict[str, str] = {}
        for at in range(0, len(hashes), KEYS_PER_CHECK):
            chunk = hashes[at : at + KEYS_PER_CHECK]
            names = await self.registry.owners(chunk)
            valid.update((h, n) for h, n in zip(chunk, names, strict=True) if n)
        for listeners in self.bots.values():
            for listener in listeners:
                if valid.get(listener.key_hash) != listener.bot:
                    listener.revoked = True
                    listener.close()

    def _consumer(self, bot: str) -> str:
        return f"{self.name}-bot-{bot}"

    @staticmethod
    def _beat_of(bot: str, lag: dict[str, int]) -> str:
        """What a bot worker's heartbeat says, from the gateway that serves its streams."""
        return beat_value(f"bot-{bot}", WORKERS_GROUP, via="gateway", **lag)
