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
and re-chained; its `GameCreated` names the original in `imported_from`, a field that is
left out of the encoding when absent, so every other event keeps its bytes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

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
from schemas.commands import SeatSpec

#: Why a game ended: the rules (`natural`), a resignation, a per-move time overrun, an abort.
EndReason = Literal["natural", "resignation", "time_forfeit", "abort"]
#: Colours held by seats 1 and 2, in that order.
Colours = Annotated[list[int], Field(min_length=2, max_length=2)]
Scores = Annotated[list[int], Field(min_length=2, max_length=2)] | None


class EventBase(WireModel):
    game_id: GameId
    seq: Annotated[int, Field(ge=1)]
    time: TimeMs
    command_id: CommandId
    prev_hash: Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]


class GameCreated(EventBase):
    """A game exists: what is played, by which seats, under which clock and engine."""

    type: Literal["game_created"] = "game_created"
    game: str
    options: dict[str, str]
    seats: list[SeatSpec]
    #: Per-move time limit in milliseconds; 0 means none.
    move_time_ms: Annotated[int, Field(ge=0)]
    seed: int
    engine_version: str
    #: For a game imported from an exported log (`ImportGame`): the original game's id.
    #: Absent from the encoding when None, so ordinary games keep their bytes.
    imported_from: GameId | None = None

    @model_serializer(mode="wrap")
    def _omit_absent_origin(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if data.get("imported_from", 0) is None:
            del data["imported_from"]
        return data


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


class MovePlayed(EventBase):
    """A move: `ply` is its 0-based index in the game, as in the conformance data.

    `to_move` is the seat to move next, or 0 when the move ended the game (a
    `GameEnded` follows in the same append).
    """

    type: Literal["move_played"] = "move_played"
    ply: Seq
    seat: Seat
    colour: Annotated[int, Field(ge=1, le=2)]
    move: str
    scores_after: Scores
    colours: Colours
    to_move: Annotated[int, Field(ge=0, le=2)]


class GameEnded(EventBase):
    """The end: `result` is the winning seat or 0 for a draw (and for an abort).

    `detail` is the engine's outcome reason for a natural end (e.g. "line",
    "no-moves", "move-limit"), else a short text on the resignation, timeout or abort.
    """

    type: Literal["game_ended"] = "game_ended"
    result: Annotated[int, Field(ge=0, le=2)]
    scores: Scores
    reason: EndReason
    detail: str = ""


Event = Annotated[
    GameCreated | PlayerSeated | GameStarted | MovePlayed | GameEnded,
    Field(discriminator="type"),
]

__all__ = [
    "EVENT_MAPS",
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


class _ImportedFrom(TypedDict, total=False):
    #: only in the `GameCreated` of an imported game
    imported_from: str


class GameCreatedMap(_EventMapBase, _ImportedFrom):
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


class MovePlayedMap(_EventMapBase):
    type: Literal["move_played"]
    ply: int
    seat: int
    colour: int
    move: str
    scores_after: list[int] | None
    colours: list[int]
    to_move: int


class GameEndedMap(_EventMapBase):
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
