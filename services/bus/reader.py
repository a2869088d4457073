"""The group reader: one consumer group over partition streams, read, claimed and acknowledged.

`GroupReader` is what every consumer loop (`services.bus.consumer`) reads with: one consumer
group, a process-unique consumer name, batches of entries (`Entry`: stream, id and the
encoded model), each acknowledged by `ack` after its effect is written. `ensure_group`
creates a group and its stream; `trim_acknowledged` drops what every group has acknowledged.

`GroupReader` never names two hash slots in one command, so it works on a Redis Cluster,
where each partition is its own slot. A single server has no slots, and one XREADGROUP
over every stream serves all partitions in one round trip with whole batches (one lane per
stream costs a third of the throughput there, measured). On a cluster, reads that do not
wait go stream by stream in one pipeline, and waiting uses one blocking XREADGROUP per
stream ("lanes", each on its own connection), fanned into one buffer; a lane holds at most
one unread batch. `read(None)` never waits: the drain ("burst") mode of tests and benchmarks.
On a single server a consumer reads its next batch in the round trip of its batch's last
write (`read_ahead`): the engine's commit, everyone else's `ack`.

Dead consumers are noticed in about a second, not minutes: every running consumer beats
(`services.bus.presence`) every 0.175 s; a sweep every half second claims (XCLAIM)
entries pending with a consumer that is not alive by its beat (none for `ALIVE_MS`, 0.7 s),
and another sweep comes as soon as a consumer holding entries (fresh ones too) would die
by its beat, or a master that was away answers again (`claim_at`), so a killed bot
worker's turn is answered by another well inside a 2 s move clock.
Housekeeping removes dead consumers that hold nothing from the group; the sweep sets
aside another consumer's entries delivered `max_deliveries` times (they kill whoever takes
them; a consumer's own reads of its entries after failed batches do not count). Entries
idle for `claim_idle_ms` are claimed too, from a stuck process that still beats or from
this consumer itself (a read whose answer was lost on a dropped connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from schemas.codec import FIELD_BYTES
from services.bus.cache import LRU
from services.bus.connection import (
    RETRIED_ERRORS,
    TRANSIENT_ERRORS,
    Client,
    is_cluster,
    pause_after_failure,
    seen,
)
from services.bus.presence import (
    ALIVE_MS,
    Beat,
    Sight,
    alive,
    ask_each,
    group_rows,
    group_totals,
)
from services.bus.scripts import UNANSWERED, execute_riding
from services.bus.text import as_text, now_ms

log = logging.getLogger("agon.bus")

#: The pause after a failed batch, so that a Redis that is down is not hammered.
RETRY_PAUSE_S = 0.5
#: How many received entry ids a reader remembers, to tell an entry Redis delivered to it
#: but whose answer it never got: at least `SEEN_IDS`, and `SEEN_READS` whole reads of its
#: streams (a read takes up to `count` entries of each; two are in hand, the batch being
#: handled and one read ahead), however many streams it reads.
SEEN_IDS = 20_000
SEEN_READS = 4
#: How often a reader sweeps its streams for entries of dead or stuck consumers (s).
CLAIM_EVERY_S = 0.5
#: How long a read waits for new entries while a sweep is under way (s): what the sweep
#: takes is handed over after that.
CLAIM_WAIT_S = 0.05


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)


@dataclass(frozen=True, slots=True)
class Entry:
    """One stream entry as a reader got it."""

    stream: str
    entry_id: bytes
    #: The encoded model in field `m`, or None when the entry has no such field.
    data: bytes | None
    #: Claimed from a consumer of the group that died: whatever it did with the entry
    #: (a bot's turn it handed over and never answered) may be lost with it.
    taken_over: bool = False


async def ensure_group(redis: Client, stream: str, group: str, start: str = "0") -> None:
    """Create a consumer group (and its stream) unless it exists."""
    try:
        await redis.xgroup_create(stream, group, id=start, mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def trim_acknowledged(redis: Client, stream: str, groups: Sequence[str]) -> int:
    """Drop the entries of `stream` that every one of `groups` has acknowledged.

    Nothing is trimmed while one of the groups does not exist yet (it would start from the
    beginning and must find everything there). Returns how many entries went.
    """
    try:
        info: Any = await redis.xinfo_groups(stream)
    except ResponseError:
        return 0  # no such stream
    by_name = {as_text(g["name"]): g for g in info}
    if any(g not in by_name for g in groups):
        return 0
    floor: str | None = None
    for name in groups:
        g = by_name[name]
        delivered = as_text(g["last-delivered-id"])
        # XINFO said pending, but the group may have acknowledged the last of them since:
        # then there is no oldest entry, and what XINFO said it delivered is the floor.
        summary: Any = await redis.xpending(stream, name) if g["pending"] else None
        if summary and summary["min"] is not None:
            delivered = min(delivered, as_text(summary["min"]), key=_id_key)
        else:
            ms, n = _id_key(delivered)
            delivered = f"{ms}-{n + 1}"  # everything up to and including it is acknowledged
        floor = delivered if floor is None else min(floor, delivered, key=_id_key)
    if floor is None or floor in ("0-0", "0-1"):
        return 0
    removed: int = await redis.xtrim(stream, minid=floor, approximate=False)
    return removed


class GroupReader:
    """Reads `streams` as consumer `consumer` of `group`; claims the work of dead consumers.

    `claim_idle_ms`: how long an entry may sit with a live consumer before this one takes
    it; `dead_idle_ms`: how idle a dead consumer's entry must be before it is taken (so that
    two sweeping consumers do not both take it).
    """

    def __init__(
        self,
        redis: Client,
        streams: Sequence[str],
        group: str,
        consumer: str,
        *,
        heartbeats: str | Sequence[str],
        count: int = 500,
        claim_idle_ms: int = 30_000,
        dead_idle_ms: int = 500,
        claim_every_s: float = CLAIM_EVERY_S,
        max_deliveries: int = 5,
    ) -> None:
        self.redis = redis
        self.streams = list(streams)
        self.group = group
        self.consumer = consumer
        #: the hashes the beats are in (`services.bus.presence.beat_keys`)
        self.heartbeats = [heartbeats] if isinstance(heartbeats, str) else list(heartbeats)
        self.count = count
        self.claim_idle_ms = claim_idle_ms
        self.dead_idle_ms = dead_idle_ms
        self.claim_every_s = claim_every_s
        self.max_deliveries = max_deliveries
        #: entries claimed from dead or stuck consumers so far
        self.claimed = 0
        #: claimed entries delivered `max_deliveries` times: the loop sets them aside
        self.poison: list[Entry] = []
        self._next_claim = 0.0
        self._claiming: asyncio.Task[list[Entry]] | None = None
        #: the start of a claim pass brought forward (`claim_at`)
        self._due: asyncio.TimerHandle | None = None
        #: what claim passes beside the reads took, for the next read
        self._took: list[Entry] = []
        #: a wait for new entries under way ends early: a claim pass took entries
        self._nudged = False
        #: what this consumer read as its own pending since the last claim pass began: a
        #: pass that claimed it too does not hand it over again
        self._own_read: set[tuple[str, bytes]] = set()
        #: the entries the claim pass under way asked XCLAIM for (from before it sent it):
        #: a read of this consumer's own pending that Redis answered after the XCLAIM finds
        #: them its own, and they are the pass's to hand over, as taken over
        self._taking: set[tuple[str, bytes]] = set()
        #: own pending entries read while the pass under way was taking them, handed over
        #: as it ends: as what it took if it took them, else as this consumer's own
        self._held_back: list[Entry] = []
        #: stopped (`close`) until the next read: nothing brings a claim pass forward
        self._closed = False
        self._notifying: asyncio.Future[None] | None = None
        #: entries this reader received (the newest): Redis may have delivered others to it
        #: whose answer was lost (the client retried the read after a dropped connection)
        self._received_ids: LRU[tuple[str, bytes], bool] = LRU(self._seen_size())
        self._ready = False
        self.sight = Sight()
        #: streams whose own pending entries are read again before new ones (`recover`)
        self._recover: set[str] = set()
        self._lanes: dict[str, asyncio.Task[None]] = {}
        self._buffer: list[Entry] = []
        self._cond = asyncio.Condition()
        self._lane_block_ms = 1000
        #: new entries read in another command's round trip (`read_ahead`), for the next read
        self._ahead: list[Entry] = []
        #: whether reads ride with writes (`read_ahead`): not once its loop stops
        self.riding = True

    async def setup(self) -> None:
        for stream in self.streams:
            await ensure_group(self.redis, stream, self.group)
        self._ready = True

    async def read(self, block_ms: int | None = None, *, reclaim: bool = False) -> list[Entry]:
        """The next batch: claimed and own entries first, then new ones.

        Waits up to `block_ms` for new entries (None: not at all), and no longer than the
        next claim pass, or `CLAIM_WAIT_S` while one is under way: claiming runs beside
        the reads (a claim pass costs round trips that no read should wait for), every
        `claim_every_s` and when `claim_at` brings it forward, and its entries are handed
        over by the next read; when `reclaim` is set (drain mode) it runs now, first.
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
        self._closed = False
        if not self._ready:
            await self.setup()
        # Claimed entries before this consumer's own: once claimed they are its own too,
        # and handed over as claimed they say whose they were (`Entry.taken_over`).
        if reclaim:
            claimed = await self.claimed_so_far()
            self._next_claim = time.monotonic() + self.claim_every_s
            claimed += (await self._reclaim())[0]
        else:
            claimed = self._claimed_beside()
        if claimed:
            return claimed
        if self._recover:
            own = await self._own_pending()
            if own:
                self._own_read.update((e.stream, e.entry_id) for e in own)
                return own
        if self._ahead:
            ahead, self._ahead = self._ahead, []
            return ahead
        if block_ms is None:
            return await self._poll()
        # No longer than until the next claim pass, or while one is under way, than a
        # moment: what it takes (a dead consumer's entries) is handed over then.
        if self._claiming is None:
            wait_s = min(self.claim_every_s, self._next_claim - time.monotonic())
        else:
            wait_s = CLAIM_WAIT_S
        return await self._wait(max(1, min(block_ms, int(wait_s * 1000))))

    def claim_at(self, when: float) -> None:
        """Start the next claim pass at `when` (`time.monotonic()`) if that is sooner than
        planned: a consumer with entries pending dies by its beat then, or a master that
        was away answers again. It starts then, beside whatever the consumer does (a bot
        worker's pace), and what it takes ends a wait for new entries under way."""
        if when >= self._next_claim or self._closed:
            return
        self._next_claim = when
        if self._due is not None:
            self._due.cancel()
        delay = max(0.0, when - time.monotonic())
        self._due = asyncio.get_running_loop().call_later(delay, self._claim_due)

    def _claim_due(self) -> None:
        self._due = None
        self._claim_if_due()

    def _claim_if_due(self) -> None:
        """Start a claim pass if one is due and none is under way (nor the reader closed)."""
        if self._claiming is None and not self._closed and time.monotonic() >= self._next_claim:
            self._start_claim()

    def _start_claim(self) -> None:
        """Start a claim pass beside the reads."""
        self._next_claim = time.monotonic() + self.claim_every_s
        self._own_read, self._taking = set(), set()
        self._claiming = asyncio.create_task(self._pass())
        self._claiming.add_done_callback(self._claimed)

    async def _pass(self) -> list[Entry]:
        """A claim pass beside the reads: the next comes as the soonest of the others
        holding entries would die by its beat (if it does), not up to
        `claim_every_s` after (a killed bot worker's turns)."""
        took, death_ms = await self._reclaim(self._taking)
        if death_ms is not None:
            self.claim_at(time.monotonic() + (death_ms - now_ms()) / 1000)
        return took

    def _claimed(self, task: asyncio.Task[list[Entry]]) -> None:
        """A claim pass ended: what it took waits for the next read, and ends a wait for
        new entries under way; the next pass starts if it came due meanwhile."""
        seen(task)
        if self._claiming is task:  # (else collected already, or the reader closed)
            self._collect(task)
            self._claim_if_due()

    def _collect(self, task: asyncio.Task[list[Entry]]) -> None:
        """Keep what a finished claim pass took for the next read, but what this consumer
        read as its own pending meanwhile (it was handed over then); and after it, the own
        pending entries held back for it that it did not take."""
        self._claiming = None
        result = self._claim_result(task)
        took = [e for e in result if (e.stream, e.entry_id) not in self._own_read]
        taken = {(e.stream, e.entry_id) for e in result}
        took += [e for e in self._held_back if (e.stream, e.entry_id) not in taken]
        self._held_back, self._taking = [], set()
        if took:
            self._took.extend(took)
            self._nudge()

    def _nudge(self) -> None:
        """End a wait for new entries under way (`_wait` on a cluster; on a single server
        the blocking read runs out): the next read hands over what a claim pass took."""
        self._nudged = True
        self._notifying = asyncio.ensure_future(self._notify())
        self._notifying.add_done_callback(seen)

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    def _received(self, raw: Any) -> list[Entry]:
        """A read's answer as entries, each noted as received."""
        entries = _entries(raw)
        for e in entries:
            self._received_ids.put((e.stream, e.entry_id), True)
        return entries

    def _claimed_beside(self) -> list[Entry]:
        """What the claim passes beside the reads took, and the next pass when due."""
        out, self._took = self._took, []
        if out:
            self._nudged = False  # (handed over here)
        self._claim_if_due()
        return out

    async def claimed_so_far(self) -> list[Entry]:
        """What the claim passes beside the reads took, once none is under way and none
        is to come (a drain that stops must not leave entries it claimed pending with
        this consumer, unread)."""
        if self._due is not None:
            self._due.cancel()
            self._due = None
        while (task := self._claiming) is not None:
            await asyncio.wait([task])
            if self._claiming is task:  # (its callback may not have run yet)
                self._collect(task)
        out, self._took = self._took, []
        return out

    def _claim_result(self, task: asyncio.Task[list[Entry]]) -> list[Entry]:
        """What a finished claim pass took."""
        if task.cancelled():
            return []
        if task.exception() is not None:
            # Redis away: the next pass tries again (and takes back what an XCLAIM whose
            # answer was lost gave this consumer: it never received them).
            log.debug("%s: a claim pass failed: %s", self.consumer, task.exception())
            return []
        return task.result()

    def read_ahead(self, pipe: Any) -> Callable[[Any], None] | None:
        """Queue in `pipe`, the pipeline of a consumer's write, a read of new entries that
        does not wait (`scripts.Rider`); the next read hands them over. Nothing is queued
        on a cluster (its pipeline is one per node), with entries read ahead still to hand
        over, or own pending entries to read again first (they would come twice). A read
        whose answer is lost leaves what Redis delivered pending, as any read does."""
        if not self.riding or is_cluster(self.redis) or not self.streams:
            return None
        if self._ahead or self._recover:  # (entries would come out of order, or twice)
            return None
        pipe.xreadgroup(
            self.group, self.consumer, dict.fromkeys(self.streams, ">"), count=self.count
        )

        def take(raw: Any) -> None:
            if isinstance(raw, Exception):
                return
            # A stream given up meanwhile keeps its entries pending for its new owner, and
            # one to recover meanwhile (a claim beside the loop, a close) reads them again.
            self._ahead += [
                e
                for e in self._received(raw)
                if e.stream in self.streams and e.stream not in self._recover
            ]

        return take

    def stop_riding(self) -> list[Entry]:
        """No read rides with a write any more; what one read ahead, for its consumer to
        handle before it stops (it would stay pending with a consumer that left)."""
        self.riding = False
        ahead, self._ahead = self._ahead, []
        return ahead

    async def _poll(self) -> list[Entry]:
        """New entries of every stream without waiting."""
        return await self._read_streams(">", None)

    async def _read_streams(self, start: str, block_ms: int | None) -> list[Entry]:
        """XREADGROUP of every stream from `start` (">": new ones; "0": own pending).

        A single server has no slots: one command serves every stream. On a cluster each
        stream gets its own command (pipelined; never blocking: see `_wait`).
        """
        if not self.streams:  # a member whose share is empty, for now
            await asyncio.sleep((block_ms or 0) / 1000)
            return []
        if not is_cluster(self.redis):
            raw: Any = await self.redis.xreadgroup(
                self.group,
                self.consumer,
                dict.fromkeys(self.streams, start),
                count=self.count,
                block=block_ms,
            )
            return self._received(raw)
        pipe = self.redis.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xreadgroup(self.group, self.consumer, {stream: start}, count=self.count)
        out: list[Entry] = []
        for answer in await pipe.execute():
            out.extend(self._received(answer))
        return out

    async def _wait(self, block_ms: int) -> list[Entry]:
        """New entries, waiting up to `block_ms` for something to arrive."""
        if not is_cluster(self.redis):
            return await self._read_streams(">", block_ms)
        self._start_lanes(self.streams)
        async with self._cond:
            if not self._buffer and not self._nudged:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: bool(self._buffer) or self._nudged),
                        block_ms / 1000,
                    )
            self._nudged = False
            out, self._buffer = self._buffer, []
            self._cond.notify_all()
        return out

    def _start_lanes(self, streams: Sequence[str]) -> None:
        """Start a lane for each of `streams` that has none."""
        for stream in streams:
            if stream not in self._lanes:
                self._lanes[stream] = asyncio.create_task(self._lane(stream))

    async def _lane(self, stream: str) -> None:
        """Block on one stream; hand over what arrives; wait until it was taken. Only while
        it is the stream's lane: one stopped that ran on (a cancellation lost) leaves
        what it read pending, for whoever reads the stream to take."""
        me = asyncio.current_task()
        while self._lanes.get(stream) is me:
            try:
                raw: Any = await self.redis.xreadgroup(
                    self.group,
                    self.consumer,
                    {stream: ">"},
                    count=self.count,
                    block=self._lane_block_ms,
                )
            except ResponseError as exc:
                if "NOGROUP" in str(exc):
                    with contextlib.suppress(*TRANSIENT_ERRORS, ResponseError):
                        await ensure_group(self.redis, stream, self.group)
                else:
                    log.warning("%s: reading %s failed: %s", self.consumer, stream, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            except RETRIED_ERRORS as exc:
                # Its answer may have been lost with the connection: what Redis delivered
                # meanwhile is pending with this consumer; read it again. On a cluster the
                # client may also have lost track of the stream's slot for a moment (no
                # node serves it in the map it learnt, or redirections ran out): a lane
                # that ended there left its stream unread for good.
                if not isinstance(exc, TRANSIENT_ERRORS):
                    log.warning("%s: reading %s failed: %s; retrying", self.consumer, stream, exc)
                self.recover([stream])
                await pause_after_failure(self.redis, RETRY_PAUSE_S)
                continue
            if self._lanes.get(stream) is not me:
                log.warning("%s: a lane of %s that was stopped read on", self.consumer, stream)
                if stream in self.streams:
                    self.recover([stream])  # (read again by this consumer's new lane)
                return
            entries = self._received(raw)
            if entries:
                async with self._cond:
                    self._buffer.extend(entries)
                    self._cond.notify_all()
                    await self._cond.wait_for(lambda: not self._buffer)

    async def close(self) -> None:
        """Stop the lanes. Entries a cancelled lane had read stay pending with this consumer:
        once its heartbeat is gone another consumer claims them, and if this reader goes on
        (a drain after a stop) it reads them again first."""
        lanes: list[asyncio.Task[Any]] = [*self._lanes.values()]
        if self._claiming is not None:
            lanes.append(self._claiming)  # what it claimed stays pending with this consumer
        self._lanes, self._claiming, self._took, self._closed = {}, None, [], True
        self._held_back, self._taking = [], set()
        if self._due is not None:
            self._due.cancel()
            self._due = None
        for lane in lanes:
            lane.cancel()
        if lanes:
            await asyncio.wait(lanes, timeout=2.0)
        # Read, or handed over but not processed: read them again if we go on.
        self.recover()
        self._buffer = []

    def _seen_size(self) -> int:
        return max(SEEN_IDS, SEEN_READS * self.count * len(self.streams))

    async def set_streams(self, streams: Sequence[str]) -> None:
        """Read `streams` from now on (a member's share of the partitions changed): the
        groups of new ones are made; the lanes of streams given up stop, and what they
        read stays pending with this consumer, for the new owner to claim (`claim_strays`)."""
        new = [s for s in streams if s not in self.streams]
        await asyncio.gather(*(ensure_group(self.redis, s, self.group) for s in new))
        self.streams = list(streams)
        self._received_ids.size = self._seen_size()
        self._ahead = [e for e in self._ahead if e.stream in self.streams]
        for stream in [s for s in self._lanes if s not in streams]:
            self._lanes.pop(stream).cancel()
        if self._lanes:  # serving on a cluster: a wait under way reads the new ones too
            self._start_lanes(new)

    async def claim_strays(self, streams: Sequence[str]) -> int:
        """Claim the entries pending with other consumers on `streams`, which this consumer
        owns (`services.bus.ownership`): its predecessor's unfinished work, or what an owner
        that lost its lease read before it noticed. The next read hands them over."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xpending(stream, self.group)
        summaries = await pipe.execute(raise_on_error=False)
        strays = [
            (stream, as_text(c["name"]), int(c["pending"]))
            for stream, summary in zip(streams, summaries, strict=True)
            if not isinstance(summary, Exception) and summary["pending"]
            for c in summary["consumers"]
            if as_text(c["name"]) != self.consumer
        ]
        if not strays:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for stream, name, count in strays:
            pipe.xpending_range(stream, self.group, "-", "+", count, consumername=name)
        rows = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        for (stream, _, _), pending in zip(strays, rows, strict=True):
            ids = [row["message_id"] for row in pending]
            if ids:
                pipe.xclaim(stream, self.group, self.consumer, 0, ids, justid=True)
        claimed = sum(len(ids) for ids in await pipe.execute())
        if claimed:
            log.info("%s: took over %d entries of the partitions it owns", self.consumer, claimed)
            self.recover()
        return claimed

    def recover(self, streams: Sequence[str] | None = None) -> None:
        """After a failed batch (or a read or write of `streams` that failed): read this
        consumer's own pending entries there again first.

        XREADGROUP ">" never redelivers them to their owner; without this they would wait
        for another consumer's claim sweep. Entries read ahead there are among them.
        """
        again = set(self.streams if streams is None else streams)
        self._recover.update(again)
        self._ahead = [e for e in self._ahead if e.stream not in again]
        if again and self._lanes:  # a wait under way on a cluster ends: the next read
            self._nudge()  # reads them (after a failover, not up to a claim pass later)

    async def _own_pending(self) -> list[Entry]:
        """This consumer's pending entries of the streams to recover. A stream that answers
        none is recovered; on a cluster, one whose node fails stays to recover, and the
        others are read all the same (a dead master must not hold the live ones back)."""
        streams = [s for s in self.streams if s in self._recover]
        self._recover.intersection_update(streams)
        if not streams:
            return []
        if not is_cluster(self.redis):
            raw: Any = await self.redis.xreadgroup(
                self.group, self.consumer, dict.fromkeys(streams, "0"), count=self.count
            )
            entries = self._received(raw)
            if not entries:
                self._recover.clear()
            return self._not_taken(entries)
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xreadgroup(self.group, self.consumer, {stream: "0"}, count=self.count)
        out: list[Entry] = []
        for stream, answer in zip(streams, await pipe.execute(raise_on_error=False), strict=True):
            if isinstance(answer, TRANSIENT_ERRORS):
                continue
            if isinstance(answer, Exception):
                raise answer
            entries = self._received(answer)
            if not entries:
                self._recover.discard(stream)
            out.extend(entries)
        return self._not_taken(out)

    def _not_taken(self, own: list[Entry]) -> list[Entry]:
        """Of the own pending entries a read found, those no claim pass took: a pass that
        ran beside the read (master_away's recovery and its claim pass now, at once) may
        have claimed a dead consumer's entry before Redis answered the read, and it is the
        pass's to hand over, as taken over (`Entry.taken_over`: a bot worker gives the
        bot's clock back), once. One it took and kept for the next read is left out; one
        the pass under way is taking waits for it (`_collect`)."""
        took = {(e.stream, e.entry_id) for e in self._took}
        out: list[Entry] = []
        for e in own:
            if (e.stream, e.entry_id) in took:
                continue
            if (e.stream, e.entry_id) in self._taking:
                self._held_back.append(e)
            else:
                out.append(e)
        return out

    async def dead_consumers(self, names: set[str]) -> set[str]:
        """Which of `names` have no fresh heartbeat."""
        return (await self._judge(names))[0]

    async def _judge(self, names: set[str]) -> tuple[set[str], int | None]:
        """Which of `names` have no fresh heartbeat, and when the soonest of the others
        dies by its beat (ms; None: none, or the beats may not say)."""
        if not names:
            return set(), None
        # Its own beat too: whether a copy that answered alone is one anybody writes to.
        ordered, began = sorted(names | {self.consumer}), now_ms()
        try:
            settled = self.sight.settled(began)
            copies = await ask_each(self.redis, self.heartbeats, "HMGET", *ordered, prefer=settled)
        except UNANSWERED:
            self.sight.failed()  # every copy of the beats is away
            raise
        now = now_ms()
        beats = [[Beat.parse(raw) for raw in raws] for raws in zip(*copies.answers, strict=True)]
        times = (b.time for row in beats for b in row if b is not None)
        fresh = copies.fresh(times, now)
        if not self.sight.read(now, now - began, fresh, copies):
            return set(), None
        dead, dies = set(), []
        for name, row in zip(ordered, beats, strict=True):
            if name not in names:
                continue
            if any(alive(b, now) for b in row):
                dies.append(max(b.time for b in row if b is not None) + ALIVE_MS + 1)
            else:
                dead.add(name)
        return dead, min(dies, default=None)

    async def reclaim(self) -> list[Entry]:
        """Take over entries of dead consumers and entries stuck with live ones.

        One pipelined XPENDING per stream that has pending entries finds them; XCLAIM takes
        them. Another's entries delivered `max_deliveries` times go to `poison` instead.
        """
        return (await self._reclaim())[0]

    async def _reclaim(
        self, taking: set[tuple[str, bytes]] | None = None
    ) -> tuple[list[Entry], int | None]:
        """`reclaim`, and when the soonest of the others holding entries dies by its beat
        (`_judge`). What it asks XCLAIM for is noted in `taking` before it is sent."""
        idle = min(self.dead_idle_ms, self.claim_idle_ms)
        streams = list(self.streams)  # a rebalance may change them while this waits
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            # Every pending entry, the fresh too: a consumer that holds only fresh ones
            # (a bot worker's turns just delivered) dies by its beat all the same, and the
            # next pass must come then, not a pass after they grew idle enough to take.
            pipe.xpending_range(stream, self.group, "-", "+", self.count)
        rows_by_stream: list[Any] = await pipe.execute(raise_on_error=False)
        owners = {
            as_text(row["consumer"])
            for rows in rows_by_stream
            if not isinstance(rows, Exception)
            for row in rows
        }
        owners.discard(self.consumer)
        dead, death_ms = await self._judge(owners)
        # id; deliveries, counted against `max_deliveries` only for another's entry (an
        # entry's own consumer reads it again after each failed batch, each read counted:
        # a master away for a while made a turn poison); of a dead consumer
        take: dict[str, list[tuple[bytes, int, bool]]] = {}
        for stream, rows in zip(streams, rows_by_stream, strict=True):
            if isinstance(rows, Exception):
                continue  # no group yet: the next read makes it
            for row in rows:
                if row["time_since_delivered"] < idle:
                    continue  # too fresh to take (XCLAIM would pass it over)
                # Entries of a dead consumer, entries Redis delivered to this one that it
                # never received (a read whose answer was lost: the client retried it
                # after a dropped connection), and any entry idle too long.
                owner = as_text(row["consumer"])
                lost = owner == self.consumer and not self._received_ids.get(
                    (stream, row["message_id"])
                )
                if lost or owner in dead or row["time_since_delivered"] >= self.claim_idle_ms:
                    n = int(row["times_delivered"]) if owner != self.consumer else 0
                    take.setdefault(stream, []).append((row["message_id"], n, owner in dead))
        if not take:
            return [], death_ms
        if taking is not None:
            taking.update((stream, i) for stream, ids in take.items() for i, _, _ in ids)
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in take.items():
            pipe.xclaim(stream, self.group, self.consumer, idle, [i for i, _, _ in ids])
        out: list[Entry] = []
        for (stream, ids), claimed in zip(take.items(), await pipe.execute(), strict=True):
            deliveries = {i: (n, of_dead) for i, n, of_dead in ids}
            for entry_id, fields in claimed:
                n, of_dead = deliveries.get(entry_id, (0, False))
                entry = Entry(stream, entry_id, _field(fields), taken_over=of_dead)
                self._received_ids.put((stream, entry_id), True)
                if n + 1 > self.max_deliveries:
                    self.poison.append(entry)
                else:
                    out.append(entry)
        self.claimed += len(out) + len(self.poison)
        if out or self.poison:
            log.info(
                "%s: claimed %d entries of dead or stuck consumers (%s)",
                self.consumer,
                len(out) + len(self.poison),
                ", ".join(sorted(dead)) or "stuck",
            )
        return out, death_ms

    async def forget_dead_consumers(self) -> int:
        """Remove consumers with nothing pending and no fresh heartbeat from the group."""
        streams, infos = await self._consumers()
        idle_empty: dict[str, list[str]] = {}
        for stream, consumers in zip(streams, infos, strict=True):
            if isinstance(consumers, Exception):
                continue
            for c in consumers:
                name = as_text(c["name"])
                if name != self.consumer and not c["pending"] and c["idle"] > ALIVE_MS:
                    idle_empty.setdefault(name, []).append(stream)
        dead = await self.dead_consumers(set(idle_empty))
        if not dead:
            return 0
        pipe = self.redis.pipeline(transaction=False)
        for name in sorted(dead):
            for stream in idle_empty[name]:
                pipe.xgroup_delconsumer(stream, self.group, name)
        await pipe.execute(raise_on_error=False)
        return len(dead)

    async def leave(self) -> None:
        """Deregister this consumer from its groups, where it holds nothing pending.

        A consumer with pending entries stays, so that another one can claim them.
        """
        for stream, consumers in zip(*await self._consumers(), strict=True):
            if isinstance(consumers, Exception):
                continue
            for c in consumers:
                if as_text(c["name"]) == self.consumer and int(c["pending"]) == 0:
                    await self.redis.xgroup_delconsumer(stream, self.group, self.consumer)

    async def _consumers(self) -> tuple[list[str], list[Any]]:
        """The streams read, and the group's consumers on each (XINFO CONSUMERS, or the
        error in its place), in one pipeline. The streams are taken once: a rebalance may
        change them while this waits."""
        streams = list(self.streams)
        pipe = self.redis.pipeline(transaction=False)
        for stream in streams:
            pipe.xinfo_consumers(stream, self.group)
        return streams, await pipe.execute(raise_on_error=False)

    async def ack(self, entries: Sequence[Entry], *, ride: bool = True) -> None:
        """Acknowledge the entries; with `ride`, the next batch's read rides along
        (`read_ahead`): an ack that ends a batch, not one in its middle."""
        by_stream: dict[str, list[bytes]] = {}
        for e in entries:
            by_stream.setdefault(e.stream, []).append(e.entry_id)
        if not by_stream:
            return
        pipe = self.redis.pipeline(transaction=False)
        for stream, ids in by_stream.items():
            pipe.xack(stream, self.group, *ids)
        for answer in await execute_riding(pipe, self.read_ahead if ride else None):
            if isinstance(answer, Exception):
                raise answer

    async def lag(self) -> tuple[int, int]:
        """(entries not yet delivered to the group, entries pending) over every stream."""
        totals = group_totals(await group_rows(self.redis, self.streams))
        return totals.get(self.group, (0, 0))


def _entries(raw: Any) -> list[Entry]:
    """The entries of an XREADGROUP answer (RESP2 list or RESP3 map), stream by stream."""
    if not raw:
        return []
    items = raw.items() if isinstance(raw, dict) else raw
    out: list[Entry] = []
    for stream, entries in items:
        if isinstance(entries, list) and len(entries) == 1 and isinstance(entries[0], list):
            entries = entries[0]  # RESP3 wraps each stream's entries once more
        name = as_text(stream)
        out.extend(Entry(name, entry_id, _field(fields)) for entry_id, fields in entries)
    return out


def _field(fields: dict[bytes, bytes] | None) -> bytes | None:
    if not fields:
        return None
    return fields.get(FIELD_BYTES)
