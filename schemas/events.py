"""Events: the facts in a game's log, the single source of truth. Events are past tense.

A log is `GameCreated`, `PlayerSeated`..., `GameStarted`, `MovePlayed`..., `GameEnded`.
Every event carries `game_id`, `seq` (1, 2, ... without gaps), `time` (ms since the
epoch, by the engine service's clock), the `command_id` that caused it and `prev_hash`:
the sha256 hex of the previous event's encoded bytes ("" for seq 1), which makes every
log a hash chain anyone can verify (`schemas.codec.event_hash`).

Players are seats, not colours. `colours[i]` is the colour held by seat i+1; only
Hexade's swap changes it, and the `MovePlayed` of the swap records the new map.
Seat tokens never appear in a log: `PlayerSeated` keeps the sha256 hex of the token.

A game imported from an exported log (`ImportGame`) has the original's events, re-keyed
and re-chained; its `GameCreated` names the original in `imported_from`.

Fields added after the first logs were written (`imported_from`, the clock's time bank and
timeout policy, `forfeit_illegal`, `tournament`, a move's `timeout`, an end's `fault` and
`overrun_ms`) are left out of the encoding while they hold their default, so the events of
games that do not use them keep their bytes (`_Lean`).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, TypedDict

from pydantic import Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from schemas.base import (
    CommandId,
    GameId,
    PlayerName,
    Seat,
    Seq,
    TimeMs,
    WireModel,
)
from schemas.commands import SeatSpec, TimeoutPolicy

#: Why a game ended, a closed set. The rules: `natural`. A player's fault (the seat in
#: `GameEnded.fault`): `resignation`, `time_forfeit` (with the overrun), `illegal_move` (with
#: its text), `no_reply` (nobody serves the built-in bot to move), `disconnect` (no connection
#: serves the outside bot to move), and `abort` by a seated player (scored as its forfeit).
#: The platform's (`PLATFORM_REASONS`): `aborted` by the operator and `interrupted`;
#: tournaments replay such games instead of scoring them.
EndReason = Literal[
    "natural",
    "resignation",
    "time_forfeit",
    "illegal_move",
    "no_reply",
    "disconnect",
    "abort",
    "aborted",
    "interrupted",
]
#: Ends that are the platform's fault, not a player's: the game is not scored.
PLATFORM_REASONS: frozenset[str] = frozenset({"aborted", "interrupted"})
#: Ends with no result: neither a win nor a draw.
NO_RESULT_REASONS: frozenset[str] = frozenset({"abort", *PLATFORM_REASONS})
#: Colours held by seats 1 and 2, in that order.
Colours = Annotated[list[int], Field(min_length=2, max_length=2)]
Scores = Annotated[list[int], Field(min_length=2, max_length=2)] | None


class EventBase(WireModel):
    game_id: GameId
    seq: Annotated[int, Field(ge=1)]
    time: TimeMs
    command_id: CommandId
    prev_hash: Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]


class _Lean(EventBase):
    """An event whose `LEAN` fields are left out of the encoding while at their default."""

    LEAN: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _omit_defaults(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        fields = type(self).model_fields
        for name in self.LEAN:
            if name in data and data[name] == fields[name].default:
                del data[name]
        return data


class GameCreated(_Lean):
    """A game exists: what is played, by which seats, under which clock and engine.

    The clock: `move_time_ms` per move, and a bank of `time_bank_ms` per seat that a move
    overrunning its limit draws on (Kaggle's overage); a seat to move must move by the time
    of the event that gave it the turn + `move_time_ms` + what is left of its bank.
    """

    type: Literal["game_created"] = "game_created"
    game: str
    options: dict[str, str]
    seats: list[SeatSpec]
    #: Per-move time limit in milliseconds; 0 means none.
    move_time_ms: Annotated[int, Field(ge=0)]
    seed: int
    engine_version: str
    #: For a game imported from an exported log (`ImportGame`): the original game's id.
    imported_from: GameId | None = None
    #: Each seat's time bank in milliseconds (0: none).
    time_bank_ms: Annotated[int, Field(ge=0)] = 0
    on_timeout: TimeoutPolicy = "forfeit"
    #: A bot seat's illegal or unreadable move ends the game (`illegal_move`) instead of
    #: being refused; tournaments set it. People always get a refusal.
    forfeit_illegal: bool = False
    #: The tournament (or match) the game belongs to.
    tournament: GameId | None = None

    LEAN = ("imported_from", "time_bank_ms", "on_timeout", "forfeit_illegal", "tournament")


class PlayerSeated(EventBase):
    """A seat is taken; `token_hash` is the sha256 hex of its token."""

    type: Literal["player_seated"] = "player_seated"
    seat: Seat
    name: PlayerName
    kind: Literal["human", "bot"]
    token_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class GameStarted(EventBase):
    """Every seat is taken; `to_move` is the seat that moves first."""

    type: Literal["game_started"] = "game_started"
    to_move: Seat
    colours: Colours


class MovePlayed(_Lean):
    """A move: `ply` is its 0-based index in the game, as in the conformance data.

    `to_move` is the seat to move next, or 0 when the move ended the game (a
    `GameEnded` follows in the same append). `think_ms` is the time the move took as the
    server measured it: from when the seat's turn reached it (the event that gave the seat
    its turn, or later when a bot's turn was delivered late) to the move's arrival in the
    command stream; `lag_ms` is the platform's part before that, its lag in getting a bot
    its turn (`services.bus.delivery`), left out of the bot's time. `timeout` marks a random
    move the engine played for a seat that overran its clock (policy `random_move`).
    """

    type: Literal["move_played"] = "move_played"
    ply: Seq
    seat: Seat
    colour: Annotated[int, Field(ge=1, le=2)]
    move: str
    scores_after: Scores
    colours: Colours
    to_move: Annotated[int, Field(ge=0, le=2)]
    think_ms: Annotated[int, Field(ge=0)] = 0
    timeout: bool = False
    lag_ms: Annotated[int, Field(ge=0)] = 0

    LEAN = ("timeout", "lag_ms")


class GameEnded(_Lean):
    """The end: `result` is the winning seat or 0 for a draw (and for an abort).

    `detail` is the engine's outcome reason for a natural end (e.g. "line",
    "no-moves", "move-limit"), else a short text on the resignation, timeout or abort.
    `fault` is the seat whose fault the end is (0: nobody's, or the platform's) and
    `overrun_ms`, for a time forfeit, how far past its deadline the claim arrived.
    """

    type: Literal["game_ended"] = "game_ended"
    result: Annotated[int, Field(ge=0, le=2)]
    scores: Scores
    reason: EndReason
    detail: str = ""
    fault: Annotated[int, Field(ge=0, le=2)] = 0
    overrun_ms: Annotated[int, Field(ge=0)] = 0

    LEAN = ("fault", "overrun_ms")


Event = Annotated[
    GameCreated | PlayerSeated | GameStarted | MovePlayed | GameEnded,
    Field(discriminator="type"),
]

__all__ = [
    "EVENT_MAPS",
    "NO_RESULT_REASONS",
    "PLATFORM_REASONS",
    "Colours",
    "EndReason",
    "Event",
    "EventMap",
    "GameCreated",
    "GameCreatedMap",
    "GameEnded",
    "GameEndedMap",
    "GameStarted",
    "GameStartedMap",
    "MovePlayed",
    "MovePlayedMap",
    "PlayerSeated",
    "PlayerSeatedMap",
    "TimeoutPolicy",
]


# -- the same events as msgpack maps, for readers that fold many of them ------------------
# Decoding a model costs more than folding it; hot readers (projector, dispatcher, rebuild)
# unpack the stored map and read it through these types, which mypy checks like the
# models. tests/test_schemas.py holds their fields equal to the models'.
class _EventMapBase(TypedDict):
    v: int
    game_id: str
    seq: int
    time: int
    command_id: str
    prev_hash: str


class SeatSpecMap(TypedDict):
    kind: Literal["human", "bot"]
    name: str


# Lean fields (`_Lean`) are in a map only when not at their default, and `think_ms` is not
# in the moves of logs written before it was recorded: these maps' keys are optional.
class _GameCreatedLean(TypedDict, total=False):
    imported_from: str
    time_bank_ms: int
    on_timeout: TimeoutPolicy
    forfeit_illegal: bool
    tournament: str


class GameCreatedMap(_EventMapBase, _GameCreatedLean):
    type: Literal["game_created"]
    game: str
    options: dict[str, str]
    seats: list[SeatSpecMap]
    move_time_ms: int
    seed: int
    engine_version: str


class PlayerSeatedMap(_EventMapBase):
    type: Literal["player_seated"]
    seat: int
    name: str
    kind: Literal["human", "bot"]
    token_hash: str


class GameStartedMap(_EventMapBase):
    type: Literal["game_started"]
    to_move: int
    colours: list[int]


class _MovePlayedLean(TypedDict, total=False):
    think_ms: int
    timeout: bool
    lag_ms: int


class MovePlayedMap(_EventMapBase, _MovePlayedLean):
    type: Literal["move_played"]
    ply: int
    seat: int
    colour: int
    move: str
    scores_after: list[int] | None
    colours: list[int]
    to_move: int


class _GameEndedLean(TypedDict, total=False):
    fault: int
    overrun_ms: int


class GameEndedMap(_EventMapBase, _GameEndedLean):
    type: Literal["game_ended"]
    result: int
    scores: list[int] | None
    reason: EndReason
    detail: str


EventMap = GameCreatedMap | PlayerSeatedMap | GameStartedMap | MovePlayedMap | GameEndedMap
#: Each event model and its map type.
EVENT_MAPS: dict[type[EventBase], type[Any]] = {
    GameCreated: GameCreatedMap,
    PlayerSeated: PlayerSeatedMap,
    GameStarted: GameStartedMap,
    MovePlayed: MovePlayedMap,
    GameEnded: GameEndedMap,
}
