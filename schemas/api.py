"""The gateway's wire models: HTTP bodies, and the tagged messages of its sockets and streams.

Bodies are what `POST` routes accept and answer (`/openapi.json` is generated from them).
Each socket direction is a closed set tagged by `type`, decoded in one place
(`decode_client_message`, `decode_bot_message`); an unknown tag is answered with an
`error` message and dropped, never fatal:

- a game socket (`/ws/games/{id}`), server to client: `event`, `snapshot`, `reply`,
  `error`, `ping`; client to server: `move`, `resign`, `ping`;
- a bot's stream (`/api/bot/stream` NDJSON, `/ws/bot`), server to bot: `turn`, `ended`,
  `reply`, `error`, `ping`; bot to server (`/ws/bot` only): `move`, `ping`.

A `turn` is self-sufficient, as Lichess's bot API is: the game, its options and every
move so far, so a bot keeps no state between turns. It never carries a seat token: the
gateway answers for the bot it authenticated by key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, TypeAdapter

from schemas.base import BotName, ClockStamp, CommandId, GameId, PlayerName, Seat, Seq, TimeMs

MoveText = Annotated[str, Field(min_length=1, max_length=32)]
Token = Annotated[str, Field(min_length=1, max_length=256)]


class Body(BaseModel):
    """An HTTP body or socket message: strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# -- HTTP bodies ---------------------------------------------------------------------------
class HumanSeat(Body):
    #: Reserve the seat for this name ("": anyone holding the token).
    name: PlayerName = ""


class HumanSeatSpec(Body):
    human: HumanSeat


class BotSeatSpec(Body):
    bot: BotName


class NewGame(Body):
    game: Annotated[str, Field(min_length=1, max_length=64)]
    options: dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=32)]] = (
        Field(default_factory=dict, max_length=16)
    )
    seats: Annotated[list[HumanSeatSpec | BotSeatSpec], Field(min_length=2, max_length=2)]
    #: Seconds per move; none means no clock.
    move_time: Annotated[float, Field(gt=0, le=86_400)] | None = None
    seed: int = 0


class GameCreatedBody(Body):
    id: GameId
    #: A secret token per human seat (null for a bot's seat). Shown once: keep it.
    tokens: list[str | None]


class MoveBody(Body):
    move: MoveText
    seq: Seq
    token: Token
    #: Send the same id again to retry safely; the gateway picks one if absent.
    command_id: CommandId | None = None


class ResignBody(Body):
    token: Token
    command_id: CommandId | None = None


class BotMoveBody(Body):
    move: MoveText
    seq: Seq
    #: The turn's `clock`, if it had one.
    clock: ClockStamp = ""


class SeqBody(Body):
    seq: Seq


class ErrorBody(Body):
    code: str
    message: str
    #: The game's seq when a command was refused.
    seq: int | None = None


class NewBot(Body):
    name: BotName
    #: Whether anyone may seat the bot in a game; otherwise only a creator bearing its key.
    accept_challenges: StrictBool = False


class BotSettingsBody(Body):
    """`PATCH /api/bots/{name}` with the bot's key: its standing settings."""

    #: Whether anyone may seat the bot in a game; otherwise only a creator bearing its key.
    accept_challenges: StrictBool


class BotKeyBody(Body):
    name: BotName
    #: The bot's key, shown once: send it as `Authorization: Bearer KEY`.
    key: str


class GamePageBody(Body):
    games: list[dict[str, Any]]
    #: Pass as `cursor` for the next page; null on the last one.
    cursor: str | None


class HealthBody(Body):
    status: Literal["ok", "degraded"]
    redis: bool
    gateway: str


# -- what the web page draws and offers ---------------------------------------------------
class BoardCellBody(Body):
    """One cell of a board as the page draws it: the engine's site, in drawing coordinates."""

    index: int
    label: str
    row: int
    col: int
    phase: int
    #: The centre, in drawing units: x to the right, y downward (the engine's y negated).
    x: float
    y: float
    #: The cell's outline as an SVG polygon's `points` ("x,y x,y ...").
    points: str


class BoardLabelBody(Body):
    """A coordinate written beside the board: a column letter or a row number."""

    text: str
    x: float
    y: float


class BoardBody(Body):
    """A board's geometry for drawing: every cell's outline and the coordinates on its edge."""

    name: str
    kind: Literal["square", "hex", "tri"]
    cells: list[BoardCellBody]
    coordinates: list[BoardLabelBody]
    #: The SVG `viewBox` that holds the cells and the coordinates: x, y, width, height.
    view_box: tuple[float, float, float, float]


class GameRulesBody(Body):
    """A game the arena plays, and its options (RULES.md §8)."""

    name: str
    title: str
    #: Each option's accepted values, the default first.
    options: dict[str, list[str]]


class BotBody(Body):
    name: BotName
    kind: Literal["built-in", "registered"]


class CatalogueBody(Body):
    """What a new game can be: every game with its options, and every bot a seat can take."""

    games: list[GameRulesBody]
    bots: list[BotBody]


# -- a game socket -------------------------------------------------------------------------
class EventMessage(Body):
    type: Literal["event"] = "event"
    seq: Seq
    #: The event as stored in the log (`schemas.events`), as a JSON object.
    event: dict[str, Any]


class SnapshotMessage(Body):
    """Sent instead of the missed events when a client is too far behind: the view at
    `seq`; events after it follow."""

    type: Literal["snapshot"] = "snapshot"
    seq: Seq
    view: dict[str, Any]


class ReplyMessage(Body):
    """The engine's answer to a `move` or `resign` sent on this socket."""

    type: Literal["reply"] = "reply"
    command_id: str
    ok: bool
    seq: Seq
    code: str | None = None
    message: str | None = None


class ErrorMessage(Body):
    type: Literal["error"] = "error"
    code: str
    message: str


class PingMessage(Body):
    type: Literal["ping"] = "ping"


class MoveMessage(Body):
    type: Literal["move"] = "move"
    move: MoveText
    seq: Seq
    token: Token
    command_id: CommandId | None = None


class ResignMessage(Body):
    type: Literal["resign"] = "resign"
    token: Token
    command_id: CommandId | None = None


ServerMessage = Annotated[
    EventMessage | SnapshotMessage | ReplyMessage | ErrorMessage | PingMessage,
    Field(discriminator="type"),
]
ClientMessage = Annotated[MoveMessage | ResignMessage | PingMessage, Field(discriminator="type")]


# -- a bot's stream ------------------------------------------------------------------------
class TurnMessage(Body):
    type: Literal["turn"] = "turn"
    game_id: GameId
    game: str
    options: dict[str, str]
    #: Every move so far, in order: replay them on `load_game(game, **options)`.
    moves: list[str]
    #: Answer with this seq.
    seq: Seq
    seat: Seat
    #: Ms since the epoch by which the move must be in; 0: no clock.
    deadline: TimeMs = 0
    #: The signed deadline: send it back with the move, and the clock runs from when the
    #: turn was handed over rather than from the previous move.
    clock: ClockStamp = ""


class EndedMessage(Body):
    type: Literal["ended"] = "ended"
    game_id: GameId
    seat: Seat
    #: The winning seat, 0 for a draw or an abort.
    winner: int
    reason: str
    detail: str = ""


class BotMoveMessage(Body):
    type: Literal["move"] = "move"
    game_id: GameId
    move: MoveText
    seq: Seq
    clock: ClockStamp = ""


BotServerMessage = Annotated[
    TurnMessage | EndedMessage | ReplyMessage | ErrorMessage | PingMessage,
    Field(discriminator="type"),
]
BotClientMessage = Annotated[BotMoveMessage | PingMessage, Field(discriminator="type")]

_CLIENT: TypeAdapter[MoveMessage | ResignMessage | PingMessage] = TypeAdapter(ClientMessage)
_BOT: TypeAdapter[BotMoveMessage | PingMessage] = TypeAdapter(BotClientMessage)
_SERVER: TypeAdapter[Any] = TypeAdapter(ServerMessage)
_BOT_SERVER: TypeAdapter[Any] = TypeAdapter(BotServerMessage)


def decode_client_message(text: str | bytes) -> MoveMessage | ResignMessage | PingMessage:
    """A game socket's message from its client; `pydantic.ValidationError` if it is none."""
    return _CLIENT.validate_json(text)


def decode_bot_message(text: str | bytes) -> BotMoveMessage | PingMessage:
    """A bot socket's message from its bot; `pydantic.ValidationError` if it is none."""
    return _BOT.validate_json(text)


def decode_server_message(text: str | bytes) -> Any:
    """A game socket's message from the gateway (for clients and tests)."""
    return _SERVER.validate_json(text)


def decode_bot_server_message(text: str | bytes) -> Any:
    """A bot stream's message from the gateway (for the SDK and tests)."""
    return _BOT_SERVER.validate_json(text)


__all__ = [
    "BoardBody",
    "BoardCellBody",
    "BoardLabelBody",
    "BotBody",
    "BotClientMessage",
    "BotKeyBody",
    "BotMoveBody",
    "BotMoveMessage",
    "BotSeatSpec",
    "BotServerMessage",
    "BotSettingsBody",
    "CatalogueBody",
    "ClientMessage",
    "EndedMessage",
    "ErrorBody",
    "ErrorMessage",
    "EventMessage",
    "GameCreatedBody",
    "GamePageBody",
    "GameRulesBody",
    "HealthBody",
    "HumanSeat",
    "HumanSeatSpec",
    "MoveBody",
    "MoveMessage",
    "NewBot",
    "NewGame",
    "PingMessage",
    "ReplyMessage",
    "ResignBody",
    "ResignMessage",
    "SeqBody",
    "ServerMessage",
    "SnapshotMessage",
    "TurnMessage",
    "decode_bot_message",
    "decode_bot_server_message",
    "decode_client_message",
    "decode_server_message",
]
