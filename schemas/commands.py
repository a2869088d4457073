"""Commands: what clients, bots and the dispatcher send to the engine service.

Each command goes to the command stream of its game's partition and carries a
client-chosen `command_id` (the same id twice gets the first reply and changes
nothing) and `reply_to`, the stream the engine answers on. Commands are verbs.

`expected_seq` is always the seq of the last event the sender has seen (the log's
head when it decided); the engine rejects the command with `stale_seq` if the log
has moved on since.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.base import (
    BOT_NAME_RE,
    ClockStamp,
    CommandId,
    GameId,
    PlayerName,
    Seat,
    Seq,
    StreamName,
    WireModel,
)

SeatKind = Literal["human", "bot"]
#: What the engine does when the seat to move overruns its clock: end the game
#: (`forfeit`) or play a random legal move for that ply (`random_move`, as Ludii's
#: competitions did).
TimeoutPolicy = Literal["forfeit", "random_move"]


class SeatSpec(BaseModel):
    """One seat of a new game: a bot (seated at creation) or a human (seated by `SeatPlayer`).

    For a bot, `name` is the bot's name and picks its inbox. For a human, a non-empty
    `name` reserves the seat for that name; "" leaves it open to anyone.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SeatKind
    name: PlayerName = ""

    @model_validator(mode="after")
    def _bot_name_is_a_key(self) -> Self:
        # A bot's name becomes part of its inbox key, so it must be a safe key word.
        if self.kind == "bot" and not BOT_NAME_RE.fullmatch(self.name):
            raise ValueError(f"bot name {self.name!r} must match {BOT_NAME_RE.pattern}")
        return self


class _Command(WireModel):
    command_id: CommandId
    reply_to: StreamName = ""


class CreateGame(_Command):
    """Create a game. The client picks `game_id` (see `schemas.new_game_id`) to route it."""

    type: Literal["create_game"] = "create_game"
    game_id: GameId
    game: Annotated[str, Field(min_length=1, max_length=64)]
    options: dict[str, str] = Field(default_factory=dict)
    seats: Annotated[list[SeatSpec], Field(min_length=2, max_length=2)]
    #: Per-move time limit in milliseconds; 0 means no limit.
    move_time_ms: Annotated[int, Field(ge=0)] = 0
    seed: int = 0
    #: Each seat's time bank in milliseconds, drawn on by moves that overrun `move_time_ms`.
    time_bank_ms: Annotated[int, Field(ge=0)] = 0
    on_timeout: TimeoutPolicy = "forfeit"
    #: A bot seat's illegal move ends the game instead of being refused.
    forfeit_illegal: bool = False
    #: The tournament or match the game belongs to.
    tournament: GameId | None = None


class SeatPlayer(_Command):
    """Take a human seat; the `Accepted` reply carries the seat token (shown once)."""

    type: Literal["seat_player"] = "seat_player"
    game_id: GameId
    seat: Seat
    name: PlayerName


class PlayMove(_Command):
    """Play `move` (Agon notation, RULES.md §9) for `seat`, authenticated by its token."""

    type: Literal["play_move"] = "play_move"
    game_id: GameId
    seat: Seat
    token: Annotated[str, Field(max_length=256)]
    move: Annotated[str, Field(min_length=1, max_length=32)]
    expected_seq: Seq
    #: The turn request's signed deadline (`TurnRequest.clock`), if the move answers one.
    clock: ClockStamp = ""


class Resign(_Command):
    """Give up: the other seat wins."""

    type: Literal["resign"] = "resign"
    game_id: GameId
    seat: Seat
    token: Annotated[str, Field(max_length=256)]


class ClaimTimeout(_Command):
    """Claim that the seat to move has overrun its per-move limit; anyone may send it.

    The engine checks the deadline against its own clock and the time of the event
    at `expected_seq`, or the later deadline that `clock` signs (the dispatcher sends the
    one it gave the bot), so a claim cannot end a game early.
    """

    type: Literal["claim_timeout"] = "claim_timeout"
    game_id: GameId
    expected_seq: Seq
    clock: ClockStamp = ""


class Abort(_Command):
    """End the game: by a seated player (`seat`, its token; no winner, reason `abort`) or
    by the operator (`seat` 0 with the admin token, `schemas.tokens.admin_token`) for the
    `reason` given: `aborted`, `abandoned` (nobody touched the game for a long time; it ends
    as `aborted`) or `interrupted` (the platform's doing: no winner),
    `no_reply` (nobody serves the built-in bot to move: it loses) or `disconnect` (no
    connection serves the outside bot to move: it loses)."""

    type: Literal["abort"] = "abort"
    game_id: GameId
    seat: Annotated[int, Field(ge=0, le=2)]
    token: Annotated[str, Field(max_length=256)]
    reason: Literal["aborted", "abandoned", "interrupted", "no_reply", "disconnect"] = "aborted"


#: The most events an `ImportGame` may carry (its entry is bounded too: see
#: `schemas.codec.MAX_IMPORT_BYTES`).
MAX_IMPORT_EVENTS = 5000


class ImportGame(_Command):
    """Create game `game_id` from a finished game's exported log (`services.gamelog.export`).

    `events` are the exported event maps, keys as stored, in seq order. The engine checks
    them as a hash chain and replays them move for move; it appends them re-keyed to
    `game_id` and re-chained, with `imported_from` (the original id) on the `GameCreated`.
    """

    type: Literal["import_game"] = "import_game"
    game_id: GameId
    events: Annotated[list[dict[str, Any]], Field(min_length=1, max_length=MAX_IMPORT_EVENTS)]


Command = Annotated[
    CreateGame | SeatPlayer | PlayMove | Resign | ClaimTimeout | Abort | ImportGame,
    Field(discriminator="type"),
]

__all__ = [
    "MAX_IMPORT_EVENTS",
    "Abort",
    "ClaimTimeout",
    "Command",
    "CreateGame",
    "ImportGame",
    "PlayMove",
    "Resign",
    "SeatKind",
    "SeatPlayer",
    "SeatSpec",
    "TimeoutPolicy",
]
