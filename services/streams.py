"""A consumer-group reader over several streams: batches, reclaiming and acknowledging.

The projector, the dispatcher and the bot workers all read streams the same way: one
consumer group, a process-unique consumer name, XREADGROUP in batches over every stream
they serve, and XAUTOCLAIM of entries another consumer of the group took and never
acknowledged (it died). An entry is acknowledged only after its effect is written, so a
crash redelivers it; the readers' effects are idempotent, which makes that exactly once in
effect. `read(block_ms=None)` never waits, which is the drain ("burst") mode of tests and
benchmarks: loop until it returns nothing.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from schemas.codec import FIELD_BYTES


def consumer_name(role: str) -> str:
    """A name no other live consumer has: role, host, pid and a random suffix."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True, slots=True)
class Entry:
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
        return [
            Entry(_text(stream), entry_id, _field(fields))
            for stream, entries in raw or ()
            for entry_id, fields in entries
        ]

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
        return [
            Entry(_text(stream), entry_id, _field(fields))
            for stream, entries in raw or ()
            for entry_id, fields in entries
        ]

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
                if _text(result[0]) != "0-0":
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
                if _text(c["name"]) == self.consumer and int(c["pending"]) == 0:
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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(fields: dict[bytes, bytes] | None) -> bytes | None:
    if not fields:
        return None
    return fields.get(FIELD_BYTES)
