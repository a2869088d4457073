"""Live events for this gateway's sockets and streams: one feed follower, many listeners.

`Hub.run` follows every partition's feed (`services.bus.feeds.FeedTail`) and hands each
event to the listeners of its game, once per event however many listen: a `LiveEvent`
encodes itself for a socket or an NDJSON line once, on first use, and every listener
shares that text. A listener keeps what it has not sent yet, up to `QUEUE_SIZE`; beyond
that, or when an event arrives out of order (a feed entry missed while Redis was away),
the listener's owner reads the gap from the game's log (`catch_up`), so a client gets
every event once, in order. Listeners of "every ended game" let bot streams tell outside
bots their results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from schemas.api import EventMessage
from schemas.codec import DecodeError, unpack
from services.bus.clients import QueryClient
from services.bus.feeds import FeedTail
from services.export import export_line

log = logging.getLogger("agon.gateway")

#: Events a listener holds for its socket before it is told to catch up from the log.
QUEUE_SIZE = 256


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
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.woken.wait(), timeout_s)
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
    """Told of every game that ends: (game id, the game_ended event's map)."""

    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_SIZE)
    )


class Hub:
    def __init__(self, tail: FeedTail) -> None:
        self.tail = tail
        self.games: dict[str, set[Listener]] = defaultdict(set)
        self.ended: set[EndedListener] = set()
        self.events_seen = 0

    def listen(self, game_id: str) -> Listener:
        listener = Listener(game_id)
        self.games[game_id].add(listener)
        return listener

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
        """Follow the feeds until `stop`, from where `tail.start_here` fixed the start (the
        app calls it before serving); a failure is logged and the following resumes."""
        while not stop.is_set():
            try:
                await self._follow(stop)
            except Exception as exc:
                log.warning("gateway feed follower failed (%s); resuming in 1 s", exc)
                await asyncio.sleep(1.0)

    async def _follow(self, stop: asyncio.Event) -> None:
        async for batch in self.tail.follow(stop):
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
                if ev.get("type") == "game_ended":
                    for ended in self.ended:
                        with contextlib.suppress(asyncio.QueueFull):
                            ended.queue.put_nowait((game_id, ev))
