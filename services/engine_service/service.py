"""The engine service: reads commands, validates them against the rules, appends events.

It is the only writer of game logs. It joins consumer group `engine` on every partition's
command stream through the shared consumer loop (`services.bus.consumer`) and works in
batches: decode, decide (`services.engine_service.decide`), commit, reply, acknowledge.
On a single server the commit's round trip also reads the next batch (`GroupReader.read_ahead`).

Exactly once in effect: every outcome, rejections included, goes through the store's
atomic commit, which checks the log head the decision was made on and the command's memory
key (its principal and id). A seq conflict (another engine appended first) evicts the cached
game and the command is decided again on the reloaded log; an accepted command seen before
gets its first reply again and appends nothing, and another request under its key is
refused with `reused_command_id`. An entry is acknowledged only after its commit and its reply, so a
consumer killed at any point leaves work another one finishes. Within one batch, commands
of one game are committed in rounds, one per game per pipeline, so no decision builds on
an unconfirmed one.

Clocks are fair: a command is judged by when it reached the command stream, and no clock
runs while Redis refused the platform's writes (`services.bus.outages`). Before a
timeout claim is decided, the engine looks in the claim's command stream for a move or a
resignation of that game that arrived before the deadline but is not in the log yet (held
by an engine that stalled, say) and decides those first, so the claim loses to them.

Bad input never stops the loop: an undecodable command gets a `malformed` or `too_large`
reply when its `command_id`/`reply_to` can be read, else it goes to the partition's
dead-letter stream; either way it is acknowledged.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from schemas.codec import (
    FIELD,
    DecodeError,
    decode_command,
    decode_reply,
    encode,
    encode_accepted,
)
from schemas.codec import reply_address as read_reply_address
from schemas.commands import ClaimTimeout, Command, PlayMove, Resign, SeatPlayer
from schemas.replies import Accepted, Rejected
from schemas.tokens import human_token
from services.bus import outages
from services.bus.cache import LRU
from services.bus.clients import REPLY_MAXLEN, REPLY_TTL_MS, log_entries
from services.bus.connection import Client
from services.bus.consumer import (
    DEAD_LETTER_MAXLEN,
    ConsumerOptions,
    ConsumerSettings,
    StreamConsumer,
    dead_letter_fields,
)
from services.bus.keys import ENGINE_GROUP, Keys
from services.bus.reader import Entry
from services.bus.secret import shared_secret
from services.bus.text import id_ms, now_ms
from services.engine_service.decide import (
    GameRecord,
    Reject,
    Rules,
    memory_key,
    request_digest,
)
from services.engine_service.store import (
    Commit,
    Committed,
    EventStore,
    Fenced,
    SeqConflict,
    Unconfirmed,
)

log = logging.getLogger("agon.engine")

#: A command that keeps conflicting (other engines keep appending to its game) is left
#: pending after this many tries in one batch; a later claim finishes it.
MAX_CONFLICT_RETRIES = 8
#: An entry delivered this many times without being acknowledged is dead-lettered:
#: something about it kills engines.
MAX_DELIVERIES = 5
#: How often the engine reads the spells in which Redis refused writes (`bus.outages`).
OUTAGES_EVERY_S = 0.25


def settle_heap() -> None:
    """Move everything allocated so far (modules, rules tables) out of the collector's sight.

    Call once a serving process has started: a full collection otherwise rescans the
    whole startup heap, a pause of tens of milliseconds in the middle of serving;
    afterwards collections see only what the loop itself keeps.
    """
    gc.collect()
    gc.freeze()


# -- the service -------------------------------------------------------------------------
@dataclass
class Work:
    entry: Entry
    command: Command
    tries: int = 0
    #: for a timeout claim: the stream was searched for commands that beat its deadline
    searched: bool = False


@dataclass
class EngineStats:
    entries: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    conflicts: int = 0
    #: commits that fewer replicas than asked acknowledged (left pending, not replied to)
    unconfirmed: int = 0
    #: commits refused because another engine owns the partition now (left pending)
    fenced: int = 0
    malformed: int = 0
    dead_lettered: int = 0
    moves: int = 0
    #: commands decided before a timeout claim because they arrived before its deadline
    in_time: int = 0


@dataclass
class _Outbox:
    """What a batch sends once its commits are done: replies, dead letters, acks."""

    replies: list[tuple[str, bytes]] = field(default_factory=list)
    dead: list[tuple[str, dict[Any, Any]]] = field(default_factory=list)
    acks: dict[str, list[bytes]] = field(default_factory=dict)

    def ack(self, entry: Entry) -> None:
        self.acks.setdefault(entry.stream, []).append(entry.entry_id)


class EngineService(StreamConsumer):
    """One engine consumer: `run` until stopped, or `drain` what is there and return."""

    role = "engine"
    trim_groups = (ENGINE_GROUP,)
    defaults = ConsumerSettings(batch=256, claim_idle_ms=10_000, cache_size=10_000)

    def __init__(
        self,
        redis: Client,
        keys: Keys | None = None,
        *,
        secret: bytes | None = None,
        clock: Callable[[], int] = now_ms,
        reply_ttl_ms: int = 24 * 3_600_000,
        settings: ConsumerSettings | None = None,
        **options: Unpack[ConsumerOptions],
    ) -> None:
        keys = keys or Keys()
        self._streams = {keys.commands(p): p for p in keys.all_partitions()}
        self.join(
            redis, keys, list(self._streams), ENGINE_GROUP, settings,
            max_deliveries=MAX_DELIVERIES, partitioned=True, **options,
        )  # fmt: skip
        self.consumer = self.reader.consumer
        # With `replicas`, nothing is reported done (replied to, acknowledged) before that
        # many replicas hold it: a master that dies then loses no acknowledged event.
        self.store = EventStore(
            redis,
            keys,
            reply_ttl_ms=reply_ttl_ms,
            replicas=self.replicas,
            replica_timeout_ms=self.replica_timeout_ms,
            fence=self.fence,
        )
        #: the rules, once the secret is known (`setup`)
        self.rules = Rules(secret) if secret is not None else None
        self.clock = clock
        # Commands are judged by when they reached Redis (entry ids); a test that sets the
        # engine's clock judges them by that clock instead.
        self._by_arrival = clock is now_ms
        self.counts = EngineStats()
        self._cache: LRU[str, GameRecord] = LRU(self.settings.cache_size)
        self._flushing: asyncio.Future[None] | None = None
        self._outages_due = 0.0
        self._partition_spells_due = False

    def stats(self) -> dict[str, int]:
        c = self.counts
        return {
            "entries": c.entries,
            "moves": c.moves,
            "accepted": c.accepted,
            "rejected": c.rejected,
            "conflicts": c.conflicts,
            "unconfirmed": c.unconfirmed,
            "fenced": c.fenced,
            "malformed": c.malformed,
            "dead": c.dead_lettered + self.entries_set_aside,
        }

    async def setup(self) -> None:
        await super().setup()
        if self.rules is None:
            self.rules = Rules(await shared_secret(self.redis, self.keys))
        self.rules.warm_up()
        self.rules.partition_of = self.keys.partition
        await self.store.load_scripts()

    def dead_letter_for(self, entry: Entry) -> str:
        return self.keys.dead_letter(self._streams.get(entry.stream, 0))

    def forget(self) -> None:
        self._cache.clear()

    def forget_partitions(self, partitions: set[int]) -> None:
        self._cache.drop(lambda gid: self.keys.partition(gid) in partitions)
        self._partition_spells_due = True  # a partition taken: its spells before its moves

    async def settle(self) -> None:
        await self._flushed()

    async def read_new(self, block_ms: int | None) -> list[Entry]:
        """New entries from every partition (up to `batch` each); block up to `block_ms`."""
        await self.setup()
        return await self.reader.read(block_ms)

    # -- processing ------------------------------------------------------------------------
    async def process(self, entries: Sequence[Entry]) -> None:
        """Decide, commit, reply and acknowledge a batch of entries."""
        await self.process_overlapped(entries)
        await self._flushed()

    async def process_overlapped(self, entries: Sequence[Entry]) -> None:
        """Decide and commit a batch; its replies and acks leave in the background.

        The serving loops go on to read and decide the next batch while Redis takes
        this one's replies and acks: one round trip less between a command and the
        next. At most one flush is in flight, so replies keep their order; a failed
        flush leaves its entries pending (their commits are done and remembered), so a
        later delivery answers them again from the replies memory.
        """
        if not entries:
            return
        self.counts.entries += len(entries)
        out = _Outbox()
        pending: list[Work] = []
        for entry in entries:
            work = self._decode(entry, out)
            if work is not None:
                pending.append(work)
        while pending:
            pending = await self._round(pending, out)
        try:
            await self._flushed()
        except Exception:
            # This batch's flush must still go out; the failed one's entries stay pending.
            log.exception("engine %s: replies and acks of a batch failed", self.consumer)
        if out.replies or out.dead or out.acks:
            self._flushing = asyncio.ensure_future(self._flush(out))

    async def _flushed(self) -> None:
        """Wait for the flush in flight, if any (it raises here if it failed)."""
        task, self._flushing = self._flushing, None
        if task is not None:
            await task

    def _decode(self, entry: Entry, out: _Outbox) -> Work | None:
        if entry.data is None:
            self._to_dead_letter(entry, f"no field {FIELD!r}", out)
            return None
        try:
            cmd = decode_command(entry.data)
        except DecodeError as exc:
            self.counts.malformed += 1
            address = read_reply_address(entry.data)
            if address is not None and self._reply_ok(address[1]):
                command_id, reply_to = address
                reply = Rejected(command_id=command_id, code=exc.code, message=exc.message)
                out.replies.append((reply_to, encode(reply)))
                out.ack(entry)
            else:
                self._to_dead_letter(entry, f"{exc.code}: {exc.message}", out)
            return None
        if cmd.reply_to and not self._reply_ok(cmd.reply_to):
            self.counts.malformed += 1
            prefix = self.keys.reply_stream("")
            self._to_dead_letter(entry, f"reply_to {cmd.reply_to!r} is outside {prefix}*", out)
            return None
        return Work(entry, cmd)

    def _reply_ok(self, stream: str) -> bool:
        # Replies go only to reply streams: a crafted reply_to must not write into a log.
        return self.keys.is_reply_stream(stream)

    async def _round(self, pending: list[Work], out: _Outbox) -> list[Work]:
        """Commit at most one command per game; return what is left for the next round."""
        this: list[Work] = []
        later: list[Work] = []
        games: set[str] = set()
        for work in pending:
            gid = work.command.game_id
            (later if gid in games else this).append(work)
            games.add(gid)
        records, broken = await self._records(games)
        await self._read_outages(
            {self.keys.partition(w.command.game_id) for w in this if self._past_due(w, records)}
        )
        this, later = await self._in_time_first(this, later, records, pending)
        # Events are stamped after the reads: a clock runs from its event's time, and the
        # reads (a cold game's whole log) would otherwise come off the next seat's time.
        now = self.clock()
        commits: list[Commit] = []
        decided: list[Work] = []
        for work in this:
            gid = work.command.game_id
            if gid in broken:
                self._fail(work, broken[gid], out)
                continue
            commit = self._decide(work, records.get(gid), now, out)
            if commit is not None:
                commits.append(commit)
                decided.append(work)
        try:
            results = await self.store.commit_many(commits, rider=self.reader.read_ahead)
        except BaseException:
            # Nobody knows which decisions reached the log: forget them all.
            for gid in games:
                self._evict(gid)
            raise
        retry: list[Work] = []
        for work, commit, result in zip(decided, commits, results, strict=True):
            if isinstance(result, Fenced):
                # Another engine owns the partition now: it claims the entry, still pending.
                self.counts.fenced += 1
                self._evict(work.command.game_id)
                self.lose(result.partition, result.epoch)
                continue
            if isinstance(result, Unconfirmed):
                # Maybe in the log, maybe not: tell nobody, keep the entry pending. The
                # sender's retry (same command id), or a later claim of the entry, finds
                # it done (and waits for the replicas again) or does it again.
                self.counts.unconfirmed += 1
                self._evict(work.command.game_id)
                self.reader.recover([work.entry.stream])  # read again once its master answers
                continue
            if isinstance(result, SeqConflict):
                self.counts.conflicts += 1
                self._evict(work.command.game_id)
                work.tries += 1
                if work.tries < MAX_CONFLICT_RETRIES:
                    retry.append(work)
                else:
                    log.warning(
                        "engine %s: %s keeps conflicting; left pending",
                        self.consumer,
                        work.entry.entry_id,
                    )
                continue
            self._settle(work, commit, result, out)
        return retry + later

    async def _in_time_first(
        self,
        this: list[Work],
        later: list[Work],
        records: dict[str, GameRecord],
        batch: Sequence[Work],
    ) -> tuple[list[Work], list[Work]]:
        """Put before each timeout claim the moves that arrived before its deadline.

        Such a move may sit with another engine (stalled, or slower): it is read again
        from the command stream and decided here first; the other engine's copy then gets
        the same reply and appends nothing. Returns the new (this round, later rounds).
        """
        assert self.rules is not None, "setup() first"
        claims = []
        for work in this:
            rec, cmd = records.get(work.command.game_id), work.command
            if isinstance(cmd, ClaimTimeout) and not work.searched and rec is not None:
                work.searched = True
                if rec.deadline and cmd.expected_seq == rec.head:
                    deadline, _ = self.rules.turn_deadline(
                        rec, cmd.expected_seq, cmd.clock, self._arrived(work)
                    )
                    claims.append((work, rec, deadline))
        if not claims:
            return this, later
        pipe = self.redis.pipeline(transaction=False)
        for work, rec, deadline in claims:
            # Slack before the turn began, for clocks that disagree a little.
            pipe.xrange(work.entry.stream, rec.last_time - 5000, deadline)
        known = {(w.entry.stream, w.entry.entry_id) for w in batch}
        for (claim, rec, _), rows in zip(claims, await pipe.execute(), strict=True):
            found = []
            for entry_id, fields in rows:
                entry = Entry(claim.entry.stream, entry_id, fields.get(b"m"))
                if (entry.stream, entry_id) in known or entry.data is None:
                    continue
                try:
                    cmd = decode_command(entry.data)
                except DecodeError:
                    continue
                if cmd.game_id == rec.game_id and isinstance(cmd, PlayMove | Resign):
                    found.append(Work(entry, cmd))
            if found:
                self.counts.in_time += len(found)
                log.info(
                    "engine %s: %d command(s) of game %s arrived before its deadline: "
                    "deciding them before the timeout claim",
                    self.consumer,
                    len(found),
                    rec.game_id,
                )
                at = this.index(claim)
                this[at] = found[0]
                later = [*found[1:], claim, *later]
        return this, later

    def _decide(self, work: Work, rec: GameRecord | None, now: int, out: _Outbox) -> Commit | None:
        cmd = work.command
        head = rec.fold.seq if rec is not None else 0
        arrived = self._arrived(work, now)
        try:
            assert self.rules is not None, "setup() first"
            decision = self.rules.decide(rec, cmd, now, arrived)
        except Reject as rej:
            reply = Rejected(
                command_id=cmd.command_id,
                game_id=cmd.game_id,
                code=rej.code,
                message=rej.message,
                seq=head,
            )
            # Never remembered: a retry is decided afresh. Its memory key still finds the
            # first reply of an accepted command that it repeats; the head check proves that
            # the rejection was decided on the current log.
            return Commit(
                cmd.game_id,
                head,
                memory_key(rej.principal, cmd.command_id),
                encode(reply),
                (),
                now,
                remember=False,
                ack=self._ack_in_commit(work),
                digest=request_digest(cmd),
            )
        except Exception as exc:
            # A bug: never kill the loop for it.
            log.exception("engine %s: cannot process %s", self.consumer, work.entry.entry_id)
            self._evict(cmd.game_id)
            self._fail(work, f"engine error: {type(exc).__name__}: {exc}", out)
            return None
        self._cache_put(decision.record)
        fold = decision.record.fold
        # A seat's token is never stored, not even in the reply memory: `_settle` adds it.
        accepted = encode_accepted(cmd.command_id, cmd.game_id, fold.seq, None)
        return Commit(
            cmd.game_id,
            head,
            memory_key(decision.principal, cmd.command_id),
            accepted,
            decision.events,
            now,
            ack=self._ack_in_commit(work),
            ends=fold.status == "ended",
            digest=request_digest(cmd),
        )

    def _ack_in_commit(self, work: Work) -> bytes:
        """The entry id for the commit script to acknowledge, or b"" to ack after replying.

        A command nobody waits on (bots send none) is done once committed, so its ack
        rides in the commit; one with a reply is acknowledged only after the reply went
        out. The script can only ack on its own partition's command stream.
        """
        if work.command.reply_to or self.store.replicas:
            return b""
        entry = work.entry
        if self._streams.get(entry.stream) != self.store.partition(work.command.game_id):
            return b""
        return entry.entry_id

    def _settle(self, work: Work, commit: Commit, result: Committed, out: _Outbox) -> None:
        cmd = work.command
        reply = result.reply
        if result.duplicate:
            self.counts.duplicates += 1
            if commit.events:
                # The events were decided but not appended: the cached record ran ahead.
                self._evict(cmd.game_id)
            if result.digest != commit.digest:
                reply = encode(self._reused(cmd))
        elif commit.events:
            self.counts.accepted += 1
            if isinstance(cmd, PlayMove):
                self.counts.moves += 1
            rec = self._cache.get(cmd.game_id)
            if rec is not None and rec.end_reason is not None:
                self._evict(cmd.game_id)  # finished games only ever get rejections now
        else:
            self.counts.rejected += 1
        if isinstance(cmd, SeatPlayer):
            reply = self._with_token(cmd, reply)
        if cmd.reply_to:
            out.replies.append((cmd.reply_to, reply))
        if not commit.ack:
            out.ack(work.entry)  # else the commit script acknowledged it

    def _with_token(self, cmd: SeatPlayer, reply: bytes) -> bytes:
        """An accepted seat command's reply with its seat's token, derived again: the token
        is in no store, the reply memory included (`schemas.tokens.human_token`)."""
        answer = decode_reply(reply)
        if not isinstance(answer, Accepted):
            return reply
        assert self.rules is not None, "setup() first"
        token = human_token(self.rules.secret, cmd.game_id, cmd.seat, cmd.command_id)
        return encode_accepted(cmd.command_id, cmd.game_id, answer.seq, token)

    @staticmethod
    def _reused(cmd: Command) -> Rejected:
        return Rejected(
            command_id=cmd.command_id,
            game_id=cmd.game_id,
            code="reused_command_id",
            message=f"command id {cmd.command_id!r} was used for another request to game"
            f" {cmd.game_id}; a new request needs a new id",
        )

    def _fail(self, work: Work, reason: str, out: _Outbox) -> None:
        """A command the engine cannot handle at all: dead-letter it, tell the sender."""
        cmd = work.command
        self._to_dead_letter(work.entry, reason, out)
        if cmd.reply_to:
            reply = Rejected(
                command_id=cmd.command_id,
                game_id=cmd.game_id,
                code="malformed",
                message=f"the engine could not process this command: {reason}",
            )
            out.replies.append((cmd.reply_to, encode(reply)))

    def _to_dead_letter(self, entry: Entry, reason: str, out: _Outbox) -> None:
        self.counts.dead_lettered += 1
        log.warning(
            "engine %s: dead-lettering %s %s: %s",
            self.consumer,
            entry.stream,
            entry.entry_id,
            reason,
        )
        p = self._streams.get(entry.stream, 0)
        fields = dead_letter_fields(entry, reason, consumer=self.consumer)
        out.dead.append((self.keys.dead_letter(p), fields))
        out.ack(entry)

    async def _flush(self, out: _Outbox) -> None:
        """Send replies and dead letters, then acknowledge: never ack what is not done.

        One pipeline: Redis runs it in order, so every acknowledgement lands after the
        replies and dead letters of its batch.
        """
        if not (out.replies or out.dead or out.acks):
            return
        pipe = self.redis.pipeline(transaction=False)
        for stream, data in out.replies:
            pipe.xadd(stream, {FIELD: data}, maxlen=REPLY_MAXLEN, approximate=True)
        for stream in {stream for stream, _ in out.replies}:
            # A reply stream outlives its reader by an hour at most.
            pipe.pexpire(stream, REPLY_TTL_MS)
        for stream, fields in out.dead:
            pipe.xadd(stream, fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        acked = list(out.acks)
        for stream in acked:
            pipe.xack(stream, ENGINE_GROUP, *out.acks[stream])
        try:
            results = await pipe.execute(raise_on_error=False)
        except BaseException:
            self.reader.recover(acked)  # which acks landed is unknown: read them all again
            raise
        sent = len(results) - len(acked)
        # A failed reply (e.g. a reply_to that names a key of another type): the command is
        # done and its reply remembered, so a retry by the sender still gets it.
        replies = [r for r in results[:sent] if isinstance(r, Exception)]
        # A failed ack (its master went down): the entries stay pending with this consumer,
        # and only it reads them again, answering from the replies memory.
        unacked = [
            s for s, r in zip(acked, results[sent:], strict=True) if isinstance(r, Exception)
        ]
        if replies or unacked:
            self.reader.recover(unacked)
            log.warning(
                "engine %s: %d replies or dead letters and %d acks failed (%s)%s",
                self.consumer,
                len(replies),
                len(unacked),
                next(r for r in results if isinstance(r, Exception)),
                "; the unacknowledged entries are read again" if unacked else "",
            )

    # -- the cache of live games ---------------------------------------------------------
    async def _records(self, game_ids: set[str]) -> tuple[dict[str, GameRecord], dict[str, str]]:
        """Records of these games, from the cache or rebuilt from their logs in one trip.

        The second map names games whose logs do not replay, with the reason.
        """
        found: dict[str, GameRecord] = {}
        broken: dict[str, str] = {}
        missing: list[str] = []
        for gid in game_ids:
            rec = self._cache.get(gid)
            if rec is None:
                missing.append(gid)
            else:
                found[gid] = rec
        if missing:
            pipe = self.redis.pipeline(transaction=False)
            for gid in missing:
                pipe.xrange(self.keys.log(gid), "-", "+")
            for gid, rows in zip(missing, await pipe.execute(), strict=True):
                try:
                    rec = GameRecord.from_log(gid, log_entries(rows))
                except Exception as exc:
                    log.exception("engine %s: game %s's log does not replay", self.consumer, gid)
                    broken[gid] = f"the log of game {gid} does not replay: {exc}"
                    continue
                if rec is not None:
                    found[gid] = rec
                    self._cache_put(rec)
        return found, broken

    async def _read_outages(self, due: set[int]) -> None:
        """Keep the rules' outages current: those of every partition every
        `OUTAGES_EVERY_S`, and before judging a timeout claim or a command that came after
        its deadline (the dispatcher and the bot worker record a spell before they claim
        or answer after one) those of its partition too, `due`; those of all this engine's
        partitions after a partition was taken or a master seen failing over. After a
        failover most batches hold such a command: each reads its own partitions' spells,
        not those of every partition the engine holds (a key on each of their masters)."""
        now = time.monotonic()
        if not (due or self._partition_spells_due) and now < self._outages_due:
            return
        self._outages_due = now + OUTAGES_EVERY_S
        assert self.rules is not None, "setup() first"
        wanted = self.partitions() if self._partition_spells_due else sorted(due)
        read = self.with_unwritten(
            await outages.partition_spells(self.redis, self.keys, [None, *wanted])
        )
        self.rules.outages = read.pop(None, self.rules.outages)
        self._partition_spells_due = False
        fresh = {p: spells for p, spells in read.items() if p in wanted}
        self.rules.partition_outages = {**self.rules.partition_outages, **fresh}

    def _arrived(self, work: Work, now: int | None = None) -> int:
        """When `work` reached its command stream (by Redis's clock), or by the engine's
        own clock (a test's) `now`."""
        if self._by_arrival:
            return id_ms(work.entry.entry_id)
        return self.clock() if now is None else now

    def _past_due(self, work: Work, records: dict[str, GameRecord]) -> bool:
        """Whether `work` is a timeout claim, or arrived after its game's deadline: the
        rules then judge it with the spells of its partition too."""
        if isinstance(work.command, ClaimTimeout):
            return True
        rec = records.get(work.command.game_id)
        return rec is not None and bool(rec.deadline) and self._arrived(work) > rec.deadline

    def spell_seen(self, spell: outages.Spell, partitions: list[int]) -> None:
        """A master did not answer during `spell`: the next round reads its partitions'
        spells (with this one, before any heartbeat wrote it) before it judges a move."""
        self._partition_spells_due = True

    def _cache_put(self, rec: GameRecord) -> None:
        self._cache.put(rec.game_id, rec)

    def _evict(self, game_id: str) -> None:
        self._cache.pop(game_id)
