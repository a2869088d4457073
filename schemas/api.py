"""The gateway's wire models: HTTP bodies, and the tagged messages of its sockets and streams.

Bodies are what `POST` routes accept and answer (`/openapi.json` is generated from them).
Each socket direction is a closed set tagged by `type`, decoded in one place
(`decode_client_message`, `decode_bot_message`); an unknown tag is answered with an
`error` message and dropped, never fatal:

- a game socket (`/ws/games/{id}`), server to client: `event`, `snapshot`, `reply`,
  `error`, `ping`; client to server: `move`, `resign`, `ping`;
- a bot's stream (`/api/bot/stream` NDJSON, `/ws/bot`), server to bot: `turn`, `prepare`,
  `ended`, `reply`, `error`, `ping`; bot to server (`/ws/bot` only; an NDJSON bot POSTs
  the same as bodies): `move`, `resign`, `ready`, `ping`.

A `turn` is self-sufficient, as Lichess's bot API is: the game, its options, every move so
far, the legal moves and the clock, so a bot keeps no state between turns and needs no rules
to know what it may play. It never carries a seat token: the gateway answers for the bot it
authenticated by key. `bot_message_schema()` is the JSON Schema of every bot message, served
beside the OpenAPI document (`/api/bot/messages.json`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictBool, TypeAdapter, model_validator

from schemas.base import (
    BotName,
    ClockStamp,
    Colour,
    CommandId,
    GameId,
    PlayerName,
    Seat,
    Seq,
    TimeMs,
)
from schemas.commands import TimeoutPolicy
from schemas.views import GameSummary, GameView

MoveText = Annotated[str, Field(min_length=1, max_length=32)]
Token = Annotated[str, Field(min_length=1, max_length=256)]


class Body(BaseModel):
    """An HTTP body or socket message: strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")


# -- HTTP bodies ---------------------------------------------------------------------------
class HumanSeat(Body):
    #: Reserve the seat for this name, which the person's results are rated under apart from
    #: the bots' (a bot's name is refused); "": an anonymous seat, never rated.
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
    #: Each seat's time bank in seconds, drawn on by moves that overrun `move_time` (which it
    #: needs); none means no bank.
    time_bank: Annotated[float, Field(gt=0, le=86_400)] | None = None
    #: When the seat to move overruns its clock: it loses (`forfeit`) or a random legal move
    #: is played for it (`random_move`).
    on_timeout: TimeoutPolicy = "forfeit"
    seed: int = 0

    @model_validator(mode="after")
    def _bank_needs_a_clock(self) -> Self:
        if self.time_bank is not None and self.move_time is None:
            raise ValueError("a time_bank needs a move_time: the bank pays for overruns")
        return self


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


GameOptions = Annotated[
    dict[Annotated[str, Field(max_length=32)], Annotated[str, Field(max_length=32)]],
    Field(max_length=16),
]


class ReadyBody(Body):
    """`POST /api/bot/ready`: the bot has prepared for this game type (answering `prepare`)."""

    game: Annotated[str, Field(min_length=1, max_length=64)]
    options: GameOptions = Field(default_factory=dict)


class HeldBody(Body):
    #: The turns of this bot's streams here that the answer released.
    released: Annotated[int, Field(ge=0)]


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
    games: list[GameSummary]
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
    view: GameView


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
    """The bot is to move: everything it needs, with no rules and no earlier message."""

    type: Literal["turn"] = "turn"
    game_id: GameId
    game: str
    options: dict[str, str]
    seat: Seat
    #: The colour the seat plays now (a swap may have exchanged them).
    colour: Colour
    #: Moves played so far (the length of `moves`).
    ply: Annotated[int, Field(ge=0)]
    #: Answer with this seq.
    seq: Seq
    #: Every move so far, in order: replay them on `load_game(game, **options)`.
    moves: list[str]
    #: What the seat may play now, in the engine's order.
    legal_moves: list[str]
    #: Ms the bot has for this move from when the turn reached it: the per-move limit and
    #: what is left of its bank; 0: no clock.
    allowance: Annotated[int, Field(ge=0)] = 0
    #: The game's per-move limit in ms (0: none).
    move_time_ms: Annotated[int, Field(ge=0)] = 0
    #: What is left of the seat's time bank in ms, drawn on once a move overruns the limit.
    bank_ms: Annotated[int, Field(ge=0)] = 0
    #: Ms since the epoch by which the move must be in; 0: no clock.
    deadline: TimeMs = 0
    #: The signed deadline: send it back with the move (the clock ran from the hand-over).
    clock: ClockStamp = ""


class PrepareMessage(Body):
    """A turn of a game type this stream has not said it is ready for is on its way: load
    what it needs and answer `ready`. The clock of a seat's first turn in a game waits for
    that answer (up to 10 s); a later turn (a reconnection mid-game) follows at once, its
    clock running: say `?ready=` when connecting to skip the warm-up."""

    type: Literal["prepare"] = "prepare"
    game: str
    options: dict[str, str]


class EndedMessage(Body):
    type: Literal["ended"] = "ended"
    game_id: GameId
    seat: Seat
    #: The winning seat; null for a draw and for a game ended without a result (an abort).
    winner: Seat | None
    #: Whether the game was drawn, as the game's view says it.
    draw: bool
    reason: str
    detail: str = ""


class BotMoveMessage(Body):
    type: Literal["move"] = "move"
    game_id: GameId
    move: MoveText
    seq: Seq
    clock: ClockStamp = ""


class BotResignMessage(Body):
    """Give up the game: the other seat wins. None of the games offers draws by agreement."""

    type: Literal["resign"] = "resign"
    game_id: GameId


class ReadyMessage(Body):
    """The answer to `prepare`: the bot is ready for this game type."""

    type: Literal["ready"] = "ready"
    game: Annotated[str, Field(min_length=1, max_length=64)]
    options: GameOptions = Field(default_factory=dict)


BotServerMessage = Annotated[
    TurnMessage | PrepareMessage | EndedMessage | ReplyMessage | ErrorMessage | PingMessage,
    Field(discriminator="type"),
]
BotClientMessage = Annotated[
    BotMoveMessage | BotResignMessage | ReadyMessage | PingMessage, Field(discriminator="type")
]
BotClientMessages = BotMoveMessage | BotResignMessage | ReadyMessage | PingMessage

_CLIENT: TypeAdapter[MoveMessage | ResignMessage | PingMessage] = TypeAdapter(ClientMessage)
_BOT: TypeAdapter[BotClientMessages] = TypeAdapter(BotClientMessage)
_SERVER: TypeAdapter[Any] = TypeAdapter(ServerMessage)
_BOT_SERVER: TypeAdapter[Any] = TypeAdapter(BotServerMessage)


def decode_client_message(text: str | bytes) -> MoveMessage | ResignMessage | PingMessage:
    """A game socket's message from its client; `pydantic.ValidationError` if it is none."""
    return _CLIENT.validate_json(text)


def decode_bot_message(text: str | bytes) -> BotClientMessages:
    """A bot socket's message from its bot; `pydantic.ValidationError` if it is none."""
    return _BOT.validate_json(text)


def decode_server_message(text: str | bytes) -> Any:
    """A game socket's message from the gateway (for clients and tests)."""
    return _SERVER.validate_json(text)


def decode_bot_server_message(text: str | bytes) -> Any:
    """A bot stream's message from the gateway (for the SDK and tests)."""
    return _BOT_SERVER.validate_json(text)


def bot_message_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a bot's stream and socket messages: `$defs` holds each
    message, `BotServerMessage` (gateway to bot) and `BotClientMessage` (bot to gateway)
    the two directions; the document itself accepts a message of either."""
    server = TypeAdapter(BotServerMessage).json_schema(ref_template="#/$defs/{model}")
    client = TypeAdapter(BotClientMessage).json_schema(ref_template="#/$defs/{model}")
    defs = {**server.pop("$defs"), **client.pop("$defs")}
    for message in defs.values():  # a tag has a default in Python, never on the wire
        message["required"] = ["type", *message.get("required", [])]
    defs["BotServerMessage"], defs["BotClientMessage"] = server, client
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "/api/bot/messages.json",
        "title": "Agon bot stream and socket messages",
        "description": "NDJSON lines of /api/bot/stream and text frames of /ws/bot.",
        "$defs": defs,
        "anyOf": [{"$ref": "#/$defs/BotServerMessage"}, {"$ref": "#/$defs/BotClientMessage"}],
    }


__all__ = [
    "BoardBody",
    "BoardCellBody",
    "BoardLabelBody",
    "BotBody",
    "BotClientMessage",
    "BotKeyBody",
    "BotMoveBody",
    "BotMoveMessage",
    "BotResignMessage",
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
    "GameOptions",
    "GamePageBody",
    "GameRulesBody",
    "HealthBody",
    "HeldBody",
    "HumanSeat",
    "HumanSeatSpec",
    "MoveBody",
    "MoveMessage",
    "NewBot",
    "NewGame",
    "PingMessage",
    "PrepareMessage",
    "ReadyBody",
    "ReadyMessage",
    "ReplyMessage",
    "ResignBody",
    "ResignMessage",
    "SeqBody",
    "ServerMessage",
    "SnapshotMessage",
    "TurnMessage",
    "bot_message_schema",
    "decode_bot_message",
    "decode_bot_server_message",
    "decode_client_message",
    "decode_server_message",
]
