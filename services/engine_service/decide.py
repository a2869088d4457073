"""The engine's functional core: `decide(record, command, now)` -> events, or `Reject`.

Pure: no Redis, no clock of its own. `Rules.decide` validates a command against a game's
`GameRecord` (the position and the facts of its log) and either raises `Reject` before any
event exists or emits the command's events and folds them into the record.
`GameRecord.from_log` folds a stored log the same way, so the engine service's cache of
live games is rebuilt from the log on a miss.

Clocks are judged by arrival: `decide` gets `arrived`, when the command reached the command
stream (its entry id's time), and a move that arrived by the deadline counts however late
an engine gets to it; a timeout claim counts only if it arrived after the deadline. The
deadline runs from the head event, or from when the turn reached the bot when the command
carries the deadline signed then (`schemas.tokens.clock_stamp`), whichever is later, but at
most `MAX_GRACE_MS` later: the platform's lag in getting the turn to the bot is not the
bot's time. A claim signed as the platform's (`late_stamp`: the turn never reached its bot
in time) ends the game as `interrupted`, which tournaments replay instead of scoring.

Every command is decided for a principal, the one its credentials prove (`principal`): a
seat once its token matched, the operator once the admin token matched, and the roles that
need none (joining an open seat, claiming a timeout, creating, importing). The engine
service keeps a command's reply under that principal and its command id, so no client can
name, pre-empt or poison another principal's ids: a command that fails authentication has
no principal, and nothing is looked up or remembered for it.

`ImportGame` creates a game from a finished game's exported log: checked as `agon verify`
checks a log (hash chain, seqs, a replay move for move), then appended whole, re-keyed to
the new id and re-chained (`services.gamelog.export`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import msgpack

from engine import ENGINE_VERSION, IllegalMoveError, InvalidMoveError, Move, State, load_game
from engine.core import game_names
from schemas.codec import (
    decode_event,
    encode,
    encode_map,
    event_hash,
    move_played_map,
    unpack_event,
)
from schemas.commands import (
    Abort,
    ClaimTimeout,
    Command,
    CreateGame,
    ImportGame,
    PlayMove,
    Resign,
    SeatPlayer,
    SeatSpec,
)
from schemas.events import (
    EndReason,
    EventBase,
    EventMap,
    GameCreated,
    GameEnded,
    GameStarted,
    PlayerSeated,
)
from schemas.replies import RejectCode
from schemas.tokens import (
    MAX_GRACE_MS,
    SEND_GRACE_MS,
    admin_token,
    bot_token,
    clock_key,
    human_token,
    late_deadline,
    stamped_deadline,
    token_hash,
    token_matches,
    tokens_equal,
)
from services.bus.clients import LogEntry
from services.bus.outages import paused_ms
from services.gamelog.export import log_problems, rekeyed
from services.gamelog.fold import GameFold, fold


class Reject(Exception):
    """A command the rules, the seats or the log refuse; becomes a `Rejected` reply.

    `principal` is who the command was proved to come from before it was refused ("" when
    it failed authentication): a retry of an accepted command, refused now that the log has
    moved on, still finds its first reply under that principal."""

    def __init__(self, code: RejectCode, message: str) -> None:
        super().__init__(message)
        self.code: RejectCode = code
        self.message = message
        self.principal = ""


def stale(sent: int, head: int) -> str:
    """A `stale_seq` refusal's words: the seq the command was sent for, and the one the log
    expects (its head)."""
    return f"sent for seq {sent}, but the log is at seq {head}: expected seq {head}"


#: The principals that need no credentials: whoever may join an open seat, claim a
#: timeout (only a deadline that has passed is accepted), create or import a game.
JOINER, CLOCK, CREATOR, IMPORTER = "join", "clock", "create", "import"
#: The operator, proved by the admin token.
OPERATOR = "admin"
#: Bytes of `request_digest`.
DIGEST_BYTES = 8


def seat_principal(seat: int) -> str:
    """The principal of a seat, proved by its token."""
    return f"seat{seat}"


def memory_key(principal: str, command_id: str) -> str:
    """Where a command's reply is remembered: its id within its principal's ("": nowhere,
    for a command whose credentials failed). A principal holds no space, so keys of two
    principals never meet."""
    return f"{principal} {command_id}" if principal else ""


def request_digest(cmd: Command) -> bytes:
    """What a command asks for, apart from its id, credentials and return address.

    The engine keeps it beside a remembered reply: a retry carries the same request and gets
    the first reply again; another request under a used id is refused, not answered with a
    reply that was not its own (as Stripe treats an idempotency key reused with another body).
    """
    if isinstance(cmd, PlayMove):  # the hot path: no model dump
        body = f"move|{cmd.seat}|{cmd.move}|{cmd.expected_seq}".encode()
    else:
        fields = cmd.model_dump(exclude={"command_id", "reply_to", "token", "clock"})
        body = msgpack.packb(fields, use_bin_type=True)
    return hashlib.blake2b(body, digest_size=DIGEST_BYTES).digest()


# -- the functional core ---------------------------------------------------------------
@dataclass
class GameRecord:
    """What the engine knows of a live game: the shared fold of its log (position, seats,
    status, clock) plus what only the engine needs: the creation as a model, the hash of
    the head event (the next event's `prev_hash`) and the tokens it has verified."""

    created: GameCreated
    fold: GameFold
    last_hash: str = ""
    #: Per seat, the last token that matched its logged hash: a bot sends the same token
    #: with every move, and comparing it is cheaper than hashing it again.
    verified: dict[int, str] = field(default_factory=dict)

    @classmethod
    def from_log(cls, game_id: str, entries: Sequence[LogEntry]) -> GameRecord | None:
        """Fold a stored log into a record; None for a game without a log."""
        if not entries:
            return None
        created = decode_event(entries[0].data)
        if not isinstance(created, GameCreated):
            raise ValueError(f"game {game_id}: log starts with {created.type}")
        folded = fold(game_id, [unpack_event(e.data) for e in entries])
        if folded.state is None:
            raise ValueError(f"game {game_id}: {folded.error}")
        return cls(created, folded, event_hash(entries[-1].data))

    @classmethod
    def new(cls, created: GameCreated, data: bytes) -> GameRecord:
        """The record of a game whose `GameCreated` (encoded as `data`) was just decided."""
        folded = GameFold.start(_event_map(created))
        if folded.state is None:
            raise ValueError(folded.error)
        return cls(created, folded, event_hash(data))

    def evolve(self, event: EventBase, data_hash: str) -> None:
        """Fold in an event the engine decided (never a move: see `GameFold.played`)."""
        self.fold.apply(_event_map(event))
        self.last_hash = data_hash
        if isinstance(event, PlayerSeated):
            self.verified.pop(event.seat, None)

    @property
    def game_id(self) -> str:
        return self.fold.game_id

    @property
    def state(self) -> State:
        state = self.fold.state
        assert state is not None  # `new` and `from_log` refuse a game without rules
        return state

    @property
    def head(self) -> int:
        return self.fold.seq

    @property
    def last_time(self) -> int:
        """Time of the head event: a per-move deadline runs from it."""
        return self.fold.updated

    @property
    def started(self) -> bool:
        return self.fold.status != "waiting"

    @property
    def end_reason(self) -> str | None:
        """Why the game ended, or None while it goes on."""
        return None if self.fold.result is None else str(self.fold.result["reason"])

    @property
    def deadline(self) -> int:
        """When the seat to move must have sent its move (ms; 0: no clock)."""
        return self.fold.deadline

    @property
    def to_move(self) -> int:
        """The seat to move (0 once the game is over)."""
        return 0 if self.fold.status == "ended" else self.state.seat_to_move

    def colours(self) -> list[int]:
        """The colour of each seat: seats hold colours 1 and 2 in order unless swapped."""
        return self.state.seat_colours()

    def scores(self) -> list[int] | None:
        scores = self.state.scores()
        return None if scores is None else list(scores)


def _event_map(event: EventBase) -> EventMap:
    """A decided event as the map the fold reads (what its encoding unpacks to)."""
    mapped: Any = event.model_dump()
    return cast("EventMap", mapped)


@dataclass
class Decision:
    """The effect of an accepted command: encoded events (already folded into `record`),
    for `principal`."""

    record: GameRecord
    events: list[bytes]
    principal: str


class Rules:
    """`decide`: validate a command against a game record and emit its events."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._admin = admin_token(secret)
        self._clock_key = clock_key(secret)
        #: Spells in which Redis refused the platform's writes (`services.bus.outages`): no
        #: clock runs in them. The engine service keeps them current.
        self.outages: Sequence[tuple[int, int]] = ()
        #: Those of one partition alone (its master did not answer), by partition, and
        #: the partition of a game.
        self.partition_outages: Mapping[int, Sequence[tuple[int, int]]] = {}
        self.partition_of: Callable[[str], int] | None = None

    def decide(
        self, rec: GameRecord | None, cmd: Command, now: int, arrived: int | None = None
    ) -> Decision:
        """Events for `cmd`, folded into the (possibly new) record; `Reject` if refused.

        `now` stamps the events; `arrived` (default `now`) is when the command reached the
        command stream, by which clocks judge it. Never changes `rec` before it is sure to
        accept, so a rejection leaves it intact.
        """
        arrived = now if arrived is None else arrived
        if isinstance(cmd, CreateGame | ImportGame):
            principal = CREATOR if isinstance(cmd, CreateGame) else IMPORTER
        elif rec is None:
            raise Reject("unknown_game", f"no game {cmd.game_id}")
        else:
            principal = self.principal(rec, cmd)
        try:
            return self._decide(rec, cmd, now, arrived, principal)
        except Reject as rej:
            rej.principal = principal
            raise

    def principal(self, rec: GameRecord, cmd: Command) -> str:
        """Who `cmd` speaks for, its credentials checked (`Reject` with `bad_token` if they
        do not match): a seat's token, the admin token, or a role that needs none."""
        if isinstance(cmd, PlayMove | Resign) or (isinstance(cmd, Abort) and cmd.seat):
            self._check_token(rec, cmd.seat, cmd.token)
            return seat_principal(cmd.seat)
        if isinstance(cmd, Abort):
            if not tokens_equal(cmd.token, self._admin):
                raise Reject("bad_token", "the admin token does not match")
            return OPERATOR
        return JOINER if isinstance(cmd, SeatPlayer) else CLOCK

    def _decide(
        self, rec: GameRecord | None, cmd: Command, now: int, arrived: int, principal: str
    ) -> Decision:
        if isinstance(cmd, CreateGame):
            return self._create(rec, cmd, now)
        if isinstance(cmd, ImportGame):
            return self._import(rec, cmd)
        assert rec is not None  # `decide` refused a command for no game
        if rec.end_reason is not None:
            raise Reject("game_over", f"game {cmd.game_id} is over ({rec.end_reason})")
        out = Decision(rec, [], principal)
        if isinstance(cmd, SeatPlayer):
            self._seat(out, cmd, now)
        elif isinstance(cmd, PlayMove):
            self._play(out, cmd, now, arrived)
        elif isinstance(cmd, Resign):
            self._end(
                out,
                cmd,
                now,
                3 - cmd.seat,
                "resignation",
                f"seat {cmd.seat} resigned",
                fault=cmd.seat,
            )
        elif isinstance(cmd, ClaimTimeout):
            self._timeout(out, cmd, now, arrived)
        elif isinstance(cmd, Abort):
            self._abort(out, cmd, now)
        return out

    def warm_up(self) -> None:
        """Decide a throwaway creation of every game at its default options, in memory.

        The first decision of a game in a process builds its rules and the models' encoders
        (tens of ms); a clock runs from its event's time, so a cold engine would take that
        from the first seat to move."""
        for name in game_names():
            seats = [SeatSpec(kind="bot", name="warm-up")] * 2
            self.decide(None, CreateGame(command_id="warm-up", game_id="warm-up", game=name,
                                         seats=seats), 0)  # fmt: skip

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
            time_bank_ms=cmd.time_bank_ms,
            on_timeout=cmd.on_timeout,
            forfeit_illegal=cmd.forfeit_illegal,
            tournament=cmd.tournament,
        )
        data = encode(created)
        out = Decision(GameRecord.new(created, data), [data], CREATOR)
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

    @staticmethod
    def _import(rec: GameRecord | None, cmd: ImportGame) -> Decision:
        """A finished game's exported log as a new game: checked as `agon verify` checks a
        log (hash chain, seqs, a replay move for move), then appended re-keyed to the new id
        and re-chained, with its times, seats, moves and result (`services.gamelog.export.rekeyed`).
        """
        if rec is not None:
            raise Reject("stale_seq", f"game {cmd.game_id} already exists (log at {rec.head})")
        # The maps are the exported ones, keys as stored: packed again they are the
        # original bytes, which the chain links (`services.gamelog.export`).
        entries = [
            LogEntry(n, msgpack.packb(ev, use_bin_type=True))
            for n, ev in enumerate(cmd.events, start=1)
        ]
        problems = log_problems(entries)
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise Reject("invalid_import", f"cannot import: {problems[0]}{more}")
        last = cmd.events[-1].get("type")
        if last != "game_ended":
            raise Reject(
                "invalid_import",
                f"cannot import: the game has not ended (its last event, seq {len(entries)},"
                f" is {last}); only a finished game can be imported",
            )
        events = rekeyed(entries, cmd.game_id)
        record = GameRecord.from_log(
            cmd.game_id, [LogEntry(n, data) for n, data in enumerate(events, start=1)]
        )
        assert record is not None  # a checked log has events
        return Decision(record, events, IMPORTER)

    def _seat(self, out: Decision, cmd: SeatPlayer, now: int) -> None:
        rec = out.record
        spec = rec.created.seats[cmd.seat - 1]
        if spec.kind == "bot":
            raise Reject("bad_token", f"seat {cmd.seat} is the bot {spec.name}'s")
        if cmd.seat in rec.fold.token_hashes:
            taken_by = rec.fold.seats[cmd.seat - 1]["name"]
            raise Reject("bad_token", f"seat {cmd.seat} is taken by {taken_by}")
        if spec.name and spec.name != cmd.name:
            raise Reject("bad_token", f"seat {cmd.seat} is reserved for {spec.name}")
        token = human_token(self.secret, rec.game_id, cmd.seat, cmd.command_id)
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

    def _play(self, out: Decision, cmd: PlayMove, now: int, arrived: int) -> None:
        rec = out.record
        fold = rec.fold  # the hot path reads the fold's fields directly
        if fold.status == "waiting":
            raise Reject("not_your_turn", f"game {cmd.game_id} has not started: seats are open")
        head = fold.seq
        if cmd.expected_seq != head:
            raise Reject("stale_seq", stale(cmd.expected_seq, head))
        state = rec.state
        to_move = state.seat_to_move  # the game is not over: `decide` checked
        if cmd.seat != to_move:
            raise Reject("not_your_turn", f"seat {to_move} is to move, not seat {cmd.seat}")
        deadline, start = self.turn_deadline(rec, cmd.expected_seq, cmd.clock, arrived)
        if deadline and arrived > deadline:
            raise Reject(
                "too_late",
                f"the move arrived {arrived - deadline} ms after seat {to_move}'s deadline",
            )
        # The rules' notation memo (shared with every fold of these rules) holds canonical
        # texts only, so a command in canonical notation, as bots send, skips the parser.
        text = cmd.move
        action = fold.actions.get(text)
        try:
            if action is None:
                move = Move.parse(text)
                action = state.game.action_of(move)
                text = str(move)
                if text == cmd.move:
                    fold.actions[text] = action
            lag = start - fold.updated  # the platform's, before the turn reached the bot
            self._apply(out, cmd, now, action, text, arrived - start, lag_ms=lag)
        except (InvalidMoveError, IllegalMoveError) as exc:
            code: RejectCode = "illegal_move"
            if isinstance(exc, InvalidMoveError):
                code = "invalid_move"
            if not (rec.created.forfeit_illegal and fold.seats[cmd.seat - 1]["kind"] == "bot"):
                raise Reject(code, str(exc)) from None
            detail = f"seat {cmd.seat} played {cmd.move!r}: {exc}"
            self._end(out, cmd, now, 3 - cmd.seat, "illegal_move", detail, fault=cmd.seat)

    def _apply(
        self,
        out: Decision,
        cmd: Command,
        now: int,
        action: int,
        text: str,
        think_ms: int,
        timeout: bool = False,
        lag_ms: int = 0,
    ) -> None:
        """Play `action` (`text`, canonical) for the seat to move: its `MovePlayed`, and
        the `GameEnded` if it ends the game. Raises, changing nothing, if it is illegal."""
        rec = out.record
        fold = rec.fold
        state = rec.state
        seat, colour, ply = state.seat_to_move, state.current_player, state.ply
        state.apply_legal(action, text)
        # The move is in: from here on `rec` carries it. The log keeps canonical notation.
        # Every value below comes from the checked command and the engine's own state, so
        # the event is encoded without building (and validating) a model: this is the hot
        # path. tests/services/test_engine_service.py holds the bytes to the model's encoding.
        after = state.scores()
        event = move_played_map(
            fold.game_id,
            fold.seq + 1,
            now,
            cmd.command_id,
            rec.last_hash,
            ply,
            seat,
            colour,
            text,
            None if after is None else list(after),
            rec.colours(),
            state.seat_to_move,
            max(0, think_ms),
            timeout,
            max(0, lag_ms),
        )
        data = encode_map(event)
        fold.played(event)
        rec.last_hash = event_hash(data)
        out.events.append(data)
        outcome = state.outcome()
        if outcome is not None:
            winner = state.seat_of(outcome.winner) if outcome.winner else 0
            scores = list(outcome.scores) if outcome.scores is not None else None
            self._end(out, cmd, now, winner, "natural", outcome.reason, scores)

    def _timeout(self, out: Decision, cmd: ClaimTimeout, now: int, arrived: int) -> None:
        rec = out.record
        if not rec.started:
            raise Reject("not_your_turn", f"game {cmd.game_id} has not started: no clock runs")
        if cmd.expected_seq != rec.head:
            raise Reject("stale_seq", stale(cmd.expected_seq, rec.head))
        limit = rec.created.move_time_ms
        if limit == 0:
            raise Reject("illegal_move", f"game {cmd.game_id} has no per-move time limit")
        deadline, start = self.turn_deadline(rec, cmd.expected_seq, cmd.clock, arrived)
        if arrived <= deadline:
            raise Reject("illegal_move", f"seat {rec.to_move} had {deadline - arrived} ms left")
        late, overrun = rec.to_move, arrived - deadline
        if late_deadline(self.secret, rec.game_id, cmd.expected_seq, cmd.clock) is not None:
            detail = f"the platform did not hand seat {late} its turn in time ({overrun} ms late)"
            self._end(out, cmd, now, 0, "interrupted", detail)
            return
        if rec.created.on_timeout == "random_move":
            # Ludii's competitions: a random legal move for the ply, drawn from the game's
            # seed and the ply, so a replay of the log makes the same one.
            state = rec.state
            legal = [str(m) for m in state.legal_moves()]
            text = random.Random(f"{rec.created.seed}:{state.ply}").choice(sorted(legal))
            action = state.game.action_of(Move.parse(text))
            self._apply(out, cmd, now, action, text, arrived - start, timeout=True)
            return
        detail = f"seat {late} did not move within its time ({overrun} ms over)"
        self._end(out, cmd, now, 3 - late, "time_forfeit", detail, fault=late, overrun_ms=overrun)

    def _abort(self, out: Decision, cmd: Abort, now: int) -> None:
        rec = out.record
        if cmd.seat:  # its token was checked (`principal`)
            self._end(out, cmd, now, 0, "abort", f"aborted by seat {cmd.seat}", fault=cmd.seat)
            return
        if cmd.reason == "abandoned":
            idle = (now - rec.last_time) // 1000
            self._end(out, cmd, now, 0, "aborted", f"abandoned: nothing happened for {idle} s")
            return
        if cmd.reason not in ("no_reply", "disconnect"):
            self._end(out, cmd, now, 0, cmd.reason, f"{cmd.reason} by the operator")
            return
        late = rec.to_move
        if not late:
            raise Reject("not_your_turn", f"game {cmd.game_id} has nobody to move")
        name = rec.fold.seats[late - 1]["name"]
        if cmd.reason == "disconnect":
            detail = f"{name}, the outside bot to move in seat {late}, is not connected"
        else:
            detail = f"nobody serves {name}, the bot to move in seat {late}"
        self._end(out, cmd, now, 3 - late, cmd.reason, detail, fault=late)

    # -- helpers -------------------------------------------------------------------------
    def turn_deadline(self, rec: GameRecord, seq: int, clock: str, arrived: int) -> tuple[int, int]:
        """The deadline of the seat to move (0: none) and when its time began: from the head
        event, or later from when the turn reached the bot when `clock` signs a later
        deadline for this game and seq (a hand-over after the command's arrival counts as
        the arrival; at most `MAX_GRACE_MS` later), and later again by the time Redis
        refused writes since (`outages`). A `late_stamp` signs the hand-over deadline too."""
        fold = rec.fold
        deadline, start = fold.deadline, fold.updated
        if deadline and clock:
            stamped = stamped_deadline(self._clock_key, fold.game_id, seq, clock)
            if stamped is None:
                stamped = late_deadline(self.secret, fold.game_id, seq, clock)
            if stamped is not None and stamped > deadline:
                allowance = deadline - start  # the per-move limit and what is left of the bank
                # A stamp signs the deadline the bot was told plus the send grace: the turn
                # reached the bot at `given`, or at the latest when the command arrived.
                given = min(stamped - SEND_GRACE_MS - allowance, arrived)
                latest = min(stamped, given + allowance + SEND_GRACE_MS, deadline + MAX_GRACE_MS)
                deadline, start = max(deadline, latest), max(start, given)
        spells = self.outages
        if self.partition_of is not None and self.partition_outages:
            spells = [*spells, *self.partition_outages.get(self.partition_of(fold.game_id), ())]
        if deadline and spells:
            paused = paused_ms(spells, start, arrived)
            deadline, start = deadline + paused, start + paused
        return deadline, start

    def _check_token(self, rec: GameRecord, seat: int, token: str) -> None:
        seated = rec.fold.token_hashes.get(seat)
        if seated is None:
            raise Reject("bad_token", f"seat {seat} of game {rec.game_id} is not taken")
        known = rec.verified.get(seat)
        if known is not None and tokens_equal(token, known):
            return
        if not token_matches(token, seated):
            raise Reject("bad_token", f"wrong token for seat {seat} of game {rec.game_id}")
        rec.verified[seat] = token

    def _start_if_full(self, out: Decision, cmd: Command, now: int) -> None:
        rec = out.record
        if not rec.started and len(rec.fold.token_hashes) == len(rec.created.seats):
            self._emit(out, cmd, now, GameStarted, to_move=rec.to_move, colours=rec.colours())

    def _end(
        self,
        out: Decision,
        cmd: Command,
        now: int,
        winner: int,
        reason: EndReason,
        detail: str,
        scores: list[int] | bool | None = True,
        *,
        fault: int = 0,
        overrun_ms: int = 0,
    ) -> None:
        """The game ends with `scores` (True: the position's; a natural end passes the
        rules' final ones), by the fault of seat `fault` (0: nobody's)."""
        final = out.record.scores() if scores is True else scores
        self._emit(
            out,
            cmd,
            now,
            GameEnded,
            result=winner,
            scores=final,
            reason=reason,
            detail=detail,
            fault=fault,
            overrun_ms=overrun_ms,
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
