"""Wire models of every message that crosses a process boundary, and their msgpack codec.

One closed set per direction, each a pydantic v2 discriminated union on `type` with a
schema version `v`: commands (to the engine service), events (in a game's log),
replies (to a command's sender) and turn requests (to bots). `schemas.codec` is the
only place that turns them into bytes and back.
"""

from schemas.base import SCHEMA_VERSION, new_command_id, new_game_id
from schemas.codec import (
    FIELD,
    MAX_ENTRY_BYTES,
    DecodeError,
    decode_command,
    decode_event,
    decode_reply,
    decode_turn,
    encode,
    event_hash,
)
from schemas.commands import (
    Abort,
    ClaimTimeout,
    Command,
    CreateGame,
    ImportGame,
    PlayMove,
    Resign,
    SeatPlayer,
    SeatSpec,
)
from schemas.events import (
    Event,
    GameCreated,
    GameEnded,
    GameStarted,
    MovePlayed,
    PlayerSeated,
)
from schemas.replies import REJECT_CODES, Accepted, RejectCode, Rejected, Reply
from schemas.turns import Turn, TurnRequest

__all__ = [
    "FIELD",
    "MAX_ENTRY_BYTES",
    "REJECT_CODES",
    "SCHEMA_VERSION",
    "Abort",
    "Accepted",
    "ClaimTimeout",
    "Command",
    "CreateGame",
    "DecodeError",
    "Event",
    "GameCreated",
    "GameEnded",
    "GameStarted",
    "ImportGame",
    "MovePlayed",
    "PlayMove",
    "PlayerSeated",
    "RejectCode",
    "Rejected",
    "Reply",
    "Resign",
    "SeatPlayer",
    "SeatSpec",
    "Turn",
    "TurnRequest",
    "decode_command",
    "decode_event",
    "decode_reply",
    "decode_turn",
    "encode",
    "event_hash",
    "new_command_id",
    "new_game_id",
]
