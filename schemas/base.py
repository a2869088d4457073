"""Shared building blocks of every wire model: the schema version, the model base and id types.

Every message that crosses a process boundary is a frozen pydantic model with a `type`
tag (its name on the wire) and a schema version `v`. Identifiers that end up inside
Redis key names (game ids, bot names) are restricted to a safe alphabet here, once,
so no key can be forged or broken by a crafted id.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The wire schema version every model carries in its `v` field.
SCHEMA_VERSION: Literal[1] = 1

SchemaVersion = Literal[1]

#: Game ids and bot names appear inside Redis key names: no braces, colons or spaces.
ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
BOT_NAME_RE = re.compile(ID_PATTERN)
GameId = Annotated[str, Field(pattern=ID_PATTERN)]
BotName = Annotated[str, Field(pattern=ID_PATTERN)]
CommandId = Annotated[str, Field(min_length=1, max_length=128)]
#: A stream name to answer on; "" means nobody listens for the reply.
StreamName = Annotated[str, Field(max_length=256)]
PlayerName = Annotated[str, Field(max_length=64)]
Seat = Annotated[int, Field(ge=1, le=2)]
Colour = Annotated[int, Field(ge=1, le=2)]
Seq = Annotated[int, Field(ge=0)]
#: Milliseconds since the Unix epoch.
TimeMs = Annotated[int, Field(ge=0)]
#: A deadline signed by the dispatcher (`schemas.tokens.clock_stamp`); "" for none.
ClockStamp = Annotated[str, Field(max_length=64)]


class WireModel(BaseModel):
    """Base of every wire model: immutable, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: SchemaVersion = SCHEMA_VERSION


def new_game_id() -> str:
    """A fresh random game id; clients pick the id so they know the partition to send to."""
    return uuid.uuid4().hex[:16]


def new_command_id() -> str:
    """A fresh random command id for clients that do not keep their own."""
    return uuid.uuid4().hex
