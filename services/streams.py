"""Consumer groups over several streams: the reader, and the loop every reader runs.

The engine service, the projector, the dispatcher and the bot workers all read streams the
same way: one consumer group, a process-unique consumer name, XREADGROUP in batches over
every stream they serve, and XAUTOCLAIM of entries another consumer of the group took and
never acknowledged (it died). An entry is acknowledged only after its effect is written, so
a crash redelivers it; the readers' effects are idempotent, which makes that exactly once in
effect. `GroupReader.read(block_ms=None)` never waits, which is the drain ("burst") mode of
tests and benchmarks. `StreamConsumer` is the loop around a reader: serve until stopped or
drain, retry a batch when Redis is away, and set aside (dead-letter, then acknowledge) an
entry that fails on its own, so that one bad entry never stalls a consumer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schemas.codec import FIELD, FIELD_BYTES

log = logging.getLogger("agon.streams")

#: Errors that say Redis is away for a moment, not that an entry is bad: retry the batch.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError)
#: The pause after a failed batch, so that a Redis that is down is not hammered.
RETRY_PAUSE_S = 0.5
#: Set-aside entries are kept for inspection, capped so a flood of them cannot fill Redis.
DEAD_LETTER_MAXLEN = 10_000


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch, the unit of event times and deadlines."""
    return time.time_ns() // 1_000_000


def as_text(value: bytes | str) -> str:
    """A stream name, entry id or member as str (redis-py returns bytes)."""
    return value.decode() if isinstance(value, bytes) else value


def consumer_name(role: str) -> str:
    """A name no other live consumer has: role, host, pid and a random suffix."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry as a reader got it."""

    stream: str
    entry_id: bytes
    #: The encoded model in field `m`, or None when the entry has no such field.
    data: bytes | None


async def ensure_group(redis: Redis, stream: str, group: str, start: str = "0") -> None:
    """Create a consumer group (and its stream) unless it exists."""
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class GroupReader:
    """Reads `streams` as consumer `consumer` of `group`; reclaims idle pending entries.

    `claim_idle_ms` is how long an entry may sit unacknowledged with another consumer
    before this one takes it over; `claim_every_s` spaces the XAUTOCLAIM sweeps.
    """

    def __init__(
        self,
        redis: Redis,
        streams: Sequence[str],
        group: str,
        consumer: str,
        *,
        count: int = 500,
        claim_idle_ms: int = 30_000,
        claim_every_s: float = 5.0,
    ) -> None:
        self.redis = redis
        self.streams = list(streams)
        self.group = group
        self.consumer = consumer
        self.count = count
        self.claim_idle_ms = claim_idle_ms
        self.claim_every_s = claim_every_s
        self._next_claim = 0.0
        self._ready = False
        self._recovering = False

    async def setup(self) -> None:
        for stream in self.streams:
            await ensure_group(self.redis, stream, self.group)
        self._ready = True

    async def read(self, block_ms: int | None = None, *, reclaim: bool = False) -> list[Entry]:
        """The next batch: reclaimed entries first, then new ones (waiting up to `block_ms`).

        Reclaiming runs every `claim_every_s`, or now when `reclaim` is set (drain mode).
        """
        try:
            return await self._read(block_ms, reclaim)
        except ResponseError as exc:
            if "NOGROUP" in str(exc):
                # The stream went away with its group (Redis lost its data, or someone
                # deleted it): make the groups again on the next read.
                self._ready = False
            raise

    async def _read(self, block_ms: int | None, reclaim: bool) -> list[Entry]:
        if not self._ready:
            await self.setup()
        if self._recovering:
            own = await self._own_pending()
            if own:
                return own
            self._recovering = False
        now = time.monotonic()
        if reclaim or now >= self._next_claim:
            self._next_claim = now + self.claim_every_s
            claimed = await self.reclaim()
            if claimed:
                return claimed
        raw: Any = await self.redis.xreadgroup(
            self.group,
            self.consumer,
            dict.fromkeys(self.streams, ">"),
            count=self.count,
            block=block_ms,
        )
        return _entries(raw)

    def recover(self) -> None:
        """After a failed batch: read this consumer's own pending entries again first.

        XREADGROUP ">" never redelivers them to their owner; without this they would wait
        for another consumer's claim sweep.
        """
        self._recovering = True

    async def _own_pending(self) -> list[Entry]:
        raw: Any = await self.redis.xreadgroup(
            self.group, self.consumer, dict.fromkeys(self.streams, "0"), count=self.count
        )
        return _entries(raw)

    async def reclaim(self, min_idle_ms: int | None = None) -> list[Entry]:
        """Take over entries pending with any consumer for at least `min_idle_ms`.

        One pipelined XAUTOCLAIM per stream per round, so an idle sweep costs one trip.
        """
        idle = self.claim_idle_ms if min_idle_ms is None else min_idle_ms
        out: list[Entry] = []
        cursors: dict[str, Any] = dict.fromkeys(self.streams, "0-0")
        while cursors and len(out) < self.count:
            pipe = self.redis.pipeline(transaction=False)
            for stream, start in cursors.items():
                pipe.xautoclaim(stream, self.group, self.consumer, idle, start, count=self.count)
            results: list[Any] = await pipe.execute()
            following: dict[str, Any] = {}
            for stream, result in zip(cursors, results, strict=True):
                # XAUTOCLAIM returns deleted entries as (id, None); they can only be acked.
                out.extend(Entry(stream, eid, _field(fields)) for eid, fields in result[1])
                if as_text(result[0]) != "0-0":
                    following[stream] = result[0]
            cursors = following
        return out

    async def leave(self) -> None:
        """Deregister this consumer from its groups, where it holds nothing pending.

        A consumer with pending entries stays, so that another one can claim them.
        """
        for stream in self.streams:
            try:
                consumers: Any = await self.redis.xinfo_consumers(stream, self.group)
            except ResponseError:
                continue  # no such stream or group any more
            for c in consumers:
                if as_text(c["name"]) == self.consumer and int(c["pending"]) == 0:
                    await self.redis.xgroup_delconsumer(stream, self.group, self.consumer)

    async def ack(self, entries: Sequence[Entry]) -> None:
        by_stream: dict[str, list[bytes]] = {}
        for e in entries:
            by_stream.setdefault(e.stream, []).append(e.entry_id)
        if not by_stream:
            return
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.group, *ids)
        await pipe.execute()


def _entries(raw: Any) -> list[Entry]:
    """The entries of an XREADGROUP answer, stream by stream."""
    return [
        Entry(as_text(stream), entry_id, _field(fields))
        for stream, entries in raw or ()
        for entry_id, fields in entries
    ]


def _field(fields: dict[bytes, bytes] | None) -> bytes | None:
    if not fields:
        return None
    return fields.get(FIELD_BYTES)


class StreamConsumer:
    """The loop of one group reader: `run` until stopped, or `drain` what is there.

    A subclass sets `redis`, `reader`, `block_ms` and `dead_letter` (the stream for entries
    set aside) and implements `process(entries)`, which writes the batch's effects and then
    acknowledges it. `forget()` drops caches a failed batch may have left half-updated;
    `tick()` is periodic work done after every batch of `run`.
    """

    redis: Redis
    reader: GroupReader
    block_ms: int
    dead_letter: str
    #: entries set aside because they failed on their own
    entries_set_aside: int = 0

    async def process(self, entries: Sequence[Entry]) -> None:
        """Write the effects of a batch, then acknowledge it."""
        raise NotImplementedError

    def forget(self) -> None:
        """Drop cached state after a failed batch (default: nothing is cached)."""

    async def tick(self) -> None:
        """Periodic work of `run`, after every batch (default: none)."""

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set; no failure ends the loop."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.handle(await self.reader.read(self.block_ms))
                await self.tick()
            except Exception:
                # Redis is away, or something failed outside any one entry. The batch is
                # still pending with this consumer: read it again first, nothing is lost.
                log.exception("%s: batch failed; retrying", self.reader.consumer)
                self.reader.recover()
                self.forget()
                await asyncio.sleep(RETRY_PAUSE_S)

    async def drain(self) -> int:
        """Handle everything there is (and what idle dead consumers left); return how many."""
        handled = 0
        while True:
            entries = await self.reader.read(None, reclaim=not handled)
            if not entries:
                return handled
            handled += len(entries)
            await self.handle(entries)

    async def handle(self, entries: Sequence[Entry]) -> None:
        """`process` the batch; when it fails but Redis is fine, entry by entry.

        Retrying a batch that fails for its content would fail forever and stall every
        entry behind it; taken one at a time, only an entry that fails alone is set aside.
        """
        try:
            await self.process(entries)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            self.forget()
            if not entries:
                raise
            if len(entries) == 1:
                await self.set_aside(entries[0], exc)
                return
            log.warning("%s: a batch failed (%r); one entry at a time", self.reader.consumer, exc)
            for entry in entries:
                await self.handle([entry])

    async def set_aside(self, entry: Entry, exc: Exception) -> None:
        """Copy an entry nobody can handle to the dead letters, then acknowledge it."""
        log.error(
            "%s: entry %s of %s fails on its own (%r); dead-lettered to %s",
            self.reader.consumer,
            as_text(entry.entry_id),
            entry.stream,
            exc,
            self.dead_letter,
            exc_info=exc,
        )
        fields: dict[Any, Any] = {
            FIELD: entry.data or b"",
            "reason": repr(exc)[:1000],
            "stream": entry.stream,
            "id": entry.entry_id,
            "group": self.reader.group,
            "consumer": self.reader.consumer,
        }
        # Two trips on purpose: the acknowledgement only after the copy is written.
        await self.redis.xadd(self.dead_letter, fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        await self.reader.ack([entry])
        self.entries_set_aside += 1
