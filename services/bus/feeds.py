"""Following every partition's feed without a consumer group: each follower sees every event.

The gateway fans live events out to its sockets this way: every gateway process follows
all feeds on its own while anybody listens there (`services.gateway.live.Hub`). A single
server is read with one blocking XREAD over every feed; on a cluster, where one command
may not name two slots, each partition gets its own blocking read, fanned into one queue.
A follower that loses its connection reads on from the last entry it saw, so it misses
nothing that the feeds still hold; consumers fill any gap from the game's log anyway, by
seq.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

from schemas.codec import FIELD_BYTES
from services.bus.connection import TRANSIENT_ERRORS, Client, is_cluster, pause_after_failure
from services.bus.keys import Keys
from services.bus.text import as_text

log = logging.getLogger("agon.bus")

RETRY_PAUSE_S = 0.5


class FeedTail:
    """`async for batch in FeedTail(redis, keys).follow(stop)`: lists of event bytes."""

    def __init__(self, redis: Client, keys: Keys, *, block_ms: int = 1000, count: int = 500):
        self.redis = redis
        self.keys = keys
        self.block_ms = block_ms
        self.count = count
        #: the last entry id seen per feed; "$" until the first read fixes where to start
        self.last: dict[str, str] = {}

    async def start_here(self) -> None:
        """Fix the starting point at each feed's current end: what is appended later is seen."""
        pipe = self.redis.pipeline(transaction=False)
        feeds = [self.keys.feed(p) for p in self.keys.all_partitions()]
        for feed in feeds:
            pipe.xrevrange(feed, count=1)
        for feed, rows in zip(feeds, await pipe.execute(), strict=True):
            self.last[feed] = as_text(rows[0][0]) if rows else "0-0"

    async def follow(self, stop: asyncio.Event) -> AsyncGenerator[list[bytes], None]:
        """Batches of events until `stop`, an empty one after each quiet `block_ms` (so the
        follower may decide to stop: closing the generator ends its reads)."""
        if not self.last:
            await self.start_here()
        if not is_cluster(self.redis):
            while not stop.is_set():
                yield await self._read(dict(self.last))
            return
        queue: asyncio.Queue[list[bytes]] = asyncio.Queue(maxsize=64)
        done = asyncio.Event()
        lanes = [asyncio.create_task(self._lane(feed, queue, stop, done)) for feed in self.last]
        try:
            while not stop.is_set():
                try:
                    yield await asyncio.wait_for(queue.get(), self.block_ms / 1000)
                except TimeoutError:
                    yield []
        finally:
            # The follower stopped: each lane ends after its blocking read (a read cancelled
            # mid-way costs its connection); the gateway stopping cancels them at once.
            done.set()
            try:
                if not stop.is_set():
                    await asyncio.wait(lanes, timeout=self.block_ms / 1000 + 1.0)
            finally:
                for lane in lanes:
                    lane.cancel()
                await asyncio.gather(*lanes, return_exceptions=True)

    async def _lane(
        self,
        feed: str,
        queue: asyncio.Queue[list[bytes]],
        stop: asyncio.Event,
        done: asyncio.Event,
    ) -> None:
        while not (stop.is_set() or done.is_set()):
            try:
                batch = await self._read({feed: self.last[feed]})
            except Exception as exc:  # a lane that dies would silence its partition
                log.warning("feed tail of %s failed (%s); retrying", feed, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if batch and not done.is_set():
                await queue.put(batch)

    async def _read(self, streams: dict[Any, Any]) -> list[bytes]:
        try:
            reply: Any = await self.redis.xread(streams, count=self.count, block=self.block_ms)
        except TRANSIENT_ERRORS as exc:
            log.warning("feed tail: Redis unavailable (%s); retrying", exc)
            await pause_after_failure(self.redis, RETRY_PAUSE_S)
            return []
        out: list[bytes] = []
        for stream, entries in reply or ():
            for entry_id, fields in entries:
                self.last[as_text(stream)] = as_text(entry_id)
                data = fields.get(FIELD_BYTES)
                if data is not None:
                    out.append(data)
        return out
