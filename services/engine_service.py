"""The engine service: reads commands, validates them against the rules, appends events.

It is the only writer of game logs. It joins consumer group `engine` on every
partition's command stream and works in batches: read (XREADGROUP over all
partitions, plus XAUTOCLAIM of entries a dead consumer left pending), decode, decide,
commit, reply, acknowledge. The functional core is `decide(record, command, now)`,
which either raises `Reject` (no event exists yet) or emits events and folds them into
the game's `GameRecord`; `GameRecord.from_log` folds a stored log the same way, so
the in-memory cache of live games is rebuilt from the log on a miss.

Exactly once in effect: every outcome, rejections included, goes through the store's
atomic commit, which checks the log head the decision was made on and the command id.
A seq conflict (another engine appended first) evicts the cached game and the
command is decided again on the reloaded log; a command id seen before gets its
first reply again and appends nothing. An entry is acknowledged only after its
commit and its reply, so a consumer killed at any point leaves work another one
finishes (XAUTOCLAIM). Within one batch, commands of one game are committed in
rounds, one per game per pipeline, so no decision builds on an unconfirmed one.

Bad input never stops the loop: an undecodable command gets a `malformed` or
`too_large` reply when its `command_id`/`reply_to` can be read, else it goes to
the partition's dead-letter stream; either way it is acknowledged.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from engine import (
    ENGINE_VERSION,
    Game,
    IllegalMoveError,
    InvalidMoveError,
    Move,
    State,
    load_game,
)
from engine.core import game_names
from schemas.codec import (
    FIELD,
    FIELD_BYTES,
    DecodeError,
    decode_command,
    decode_event,
    encode,
    encode_accepted,
    encode_move_played,
    event_hash,
)
from schemas.codec import reply_address as read_reply_address
from schemas.commands import (
    Abort,
    ClaimTimeout,
    Command,
    CreateGame,
    PlayMove,
    Resign,
    SeatPlayer,
)
from schemas.events import (
    EndReason,
    EventBase,
    GameCreated,
    GameEnded,
    GameStarted,
    MovePlayed,
    PlayerSeated,
)
from schemas.replies import RejectCode, Rejected
from schemas.tokens import (
    admin_token,
    bot_token,
    new_human_token,
    server_secret,
    token_hash,
    token_matches,
)
from services.keys import ENGINE_GROUP, Keys
from services.redis_embedded import add_service_arguments, redis_url_or_embedded, setup_logging
from services.store import Commit, Committed, EventStore, LogEntry, SeqConflict, connect
from services.streams import Entry, GroupReader, as_text, consumer_name, now_ms

log = logging.getLogger("agon.engine")

#: A command that keeps conflicting (other engines keep appending to its game) is left
#: pending after this many tries in one batch; a later claim finishes it.
MAX_CONFLICT_RETRIES = 8
#: An entry delivered this many times without being acknowledged is dead-lettered:
#: something about it kills engines.
MAX_DELIVERIES = 5
DEAD_LETTER_MAXLEN = 10_000
REPLY_MAXLEN = 10_000


def settle_heap() -> None:
    """Move everything allocated so far (modules, rules tables) out of the collector's sight.

    Call once a serving process has started: a full collection otherwise rescans the
    whole startup heap, a pause of tens of milliseconds in the middle of serving;
    afterwards collections see only what the loop itself keeps.
    """
    gc.collect()
    gc.freeze()


class Reject(Exception):
    """A command the rules, the seats or the log refuse; becomes a `Rejected` reply."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code: RejectCode = code
        self.message = message


def _stale(expected: int, head: int) -> Reject:
    return Reject("stale_seq", f"expected seq {expected} but the log is at {head}")


# -- the functional core ---------------------------------------------------------------
@dataclass
class GameRecord:
    """What the engine knows of a live game: the position and the facts of its log."""

    game_id: str
    created: GameCreated
    game: Game
    state: State
    head: int = 0
    last_hash: str = ""
    #: time of the head event: a per-move deadline runs from it
    last_time: int = 0
    seated: dict[int, PlayerSeated] = field(default_factory=dict)
    started: bool = False
    ended: GameEnded | None = None
    #: Per seat, the last token that matched its logged hash: a bot sends the same token
    #: with every move, and comparing it is cheaper than hashing it again.
    verified: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_log(cls, game_id: str, entries: Sequence[LogEntry]) -> GameRecord | None:
        """Fold a stored log into a record; None for a game without a log."""
        if not entries:
            return None
        rec: GameRecord | None = None
        for entry in entries:
            event = decode_event(entry.data)
            if rec is None:
                if not isinstance(event, GameCreated):
                    raise ValueError(f"game {game_id}: log starts with {event.type}")
                rec = cls.new(event)
            elif isinstance(event, MovePlayed):
                rec.state.apply(event.move)
            rec.evolve(event, event_hash(entry.data))
        return rec

    @classmethod
    def new(cls, created: GameCreated) -> GameRecord:
        game = load_game(created.game, **created.options)
        return cls(created.game_id, created, game, game.new_initial_state())

    def evolve(self, event: EventBase, data_hash: str) -> None:
        """Fold one event's facts in; a `MovePlayed` must already be applied to `state`."""
        self.head = event.seq
        self.last_hash = data_hash
        self.last_time = event.time
        if isinstance(event, PlayerSeated):
            self.seated[event.seat] = event
            self.verified.pop(event.seat, None)
        elif isinstance(event, GameStarted):
            self.started = True
        elif isinstance(event, GameEnded):
            self.ended = event

    @property
    def to_move(self) -> int:
        """The seat to move (0 once the game is over)."""
        return 0 if self.ended is not None else self.state.seat_to_move

    def colours(self) -> list[int]:
        """The colour of each seat: seats hold colours 1 and 2 in order unless swapped."""
        return self.state.seat_colours()

    def scores(self) -> list[int] | None:
        scores = self.state.scores()
        return None if scores is None else list(scores)


@dataclass
class Decision:
    """The effect of an accepted command: encoded events (already folded into `record`)."""

    record: GameRecord
    events: list[bytes]
    token: str | None = None


class Rules:
    """`decide`: validate a command against a game record and emit its events."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._admin = admin_token(secret)

    def decide(self, rec: GameRecord | None, cmd: Command, now: int) -> Decision:
        """Events for `cmd`, folded into the (possibly new) record; `Reject` if refused.

        Never changes `rec` before it is sure to accept, so a rejection leaves it intact.
        """
        if isinstance(cmd, CreateGame):
            return self._create(rec, cmd, now)
        if rec is None:
            raise Reject("unknown_game", f"no game {cmd.game_id}")
        if rec.ended is not None:
            raise Reject("game_over", f"game {cmd.game_id} is over ({rec.ended.reason})")
        out = Decision(rec, [])
        if isinstance(cmd, SeatPlayer):
            out.token = self._seat(out, cmd, now)
        elif isinstance(cmd, PlayMove):
            self._play(out, cmd, now)
        elif isinstance(cmd, Resign):
            self._check_token(rec, cmd.seat, cmd.token)
            self._end(out, cmd, now, 3 - cmd.seat, "resignation", f"seat {cmd.seat} resigned")
        elif isinstance(cmd, ClaimTimeout):
            self._timeout(out, cmd, now)
        elif isinstance(cmd, Abort):
            if cmd.seat == 0:
                if not hmac.compare_digest(cmd.token, self._admin):
                    raise Reject("bad_token", "the admin token does not match")
                who = "the operator"
            else:
                self._check_token(rec, cmd.seat, cmd.token)
                who = f"seat {cmd.seat}"
            self._end(out, cmd, now, 0, "abort", f"aborted by {who}")
        return out

    # -- one method per command ----------------------------------------------------------
    def _create(self, rec: GameRecord | None, cmd: CreateGame, now: int) -> Decision:
        if rec is not None:
            raise Reject("stale_seq", f"game {cmd.game_id} already exists (log at {rec.head})")
        if cmd.game not in game_names():
            raise Reject("unknown_game", f"unknown game {cmd.game!r}; known: {game_names()}")
        try:
            game = load_game(cmd.game, **cmd.options)
        except ValueError as exc:
            raise Reject("malformed", str(exc)) from None
        created = GameCreated(
            game_id=cmd.game_id,
            seq=1,
            time=now,
            command_id=cmd.command_id,
            prev_hash="",
            game=cmd.game,
            options=dict(game.options),
            seats=list(cmd.seats),
            move_time_ms=cmd.move_time_ms,
            seed=cmd.seed,
            engine_version=ENGINE_VERSION,
        )
        data = encode(created)
        rec = GameRecord(cmd.game_id, created, game, game.new_initial_state())
        rec.evolve(created, event_hash(data))
        out = Decision(rec, [data])
        for seat, spec in enumerate(cmd.seats, start=1):
            if spec.kind == "bot":
                token = bot_token(self.secret, cmd.game_id, seat)
                self._emit(
                    out,
                    cmd,
                    now,
                    PlayerSeated,
                    seat=seat,
                    name=spec.name,
                    kind="bot",
                    token_hash=token_hash(token),
                )
        self._start_if_full(out, cmd, now)
        return out

    def _seat(self, out: Decision, cmd: SeatPlayer, now: int) -> str:
        rec = out.record
        spec = rec.created.seats[cmd.seat - 1]
        if spec.kind == "bot":
            raise Reject("bad_token", f"seat {cmd.seat} is the bot {spec.name}'s")
        if cmd.seat in rec.seated:
            raise Reject("bad_token", f"seat {cmd.seat} is taken by {rec.seated[cmd.seat].name}")
        if spec.name and spec.name != cmd.name:
            raise Reject("bad_token", f"seat {cmd.seat} is reserved for {spec.name}")
        token = new_human_token()
        self._emit(
            out,
            cmd,
            now,
            PlayerSeated,
            seat=cmd.seat,
            name=cmd.name,
            kind="human",
            token_hash=token_hash(token),
        )
        self._start_if_full(out, cmd, now)
        return token

    def _play(self, out: Decision, cmd: PlayMove, now: int) -> None:
        rec = out.record
        self._check_token(rec, cmd.seat, cmd.token)
        if not rec.started:
            raise Reject("not_your_turn", f"game {cmd.game_id} has not started: seats are open")
        if cmd.expected_seq != rec.head:
            raise Reject(
                "stale_seq", f"expected seq {cmd.expected_seq} but the log is at {rec.head}"
            )
        to_move = rec.to_move
        if cmd.seat != to_move:
            raise Reject("not_your_turn", f"seat {to_move} is to move, not seat {cmd.seat}")
        state = rec.state
        colour, ply = state.current_player, state.ply
        try:
            move = Move.parse(cmd.move)
            state.apply(move)
        except InvalidMoveError as exc:
            raise Reject("invalid_move", str(exc)) from None
        except IllegalMoveError as exc:
            raise Reject("illegal_move", str(exc)) from None
        # The move is in: from here on `rec` carries it. The log keeps canonical notation.
        # Every value below comes from the checked command and the engine's own state, so
        # the event is encoded without building (and validating) a model: this is the
        # hot path. tests/test_engine_service.py holds the bytes to the model's encoding.
        to_move = state.seat_to_move
        seq = rec.head + 1
        after = state.scores()
        data = encode_move_played(
            rec.game_id,
            seq,
            now,
            cmd.command_id,
            rec.last_hash,
            ply,
            cmd.seat,
            colour,
            str(move),
            None if after is None else list(after),
            rec.colours(),
            to_move,
        )
        rec.head, rec.last_hash, rec.last_time = seq, event_hash(data), now
        out.events.append(data)
        outcome = state.outcome()
        if outcome is not None:
            winner = state.seat_of(outcome.winner) if outcome.winner else 0
            scores = list(outcome.scores) if outcome.scores is not None else None
            self._emit(
                out,
                cmd,
                now,
                GameEnded,
                result=winner,
                scores=scores,
                reason="natural",
                detail=outcome.reason,
            )

    def _timeout(self, out: Decision, cmd: ClaimTimeout, now: int) -> None:
        rec = out.record
        if not rec.started:
            raise Reject("not_your_turn", f"game {cmd.game_id} has not started: no clock runs")
        if cmd.expected_seq != rec.head:
            raise Reject(
                "stale_seq", f"expected seq {cmd.expected_seq} but the log is at {rec.head}"
            )
        limit = rec.created.move_time_ms
        if limit == 0:
            raise Reject("illegal_move", f"game {cmd.game_id} has no per-move time limit")
        deadline = rec.last_time + limit
        if now < deadline:
            raise Reject("illegal_move", f"seat {rec.to_move} has {deadline - now} ms left")
        late = rec.to_move
        self._end(
            out, cmd, now, 3 - late, "time_forfeit", f"seat {late} did not move within {limit} ms"
        )

    # -- helpers -------------------------------------------------------------------------
    def _check_token(self, rec: GameRecord, seat: int, token: str) -> None:
        seated = rec.seated.get(seat)
        if seated is None:
            raise Reject("bad_token", f"seat {seat} of game {rec.game_id} is not taken")
        known = rec.verified.get(seat)
        if known is not None and hmac.compare_digest(token, known):
            return
        if not token_matches(token, seated.token_hash):
            raise Reject("bad_token", f"wrong token for seat {seat} of game {rec.game_id}")
        rec.verified[seat] = token

    def _start_if_full(self, out: Decision, cmd: Command, now: int) -> None:
        rec = out.record
        if not rec.started and len(rec.seated) == len(rec.created.seats):
            self._emit(out, cmd, now, GameStarted, to_move=rec.to_move, colours=rec.colours())

    def _end(
        self, out: Decision, cmd: Command, now: int, winner: int, reason: EndReason, detail: str
    ) -> None:
        self._emit(
            out,
            cmd,
            now,
            GameEnded,
            result=winner,
            scores=out.record.scores(),
            reason=reason,
            detail=detail,
        )

    @staticmethod
    def _emit(out: Decision, cmd: Command, now: int, cls: type[EventBase], **fields: Any) -> None:
        rec = out.record
        event = cls(
            game_id=rec.game_id,
            seq=rec.head + 1,
            time=now,
            command_id=cmd.command_id,
            prev_hash=rec.last_hash,
            **fields,
        )
        data = encode(event)
        rec.evolve(event, event_hash(data))
        out.events.append(data)


# -- the service -------------------------------------------------------------------------
@dataclass
class Work:
    entry: Entry
    command: Command
    tries: int = 0


@dataclass
class EngineStats:
    entries: int = 0
    accepted: int = 0
    rejected: int = 0
    duplicates: int = 0
    conflicts: int = 0
    malformed: int = 0
    dead_lettered: int = 0
    moves: int = 0


@dataclass
class _Outbox:
    """What a batch sends once its commits are done: replies, dead letters, acks."""

    replies: list[tuple[str, bytes]] = field(default_factory=list)
    dead: list[tuple[str, dict[Any, Any]]] = field(default_factory=list)
    acks: dict[str, list[bytes]] = field(default_factory=dict)

    def ack(self, entry: Entry) -> None:
        self.acks.setdefault(entry.stream, []).append(entry.entry_id)


class EngineService:
    """One engine process's consumer: `run` forever, or `drain` what is there and return."""

    def __init__(
        self,
        redis: Redis,
        keys: Keys | None = None,
        *,
        consumer: str | None = None,
        secret: bytes | None = None,
        batch: int = 256,
        block_ms: int = 1000,
        claim_idle_ms: int = 10_000,
        claim_every_s: float = 5.0,
        cache_size: int = 10_000,
        clock: Callable[[], int] = now_ms,
        feed_maxlen: int = 0,
    ) -> None:
        self.redis = redis
        self.keys = keys or Keys()
        self.store = EventStore(redis, self.keys, feed_maxlen=feed_maxlen)
        self.consumer = consumer or consumer_name("engine")
        self.rules = Rules(secret if secret is not None else server_secret())
        self.batch = batch
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.claim_every_s = claim_every_s
        self.cache_size = cache_size
        self.clock = clock
        self.stats = EngineStats()
        self._cache: OrderedDict[str, GameRecord] = OrderedDict()
        self._streams = {self.keys.commands(p): p for p in self.keys.all_partitions()}
        # The reader reclaims stale entries (XAUTOCLAIM) every `claim_every_s` by itself.
        self.reader = GroupReader(
            redis,
            list(self._streams),
            ENGINE_GROUP,
            self.consumer,
            count=batch,
            claim_idle_ms=claim_idle_ms,
            claim_every_s=claim_every_s,
        )
        self._ready = False
        self._flushing: asyncio.Future[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def setup(self) -> None:
        """Create the `engine` group on every partition (from the start of each stream)."""
        if not self._ready:
            await self.reader.setup()
            self._ready = True

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until `stop` is set: read and process; now and then reclaim and tidy."""
        stop = stop or asyncio.Event()
        next_sweep = 0.0
        while not stop.is_set():
            try:
                await self.setup()
                if time.monotonic() >= next_sweep:
                    await self.sweep_poison()
                    await self.trim_commands()
                    next_sweep = time.monotonic() + self.claim_every_s
                await self._process(await self.reader.read(self.block_ms))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Redis went away or a bug: log, wait a little, go on. Unacknowledged
                # entries stay pending and are claimed again, so nothing is lost.
                log.exception("engine %s: batch failed; retrying", self.consumer)
                if "NOGROUP" in str(exc):
                    self._ready = False  # the streams were deleted: create the groups again
                await asyncio.sleep(0.5)
        await self._flushed()

    async def drain(self) -> int:
        """Process everything available (stale pending entries first), then return.

        Returns the number of entries handled; tests and benchmarks use this instead
        of sleeping.
        """
        await self.setup()
        await self.sweep_poison()
        handled = 0
        entries = await self.reader.read(None, reclaim=True)
        while entries:
            handled += len(entries)
            await self._process(entries)
            entries = await self.reader.read(None)
        await self._flushed()
        return handled

    # -- reading -------------------------------------------------------------------------
    async def read_new(self, block_ms: int | None) -> list[Entry]:
        """New entries from every partition (up to `batch` each); block up to `block_ms`."""
        await self.setup()
        return await self.reader.read(block_ms)

    async def sweep_poison(self) -> None:
        """Dead-letter idle entries delivered `MAX_DELIVERIES` times: they kill engines."""
        pipe = self.redis.pipeline(transaction=False)
        for stream in self._streams:
            pipe.xpending(stream, ENGINE_GROUP)
        summaries = await pipe.execute(raise_on_error=False)
        out = _Outbox()
        for stream, summary in zip(self._streams, summaries, strict=True):
            if isinstance(summary, Exception) or not summary["pending"]:
                continue  # no group yet (setup makes it), or nothing pending: one trip in all
            pending: Any = await self.redis.xpending_range(
                stream, ENGINE_GROUP, "-", "+", self.batch, idle=self.claim_idle_ms
            )
            for row in pending:
                if row["times_delivered"] >= MAX_DELIVERIES:
                    eid = row["message_id"]
                    rows: Any = await self.redis.xrange(stream, eid, eid)
                    data = rows[0][1].get(FIELD_BYTES, b"") if rows else b""
                    reason = f"delivered {row['times_delivered']} times without success"
                    self._to_dead_letter(Entry(stream, eid, data), reason, out)
        await self._flush(out)

    async def trim_commands(self) -> None:
        """Drop command entries every engine has acknowledged (older than any pending one)."""
        for stream in self._streams:
            groups: Any = await self.redis.xinfo_groups(stream)
            group = next((g for g in groups if as_text(g["name"]) == ENGINE_GROUP), None)
            if group is None:
                continue
            floor = as_text(group["last-delivered-id"])
            summary: Any = await self.redis.xpending(stream, ENGINE_GROUP)
            if summary["pending"]:
                floor = min(floor, as_text(summary["min"]), key=_id_key)
            if floor != "0-0":
                await self.redis.xtrim(stream, minid=floor, approximate=True)

    # -- processing ------------------------------------------------------------------------
    async def process(self, entries: Sequence[Entry]) -> None:
        """Decide, commit, reply and acknowledge a batch of entries."""
        await self._process(entries)
        await self._flushed()

    async def _process(self, entries: Sequence[Entry]) -> None:
        """Decide and commit a batch; its replies and acks leave in the background.

        The serving loops go on to read and decide the next batch while Redis takes
        this one's replies and acks: one round trip less between a command and the
        next. At most one flush is in flight, so replies keep their order; a failed
        flush leaves its entries pending (their commits are done and remembered), so a
        later delivery answers them again from the replies memory.
        """
        if not entries:
            return
        self.stats.entries += len(entries)
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
            self.stats.malformed += 1
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
            self.stats.malformed += 1
            prefix = self.keys.reply_stream("")
            self._to_dead_letter(entry, f"reply_to {cmd.reply_to!r} is outside {prefix}*", out)
            return None
        return Work(entry, cmd)

    def _reply_ok(self, stream: str) -> bool:
        # Replies go only to reply streams: a crafted reply_to must not write into a log.
        return self.keys.is_reply_stream(stream)

    async def _round(self, pending: list[Work], out: _Outbox) -> list[Work]:
        """Commit at most one command per game; return what is left for the next round."""
        now = self.clock()
        this: list[Work] = []
        later: list[Work] = []
        games: set[str] = set()
        for work in pending:
            gid = work.command.game_id
            (later if gid in games else this).append(work)
            games.add(gid)
        records, broken = await self._records(games)
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
            results = await self.store.commit_many(commits)
        except BaseException:
            # Nobody knows which decisions reached the log: forget them all.
            for gid in games:
                self._evict(gid)
            raise
        retry: list[Work] = []
        for work, commit, result in zip(decided, commits, results, strict=True):
            if isinstance(result, SeqConflict):
                self.stats.conflicts += 1
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

    def _decide(self, work: Work, rec: GameRecord | None, now: int, out: _Outbox) -> Commit | None:
        cmd = work.command
        head = rec.head if rec is not None else 0
        try:
            decision = self.rules.decide(rec, cmd, now)
        except Reject as rej:
            reply = Rejected(
                command_id=cmd.command_id,
                game_id=cmd.game_id,
                code=rej.code,
                message=rej.message,
                seq=head,
            )
            # Without a game there is nothing to attach a memory to; the head check still
            # proves that no game appeared meanwhile.
            return Commit(
                cmd.game_id,
                head,
                cmd.command_id,
                encode(reply),
                (),
                now,
                rec is not None,
                self._ack_in_commit(work),
            )
        except Exception as exc:
            # A bug: never kill the loop for it.
            log.exception("engine %s: cannot process %s", self.consumer, work.entry.entry_id)
            self._evict(cmd.game_id)
            self._fail(work, f"engine error: {type(exc).__name__}: {exc}", out)
            return None
        self._cache_put(decision.record)
        accepted = encode_accepted(
            cmd.command_id, cmd.game_id, decision.record.head, decision.token
        )
        return Commit(
            cmd.game_id,
            head,
            cmd.command_id,
            accepted,
            decision.events,
            now,
            ack=self._ack_in_commit(work),
        )

    def _ack_in_commit(self, work: Work) -> bytes:
        """The entry id for the commit script to acknowledge, or b"" to ack after replying.

        A command nobody waits on (bots send none) is done once committed, so its ack
        rides in the commit; one with a reply is acknowledged only after the reply went
        out. The script can only ack on its own partition's command stream.
        """
        if work.command.reply_to:
            return b""
        entry = work.entry
        if self._streams.get(entry.stream) != self.store.partition(work.command.game_id):
            return b""
        return entry.entry_id

    def _settle(self, work: Work, commit: Commit, result: Committed, out: _Outbox) -> None:
        cmd = work.command
        if result.duplicate:
            self.stats.duplicates += 1
            if commit.events:
                # The events were decided but not appended: the cached record ran ahead.
                self._evict(cmd.game_id)
        elif commit.events:
            self.stats.accepted += 1
            if isinstance(cmd, PlayMove):
                self.stats.moves += 1
            rec = self._cache.get(cmd.game_id)
            if rec is not None and rec.ended is not None:
                self._evict(cmd.game_id)  # finished games only ever get rejections now
        else:
            self.stats.rejected += 1
        if cmd.reply_to:
            out.replies.append((cmd.reply_to, result.reply))
        if not commit.ack:
            out.ack(work.entry)  # else the commit script acknowledged it

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
        self.stats.dead_lettered += 1
        log.warning(
            "engine %s: dead-lettering %s %s: %s",
            self.consumer,
            entry.stream,
            entry.entry_id,
            reason,
        )
        p = self._streams.get(entry.stream, 0)
        fields: dict[Any, Any] = {
            FIELD: entry.data or b"",
            "reason": reason,
            "stream": entry.stream,
            "id": entry.entry_id,
            "consumer": self.consumer,
        }
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
        for stream, fields in out.dead:
            pipe.xadd(stream, fields, maxlen=DEAD_LETTER_MAXLEN, approximate=True)
        for stream, ids in out.acks.items():
            pipe.xack(stream, ENGINE_GROUP, *ids)
        for result in await pipe.execute(raise_on_error=False):
            if isinstance(result, Exception):
                # e.g. a reply_to that names a key of another type: the command is done
                # and its reply remembered, so a retry by the sender still gets it.
                log.warning("engine %s: reply or dead letter failed: %s", self.consumer, result)

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
                self._cache.move_to_end(gid)
                found[gid] = rec
        if missing:
            pipe = self.redis.pipeline(transaction=False)
            for gid in missing:
                pipe.xrange(self.keys.log(gid), "-", "+")
            for gid, rows in zip(missing, await pipe.execute(), strict=True):
                entries = [
                    LogEntry(int(as_text(eid).split("-")[0]), f[FIELD_BYTES]) for eid, f in rows
                ]
                try:
                    rec = GameRecord.from_log(gid, entries)
                except Exception as exc:
                    log.exception("engine %s: game %s's log does not replay", self.consumer, gid)
                    broken[gid] = f"the log of game {gid} does not replay: {exc}"
                    continue
                if rec is not None:
                    found[gid] = rec
                    self._cache_put(rec)
        return found, broken

    def _cache_put(self, rec: GameRecord) -> None:
        self._cache[rec.game_id] = rec
        self._cache.move_to_end(rec.game_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _evict(self, game_id: str) -> None:
        self._cache.pop(game_id, None)


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, n = entry_id.partition("-")
    return int(ms), int(n or 0)


# -- `agon engine`: one engine service process -------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_service_arguments(parser)
    parser.add_argument("--batch", type=int, default=256, help="entries per partition per read")
    parser.add_argument(
        "--drain", action="store_true", help="process what is there, then exit (burst mode)"
    )


def run(args: argparse.Namespace) -> int:
    setup_logging(args.verbose)

    async def main(url: str) -> int:
        redis = connect(url)
        engine = EngineService(redis, Keys(args.prefix, args.partitions), batch=args.batch)
        try:
            await engine.setup()
            settle_heap()
            if args.drain:
                print(f"engine {engine.consumer}: {await engine.drain()} entries handled")
            else:
                await engine.run()
        finally:
            await redis.aclose()
        return 0

    with redis_url_or_embedded(args.redis_url) as url:
        try:
            return asyncio.run(main(url))
        except KeyboardInterrupt:
            return 0
