"""A game past its fold: the projector's stored view, the API's view, a row of the game
list, and the result record the competitions read.

One game's facts travel four ways: the projector stores `StoredView` (canonical JSON, one
per game, `services.gamelog.fold.GameFold.view`); the gateway answers `GET /api/games/{id}`
and a socket's snapshot with `GameView` (the board cell by cell, what a person may play);
`GET /api/games` lists `GameSummary` rows, built from a stored view or, for an archived
game, from the archive's index; and every finished game between named players leaves a
`ResultRecord` that leaderboards, ratings and tournaments read back.

The parts every form shares (a seat, the last move, the result as the log has it, the
board's cells and chains) are `TypedDict`s: the fold builds and updates them in place at
no cost, and the models below validate and document them where they leave the house.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict
from typing_extensions import TypedDict  # pydantic reads only these on Python < 3.12

Status = Literal["waiting", "playing", "ended"]


class SeatView(TypedDict):
    """A seat: who sits there and the colour they play (which can change with a swap)."""

    seat: int
    kind: Literal["human", "bot"]
    name: str
    colour: int
    seated: bool


class LastMoveView(TypedDict):
    ply: int
    seat: int
    move: str


class LoggedResult(TypedDict):
    """How the game ended, as its `GameEnded` says: `winner` 0 is a draw or no result."""

    winner: int
    reason: str
    detail: str
    scores: list[int] | None
    #: the seat whose fault the end was (only when the log names one)
    fault: NotRequired[int]
    #: how far past its deadline the move that lost on time came (only when measured)
    overrun_ms: NotRequired[int]


class StoredView(TypedDict):
    """The projector's view of a game (`view:<game>`), at its log's head."""

    v: int
    game_id: str
    game: str
    options: dict[str, str]
    board: str
    seats: list[SeatView]
    move_time_ms: int
    seed: int
    engine_version: str
    status: Status
    seq: int
    ply: int
    to_move: int
    position: str
    scores: list[int] | None
    last_move: LastMoveView | None
    result: LoggedResult | None
    created: int
    updated: int
    deadline: int
    imported_from: NotRequired[str]
    banks_ms: NotRequired[list[int]]
    tournament: NotRequired[str]
    error: NotRequired[str]
    #: the legal moves, when a person is to move
    legal: NotRequired[list[str]]
    #: what the game shows beside the board (`engine.core.Display.to_dict`)
    display: NotRequired[dict[str, Any]]


class CellView(TypedDict):
    """A board cell: its label and contents (Overflow: a stack's height and its house)."""

    label: str
    piece: NotRequired[int | None]
    height: NotRequired[int]
    house: NotRequired[int]
    #: the number Supply Chains prints on the piece
    surplus: NotRequired[int]


class ChainView(TypedDict):
    """A chain of one colour's pieces: its cells and warehouses (labels) and its surplus."""

    owner: int
    cells: list[str]
    surplus: int
    warehouses: list[str]
    deficit: bool


class BoardView(TypedDict):
    name: str
    cells: list[CellView]
    #: Teeko: the markers each colour still has in hand
    hands: NotRequired[list[int]]
    chains: NotRequired[list[ChainView]]
    #: per colour ("1", "2"), the warehouses of its chains in deficit
    deficit_warehouses: NotRequired[dict[str, list[str]]]
    #: the cells of the shape that won the game (Teeko, Hexade), once it has ended
    winning: NotRequired[list[str]]


class ResultView(TypedDict):
    """How the game ended, for people: `winner` null and `draw` false is no result."""

    winner: int | None
    draw: bool
    reason: str
    detail: str
    scores: list[int] | None


class ListedResult(TypedDict):
    winner: int | None
    reason: str


class _View(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GameView(_View):
    """A game as `GET /api/games/{id}` (and a socket's snapshot) shows it."""

    id: str
    game: str
    options: dict[str, str]
    status: Status
    seq: int
    ply: int
    #: the seat to move; null when nobody is
    to_move: int | None
    #: what the seat to move may play (empty when the game is not being played)
    legal_moves: list[str]
    seats: list[SeatView]
    scores: list[int] | None
    last_move: LastMoveView | None
    moves: list[str]
    result: ResultView | None
    #: seconds a move; null: no clock
    move_time: float | None
    #: when the seat to move must have moved (ms since the epoch); null: no clock
    deadline: int | None
    created: int
    updated: int
    #: the original game's id when this one was imported (replayable here, never rated)
    imported_from: str | None
    board: BoardView
    #: why the game cannot be shown (rules this server does not know)
    error: str | None = None
    #: read from the archive (`agon archive`): nobody plays or follows it any more
    archived: bool = False


class PliesBody(_View):
    """The views after a range of plies (`GET /api/games/{id}/plies`), for a replay."""

    views: list[GameView]


class GameSummary(_View):
    """A game in the list (`GET /api/games`): the view without the position's details."""

    id: str
    game: str
    options: dict[str, str]
    status: Status
    seq: int
    ply: int
    to_move: int | None
    seats: list[SeatView]
    scores: list[int] | None
    result: ListedResult | None
    created: int
    updated: int
    imported_from: str | None = None
    #: listed from the archive (`?status=archived`)
    archived: bool = False

    @classmethod
    def of(cls, view: StoredView) -> GameSummary:
        """The row of a game from its stored view."""
        result = view["result"]
        return cls(
            id=view["game_id"],
            game=view["game"],
            options=view["options"],
            status=view["status"],
            seq=view["seq"],
            ply=view["ply"],
            to_move=view["to_move"] or None,
            seats=view["seats"],
            scores=view["scores"],
            result=None
            if not result
            else {"winner": result["winner"] or None, "reason": result["reason"]},
            created=view["created"],
            updated=view["updated"],
            imported_from=view.get("imported_from"),
        )


class ResultRecord(_View):
    """A finished game's result as the competition read models keep it (`results:<game>`,
    `tresults:<tournament>`), written once by the projector as canonical JSON."""

    game_id: str
    game: str
    #: the options as sorted (name, value) pairs
    options: list[tuple[str, str]]
    #: the names of seat 1 and seat 2
    players: tuple[str, str]
    #: the seats people held (absent when both were bots): rated apart from the bots
    people: list[int] | None = None
    #: the winning seat; 0 for a draw or no result
    winner: int
    reason: str
    #: the seat whose fault the end was (0: unnamed)
    fault: int = 0
    #: when it ended (ms since the epoch)
    ended: int
    #: per seat, each move's think time (ms)
    think_ms: tuple[list[int], list[int]]
    #: per seat, the platform's lag before each of its turns reached it (ms; bots only,
    #: absent when there was none)
    lag_ms: tuple[list[int], list[int]] | None = None
    tournament: str | None = None
