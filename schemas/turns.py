"""Turn requests: what the dispatcher puts in a bot's inbox when that bot is to move.

A request holds everything a bot needs to think without reading the log: the game
and options, the moves so far (replay them on `load_game(game, **options)`), the
seq to answer (send it back as `PlayMove.expected_seq`), the seat and its token,
and its clock: `since` (when it became the bot's turn), `allowance` (the per-move limit and
what is left of the bank) and the dispatcher's deadline. The worker or gateway that hands the
bot its turn gives it `allowance` from that moment (`services.bus.delivery`) and signs that
deadline: send the stamp back as `PlayMove.clock`. A worker drops a request whose seq the
game has moved beyond, or whose clock was claimed before the turn reached the bot.
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
    #: Ms since the epoch by which the move must arrive if the turn reached the bot when the
    #: dispatcher handed it over (delivery gives the real one); 0 means no limit.
    deadline: TimeMs = 0
    #: The signed deadline (`schemas.tokens.clock_stamp`): "" from the dispatcher; the
    #: worker or gateway that delivers the turn signs the one it gives.
    clock: ClockStamp = ""
    seed: int = 0
    #: Ms since the epoch when it became this seat's turn (the head event's time).
    since: TimeMs = 0
    #: Ms the bot has from when the turn reaches it (per-move limit and bank left); 0: no clock.
    allowance: Annotated[int, Field(ge=0)] = 0


#: The closed set of messages to bots; one member for now.
Turn = TurnRequest

__all__ = ["Turn", "TurnRequest"]
