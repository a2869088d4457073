"""Replies: what the engine service answers on a command's `reply_to` stream.

`Accepted` carries the seq of the last event the command appended (for `SeatPlayer`
also the seat token, shown only here). `Rejected` carries a code from a closed set
and a message for people; `seq` is the log's head at the time (0 when there is no
game), so a client with a stale view knows where to resume.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field

from schemas.base import CommandId, Seq, WireModel

RejectCode = Literal[
    "illegal_move",
    "invalid_move",
    "not_your_turn",
    "too_late",
    "stale_seq",
    "bad_token",
    "unknown_game",
    "game_over",
    "malformed",
    "too_large",
    "invalid_import",
    "reused_command_id",
]
REJECT_CODES: tuple[str, ...] = get_args(RejectCode)


class Accepted(WireModel):
    type: Literal["accepted"] = "accepted"
    command_id: CommandId
    game_id: str
    seq: Seq
    token: str | None = None


class Rejected(WireModel):
    type: Literal["rejected"] = "rejected"
    #: "" when the command was too broken to read its id.
    command_id: Annotated[str, Field(max_length=128)]
    game_id: str = ""
    code: RejectCode
    message: str
    seq: Seq = 0


Reply = Annotated[Accepted | Rejected, Field(discriminator="type")]

__all__ = ["REJECT_CODES", "Accepted", "RejectCode", "Rejected", "Reply"]
