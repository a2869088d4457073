"""Turn requests: what the dispatcher puts in a bot's inbox when that bot is to move.

A request holds everything a bot needs to think without reading the log: the game
and options, the moves so far (replay them on `load_game(game, **options)`), the
seq to answer (send it back as `PlayMove.expected_seq`), the seat and its token,
and the deadline with its signed stamp (send it back as `PlayMove.clock`: the clock then
runs from when the turn was handed over). A worker drops a request whose deadline has
passed or whose seq the game has moved beyond.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from schemas.base import BotName, ClockStamp, GameId, Seat, Seq, TimeMs, WireModel


class TurnRequest(WireModel):
    type: Literal["turn_request"] = "turn_request"
    game_id: GameId
    game: str
    options: dict[str, str]
    moves: list[str]
    #: The seq of the event that made it this bot's turn; answer with it as expected_seq.
    seq: Seq
    seat: Seat
    colour: Annotated[int, Field(ge=1, le=2)]
    bot: BotName
    token: str
    #: Ms since the epoch by which the move must arrive; 0 means no limit.
    deadline: TimeMs = 0
    #: The deadline signed by the dispatcher (`schemas.tokens.clock_stamp`); "" without one.
    clock: ClockStamp = ""
    seed: int = 0


#: The closed set of messages to bots; one member for now.
Turn = TurnRequest

__all__ = ["Turn", "TurnRequest"]
