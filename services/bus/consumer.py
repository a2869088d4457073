"""The one consumer loop: consumer groups over partition streams, for every Agon service.

The engine service, the projector, the dispatcher and the bot workers all read streams the
same way: one consumer group, a process-unique consumer name, batches of entries, each
entry acknowledged only after its effect is written (so a crash redelivers it, and the
effects are idempotent: exactly once in effect).

`StreamConsumer` is the loop around a reader: serve until stopped or drain; log a ready
line and (with -v) a stats line; retry a batch when Redis is away; set aside (dead-letter,
then acknowledge) an entry that fails on its own, so that one bad entry never stalls a
consumer; trim what every group has acknowledged; on stop, leave the group cleanly.

`ConsumerSettings` is how a service kind consumes (batch, wait, claim idle, replicas). The
reading itself, claims of dead consumers' entries included, is `services.bus.reader`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypedDict, Unpack

from redis.crc import key_slot

from schemas.codec import FIELD
from services.bus import outages
from services.bus.connection import (
    RETRIED_ERRORS,
    TRANSIENT_ERRORS,
    WRITES_REFUSED,
    AgonCluster,
    Client,
    pause_after_failure,
    seen,
)
from services.bus.keys import Keys
from services.bus.outages import WriteWatch
from services.bus.ownership import ROUND_S, Ownership
from services.bus.presence import beat, beat_keys, beating, forget_old
from services.bus.reader import (
    CLAIM_EVERY_S,
    RETRY_PAUSE_S,
    Entry,
    GroupReader,
    trim_acknowledged,
)
from services.bus.text import as_text

log = logging.getLogger("agon.bus")

#: Set-aside entries are kept for inspection, capped so a flood of them cannot fill Redis.
DEAD_LETTER_MAXLEN = 10_000
#: A set-aside entry keeps at most this much of its payload (plus its size and sha256).
DEAD_LETTER_KEEP_BYTES = 4096
#: How often a consumer trims acknowledged entries and logs its stats line (with -v).
TRIM_EVERY_S = 5.0
#: The least pause between two rounds of periodic work.
MIN_PAUSE_S = 0.02
#: How often a member looks for entries others left pending in the partitions it owns,
#: besides at once when it takes one (s): what an owner that lost its lease read before it
#: noticed. Every round (a pending summary per partition), it was a third of an idle
#: member's Redis calls.
STRAYS_EVERY_S = 1.0
#: How often a member of a kind that divides the partitions sweeps its partitions for the
#: entries of dead or stuck consumers (s): a dead member's are claimed as strays the moment
#: its partitions are taken, so this sweep is only the backstop (every 0.5 s, as a bot
#: worker's, it was another third of an idle member's Redis calls).
SHARED_RECLAIM_EVERY_S = 2.0
FIRST = asyncio.FIRST_COMPLETED


def consumer_name(role: str) -> str:
    """A name no other live consumer has: role, host, pid and a random suffix."""
    return f"{role}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def dead_letter_fields(entry: Entry, reason: str, **extra: Any) -> dict[Any, Any]:
    """A dead-letter entry: the first 4 KiB of the payload, its size and sha256, and why."""
    data = entry.data or b""
    return {
        FIELD: data[:DEAD_LETTER_KEEP_BYTES],
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "reason": reason[:1000],
        "stream": entry.stream,
        "id": entry.entry_id,
        **extra,
    }


@dataclass(frozen=True, slots=True)
class ConsumerSettings:
    """How a service consumes its streams, built once per service kind from its command's
    arguments (`--batch`, `--ack-replicas`, `--ack-timeout-ms`) or a test's keywords.

    Each kind starts from its own `StreamConsumer.defaults`; its constructor takes a
    `settings` and, as keywords (`ConsumerOptions`), the fields to change in it.
    """

    #: entries per read
    batch: int = 1000
    #: how long a read waits for new entries (the loop checks its stop flag that often)
    block_ms: int = 1000
    #: how long an entry may sit with a live consumer before another one takes it
    claim_idle_ms: int = 30_000
    #: games (folds, records, positions) the consumer keeps in memory
    cache_size: int = 20_000
    #: replicas each write waits for before the work counts done (`--ack-replicas`)
    replicas: int = 0
    #: how long it waits for them (`--ack-timeout-ms`)
    replica_timeout_ms: int = 1000
    #: the consumer's name in its group (None: a fresh one for its role)
    consumer: str | None = None
    #: a kind that divides the partitions (engine, projector, dispatcher) reads only its
    #: live members' share when it runs (`services.bus.ownership`); off: every partition
    share: bool = True


class ConsumerOptions(TypedDict, total=False):
    """The fields of `ConsumerSettings` as a constructor's keywords."""

    batch: int
    block_ms: int
    claim_idle_ms: int
    cache_size: int
    replicas: int
    replica_timeout_ms: int
    consumer: str | None
    share: bool


class StreamConsumer:
    """The loop of one group reader: `run` until stopped, or `drain` what is there.

    A subclass sets `role`, `redis`, `reader`, `block_ms` and `dead_letter` (the stream for
    entries set aside), and implements `process(entries)`, which writes the batch's effects
    and then acknowledges it. `forget()` drops caches a failed batch may have left
    half-updated; `tick()` is periodic work done after every batch of `run`; `settle()`
    waits for work a batch left in flight; `stats()` is what the stats line shows.
    `trim_groups` names the groups that must all have acknowledged an entry before
    `run` trims it from the reader's streams (empty: this consumer trims nothing).
    """

    role: str
    redis: Client
    keys: Keys
    reader: GroupReader
    #: the kind's settings, before its constructor's keywords change them
    defaults: ClassVar[ConsumerSettings] = ConsumerSettings()
    settings: ConsumerSettings
    block_ms: int
    #: replicas each write waits for, and how long (`settings`)
    replicas: int
    replica_timeout_ms: int
    dead_letter: str
    trim_groups: tuple[str, ...] = ()
    #: entries set aside because they failed on their own
    entries_set_aside: int = 0
    entries_handled: int = 0
    #: replicas each write waits for (`--ack-replicas`), told in the heartbeat
    ack_replicas: int = 0
    #: a kind that divides the partitions: its stream of each partition (None: it reads
    #: all of its streams, as the bot workers do)
    partition_streams: dict[int, str] | None = None
    #: this member's share of them while it runs (with `settings.share`)
    ownership: Ownership | None = None
    #: the look for strays in every partition held, every `STRAYS_EVERY_S`
    _claiming: asyncio.Future[int] | None = None
    _next_strays = 0.0
    #: the looks in partitions just taken, each at once
    _taking: frozenset[asyncio.Future[int]] = frozenset()
    #: spells a master of the cluster did not answer in, with its partitions, not yet
    #: written (`services.bus.outages`): the heartbeat writes them
    spells_unwritten: list[tuple[outages.Spell, list[int]]]

    def join(
        self,
        redis: Client,
        keys: Keys,
        streams: Sequence[str],
        group: str,
        settings: ConsumerSettings | None = None,
        *,
        max_deliveries: int = 5,
        partitioned: bool = False,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        """Set up this consumer of `group` on `streams` with `settings` (default: the kind's
        `defaults`) changed by `options`; its set-aside entries go to the readers' dead
        letters. `partitioned`: `streams` are one per partition, in order, divided among
        the kind's live members when they run."""
        self.settings = s = replace(settings or self.defaults, **options)
        if partitioned:
            self.partition_streams = dict(zip(keys.all_partitions(), streams, strict=True))
        self.redis = redis
        self.keys = keys
        self.block_ms = s.block_ms
        self.replicas = s.replicas
        self.replica_timeout_ms = s.replica_timeout_ms
        self.dead_letter = keys.reader_dead_letter()
        self.reader = GroupReader(
            redis,
            streams,
            group,
            s.consumer or consumer_name(self.role),
            heartbeats=beat_keys(redis, keys),
            count=s.batch,
            claim_idle_ms=s.claim_idle_ms,
            max_deliveries=max_deliveries,
            claim_every_s=SHARED_RECLAIM_EVERY_S if partitioned and s.share else CLAIM_EVERY_S,
        )
        self.write_watch = WriteWatch()
        self.spells_unwritten = []
        self._writing_spells = asyncio.Lock()
        #: set to start the next ownership round at once (`_every` with `rate`)
        self._round_now = asyncio.Event()

    async def process(self, entries: Sequence[Entry]) -> None:
        """Write the effects of a batch, then acknowledge it."""
        raise NotImplementedError

    async def process_overlapped(self, entries: Sequence[Entry]) -> None:
        """`process`, but the batch's last writes (replies, acks) may still be in flight
        when it returns, overlapping the next read; `settle()` waits for them. The loop
        uses this; default: `process`."""
        await self.process(entries)

    def forget(self) -> None:
        """Drop cached state after a failed batch (default: nothing is cached)."""

    def forget_partitions(self, partitions: set[int]) -> None:
        """Drop what is cached of the games of `partitions`, taken or given up (another
        member wrote them meanwhile); the rest stays warm. Default: `forget()`."""
        self.forget()

    async def tick(self) -> None:
        """Periodic work of `run`, after every batch (default: none)."""

    async def settle(self) -> None:
        """Wait for what a batch left in flight (default: nothing)."""

    def dead_letter_for(self, entry: Entry) -> str:
        """Where an entry that is set aside goes (default: `dead_letter`)."""
        return self.dead_letter

    def stats(self) -> dict[str, int]:
        """Counters for the stats line and the heartbeat."""
        return {"entries": self.entries_handled, "set_aside": self.entries_set_aside}

    async def setup(self) -> None:
        await self.reader.setup()

    def master_away(self, spell: outages.Spell, slots: frozenset[int]) -> None:
        """A master of the cluster did not answer during `spell` (it died, and its replica
        took over): the games of the partitions it served (`slots`) could not be moved
        meanwhile, and that time is the platform's. Kept here at once (`spell_seen`),
        written by the next heartbeat.

        What this consumer acknowledged there in the spell's last moments may not have
        reached the replica that took over: those entries are pending with it again, and
        `>` never hands them back; it reads its own pending there first (else they would
        wait `claim_idle_ms` for a claim)."""
        self.reader.recover([s for s in self.reader.streams if key_slot(s.encode()) in slots])
        # And a claim pass now: the dead consumers' entries there could not be claimed
        # while the master was away (a killed bot worker's turns, on its inbox's master).
        self.reader.claim_at(0.0)
        hit = [p for p in self.keys.all_partitions() if self.keys.slot(p) in slots]
        if hit:
            self.spells_unwritten.append((spell, hit))
            self.spell_seen(spell, hit)
            # Its leases answer again: renew and take them now, not up to a round later.
            self._round_now.set()

    def with_unwritten(
        self, read: dict[int | None, list[outages.Spell]]
    ) -> dict[int | None, list[outages.Spell]]:
        """Spells `read` by partition, with those this consumer saw and has not written."""
        for spell, partitions in self.spells_unwritten:
            for p in partitions:
                read.setdefault(p, []).append(spell)
        return read

    async def write_spells(self) -> None:
        """Write the spells in which a master did not answer (`master_away`); what Redis
        does not take now, the next call writes. One call at a time (a bot worker's batch
        and its heartbeat may both call): a spell leaves the list once it is written."""
        async with self._writing_spells:
            with contextlib.suppress(*TRANSIENT_ERRORS):
                while self.spells_unwritten:
                    away, partitions = self.spells_unwritten[0]
                    await outages.record(self.redis, self.keys, away, partitions)
                    self.spells_unwritten.pop(0)

    def spell_seen(self, spell: outages.Spell, partitions: list[int]) -> None:
        """A kind that judges clocks takes `spell` of `partitions` into account at once
        (default: nothing)."""

    async def heartbeat(self) -> None:
        """Tell the others this consumer is alive (and what it has done); a write, so it
        also finds out whether Redis takes writes, and records the spell when it did not.
        Spells in which a master did not answer are written beside it: after a kill their
        writes, on a master promoted a moment ago, took up to 0.4 s, and a beat that waited
        for them told the others this consumer was 0.4 s older than it was (the members of
        its kind, reading no fresh beat of theirs, stopped judging who is dead)."""
        spells = asyncio.ensure_future(self.write_spells())
        try:
            share = {} if self.ownership is None else {"partitions": len(self.ownership.owned)}
            await beat(
                self.redis, self.keys, self.reader.consumer, self.role, self.reader.group,
                ack_replicas=self.ack_replicas, **self.stats(), **share,
            )  # fmt: skip
        except WRITES_REFUSED:
            self.write_watch.refused()
            raise
        finally:
            await spells
        spell = self.write_watch.accepted()
        if spell is not None:
            log.warning(
                "%s: Redis takes writes again after refusing them for %.1f s; no move clock"
                " ran meanwhile",
                self.reader.consumer,
                (spell[1] - spell[0]) / 1000,
            )
            await outages.record(self.redis, self.keys, spell)
            self.write_watch.recorded()

    async def _until_writes_accepted(self, stop: asyncio.Event) -> None:
        """Backpressure: Redis refuses writes (out of memory, say). Nothing is read, set aside
        or acknowledged meanwhile; the heartbeat probes until a write goes through."""
        log.warning(
            "%s: Redis refuses writes; pausing until it takes them again", self.reader.consumer
        )
        pause = RETRY_PAUSE_S / 4
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), pause)
            pause = min(pause * 2, RETRY_PAUSE_S * 2)
            with contextlib.suppress(*TRANSIENT_ERRORS):
                await self.heartbeat()
                return

    async def _every(
        self, seconds: float, work: Any, done: asyncio.Event, *, rate: bool = False
    ) -> None:
        """Run `work()` every `seconds` until `done`, beside the loop: a failure (Redis away)
        is logged at debug level and the next round tries again. With `rate`, `seconds`
        from start to start (a round slowed down by a starved host does not stretch the
        period its leases are renewed at), and sooner when a lease this member waits for
        expires or another member stops counting (`Ownership.due_s`), or a master that
        was away answers again (`master_away`)."""
        while not done.is_set():
            began = time.monotonic()
            try:
                await work()
            except Exception as exc:
                log.debug("%s: %s failed: %s", self.reader.consumer, work.__name__, exc)
            pause = seconds
            if rate:
                pause -= time.monotonic() - began
                if self.ownership is not None and self.ownership.due_s is not None:
                    pause = min(pause, self.ownership.due_s)
            ends = [asyncio.ensure_future(e.wait()) for e in (done, self._round_now)[: 1 + rate]]
            try:
                await asyncio.wait(ends, timeout=max(pause, MIN_PAUSE_S), return_when=FIRST)
            finally:
                for end in ends:
                    end.cancel()
            if rate:
                self._round_now.clear()

    def partitions(self) -> list[int]:
        """The partitions this consumer serves: its share while it runs, else every one."""
        if self.ownership is not None:
            return sorted(self.ownership.owned)
        return list(self.keys.all_partitions())

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set; no failure ends the loop. Leaves cleanly at the end.

        Beside the loop, two tasks: the heartbeat (`beating`), and housekeeping (trimming,
        forgetting dead consumers, the stats line), so neither ever delays a batch; a kind
        that divides the partitions renews its share beside them (`rebalance`).
        """
        stop = stop or asyncio.Event()
        name = self.reader.consumer
        if self.partition_streams is not None and self.settings.share:
            self.ownership = Ownership(
                self.redis, self.keys, self.role, name, replicas=self.replicas
            )
            await self.reader.set_streams([])
        await self._serve_ready(stop)
        hooks = self.redis.outage_hooks if isinstance(self.redis, AgonCluster) else []
        hooks.append(self.master_away)
        try:
            async with beating(self.redis, self.keys, name, self.heartbeat):
                await self._serve(stop)
        finally:
            hooks.remove(self.master_away)
            if self.ownership is not None and self.partition_streams is not None:
                # Its leases are given back: a drain after the run serves every partition,
                # unfenced, as one before it does (the tests' and benchmarks' settling).
                # (`drain` makes the groups; what this consumer holds pending anywhere is
                # read again first.)
                self.ownership = None
                self.reader.streams = list(self.partition_streams.values())
                self.reader.recover()
            log.info("%s stopped", name)

    async def _serve(self, stop: asyncio.Event) -> None:
        """`run`'s loop beside housekeeping, until `stop`; then leave the groups."""
        done = asyncio.Event()
        name = self.reader.consumer
        self.reader.riding = True
        housekeeping = asyncio.create_task(self._every(TRIM_EVERY_S, self.housekeeping, done))
        sharing = (
            asyncio.create_task(self._every(ROUND_S, self.rebalance, done, rate=True))
            if self.ownership is not None
            else None
        )
        try:
            while not stop.is_set():
                try:
                    await self.handle(await self.reader.read(self.block_ms))
                    if self.reader.poison:
                        await self._set_aside_poison()
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    # Redis is away, or something failed outside any one entry. The batch
                    # is still pending with this consumer: read it again first.
                    if isinstance(exc, WRITES_REFUSED):
                        self.write_watch.refused()
                        await self._until_writes_accepted(stop)
                    elif isinstance(exc, RETRIED_ERRORS):
                        log.warning("%s: Redis unavailable (%s); retrying", name, exc)
                    else:
                        log.exception("%s: batch failed; retrying", name)
                    self.reader.recover()
                    self.forget()
                    await pause_after_failure(self.redis, RETRY_PAUSE_S)
            # What the last batch's write read ahead is this consumer's: handled, not left.
            if ahead := self.reader.stop_riding():
                with contextlib.suppress(*RETRIED_ERRORS):  # (pending: claimed once it left)
                    await self.handle(ahead)
            await self.settle()
        finally:
            done.set()
            for claim in (self._claiming, *self._taking):
                if claim is not None:
                    claim.cancel()
            await self.reader.close()
            await asyncio.wait([t for t in (housekeeping, sharing) if t], timeout=2.0)
            if self.ownership is not None:
                with contextlib.suppress(Exception):
                    await self.ownership.release_all()
            with contextlib.suppress(Exception):
                await self.reader.leave()

    async def rebalance(self) -> None:
        """Renew this member's leases, give up what is over its count, take the free
        partitions dealt to it where it is short (`Ownership.round`), and read what it
        owns; claim what others left pending there."""
        assert self.ownership is not None and self.partition_streams is not None
        change = await self.ownership.round()
        streams = [self.partition_streams[p] for p in self.partitions()]
        if streams != self.reader.streams:
            await self.reader.set_streams(streams)
        if change.taken or change.lost:
            self.forget_partitions({*change.taken, *change.lost})
            # A partition held before, and taken again, may hold entries this consumer
            # read then: `claim_strays` takes only the others'.
            self.reader.recover([self.partition_streams[p] for p in change.taken])
            log.info(
                "%s: took partitions %s, gave up %s; serving %d",
                self.reader.consumer, change.taken, change.lost, len(streams),
            )  # fmt: skip
        # Beside the rounds: a claim that waits on a master that died must not hold back
        # the renewal of every lease this member holds. The partitions just taken are
        # looked at at once, beside a look still under way (one held up by that master,
        # say): a dead member's last batch waits there, every turn and move of it.
        now = time.monotonic()
        if now >= self._next_strays and (self._claiming is None or self._claiming.done()):
            self._next_strays = now + STRAYS_EVERY_S
            self._claiming = self._claim(streams)
        elif change.taken:
            take = self._claim([self.partition_streams[p] for p in change.taken])
            take.add_done_callback(lambda c: setattr(self, "_taking", self._taking - {c}))
            self._taking = frozenset({*self._taking, take})

    def _claim(self, streams: list[str]) -> asyncio.Future[int]:
        """Claim the strays of `streams`, beside the loop (`GroupReader.claim_strays`)."""
        claim = asyncio.ensure_future(self.reader.claim_strays(streams))
        claim.add_done_callback(seen)
        return claim

    def fence(self, p: int) -> int:
        """The epoch this member's writes in partition `p` carry, for its scripts to check
        against the partition's lease (`Keys.lease`): 0 (not checked) for a consumer that
        does not divide the partitions, -1 (always refused) for one not held."""
        return 0 if self.ownership is None else self.ownership.epoch(p)

    def lose(self, p: int, epoch: int) -> None:
        """A write in partition `p` under `epoch` was refused: another member owns it now.
        What is cached of p's games goes; p itself too, unless this member took it again
        since (a newer epoch), and then the next round comes at once: it stops reading p
        and claims nothing of it."""
        self.forget_partitions({p})
        if self.ownership is not None and self.ownership.lose(p, epoch):
            self._round_now.set()

    async def ack_except(self, entries: Sequence[Entry], partitions: set[int]) -> None:
        """Acknowledge the entries, but those of `partitions`, which stay pending: for the
        partition's new owner to claim (a write there was refused, `lose`), or for this
        consumer to read again (their master did not take a write)."""
        if partitions and self.partition_streams is not None:
            gone = {self.partition_streams[p] for p in partitions}
            entries = [e for e in entries if e.stream not in gone]
        await self.reader.ack(entries)

    async def _serve_ready(self, stop: asyncio.Event) -> None:
        """Create the groups (retrying while Redis is away), then say so."""
        while not stop.is_set():
            try:
                await self.setup()
                if self.ownership is not None:
                    await self.rebalance()
                break
            except TRANSIENT_ERRORS as exc:
                log.warning("%s: Redis unavailable (%s); retrying", self.reader.consumer, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
        share = "" if self.ownership is None else f" (its share of {self.keys.partitions})"
        log.warning(
            "%s ready: group %s on %d streams%s",
            self.reader.consumer,
            self.reader.group,
            len(self.reader.streams),
            share,
        )

    async def housekeeping(self) -> None:
        """Trim acknowledged entries, forget dead consumers and old heartbeats; log stats."""
        for stream in self.reader.streams if self.trim_groups else ():
            await trim_acknowledged(self.redis, stream, self.trim_groups)
        await self.reader.forget_dead_consumers()
        await forget_old(self.redis, self.keys)
        if log.isEnabledFor(logging.INFO):
            await self._log_stats()

    async def _log_stats(self) -> None:
        lag, pending = await self.reader.lag()
        counters = " ".join(f"{k}={v}" for k, v in self.stats().items())
        log.info("%s: %s lag=%d pending=%d", self.reader.consumer, counters, lag, pending)

    async def drain(self) -> int:
        """Handle everything there is (and what dead consumers left); return how many. At
        the end it leaves the groups where it holds nothing, as a run does: a drained
        consumer's name would stay in every group it read until it counted as dead."""
        await self.setup()
        handled = 0
        while True:
            entries = await self.reader.read(None, reclaim=not handled)
            if not entries:
                entries = await self.reader.claimed_so_far()
            if self.reader.poison:
                await self._set_aside_poison()
            if not entries:
                await self.settle()
                await self.reader.leave()
                return handled
            handled += len(entries)
            await self.handle(entries)

    async def handle(self, entries: Sequence[Entry], *, overlapped: bool = True) -> None:
        """`process` the batch; when it fails but Redis is fine, entry by entry.

        Retrying a batch that fails for its content would fail forever and stall every
        entry behind it; taken one at a time, only an entry that fails alone is set aside.
        """
        try:
            await (self.process_overlapped if overlapped else self.process)(entries)
            self.entries_handled += len(entries)
        except RETRIED_ERRORS:
            raise  # Redis's, not the entries': the loop reads the batch again
        except Exception as exc:
            self.forget()
            if not entries:
                raise
            if len(entries) == 1:
                await self.set_aside(entries[0], repr(exc), exc)
                return
            log.warning("%s: a batch failed (%r); one entry at a time", self.reader.consumer, exc)
            await self.settle()
            for entry in entries:
                await self.handle([entry], overlapped=False)

    async def _set_aside_poison(self) -> None:
        poison, self.reader.poison = self.reader.poison, []
        for entry in poison:
            reason = f"delivered {self.reader.max_deliveries} times without success"
            await self.set_aside(entry, reason)

    async def set_aside(self, entry: Entry, reason: str, exc: BaseException | None = None) -> None:
        """Copy an entry nobody can handle to the dead letters, then acknowledge it."""
        log.error(
            "%s: entry %s of %s set aside to %s: %s",
            self.reader.consumer,
            as_text(entry.entry_id),
            entry.stream,
            self.dead_letter_for(entry),
            reason,
            exc_info=exc,
        )
        fields = dead_letter_fields(
            entry, reason, group=self.reader.group, consumer=self.reader.consumer
        )
        # Two trips on purpose: the acknowledgement only after the copy is written.
        await self.redis.xadd(
            self.dead_letter_for(entry), fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True
        )
        await self.reader.ack([entry], ride=False)
        self.entries_set_aside += 1
